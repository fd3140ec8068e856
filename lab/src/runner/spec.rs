//! The VM a repetition boots: its spec, with the cell's kernel command line
//! ([`crate::matrix::Plan::cmdline`]) and the peer's words.

use vm_spec::{IommuSpec, Kernel, SerialOutput, SerialSpec, VmSpec};

use super::Repetition;
use super::device::StartedDevice;
use super::output::{AGENT_LOG, SERIAL_LOG};
use crate::failure::Failure;

impl Repetition<'_> {
    /// The VM's spec: the image's kernel and initrd, the cell's command line and the peer's
    /// words, the device, the serial ports into the repetition's folder.
    pub(super) fn vm_spec(&self, device: &StartedDevice) -> Result<VmSpec, Failure> {
        let plan = &self.plan.plan;
        let linux = self.linux();
        let files = match (linux, self.plan.files(&self.image.name)) {
            (false, _) => None,
            (true, Some(files)) => Some(files),
            (true, None) => {
                return Err(Failure::Setup { what: format!("image {:?} has no files", self.image.name) });
            }
        };
        let mut words = plan.cmdline(self.cell);
        if let Some(peer) = &device.peer {
            words.push(' ');
            words.push_str(&peer.cmdline());
        }
        Ok(VmSpec {
            kernel: files.map_or(Kernel::Probe, |f| Kernel::Path(f.kernel.clone())),
            initrd: files.and_then(|f| f.initrd.clone()),
            cmdline: words,
            memory_mib: self.image.memory_mib,
            vcpus: self.image.vcpus,
            // Linux attaches every endpoint to a DMA domain before its driver probes, so its VMs
            // start with bypass off: nothing is mapped before the guest maps it (an identity map
            // of all guest RAM pins every page through VFIO, seconds behind a nested IOMMU).
            iommu: self.image.iommu.then_some(IommuSpec { bypass: !linux }),
            devices: vec![device.spec.clone()],
            serial: SerialSpec {
                com1: SerialOutput::File(self.dir.join(SERIAL_LOG)),
                com2: linux.then(|| SerialOutput::File(self.dir.join(AGENT_LOG))),
            },
            timeout_s: Some(plan.matrix.timeout_s),
            ..VmSpec::new(Kernel::Probe)
        })
    }
}

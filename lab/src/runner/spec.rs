//! The VM a repetition boots: its kernel command line and its spec.

use vm_spec::{IommuSpec, Kernel, NicKind, SerialOutput, SerialSpec, VmSpec};

use super::Repetition;
use super::device::StartedDevice;
use super::output::{AGENT_LOG, SERIAL_LOG};
use crate::failure::Failure;
use crate::matrix::{Cell, Device, Plan, Workload};

/// The kernel command line of a cell: the image's words, the variant's, its parameters, then
/// what the workload needs.
pub fn cmdline(plan: &Plan, cell: &Cell) -> String {
    let mut words: Vec<String> = Vec::new();
    if let Some(image) = plan.image(&cell.image) {
        words.extend(image.cmdline.split_whitespace().map(String::from));
    }
    if let Some(variant) = plan.variant(&cell.variant) {
        words.extend(variant.cmdline.split_whitespace().map(String::from));
        if variant.iommu_domain == Some(crate::matrix::IommuDomainChoice::Lazy) {
            // The agent writes the group's type in its iommu-group step.
            words.push("driverlab.iommu_domain=lazy".into());
        }
    }
    words.extend(cell.params.iter().map(|(k, v)| format!("{k}={v}")));
    match plan.workload(&cell.workload) {
        Some(Workload::ProbeRx { frames, .. }) => {
            // The probe drives the NICs driverlab knows (the matrix's check refuses a probe-rx
            // workload on any other).
            let nic = plan.device(&cell.device).and_then(Device::nic).unwrap_or(NicKind::Aqc100);
            words.extend(["probe.viommu_ops=0".into(), format!("probe.nic={nic}"), format!("probe.frames={frames}")]);
        }
        Some(Workload::Iperf3 {
            direction,
            duration_s,
            ip,
            mtu,
            streams,
            protocol,
            bitrate_mbit,
            surprise_unplug_after_s,
            ..
        }) => {
            // The agent's words (guest-images/agent/init): its driver, the workload, the MTU.
            let driver =
                plan.device(&cell.device).map_or_else(|| NicKind::Aqc100.linux_driver().into(), Device::linux_driver);
            words.extend([
                "console=ttyS0".into(),
                "panic=-1".into(),
                format!("driverlab.nic={driver}"),
                format!("driverlab.mtu={mtu}"),
                match bitrate_mbit {
                    0 => format!("driverlab.iperf={direction},{},{ip},{streams},{protocol}", duration_s.ceil() as u64),
                    rate => format!(
                        "driverlab.iperf={direction},{},{ip},{streams},{protocol},{rate}M",
                        duration_s.ceil() as u64
                    ),
                },
            ]);
            if surprise_unplug_after_s.is_some() {
                // The agent expects the device to go mid-traffic and checks how the guest took it.
                words.push("driverlab.unplug=surprise".into());
            }
        }
        None => {}
    }
    words.join(" ")
}

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
        let mut words = cmdline(plan, self.cell);
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

//! The QEMU engine: the reference the lab runs guests under where its own VMM cannot (hosts whose
//! KVM does not run Linux, CI without hardware). QEMU 11 from Debian forky, cached as a chroot by
//! `driverlab engine setup qemu`, run straight from it through the chroot's own dynamic loader
//! (no `chroot`, no root): q35, TCG or KVM, a virtio-iommu, the device as `vfio-user-pci` (a
//! model) or `vfio-pci` (a host device), COM1 and COM2 into files. What the virtio-iommu did is
//! read from QEMU's trace events (`virtio_iommu_map`, `virtio_iommu_unmap`,
//! `virtio_iommu_report_fault`) and how the guest stopped from `qemu_system_shutdown_request`.

pub mod engine;
pub mod setup;
pub mod ssdt;
pub mod trace;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use vm_spec::{DeviceBackend, DeviceSpec, Slot};

pub use engine::QemuEngine;
use trace::TRACE_EVENTS;
pub use trace::{ShutdownCause, Trace};

/// What the chroot must hold; the marker file of a complete one says so.
pub(crate) const PACKAGES: &str = "qemu-system-x86";
/// The marker [`setup`] writes when the chroot is complete.
pub(crate) const MARKER: &str = ".driverlab-complete";

/// Errors finding or running QEMU.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// The chroot is not there (or not complete).
    #[error(
        "no QEMU at {root}: run `sudo driverlab engine setup qemu` (it caches Debian forky's QEMU 11 there), \
         or point DRIVERLAB_QEMU_ROOT at such a chroot",
        root = root.display()
    )]
    NotSetUp {
        /// Where it was looked for.
        root: PathBuf,
    },
    /// QEMU did not run.
    #[error("running {binary}: {detail}", binary = binary.display())]
    Run {
        /// The binary.
        binary: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// How QEMU runs guest code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Binary translation: works everywhere, slowly.
    #[default]
    Tcg,
    /// Hardware virtualization through /dev/kvm.
    Kvm,
}

/// QEMU in a forky chroot.
#[derive(Debug, Clone)]
pub struct Qemu {
    root: PathBuf,
}

/// The chroot's default place: `$DRIVERLAB_QEMU_ROOT`, else `forky-qemu` in driverlab's cache
/// (`$DRIVERLAB_CACHE`, else `$XDG_CACHE_HOME/driverlab`, else `~/.cache/driverlab`), where
/// `driverlab engine setup qemu` puts it.
pub fn default_root() -> PathBuf {
    if let Some(root) = std::env::var_os("DRIVERLAB_QEMU_ROOT") {
        return PathBuf::from(root);
    }
    guest_images::store::cache_dir().join("forky-qemu")
}

/// Where Debian's QEMU packages and their firmware dependencies (SeaBIOS, iPXE, OVMF) put the
/// files QEMU loads.
const DATA_FOLDERS: &[&str] =
    &["usr/share/qemu", "usr/share/seabios", "usr/lib/ipxe/qemu", "usr/share/ipxe/qemu", "usr/share/ovmf"];

/// RAM above 4 GiB in a guest with a `thunderbolt` slot, as driverlab's VMM gives it.
const RAM_ABOVE_4GIB_MIB: u64 = 2;

/// One guest for QEMU to run.
#[derive(Debug, Clone)]
pub struct Machine<'a> {
    /// The kernel (a bzImage, or an ELF with a PVH note such as the probe).
    pub kernel: &'a Path,
    /// The initrd.
    pub initrd: Option<&'a Path>,
    /// The kernel command line.
    pub cmdline: &'a str,
    /// Guest memory in MiB.
    pub memory_mib: u64,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// TCG or KVM.
    pub accel: Accel,
    /// A virtio-iommu in front of the device.
    pub iommu: bool,
    /// The device: a vfio-user socket or a host BDF, and its slot. A `thunderbolt` slot is a
    /// `pcie-root-port` that `ssdt` declares external-facing, with some RAM above 4 GiB (x86
    /// Linux sets swiotlb up only then: `pci_swiotlb_detect()` in arch/x86/kernel/pci-dma.c).
    pub device: &'a DeviceSpec,
    /// The SSDT of a `thunderbolt` slot ([`ssdt::external_facing_port`], written to a file).
    pub ssdt: Option<&'a Path>,
    /// Where COM1 goes.
    pub com1: &'a Path,
    /// Where COM2 goes, when the guest has one.
    pub com2: Option<&'a Path>,
    /// Where the trace events go.
    pub trace: &'a Path,
}

impl Qemu {
    /// The chroot at `root`, if it is complete.
    pub fn find(root: &Path) -> Result<Qemu, QemuError> {
        let qemu = Qemu { root: root.to_path_buf() };
        let marker = std::fs::read_to_string(root.join(MARKER)).unwrap_or_default();
        if marker.trim() != PACKAGES || !qemu.binary().exists() || !qemu.loader().exists() {
            return Err(QemuError::NotSetUp { root: root.to_path_buf() });
        }
        Ok(qemu)
    }

    /// The chroot.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn binary(&self) -> PathBuf {
        self.root.join("usr/bin/qemu-system-x86_64")
    }

    fn loader(&self) -> PathBuf {
        self.root.join("usr/lib64/ld-linux-x86-64.so.2")
    }

    /// `qemu-system-x86_64` with `args`, run through the chroot's loader and libraries, and
    /// every firmware folder of the chroot named with `-L`: QEMU looks for its data files in the
    /// `-L` folders and then in its built-in host ones (`/usr/share/qemu`, `/usr/share/seabios`,
    /// ...), and Debian's `/usr/share/qemu` holds links into those, so a chroot's QEMU would
    /// otherwise load the host's firmware, or fail on a host that has none.
    pub fn command(&self, args: &[String]) -> Command {
        let mut command = Command::new(self.loader());
        command.arg("--library-path").arg(self.root.join("usr/lib/x86_64-linux-gnu")).arg(self.binary());
        for folder in self.data_folders() {
            command.arg("-L").arg(folder);
        }
        command.args(args);
        command
    }

    /// The chroot's folders of QEMU data files that exist, in the order QEMU should search them.
    pub fn data_folders(&self) -> Vec<PathBuf> {
        DATA_FOLDERS.iter().map(|f| self.root.join(f)).filter(|p| p.is_dir()).collect()
    }

    /// QEMU's version line (`QEMU emulator version 11.1.2 (Debian ...)`).
    pub fn version(&self) -> Result<String, QemuError> {
        let out = self.command(&["--version".into()]).output().map_err(|e| self.run_error(e.to_string()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        match text.lines().next() {
            Some(line) if out.status.success() => Ok(line.trim().to_string()),
            _ => Err(self.run_error(format!("--version: {}", String::from_utf8_lossy(&out.stderr).trim()))),
        }
    }

    fn run_error(&self, detail: String) -> QemuError {
        QemuError::Run { binary: self.binary(), detail }
    }

    /// The command that runs `machine`. QEMU ends when the guest powers off or resets
    /// (`-no-reboot`); SIGTERM ends it cleanly.
    pub fn machine_command(&self, machine: &Machine<'_>) -> Command {
        self.command(&machine_args(machine))
    }
}

/// QEMU's arguments for `machine`.
pub fn machine_args(m: &Machine<'_>) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let accel = match m.accel {
        Accel::Tcg => "tcg",
        Accel::Kvm => "kvm",
    };
    let thunderbolt = m.device.slot == Slot::Thunderbolt;
    let mut machine = String::from("q35,memory-backend=mem");
    if thunderbolt {
        let below = m.memory_mib.saturating_sub(RAM_ABOVE_4GIB_MIB);
        machine.push_str(&format!(",max-ram-below-4g={below}M"));
    }
    let mut args: Vec<String> = ["-machine".into(), machine, "-accel".into(), accel.into()].into();
    // vfio-user hands guest RAM to the device's process as file descriptors: shared memfd.
    args.push("-object".into());
    args.push(format!("memory-backend-memfd,id=mem,size={}M,share=on", m.memory_mib));
    args.extend(["-m".into(), format!("{}M", m.memory_mib), "-smp".into(), m.vcpus.to_string()]);
    // No default devices (q35 would add a NIC and VGA), no monitor, no display.
    args.extend(
        ["-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot"].map(String::from),
    );
    // vCPU threads named `CPU N/TCG`, so that the host's CPU time splits into the vCPUs' and the
    // rest (host_cpu).
    args.extend(["-name".into(), "driverlab,debug-threads=on".into()]);
    args.extend(["-serial".into(), format!("file:{}", path(m.com1))]);
    if let Some(com2) = m.com2 {
        args.extend(["-serial".into(), format!("file:{}", path(com2))]);
    }
    args.extend(["-kernel".into(), path(m.kernel), "-append".into(), m.cmdline.to_string()]);
    if let Some(initrd) = m.initrd {
        args.extend(["-initrd".into(), path(initrd)]);
    }
    if m.iommu {
        args.extend(["-device".into(), "virtio-iommu-pci".into()]);
    }
    let bus = if thunderbolt {
        let port = format!(
            "pcie-root-port,id={},chassis=1,slot=1,bus=pcie.0,addr={:#x}",
            ssdt::ROOT_PORT_ID,
            ssdt::ROOT_PORT_DEVICE
        );
        args.extend(["-device".into(), port]);
        if let Some(table) = m.ssdt {
            args.extend(["-acpitable".into(), format!("file={}", path(table))]);
        }
        ssdt::ROOT_PORT_ID
    } else {
        "pcie.0"
    };
    match &m.device.backend {
        DeviceBackend::VfioUser(socket) => {
            let device = serde_json::json!({
                "driver": "vfio-user-pci", "bus": bus, "socket": {"path": path(socket), "type": "unix"}
            });
            args.extend(["-device".into(), device.to_string()]);
        }
        DeviceBackend::Vfio(bdf) => args.extend(["-device".into(), format!("vfio-pci,host={bdf},bus={bus}")]),
    }
    args.extend(["-D".into(), path(m.trace)]);
    for event in TRACE_EVENTS {
        args.extend(["-trace".into(), (*event).into()]);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_names_the_device_the_iommu_and_the_ports() {
        let socket = PathBuf::from("/run/x/aqc100.sock");
        let device = DeviceSpec::vfio_user(socket);
        let machine = Machine {
            kernel: Path::new("/img/bzImage"),
            initrd: Some(Path::new("/img/initrd.gz")),
            cmdline: "console=ttyS0 panic=-1",
            memory_mib: 512,
            vcpus: 1,
            accel: Accel::Tcg,
            iommu: true,
            device: &device,
            ssdt: None,
            com1: Path::new("/a/serial.log"),
            com2: Some(Path::new("/a/agent.log")),
            trace: Path::new("/a/trace.log"),
        };
        let args = machine_args(&machine).join(" ");
        for part in [
            "-machine q35,memory-backend=mem -accel tcg",
            "memory-backend-memfd,id=mem,size=512M,share=on -m 512M -smp 1",
            "-serial file:/a/serial.log -serial file:/a/agent.log",
            "-kernel /img/bzImage -append console=ttyS0 panic=-1 -initrd /img/initrd.gz",
            "-device virtio-iommu-pci",
            r#"{"driver":"vfio-user-pci","bus":"pcie.0","socket":{"path":"/run/x/aqc100.sock","type":"unix"}}"#,
            "-D /a/trace.log -trace virtio_iommu_map",
        ] {
            assert!(args.contains(part), "{part} in {args}");
        }
        let host = DeviceSpec::vfio("0000:03:00.0".parse().unwrap());
        let args = machine_args(&Machine { device: &host, iommu: false, com2: None, ..machine }).join(" ");
        assert!(
            args.contains("-device vfio-pci,host=0000:03:00.0,bus=pcie.0") && !args.contains("virtio-iommu"),
            "{args}"
        );
        assert!(!args.contains("max-ram-below-4g") && !args.contains("pcie-root-port"), "{args}");
    }

    #[test]
    fn a_thunderbolt_slot_is_an_external_facing_root_port_with_ram_above_4_gib() {
        let mut device = DeviceSpec::vfio_user(PathBuf::from("/run/x/aqc100.sock"));
        device.slot = Slot::Thunderbolt;
        let machine = Machine {
            kernel: Path::new("/img/bzImage"),
            initrd: None,
            cmdline: "console=ttyS0",
            memory_mib: 512,
            vcpus: 1,
            accel: Accel::Tcg,
            iommu: true,
            device: &device,
            ssdt: Some(Path::new("/a/thunderbolt.aml")),
            com1: Path::new("/a/serial.log"),
            com2: None,
            trace: Path::new("/a/trace.log"),
        };
        let args = machine_args(&machine).join(" ");
        for part in [
            "-machine q35,memory-backend=mem,max-ram-below-4g=510M",
            "-device pcie-root-port,id=thunderbolt0,chassis=1,slot=1,bus=pcie.0,addr=0x10",
            "-acpitable file=/a/thunderbolt.aml",
            r#"{"driver":"vfio-user-pci","bus":"thunderbolt0","socket""#,
        ] {
            assert!(args.contains(part), "{part} in {args}");
        }
        let host = DeviceSpec { slot: Slot::Thunderbolt, ..DeviceSpec::vfio("0000:03:00.0".parse().unwrap()) };
        let args = machine_args(&Machine { device: &host, ..machine }).join(" ");
        assert!(args.contains("-device vfio-pci,host=0000:03:00.0,bus=thunderbolt0"), "{args}");
    }

    #[test]
    fn a_missing_chroot_says_how_to_make_one() {
        let dir = tempfile::tempdir().unwrap();
        let error = Qemu::find(dir.path()).unwrap_err().to_string();
        assert!(error.contains("driverlab engine setup qemu"), "{error}");
    }
}

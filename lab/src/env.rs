//! What the lab works with, found once by the CLI or the daemon and passed down to every run:
//! the binary that serves device models, the image store, the engines that run VMs, and what
//! this host can run. Nothing below a [`LabEnv`] looks up a default folder or probes the host.

use std::path::Path;

use guest_images::store::ImageStore;
use vm_spec::host::Virtualization;

use crate::matrix::EngineKind;
use engines::Engine;
use engines::Programs;
use engines::driverlab::DriverlabEngine;
use engines::qemu::Qemu;
use engines::qemu::QemuEngine;

/// What decides whether a cell can run on this host.
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// What /dev/kvm offers.
    pub virt: Virtualization,
    /// Whether the host has kernel VFIO.
    pub vfio: bool,
    /// Whether the lab may make network namespaces (a model's iperf3 peer).
    pub root: bool,
    /// Whether the SSH client runs (a host device's peer).
    pub ssh: bool,
    /// Whether this host's own CPU is emulated by QEMU's TCG (the nested lab box).
    pub emulated_by_tcg: bool,
}

impl HostFacts {
    /// This host's facts.
    pub fn detect() -> HostFacts {
        HostFacts {
            virt: vm_spec::host::virtualization(),
            vfio: Path::new("/dev/vfio/vfio").exists(),
            root: engines::peer::can_create(),
            ssh: ssh_found(),
            emulated_by_tcg: vm_spec::host::emulated_by_tcg(),
        }
    }
}

/// Whether the SSH client runs.
fn ssh_found() -> bool {
    std::process::Command::new(engines::peer::ssh_program())
        .arg("-V")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

/// The lab's surroundings.
pub struct LabEnv {
    /// What runs VMs and device models.
    pub programs: Programs,
    /// Where images are kept and recipes built.
    pub images: ImageStore,
    /// What this host can run.
    pub host: HostFacts,
    driverlab_engine: Box<dyn Engine>,
    /// QEMU's chroot, or why there is none.
    qemu: Result<Qemu, String>,
    /// The QEMU engine, or why there is none.
    qemu_engine: Result<Box<dyn Engine>, String>,
}

impl LabEnv {
    /// The lab of this host: `programs` run VMs and models, QEMU comes from the chroot at
    /// `qemu_root` (when it is set up there).
    pub fn detect(programs: Programs, images: ImageStore, qemu_root: &Path) -> LabEnv {
        let qemu = Qemu::find(qemu_root).map_err(|e| e.to_string());
        let qemu_engine = qemu.clone().map(|qemu| Box::new(QemuEngine::new(qemu)) as Box<dyn Engine>);
        LabEnv {
            driverlab_engine: Box::new(DriverlabEngine::new(programs.vmm.clone())),
            programs,
            images,
            host: HostFacts::detect(),
            qemu,
            qemu_engine,
        }
    }

    /// A lab with the engines given (tests: an engine that boots nothing).
    pub fn with_engines(
        programs: Programs,
        images: ImageStore,
        host: HostFacts,
        driverlab_engine: Box<dyn Engine>,
        qemu_engine: Result<Box<dyn Engine>, String>,
    ) -> LabEnv {
        let qemu = Err("this lab has no QEMU chroot".into());
        LabEnv { programs, images, host, driverlab_engine, qemu, qemu_engine }
    }

    /// QEMU's chroot (what the QEMU engine runs, and the boot benchmark's reference), or why
    /// there is none.
    pub fn qemu(&self) -> Result<&Qemu, &str> {
        self.qemu.as_ref().map_err(String::as_str)
    }

    /// The engine of `kind`, or why this host has none.
    pub fn engine(&self, kind: EngineKind) -> Result<&dyn Engine, &str> {
        match kind {
            EngineKind::Driverlab => Ok(self.driverlab_engine.as_ref()),
            EngineKind::Qemu => self.qemu_engine.as_deref().map_err(String::as_str),
        }
    }
}

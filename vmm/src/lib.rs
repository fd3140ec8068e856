//! driverlab's VMM: boots one kernel in one KVM micro-VM and runs it to its end.
//!
//! The flow follows Firecracker's builder: the [`vm_spec::VmSpec`] is checked ([`config`]), the
//! control socket starts answering ([`control`]), guest memory is created ([`memory`]), the kernel
//! and its boot data are loaded ([`boot`]), KVM objects and devices are created ([`vm`],
//! [`platform`]), vCPU threads run the guest ([`vcpu`]) under seccomp ([`seccomp`]), and the run
//! ends with a [`vm_spec::ExitSummary`] whose exit code says how the guest stopped ([`exit`]).

pub mod acpi;
pub mod boot;
pub mod cli;
pub mod config;
pub mod control;
pub mod exit;
pub mod hotplug;
pub mod interrupts;
pub mod layout;
pub mod memory;
pub mod memory_slots;
pub mod opening;
pub mod pause;
pub mod platform;
pub mod seccomp;
pub mod snapshot;
pub mod vcpu;
pub mod vm;
pub mod x86;

use std::path::PathBuf;

pub use config::ConfigError;
pub use exit::StopCause;
pub use vm::run;
use vm_spec::ErrorKind;

/// What a run needs besides its spec.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The image that [`vm_spec::Kernel::Probe`] boots.
    pub probe_image: &'static [u8],
    /// Serve the control socket at this path.
    pub control_socket: Option<PathBuf>,
    /// Make this directory for a snapshot, which the control socket's `vm.snapshot` writes.
    pub snapshot_to: Option<PathBuf>,
    /// Start from this snapshot instead of booting the spec's kernel.
    pub restore: Option<Restore>,
}

/// A snapshot to start a VM from, read and checked (`vm run --restore DIR`).
#[derive(Debug, Clone)]
pub struct Restore {
    /// Its directory.
    pub dir: PathBuf,
    /// Its state.
    pub snapshot: std::sync::Arc<snapshot::VmSnapshot>,
    /// How long reading and checking the state took.
    pub read: std::time::Duration,
    /// Text the restored guest reads on COM2, queued as its vCPUs start (empty: none).
    pub com2_input: Vec<u8>,
    /// Bytes written at the start of the snapshot's payload window before the vCPUs start
    /// (empty: none; at most the window's size).
    pub payload: Vec<u8>,
}

/// Why a passed-through device could not be set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceFailure {
    /// The device named does not exist or is not a device (the user's to fix).
    NotFound,
    /// A vfio-user peer refused, hung up or broke the protocol.
    Peer,
    /// The host's VFIO set-up failed.
    Host,
}

/// Errors that stop a VM from being built or run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec is invalid.
    #[error(transparent)]
    Spec(#[from] vm_spec::SpecError),
    /// The spec does not fit this host, or a file it names cannot be used.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The kernel, initrd or command line cannot be booted.
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    /// Guest memory could not be created.
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    /// Writing guest memory failed.
    #[error("guest memory: {0}")]
    GuestMemory(String),
    /// /dev/kvm cannot be used.
    #[error("cannot open /dev/kvm: {0} (run `driverlab doctor` to check the host)")]
    KvmUnavailable(#[source] kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("{what}: {source}")]
    Kvm {
        /// The ioctl.
        what: &'static str,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A vCPU could not be set up.
    #[error(transparent)]
    Vcpu(#[from] vcpu::VcpuError),
    /// Devices could not be placed on a bus.
    #[error("device layout: {0}")]
    Bus(#[from] vm_device::bus::BusError),
    /// Interrupt routing could not be set up.
    #[error(transparent)]
    Interrupt(#[from] vm_device::interrupt::InterruptError),
    /// The seccomp filters could not be built.
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    /// A device to pass through cannot be used.
    #[error("device {device}: {reason}")]
    Device {
        /// The device as given (`vfio=...`, `vfio-user=...`).
        device: String,
        /// Whose failure it is.
        failure: DeviceFailure,
        /// What went wrong, in words.
        reason: String,
    },
    /// The control socket cannot be served.
    #[error(transparent)]
    Control(#[from] control::ControlError),
    /// The platform (PCI, ACPI, interrupt routing) could not be assembled.
    #[error("platform: {0}")]
    Platform(String),
    /// The jail's settings (from the environment) are invalid.
    #[error("jail: {0}")]
    Jail(#[from] jail::JailError),
    /// A snapshot cannot be taken or restored.
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    /// Another system call failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// What kind of failure this is, for the error line; its exit code follows from it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Spec(_) | Error::Config(_) | Error::Jail(_) => ErrorKind::Spec,
            Error::Boot(e) if e.is_bad_input() => ErrorKind::Image,
            Error::Device { failure: DeviceFailure::NotFound, .. } => ErrorKind::Device,
            Error::Device { failure: DeviceFailure::Peer, .. } => ErrorKind::Peer,
            Error::KvmUnavailable(_) | Error::Kvm { .. } | Error::Vcpu(_) => ErrorKind::Kvm,
            Error::Control(e) if e.is_bad_input() => ErrorKind::Spec,
            Error::Snapshot(e) => e.kind(),
            _ => ErrorKind::Host,
        }
    }

    /// The process exit code: [`vm_spec::exit::code::BAD_INPUT`] for the user's mistakes,
    /// [`vm_spec::exit::code::VMM_ERROR`] otherwise.
    pub fn exit_code(&self) -> i32 {
        self.kind().exit_code()
    }

    /// The error line for this error.
    pub fn to_line(&self) -> vm_spec::ErrorLine {
        vm_spec::ErrorLine::new(self.kind(), message_chain(self))
    }
}

/// The error and its sources as one message, each source once (many errors already print theirs).
pub fn message_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !message.contains(&part) {
            message.push_str(": ");
            message.push_str(&part);
        }
        source = e.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_tell_the_users_mistakes_from_host_and_peer_failures() {
        let device = |failure| Error::Device { device: "vfio-user=/x".into(), failure, reason: "r".into() };
        assert_eq!(device(DeviceFailure::NotFound).exit_code(), 2);
        assert_eq!(device(DeviceFailure::Peer).kind(), ErrorKind::Peer);
        assert_eq!(device(DeviceFailure::Peer).exit_code(), 1);
        assert_eq!(Error::KvmUnavailable(kvm_ioctls::Error::new(libc::ENOENT)).exit_code(), 1);
        assert_eq!(Error::Spec(vm_spec::SpecError::Vcpus(0)).exit_code(), 2);
        let line = device(DeviceFailure::Peer).to_line();
        assert_eq!((line.kind, line.exit_code, line.message.as_str()), (ErrorKind::Peer, 1, "device vfio-user=/x: r"));
    }

    #[test]
    fn the_chain_names_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let wrapped = vm_device::memory_slots::SlotError::Hypervisor { what: "slot 3".into(), source: io };
        assert_eq!(message_chain(&wrapped), "slot 3: gone");
        let kvm = Error::KvmUnavailable(kvm_ioctls::Error::new(libc::ENOENT));
        assert!(message_chain(&kvm).starts_with("cannot open /dev/kvm: "), "{}", message_chain(&kvm));
    }
}

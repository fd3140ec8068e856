//! driverlab's VMM: boots one kernel in one KVM micro-VM and runs it to its end.
//!
//! The flow follows Firecracker's builder: [`VmConfig`] is checked, guest memory is created
//! ([`memory`]), the kernel and its boot data are loaded ([`boot`]), KVM objects and devices are
//! created ([`vm`]), vCPU threads run the guest ([`vcpu`]) under seccomp ([`seccomp`]), and the run
//! ends with an [`ExitSummary`] whose exit code says how the guest stopped ([`exit`]).

pub mod acpi;
pub mod boot;
pub mod config;
pub mod exit;
pub mod host;
pub mod interrupts;
pub mod layout;
pub mod memory;
pub mod memory_slots;
pub mod platform;
pub mod seccomp;
pub mod vcpu;
pub mod vm;
pub mod x86;

pub use boot::EntryProtocol;
pub use config::{ConfigError, DeviceSpec, KernelSource, SerialOutput, VmConfig};
pub use exit::{ExitReason, ExitSummary};
pub use vm::run;

/// Errors that stop a VM from being built or run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid options.
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
    KvmUnavailable(String),
    /// A KVM ioctl failed.
    #[error("{what}: {source}")]
    Kvm {
        /// The ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// A vCPU could not be set up.
    #[error(transparent)]
    Vcpu(#[from] vcpu::VcpuError),
    /// Devices could not be placed on a bus.
    #[error("device layout: {0}")]
    Bus(#[from] devices::bus::BusError),
    /// The seccomp filters could not be built.
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    /// A device to pass through cannot be used.
    #[error("device {device}: {reason}")]
    Device {
        /// The device as given (`vfio=...`, `vfio-user=...`).
        device: String,
        /// Why.
        reason: String,
    },
    /// The platform (PCI, ACPI, interrupt routing) could not be assembled.
    #[error("platform: {0}")]
    Platform(String),
    /// Another system call failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The process exit code: [`exit::code::BAD_INPUT`] for the user's mistakes,
    /// [`exit::code::VMM_ERROR`] otherwise.
    pub fn exit_code(&self) -> i32 {
        let bad_input = match self {
            Error::Config(_) | Error::Device { .. } => true,
            Error::Boot(e) => e.is_bad_input(),
            _ => false,
        };
        if bad_input { exit::code::BAD_INPUT } else { exit::code::VMM_ERROR }
    }
}

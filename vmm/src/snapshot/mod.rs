//! Snapshots of a VM (issue 34, in progress): the checked file a snapshot is written to
//! ([`file`]), the state of a vCPU as KVM holds it ([`vcpu_state`]) and the VM's own, its
//! irqchips and clock ([`vm_state`]). What is not here yet: the emulated devices, guest RAM
//! (as a file, and how a restored VM shares it with a device model), the control socket's
//! `snapshot` and `vm run --restore`.

pub mod file;
pub mod vcpu_state;
pub mod vm_state;

pub use file::{SnapshotFileError, read_snapshot, write_snapshot};
pub use vcpu_state::{KvmStateError, VcpuState};
pub use vm_state::VmState;

//! Snapshots of a VM (issue 34, in progress): the checked file a snapshot is written to
//! ([`file`]) and the state of a vCPU as KVM holds it ([`vcpu_state`]). What is not here yet:
//! the in-kernel irqchip, the KVM clock, the emulated devices, guest RAM as a file mapped
//! `MAP_PRIVATE` on restore, the control socket's `snapshot` and `vm run --restore`.

pub mod file;
pub mod vcpu_state;

pub use file::{SnapshotFileError, read_snapshot, write_snapshot};
pub use vcpu_state::{VcpuState, VcpuStateError};

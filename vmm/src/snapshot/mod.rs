//! Snapshots of a VM (issue 34): the checked file a snapshot's state is written to
//! ([`file`](mod@file)), the state of a vCPU as KVM holds it ([`vcpu_state`]) and the VM's own,
//! its irqchips and clock ([`vm_state`]), guest RAM as a sparse file ([`ram`]), and the whole
//! VM's snapshot directory ([`vm_snapshot`]): taken through the control socket's `vm.snapshot`
//! into `vm run --snapshot-to DIR`, started from with `vm run --restore DIR`.

pub mod file;
pub mod ram;
pub mod tsc;
pub mod vcpu_state;
pub mod vm_snapshot;
pub mod vm_state;

pub use file::{SnapshotFileError, read_snapshot, write_snapshot};
pub use ram::{RamError, RamImage};
pub use vcpu_state::{KvmStateError, VcpuState};
pub use vm_snapshot::{PlatformState, SnapshotError, SnapshotTarget, VcpuSaves, VmSnapshot};
pub use vm_state::VmState;

//! Snapshots of a VM (issue 34, in progress): the checked file a snapshot is written to
//! ([`file`](mod@file)), the state of a vCPU as KVM holds it ([`vcpu_state`]) and the VM's own, its
//! irqchips and clock ([`vm_state`]), and guest RAM as a sparse file ([`ram`]). What is not
//! here yet: the emulated devices' state (of which the serial ports' can be taken and given,
//! `devices::serial::SerialPortState`), pausing a running VM to take one, the control socket's
//! `snapshot` and `vm run --restore`.

pub mod file;
pub mod ram;
pub mod vcpu_state;
pub mod vm_state;

pub use file::{SnapshotFileError, read_snapshot, write_snapshot};
pub use ram::{RamError, RamImage};
pub use vcpu_state::{KvmStateError, VcpuState};
pub use vm_state::VmState;

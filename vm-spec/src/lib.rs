//! The contract of one `driverlab vm run` process, shared by the VMM and by everything that
//! starts one (the lab, the HTTP API, scripts), without linking KVM or VFIO code. Firecracker
//! shares its `vmm_config` types between its API and `--config-file` the same way.
//!
//! - [`spec`]: [`VmSpec`], what to boot and with what; `driverlab vm run --config FILE` reads it
//!   as JSON, and the flags build the same value.
//! - [`exit`]: how a run ends: the exit codes, the exit line (`{"vmm":"exit",...}`) and the error
//!   line (`{"vmm":"error",...}`) on stderr.
//! - [`device`]: a device to pass through and its slot (root bus or Thunderbolt).
//! - [`counters`]: what the virtio-iommu and driverlab's device models count, in the exit line
//!   and on the control socket; the layout of a model's counters region.
//! - [`control`]: the control socket's routes and messages (`vm.info`, `vm.counters`,
//!   `vm.shutdown`).
//! - [`confinement`]: how the process is jailed, step by step.
//! - [`bus`]: what a NIC model puts on its PCIe link, and the cost model over it.
//! - [`bdf`]: PCI addresses.
//! - [`nic`]: the NICs driverlab models and drives ([`NicKind`]).
//! - [`host`]: what this host's `/dev/kvm` can run (hardware virtualization, PVM), so that a
//!   parent refuses what cannot boot before it starts a VMM.
//!
//! `docs/vmm.md` documents all of it as the stable interface it is.

pub mod bdf;
pub mod confinement;
pub mod control;
pub mod counters;
pub mod device;
pub mod exit;
pub mod host;
pub mod model_control;
pub mod nic;
pub mod pcie_link;
pub mod spec;

/// The format of the VMM's snapshots: the file's layout and the state's types. Raised with any
/// change to either, so that a snapshot of another format is refused (and the lab takes its
/// cells' snapshots again) between builds of one version too.
pub const SNAPSHOT_FORMAT: u32 = 4;

pub use bdf::Bdf;
pub use exit::{
    AddressCount, DeviceCounters, DeviceSummary, ErrorKind, ErrorLine, ExitCounts, ExitReason, ExitSummary, Restored,
    RestoredRam, SnapshotWritten,
};
pub use nic::NicKind;
pub use spec::{
    DeviceBackend, DeviceSpec, Entry, IommuSpec, Kernel, SerialOutput, SerialSpec, Slot, SpecError, VmLimits, VmSpec,
    payload_window_fits,
};

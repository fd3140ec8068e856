//! The control socket of one VMM process (`driverlab vm run --control PATH`): HTTP/1.1 with JSON
//! bodies on a Unix socket, with Cloud Hypervisor's route names.
//!
//! | request                     | answer                                                    |
//! |-----------------------------|-----------------------------------------------------------|
//! | `GET /api/v1/vm.info`       | 200 [`VmInfo`]                                            |
//! | `GET /api/v1/vm.counters`   | 200 [`LiveCounters`]: the exit line's counter keys, live  |
//! | `PUT /api/v1/vm.shutdown`   | 202 [`ShutdownAccepted`]; optional body [`ShutdownRequest`] |
//! | `PUT /api/v1/vm.bounce-pool` | 200 [`BouncePool`]; body [`BouncePool`]: where the guest's swiotlb is |
//! | `PUT /api/v1/vm.plug`       | 200 [`SlotInfo`]; body [`PlugRequest`]: a device into its empty hot-plug slot |
//! | `PUT /api/v1/vm.unplug`     | 200 (surprise) or 202 (orderly: the guest lets go, then the slot empties) [`SlotInfo`]; body [`UnplugRequest`] |
//! | `PUT /api/v1/vm.snapshot`   | body [`SnapshotRequest`] (optional): `then: stop`: 202 [`SnapshotAccepted`], the vCPUs stop, the snapshot is written to the run's `--snapshot-to` directory, the VM ends (reason `snapshot`); `then: resume`: 200 [`SnapshotAccepted`] once the snapshot is written, the VM running on (500 when it could not be written); 409 when this VM cannot be snapshotted or wrote its snapshot already |
//!
//! Errors are JSON [`ControlError`] bodies with 400, 404, 405, 409 or 413. One request per connection
//! is answered (`Connection: close`).

use serde::{Deserialize, Serialize};

use crate::counters::IommuCounts;
use crate::exit::{DeviceCounters, ExitCounts};
use crate::spec::VmSpec;

/// `GET`: the VM's state and spec.
pub const VM_INFO: &str = "/api/v1/vm.info";
/// `GET`: live counters.
pub const VM_COUNTERS: &str = "/api/v1/vm.counters";
/// `PUT`: power button, then a forced stop.
pub const VM_SHUTDOWN: &str = "/api/v1/vm.shutdown";
/// `PUT`: where the guest's swiotlb bounce pool is, so that the virtio-iommu counts its maps.
pub const VM_BOUNCE_POOL: &str = "/api/v1/vm.bounce-pool";
/// `PUT`: a device into its empty hot-plug slot.
pub const VM_PLUG: &str = "/api/v1/vm.plug";
/// `PUT`: a device out of its hot-plug slot, orderly or by surprise.
pub const VM_UNPLUG: &str = "/api/v1/vm.unplug";
/// `PUT`: stop the vCPUs, write a snapshot, end the VM.
pub const VM_SNAPSHOT: &str = "/api/v1/vm.snapshot";
/// Largest request the control socket reads, headers and body.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// Seconds the guest gets to power off after the power button before the VMM stops it.
pub const DEFAULT_SHUTDOWN_GRACE_S: f64 = 5.0;

/// Where the VM is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// Memory, the kernel and devices are being set up; no vCPU runs yet.
    Booting,
    /// The vCPUs run the guest.
    Running,
    /// A stop was requested or the guest stopped; the VMM is tearing down.
    Stopping,
}

/// `GET /api/v1/vm.info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmInfo {
    /// The state.
    pub state: VmState,
    /// The VMM's process ID.
    pub pid: u32,
    /// Milliseconds since the VMM started.
    pub uptime_ms: f64,
    /// The boot protocol used, once the kernel is loaded ("pvh", "linux64").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// The spec the VM runs.
    pub config: VmSpec,
    /// How the VMM process is confined, once it jailed itself (none while it sets up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confinement: Option<crate::confinement::Confinement>,
    /// The hot-plug slots and what is in them, once the devices are set up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<SlotInfo>,
}

/// What a hot-plug slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// Nothing: the device waits for `vm.plug`.
    Empty,
    /// The device, present to the guest.
    Occupied,
    /// The device, its attention button pressed: the guest is letting it go (Linux's pciehp
    /// waits 5 s, unbinds the driver and turns the slot's power off; then the slot is empty).
    Releasing,
}

/// A hot-plug slot: `vm.info`'s `slots`, and the answer of `vm.plug` and `vm.unplug`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotInfo {
    /// The device that belongs in it, as the spec names it (`vfio-user=...` or `vfio=...`).
    pub device: String,
    /// The root port whose slot it is, on the guest's bus 0 (`00:02.0`).
    pub port: String,
    /// Where the device is in the guest when plugged (`01:00.0`).
    pub bdf: String,
    /// What the slot holds now.
    pub state: SlotState,
}

/// The body of `PUT /api/v1/vm.plug`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlugRequest {
    /// The device, as the spec names it without its options (`vfio-user=/path`, `vfio=BDF`).
    pub device: String,
}

/// The body of `PUT /api/v1/vm.unplug`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnplugRequest {
    /// The device, as for `vm.plug`.
    pub device: String,
    /// Pull it without notice, as a cable pulled (default: press the attention button and let the
    /// guest release it first).
    #[serde(default)]
    pub surprise: bool,
}

/// `GET /api/v1/vm.counters`: the counters of the exit line, as they are now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveCounters {
    /// The state.
    pub state: VmState,
    /// Milliseconds since the vCPUs started (0 while booting).
    pub run_ms: f64,
    /// Bytes the guest wrote to COM1.
    pub serial_bytes: u64,
    /// Bytes the guest wrote to COM2, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub com2_bytes: Option<u64>,
    /// Exits handled by the VMM.
    pub exits: ExitCounts,
    /// The virtio-iommu's counters, with an IOMMU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viommu: Option<IommuCounts>,
    /// Passed-through devices, with what driverlab models counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceCounters>,
}

/// The optional body of `PUT /api/v1/vm.shutdown`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ShutdownRequest {
    /// Seconds the guest gets to power off after the power button, before the VMM stops it
    /// ([`DEFAULT_SHUTDOWN_GRACE_S`]); 0 stops it at once.
    #[serde(default)]
    pub grace_s: Option<f64>,
}

/// The answer to `PUT /api/v1/vm.shutdown`: the VM will stop; the process then exits with its exit
/// line (`poweroff` if the guest obeyed the power button, `shutdown` if it was stopped).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ShutdownAccepted {
    /// The state now (`stopping`, or `booting` if the VM had not started).
    pub state: VmState,
    /// The grace period in effect.
    pub grace_s: f64,
}

/// `PUT /api/v1/vm.snapshot`'s body, which may be left out (`{"then":"stop"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// What the VM does once its snapshot is written.
    #[serde(default)]
    pub then: AfterSnapshot,
}

/// What a VM does once its snapshot is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AfterSnapshot {
    /// It ends, its exit line's reason `snapshot`.
    #[default]
    Stop,
    /// Its vCPUs go on from where they were stopped (the snapshot is written while they wait).
    Resume,
}

/// The answer to `PUT /api/v1/vm.snapshot`. With `then: stop` (202): the vCPUs are being
/// stopped; the process then writes the snapshot and exits with its exit line (reason `snapshot`
/// and the exit line's `snapshot` once it is written, or `vmm-error` saying why it could not be).
/// With `then: resume` (200, once written): the snapshot is written and the VM runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotAccepted {
    /// The state now (`stopping`, or `running` after a resume).
    pub state: VmState,
    /// The directory the snapshot goes to, as given to `--snapshot-to`.
    pub dir: String,
    /// With `then: resume`: what was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written: Option<crate::SnapshotWritten>,
}

/// `PUT /api/v1/vm.bounce-pool`: the guest's swiotlb bounce pool, inclusive guest-physical
/// bounds as Linux prints them ("software IO TLB: mapped [mem START-END]"). From then on the
/// virtio-iommu counts the maps of memory in it (`bounced_maps_writable`,
/// `bounced_maps_read_only`). Needs a virtio-iommu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BouncePool {
    /// First byte.
    pub start: u64,
    /// Last byte.
    pub end: u64,
}

impl BouncePool {
    /// Whether guest-physical address `gpa` lies in the pool.
    pub fn contains(&self, gpa: u64) -> bool {
        (self.start..=self.end).contains(&gpa)
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlError {
    /// What was wrong with the request.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Kernel;

    #[test]
    fn messages_have_the_documented_shape() {
        let info = VmInfo {
            state: VmState::Running,
            pid: 7,
            uptime_ms: 1.5,
            entry: Some("pvh".into()),
            config: VmSpec::new(Kernel::Probe),
            confinement: None,
            slots: Vec::new(),
        };
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["state"], "running");
        assert_eq!(json["config"]["kernel"], "probe");
        let request: ShutdownRequest = serde_json::from_str(r#"{"grace_s":0}"#).unwrap();
        assert_eq!(request.grace_s, Some(0.0));
        assert!(serde_json::from_str::<ShutdownRequest>(r#"{"grace":1}"#).is_err());
    }
}

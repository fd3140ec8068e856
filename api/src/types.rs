//! Request and response bodies, with their OpenAPI schemas. Records and reports are the lab's
//! own JSON (`docs/lab.md`); VM counters and exit lines are the VMM's (`docs/vmm.md`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code: `bad_request`, `unauthorized`, `forbidden`,
    /// `not_found`, `method_not_allowed`, `timeout`, `conflict`, `too_large`, `head_too_large`,
    /// `unsupported_media_type`, `not_acceptable`, `unprocessable`, `busy`, `insufficient_storage`,
    /// `internal`.
    pub code: String,
    /// What went wrong, and what to do.
    pub message: String,
}

/// `GET /v1/version`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Version {
    /// "driverlab".
    pub name: String,
    /// The version.
    pub version: String,
}

/// `GET /v1/host`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostInfo {
    /// What /dev/kvm offers here.
    pub virtualization: String,
    /// Whether unmodified Linux guests boot under driverlab's VMM here.
    pub boots_linux: bool,
}

/// Who holds a device's lease.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Lease {
    /// The run.
    pub run: String,
    /// The lab process.
    pub pid: u32,
    /// Its host.
    pub host: String,
}

/// Why a device is quarantined.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Quarantine {
    /// What failed.
    pub reason: String,
    /// Since when (RFC 3339).
    pub since: String,
}

/// What a registered device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A driverlab model, a fresh process per VM.
    Model,
    /// A host PCI device.
    Host,
}

/// A registered device and its state.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeviceState {
    /// The definition: the fields of a matrix's `[[device]]` (`docs/lab.md`).
    pub device: lab::matrix::Device,
    /// A model or a host device.
    pub kind: DeviceKind,
    /// When it was registered (RFC 3339).
    pub registered_at: String,
    /// The lease on it, if a run holds it (host devices).
    pub lease: Option<Lease>,
    /// Its quarantine, if it is in one (host devices).
    pub quarantine: Option<Quarantine>,
}

/// `POST /v1/devices/{name}/health`: the probe's NIC checks on the device.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HealthResult {
    /// Whether every check passed.
    pub ok: bool,
    /// The one-line verdict, as `driverlab probe` prints it.
    pub verdict: String,
    /// What the check found: firmware, MAC, link, frames, MSI-X, failures.
    #[schema(value_type = Object)]
    pub report: serde_json::Value,
}

/// `POST /v1/devices/{name}/quarantine`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuarantineRequest {
    /// What went wrong, in words.
    pub reason: String,
}

/// An image in the store.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ImageSummary {
    /// Its ID, which matrices and VM requests name.
    pub id: String,
    /// `kernel`, `module` or `initramfs`.
    #[schema(value_type = String)]
    pub kind: guest_images::store::ImageKind,
    /// Its manifest (`docs/images.md`).
    #[schema(value_type = Object)]
    pub manifest: serde_json::Value,
}

/// `POST /v1/bench/boot`: a kernel of the image store booted under each engine, interleaved
/// (`driverlab bench boot --linux`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchBoot {
    /// The kernel image (`kernel-…`): its ELF vmlinux boots under every engine, with an
    /// initramfs whose `/init` prints a line and powers off.
    pub kernel: String,
    /// Boots per engine, 1 to 30.
    #[serde(default = "default_bench_runs")]
    #[schema(default = 10, minimum = 1, maximum = 30)]
    pub runs: u32,
    /// QEMU `-M microvm` with KVM beside driverlab (the daemon's QEMU engine).
    #[serde(default = "default_true")]
    #[schema(default = true)]
    pub qemu: bool,
    /// QEMU `-M q35` with KVM as well.
    #[serde(default)]
    pub q35: bool,
}

fn default_bench_runs() -> u32 {
    10
}

fn default_true() -> bool {
    true
}

/// What `POST /v1/bench/boot` measured.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BenchBootResult {
    /// The measurements: each engine's times from spawning it to the init's line
    /// (`to_init_ms`) and to its exit (`to_exit_ms`), one per boot, and driverlab's exit census
    /// (docs/benchmarks.md).
    #[schema(value_type = Object)]
    pub bench: serde_json::Value,
    /// The table `driverlab bench boot --linux` prints for them.
    pub table: String,
}

/// `POST /v1/images/kernel`: Debian's kernel package, fetched with `apt-get download`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildKernel {
    /// The package, e.g. `linux-image-6.12.57+deb13-amd64-unsigned` (default: the newest 6.12).
    #[serde(default)]
    pub package: Option<String>,
}

/// `POST /v1/images/module`: a driver variant built from patches.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildModule {
    /// The kernel image to build against.
    pub kernel: String,
    /// The driver's folder in the kernel tree (default `drivers/net/ethernet/aquantia/atlantic`).
    #[serde(default)]
    pub driver: Option<String>,
    /// The patches, in order, each the text of a `git format-patch` file, a mail or an mbox.
    #[serde(default)]
    pub patches: Vec<String>,
    /// Build only these modules of the folder.
    #[serde(default)]
    pub only: Vec<String>,
}

/// `POST /v1/images/initramfs`: an initramfs with the guest agent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildInitramfs {
    /// The kernel image.
    pub kernel: String,
    /// Driver variants: module image IDs.
    #[serde(default)]
    pub modules: Vec<String>,
    /// Stock drivers of the kernel to include (default `atlantic` without variants).
    #[serde(default)]
    pub drivers: Vec<String>,
    /// Programs the workloads need beyond iperf3 and ethtool: `sockperf` (for `latency`),
    /// `xdp-bench` (for `xdp`), `kselftest` (the NIC selftests with Python, for `kselftest`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}

/// `POST /v1/runs` and `POST /v1/vms`: what was made.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Created {
    /// Its ID.
    pub id: String,
}

pub use lab::run::{RunPhase, RunStatus};

/// One server-sent event of `GET /v1/runs/{id}/events` (its `data`, as JSON).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum RunEvent {
    /// The run's state: the first event, and the last when the run ends.
    State {
        /// The run's status.
        status: RunStatus,
    },
    /// A repetition was recorded.
    Recorded {
        /// The cell.
        cell: String,
        /// The cell's variant and parameters, as reports label it.
        label: String,
        /// The repetition, from 0.
        repetition: u32,
        /// Its status.
        status: lab::record::Status,
        /// Why, for anything but PASS.
        reason: String,
        /// Goodput: payload Gbit/s as the workload measured it.
        gbit_s: Option<f64>,
        /// IOMMU maps per packet: RX buffer maps per packet received where the record splits
        /// maps by direction (Linux guests), else all of the workload's maps per packet.
        maps_per_packet: Option<f64>,
        /// Results so far.
        done: usize,
        /// Results in all.
        total: usize,
    },
    /// A line worth showing: a health check, a quarantine, waiting for a lease.
    Note {
        /// The line.
        line: String,
    },
    /// A bisection judged a prefix of its series (`POST /v1/bisects`).
    Step {
        /// The prefix: its place in the series, its last patch's subject, author, Message-ID.
        at: lab::matrix::SeriesStep,
        /// The step: `prefix`, `verdict` (`same`, `changed`, `broken` with `why`,
        /// `undecided`), `figures` and the `base`'s (n, mean, stddev, min, max, median,
        /// ci95), the `change` against the base (`change_pct`, `p_value`, `verdict`), `runs`.
        #[schema(value_type = Object)]
        step: lab::bisect::Step,
    },
}

/// `GET /v1/bisects/{id}`: a bisection's run and what it decided.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BisectStatus {
    /// Its run.
    pub run: RunStatus,
    /// What it decided, as `lab bisect` keeps it (`bisect.json`): `metric`, `patches`,
    /// `steps` and `outcome` (`first-change` with `patch`, `before`, `after`, `broken`;
    /// `no-change`; `undecided` with `from`, `to`; `base-broken` with `why`); `outcome` is
    /// null until it ends.
    #[schema(value_type = Object)]
    pub bisection: serde_json::Value,
}

/// `POST /v1/vms`: one VM. Kernels and initrds are images; devices are registered devices.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VmRequest {
    /// `probe`, or a kernel image's ID.
    pub kernel: String,
    /// An initramfs image's ID.
    #[serde(default)]
    pub initrd: Option<String>,
    /// The kernel command line.
    #[serde(default)]
    pub cmdline: String,
    /// Guest memory in MiB (default 256).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// vCPUs (default 1).
    #[serde(default)]
    pub vcpus: Option<u32>,
    /// A virtio-iommu in front of the devices.
    #[serde(default)]
    pub iommu: bool,
    /// Registered devices to pass through, by name (models get a fresh process).
    #[serde(default)]
    pub devices: Vec<String>,
    /// Seconds before the VMM stops the VM (default 60, at most a day).
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

/// Where a VM the daemon started is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// Its device and VMM are starting.
    Starting,
    /// The guest runs.
    Running,
    /// The VMM exited.
    Exited,
    /// The VMM could not start.
    Failed,
}

/// A VM the daemon started.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VmStatus {
    /// Its ID.
    pub id: String,
    /// Where it is.
    pub state: VmState,
    /// The VMM process's exit code, once it exited.
    pub exit_code: Option<i32>,
    /// The VMM's exit line, once the VM ran (`docs/vmm.md`).
    #[schema(value_type = Option<Object>)]
    pub exit: Option<serde_json::Value>,
    /// The VMM's error line, when it could not run the VM.
    #[schema(value_type = Option<Object>)]
    pub error: Option<serde_json::Value>,
    /// Bytes the guest wrote to its serial port so far.
    pub serial_bytes: u64,
}

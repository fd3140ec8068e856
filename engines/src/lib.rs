//! The engines that run a VM and watch it, and what runs beside one: this project's VMM
//! (`driverlab vm run`, a process read through its control socket; [`driverlab`]) and QEMU (read
//! through its trace file and the model's control socket; [`qemu`]). Both take a
//! [`BootRequest`] and hand back the same [`Booted`]: how the VM ended, what the virtio-iommu
//! and the device counted, and those counts when the guest agent opened and closed the
//! workload's window ([`window`]). The lab's runner and the health check see only the
//! [`Engine`] trait, so that their phases can be tested with an engine that boots nothing.
//!
//! Beside a VM: its device ([`device`]: a model process, [`model_process`], or a host device),
//! the traffic peer on the device's wire ([`peer`]). What its guest reports: the probe's JSON
//! lines ([`probe_report`]), the guest agent's frames and verdict ([`agent`]), a crash in its
//! console ([`crash`]). The VMM process itself ([`vm_process`], [`vm_control`]), the device
//! health check ([`health`]), and what processes killed with -9 left behind ([`runtime_dirs`]).

pub mod agent;
pub mod crash;
pub mod device;
pub mod driverlab;
pub mod file_watch;
pub mod health;
pub mod host_cpu;
pub mod model_process;
pub mod peer;
pub mod probe_report;
pub mod program;
pub mod qemu;
pub mod runtime_dirs;
pub mod ssh_remote;
pub mod udp_source;
pub mod vm_control;
pub mod vm_process;
pub mod window;

use std::path::{Path, PathBuf};
use std::time::Duration;

use vm_spec::counters::{IommuCounts, ModelCounters};
use vm_spec::{ErrorLine, ExitReason, ExitSummary, VmSpec};

pub use host_cpu::{HostCpu, HostCpuSource};
pub use model_process::{ModelError, ModelProcess};
pub use probe_report::ProbeReport;
pub use program::{Program, Programs};
pub use vm_control::ControlClient;
pub use vm_process::{Launch, RunningVm, VmOutcome, VmProcess};
pub use window::{Snapshot, Window};

/// How often the watchdogs look.
const WATCH_PERIOD: Duration = Duration::from_millis(100);
/// Beyond the spec's own timeout, how long the lab waits before it kills the VMM.
const KILL_GRACE: Duration = Duration::from_secs(30);

/// Where a device model's counters come from when the VMM cannot read them itself (a host
/// device that is a model somewhere else: the nested lab box's cards, read through their peer).
pub type CounterSource = std::sync::Arc<dyn Fn() -> Option<ModelCounters> + Send + Sync>;

/// How a VM's process ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// The VMM could not run the VM (its error line, or QEMU's complaint).
    Refused(String),
    /// The lab killed it past its deadline.
    Killed,
    /// It ended without saying why.
    Unexplained(String),
    /// The VM stopped, for the reason its exit line gives, with its details.
    Stopped {
        /// The exit reason the VMM reported.
        reason: ExitReason,
        /// Details, for errors.
        detail: Option<String>,
    },
}

/// What an engine hands back.
#[derive(Debug, Clone)]
pub struct Booted {
    /// How it ended.
    pub ending: Ending,
    /// The VMM's exit line (this project's VMM).
    pub exit: Option<ExitSummary>,
    /// The VMM's error line (this project's VMM).
    pub error: Option<ErrorLine>,
    /// The virtio-iommu's counts over the whole VM.
    pub iommu: Option<IommuCounts>,
    /// The device model's counts over the whole VM.
    pub device_counters: Option<ModelCounters>,
    /// A device's error, when one reported it.
    pub device_error: Option<String>,
    /// The workload's window.
    pub window: Window,
    /// Set when the watchdog stopped a silent guest: how long it was silent.
    pub silent_for: Option<Duration>,
    /// From spawning the VMM to its control socket answering.
    pub answered_ms: Option<f64>,
    /// From the vCPUs starting (QEMU: from its spawn) to the VM stopping.
    pub run_ms: Option<f64>,
    /// What the VMM wrote on stderr (this project's VMM; QEMU's goes to `qemu.log`).
    pub vmm_stderr: String,
    /// How the device's model process ended, when it died during the repetition.
    pub model_ended: Option<String>,
}

impl Booted {
    /// A VM that ended so before anything of it could be read (and, for engines that boot
    /// nothing, the base of what they hand back).
    pub fn failed(ending: Ending) -> Booted {
        Booted {
            ending,
            exit: None,
            error: None,
            iommu: None,
            device_counters: None,
            device_error: None,
            window: Window::default(),
            silent_for: None,
            answered_ms: None,
            run_ms: None,
            vmm_stderr: String::new(),
            model_ended: None,
        }
    }
}

/// What the watchdogs need besides the VM.
#[derive(Debug, Clone)]
pub struct Watch {
    /// Stop a guest whose serial ports stay silent this long.
    pub silence: Duration,
    /// The guest agent's port (Linux images), read for the window's frames.
    pub agent_log: Option<PathBuf>,
    /// Take the hot-plugged device out of its slot during the workload (the `surprise-unplug`
    /// and `orderly-unplug` checks).
    pub unplug: Option<Unplug>,
}

/// How a hot-plugged device leaves its slot during the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, strum::Display, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum UnplugKind {
    /// Pulled without notice, as a cable pulled (`vm.unplug` with `surprise`).
    Surprise,
    /// Released in order: the slot's attention button pressed, the guest's pciehp unbinds the
    /// driver (after its 5 s grace) and powers the slot off, and only then the device goes.
    Orderly,
}

/// When and how the engine takes the device out of its slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unplug {
    /// How long after the workload's begin.
    pub after: Duration,
    /// How.
    pub kind: UnplugKind,
}

/// What an engine is asked to run.
pub struct BootRequest<'a> {
    /// The VM. COM1 (and COM2, for Linux images) are files.
    pub spec: VmSpec,
    /// How to watch it.
    pub watch: Watch,
    /// The device's model process, when the lab started one for this VM: the engine watches
    /// it and stops it when the VM has ended.
    pub model: Option<ModelProcess>,
    /// Where the model's counters come from when neither the VMM nor the engine can read them
    /// (a nested box's card, through its peer).
    pub counters: Option<CounterSource>,
    /// The repetition's folder, for what the engine keeps (QEMU's log and trace, the probe's ELF).
    pub dir: &'a Path,
    /// The kernel image's bzImage, when the spec's kernel is a kernel image's vmlinux (QEMU
    /// boots the bzImage).
    pub bzimage: Option<&'a Path>,
    /// How QEMU runs guest code (its engine only).
    pub accel: crate::qemu::Accel,
    /// How the guest starts: booted, booted into a snapshot, or restored from one (the
    /// driverlab engine only).
    pub start: Start<'a>,
}

/// How a VM's guest starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Start<'a> {
    /// Its kernel boots.
    #[default]
    Boot,
    /// Its kernel boots up to the guest agent's `ready` frame (the guest up, the NIC's slot
    /// still empty), and the VM stops into a snapshot in `dir` (which must not exist yet).
    Snapshot {
        /// The snapshot's folder.
        dir: &'a Path,
    },
    /// It starts from the snapshot in `dir`; devices whose slots are empty are plugged as soon
    /// as it runs (the guest agent waits for its NIC at the snapshot's point).
    Restore {
        /// The snapshot's folder.
        dir: &'a Path,
        /// What the restored guest reads on COM2 as it starts: the guest agent, waiting at the
        /// snapshot's point, takes its cell's command line from there.
        com2_input: Option<&'a str>,
        /// A file written into the snapshot's payload window before the guest runs (the driver
        /// variant's modules, which the agent unpacks before loading the driver).
        payload: Option<&'a Path>,
    },
}

/// What runs a VM: boots the request's VM and watches it to its end.
pub trait Engine: Send + Sync {
    /// Runs `request`'s VM to its end; whatever happens is in the [`Booted`] it returns.
    fn boot(&self, request: BootRequest<'_>) -> Booted;
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

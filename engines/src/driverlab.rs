//! This project's VMM as an engine: `driverlab vm run --config -` with a control socket, read
//! while the VM runs by a watchdog thread (live counters, the guest's silence, the agent's
//! frames), and its exit or error line at the end.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vm_spec::VmSpec;
use vm_spec::control::{LiveCounters, ShutdownRequest, VmState};
use vm_spec::counters::{IommuCounts, ModelCounters};

use crate::agent::FrameKind;
use crate::file_watch::{FileWatch, Waker, Woken};
use crate::model_process::ModelProcess;
use crate::program::Program;
use crate::vm_control::ControlClient;
use crate::vm_process::{VmOutcome, VmProcess};
use crate::window::AgentFrames;
use crate::{
    BootRequest, Booted, CounterSource, Ending, Engine, HostCpuSource, KILL_GRACE, Start, WATCH_PERIOD, Watch, Window,
    ms,
};

/// VMM processes of one program (`driverlab-vmm`, or `driverlab vm run`).
#[derive(Debug, Clone)]
pub struct DriverlabEngine {
    vmm: Program,
}

impl DriverlabEngine {
    /// The engine that starts `vmm` for each VM.
    pub fn new(vmm: Program) -> DriverlabEngine {
        DriverlabEngine { vmm }
    }
}

impl Engine for DriverlabEngine {
    fn boot(&self, request: BootRequest<'_>) -> Booted {
        let private = match private_dir() {
            Ok(dir) => dir,
            Err(e) => return Booted::failed(Ending::Refused(format!("a folder for the control socket: {e}"))),
        };
        let booted = self.run(request, &private.join("vm.sock"));
        let _ = std::fs::remove_dir_all(&private);
        booted
    }
}

impl DriverlabEngine {
    /// Runs the request's VM with its control socket at `socket`.
    fn run(&self, request: BootRequest<'_>, socket: &Path) -> Booted {
        let BootRequest { spec, watch, model, counters, start, .. } = request;
        // The agent's log, watched for its frames from before the VMM opens it.
        let (agent_watch, waker) = match FileWatch::new(watch.agent_log.as_deref()) {
            Ok(watched) => watched,
            Err(e) => return Booted::failed(Ending::Refused(format!("watching the guest agent's log: {e}"))),
        };
        // Devices whose slot starts empty are plugged once the guest is up, as a user plugs the
        // cable into a booted machine (at once into a restored guest, which is up; never into
        // one that is to be snapshotted).
        let to_plug: Vec<String> = match start {
            Start::Snapshot { .. } => Vec::new(),
            _ => spec.devices.iter().filter(|d| !d.plugged).map(|d| d.backend.to_string()).collect(),
        };
        let spawned = Instant::now();
        let vm = match self.process(spec, start).with_control(socket).start() {
            Ok(vm) => vm,
            Err(e) => return Booted::failed(Ending::Refused(e.to_string())),
        };
        let host_cpu = HostCpuSource { engine: vm.pid(), model: model.as_ref().map(ModelProcess::pid) };
        let watched_vm = WatchedVm { socket, spawned, source: counters.clone(), to_plug, host_cpu, start };
        let watchdog = Watchdog::start(watched_vm, watch, agent_watch, waker);
        let outcome = vm.wait();
        let watched = watchdog.stop();
        let mut model = model;
        let model_ended = model.as_mut().and_then(ModelProcess::ended_badly);
        drop(model);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => return Booted::failed(Ending::Refused(e.to_string())),
        };
        let (iommu, device_counters, device_error) = final_counts(&outcome, watched.last.as_ref());
        let device_error = watched.plug_error.clone().or(device_error);
        Booted {
            ending: ending(&outcome),
            run_ms: outcome.exit.as_ref().map(|e| e.run_ms),
            iommu,
            device_counters: device_counters.or_else(|| counters.and_then(|source| source())),
            device_error,
            window: watched.window,
            silent_for: watched.silent_for,
            answered_ms: watched.answered_ms,
            model_ended,
            exit: outcome.exit,
            error: outcome.error,
            vmm_stderr: outcome.stderr,
        }
    }
}

impl DriverlabEngine {
    /// The VMM process for `spec`, started as `start` says.
    fn process(&self, spec: VmSpec, start: Start<'_>) -> VmProcess {
        match start {
            Start::Boot => VmProcess::new(&self.vmm, spec, KILL_GRACE),
            Start::Snapshot { dir } => {
                VmProcess::new(&self.vmm, spec, KILL_GRACE).with_flags(["--snapshot-to".as_ref(), dir.as_os_str()])
            }
            Start::Restore { dir, com2_input, payload } => {
                let deadline = spec.timeout_s.map_or(Duration::ZERO, Duration::from_secs_f64) + KILL_GRACE;
                VmProcess::with_args(&self.vmm, restore_flags(&spec, dir, com2_input, payload), deadline)
            }
        }
    }
}

/// `vm run`'s flags that restore the snapshot in `dir` as the VM `spec` would be: its devices
/// (new backends in the snapshot's slots), serial ports and timeout, and what the guest reads on
/// COM2 and in the payload window.
fn restore_flags(spec: &VmSpec, dir: &Path, com2_input: Option<&str>, payload: Option<&Path>) -> Vec<OsString> {
    let mut flags: Vec<OsString> = vec!["--restore".into(), dir.into()];
    if let Some(text) = com2_input {
        flags.extend(["--com2-input".into(), text.into()]);
    }
    if let Some(file) = payload {
        flags.extend(["--payload".into(), file.into()]);
    }
    for device in &spec.devices {
        flags.extend(["--device".into(), device.to_string().into()]);
    }
    flags.extend(["--serial".into(), spec.serial.com1.to_string().into()]);
    if let Some(com2) = &spec.serial.com2 {
        flags.extend(["--com2".into(), com2.to_string().into()]);
    }
    if let Some(timeout) = spec.timeout_s {
        flags.extend(["--timeout".into(), timeout.to_string().into()]);
    }
    if !spec.seccomp {
        flags.push("--no-seccomp".into());
    }
    if !spec.jail {
        flags.push("--no-jail".into());
    }
    flags
}

/// How the VMM process ended, from its last line (or its absence).
fn ending(outcome: &VmOutcome) -> Ending {
    if let Some(error) = &outcome.error {
        Ending::Refused(format!("the VMM could not run the VM ({:?}): {}", error.kind, error.message))
    } else if outcome.killed {
        Ending::Killed
    } else if let Some(exit) = &outcome.exit {
        Ending::Stopped { reason: exit.reason, detail: exit.detail.clone() }
    } else {
        let how = outcome.signal().map_or(format!("exit code {:?}", outcome.code()), |s| format!("signal {s}"));
        // Its last words, when it had any (a seccomp violation names its system call).
        let said = outcome.stderr.lines().rev().find(|l| !l.trim().is_empty()).map(|l| {
            let l: String = l.trim().chars().take(300).collect();
            format!(": {l}")
        });
        Ending::Unexplained(format!("the VMM ended without its exit line ({how}){}", said.unwrap_or_default()))
    }
}

/// The virtio-iommu's and the device's counts over the whole VM and a device's error: from the
/// exit line, else (the VMM was killed) the last live counters.
fn final_counts(
    outcome: &VmOutcome,
    last: Option<&LiveCounters>,
) -> (Option<IommuCounts>, Option<ModelCounters>, Option<String>) {
    match (&outcome.exit, last) {
        (Some(exit), _) => (
            exit.viommu.clone(),
            exit.devices.first().and_then(|d| d.device.counters),
            exit.devices
                .iter()
                .find_map(|d| d.device.error.as_ref().map(|e| format!("device {}: {e}", d.device.device))),
        ),
        (None, Some(live)) => (live.viommu.clone(), live.devices.first().and_then(|d| d.counters), None),
        (None, None) => (None, None, None),
    }
}

/// A folder of this process's own, short enough for a Unix socket path.
fn private_dir() -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("driverlab-lab-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    Ok(dir)
}

/// What the VMM's watchdog saw.
#[derive(Default)]
struct Watched {
    answered_ms: Option<f64>,
    last: Option<LiveCounters>,
    silent_for: Option<Duration>,
    window: Window,
    /// Why plugging a device into its slot failed.
    plug_error: Option<String>,
}

/// The model's counts: through the VMM's control socket (`live`, the model's counters region)
/// or, where the lab reads them from the model itself, from `source`.
fn model_counts(live: &LiveCounters, source: Option<&CounterSource>) -> Option<ModelCounters> {
    live.devices.first().and_then(|d| d.counters).or_else(|| source.and_then(|s| s()))
}

/// Reads the VMM's live counters while the VM runs; stops a guest whose serial ports stay silent.
/// The agent's frames are read the moment they are written (the window's counters with them);
/// the counters and the silence are looked at every [`WATCH_PERIOD`].
struct Watchdog {
    waker: Waker,
    thread: std::thread::JoinHandle<Watched>,
}

/// The VM a watchdog watches.
struct WatchedVm<'a> {
    /// Its VMM's control socket.
    socket: &'a Path,
    /// When its VMM was spawned.
    spawned: Instant,
    /// Where the model's counters come from when the VMM cannot read them.
    source: Option<CounterSource>,
    /// Devices to plug at the agent's first frame.
    to_plug: Vec<String>,
    /// Its processes, for the host's CPU time.
    host_cpu: HostCpuSource,
    /// How its guest started.
    start: Start<'a>,
}

impl Watchdog {
    fn start(vm: WatchedVm<'_>, watch: Watch, agent_watch: FileWatch, waker: Waker) -> Watchdog {
        let WatchedVm { socket, spawned, source, to_plug, host_cpu, start } = vm;
        let client = ControlClient::new(socket, Duration::from_secs(2));
        let mut watching = Watching {
            client,
            watch,
            spawned,
            source,
            watched: Watched::default(),
            bytes_seen: 0,
            frames: AgentFrames::default(),
            quiet_since: Instant::now(),
            pull: None,
            plugged: Vec::new(),
            to_plug,
            host_cpu,
            snapshot: SnapshotStep::from(start),
            running: false,
        };
        let thread = std::thread::spawn(move || {
            let mut looked = Instant::now();
            loop {
                // Often until the socket answers (that is the VM's start time), then calmly; the
                // waker ends the watch at once, a write to the agent's log wakes it at once.
                let period =
                    if watching.watched.answered_ms.is_some() { WATCH_PERIOD } else { Duration::from_millis(2) };
                match agent_watch.wait(period.saturating_sub(looked.elapsed())) {
                    Woken::Stopped => break,
                    Woken::Written if looked.elapsed() < period => {
                        watching.frames_arrived();
                        continue;
                    }
                    Woken::Written | Woken::TimedOut => {}
                }
                looked = Instant::now();
                watching.look();
            }
            watching.watched
        });
        Watchdog { waker, thread }
    }

    fn stop(self) -> Watched {
        self.waker.wake();
        self.thread.join().unwrap_or_default()
    }
}

/// The watchdog thread's state.
struct Watching {
    client: ControlClient,
    watch: Watch,
    spawned: Instant,
    source: Option<CounterSource>,
    watched: Watched,
    bytes_seen: u64,
    frames: AgentFrames,
    quiet_since: Instant,
    /// Devices to plug at the agent's first frame.
    to_plug: Vec<String>,
    /// The device to take out of its slot, how, and when (set at the workload's begin).
    pull: Option<(String, crate::UnplugKind, Instant)>,
    /// The devices plugged at the agent's first frame.
    plugged: Vec<String>,
    /// The VM's processes, for the window's host CPU time.
    host_cpu: HostCpuSource,
    /// Where the VM is in a snapshot's life.
    snapshot: SnapshotStep,
    /// The control socket said the vCPUs run (a restored VM's devices are plugged from then on).
    running: bool,
}

/// A VM's part in a snapshot's life, as the watchdog acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SnapshotStep {
    /// A booted VM, no snapshot: its devices are plugged at the agent's first frame.
    None,
    /// To be snapshotted at the agent's `ready` frame; not asked yet.
    Take,
    /// Asked to stop into its snapshot.
    Asked,
    /// Restored: its devices are plugged as soon as it runs.
    Restored,
}

impl From<Start<'_>> for SnapshotStep {
    fn from(start: Start<'_>) -> SnapshotStep {
        match start {
            Start::Boot => SnapshotStep::None,
            Start::Snapshot { .. } => SnapshotStep::Take,
            Start::Restore { .. } => SnapshotStep::Restored,
        }
    }
}

impl Watching {
    /// The agent wrote: the window's counters for its fresh frames, read now.
    fn frames_arrived(&mut self) {
        let kinds = self.frames.fresh(self.watch.agent_log.as_deref());
        if kinds.is_empty() {
            return;
        }
        self.before_the_workload(&kinds);
        self.snapshot_when_ready(&kinds);
        let (client, source, host_cpu) = (&self.client, self.source.as_ref(), self.host_cpu);
        self.watched.window.saw(
            &kinds,
            ms(self.spawned.elapsed()),
            || client.counters().ok().and_then(|c| c.viommu),
            || client.counters().ok().and_then(|c| model_counts(&c, source)),
            || host_cpu.sample(),
        );
        self.plug_when_up();
        self.pull_when_due();
    }

    /// At the agent's `ready` frame, in a VM that is to be snapshotted: asks the VMM to stop
    /// into its snapshot (once).
    fn snapshot_when_ready(&mut self, kinds: &[FrameKind]) {
        if self.snapshot != SnapshotStep::Take || !kinds.contains(&FrameKind::Ready) {
            return;
        }
        self.snapshot = SnapshotStep::Asked;
        if let Err(e) = self.client.snapshot() {
            tracing::warn!("asking for the snapshot: {e}");
            self.watched.plug_error = Some(format!("the snapshot was refused: {e}"));
            let _ = self.client.shutdown(ShutdownRequest { grace_s: Some(0.0) });
        }
    }

    /// At the agent's first frame (the kernel and its agent are up), or as soon as a restored
    /// VM runs: plugs the devices whose slots started empty, noting when.
    fn plug_when_up(&mut self) {
        let up = match self.snapshot {
            // Its control socket answers before its vCPUs run (the VMM refuses a plug then).
            SnapshotStep::Restored => self.running,
            _ => self.watched.window.first_frame_ms.is_some(),
        };
        if self.to_plug.is_empty() || !up {
            return;
        }
        for device in std::mem::take(&mut self.to_plug) {
            self.plugged.push(device.clone());
            match self.client.plug(&device) {
                Ok(_) => self.watched.window.plugged_ms = Some(ms(self.spawned.elapsed())),
                Err(e) => {
                    tracing::warn!("plugging {device} into its slot: {e}");
                    self.watched.plug_error = Some(format!("device {device}: plugging it into its slot: {e}"));
                }
            }
        }
    }

    /// Takes the device out of its slot once its time has come (the `surprise-unplug` and
    /// `orderly-unplug` checks): pulled at once, or its slot's attention button pressed.
    fn pull_when_due(&mut self) {
        let Some((device, kind, _)) = self.pull.take_if(|(_, _, at)| Instant::now() >= *at) else { return };
        match self.client.unplug(&device, kind == crate::UnplugKind::Surprise) {
            Ok(_) => self.watched.window.pulled_ms = Some(ms(self.spawned.elapsed())),
            Err(e) => {
                tracing::warn!("taking {device} out of its slot ({kind}): {e}");
                self.watched.plug_error = Some(format!("device {device}: taking it out of its slot ({kind}): {e}"));
            }
        }
    }

    /// At the workload's begin, before its counters are read: tells the VMM where the guest's
    /// bounce pool is (the agent reported it in its `iommu-group` step), so that the window
    /// counts the maps of bounced buffers; and sets the time of an unplug.
    fn before_the_workload(&mut self, kinds: &[FrameKind]) {
        if !kinds.contains(&FrameKind::WorkloadBegin) {
            return;
        }
        if let (Some(unplug), Some(device)) = (self.watch.unplug, self.plugged.first())
            && self.watched.window.pulled_ms.is_none()
        {
            self.pull = Some((device.clone(), unplug.kind, Instant::now() + unplug.after));
        }
        if let Some(pool) = crate::agent::bounce_pool_in(self.watch.agent_log.as_deref())
            && let Err(e) = self.client.set_bounce_pool(pool)
        {
            tracing::warn!("telling the VMM where the bounce pool is: {e}");
        }
    }

    /// A periodic look: the live counters, the guest's silence, and fresh frames.
    fn look(&mut self) {
        let Ok(counters) = self.client.counters() else { return };
        self.watched.answered_ms.get_or_insert(ms(self.spawned.elapsed()));
        self.running |= counters.state == VmState::Running;
        let bytes = counters.serial_bytes + counters.com2_bytes.unwrap_or(0);
        if bytes != self.bytes_seen {
            self.bytes_seen = bytes;
            self.quiet_since = Instant::now();
        } else if self.quiet_since.elapsed() >= self.watch.silence && self.watched.silent_for.is_none() {
            tracing::warn!("the guest has been silent for {:?}; stopping it", self.watch.silence);
            self.watched.silent_for = Some(self.quiet_since.elapsed());
            let _ = self.client.shutdown(ShutdownRequest { grace_s: Some(0.0) });
        }
        let kinds = self.frames.fresh(self.watch.agent_log.as_deref());
        self.before_the_workload(&kinds);
        self.snapshot_when_ready(&kinds);
        // The virtio-iommu's counts as read now, once more when the model is read first.
        let fresh = std::cell::RefCell::new(None::<LiveCounters>);
        let (client, source, host_cpu) = (&self.client, self.source.as_ref(), self.host_cpu);
        self.watched.window.saw(
            &kinds,
            ms(self.spawned.elapsed()),
            || match client.counters() {
                Ok(now) => {
                    let iommu = now.viommu.clone();
                    *fresh.borrow_mut() = Some(now);
                    iommu
                }
                Err(_) => counters.viommu.clone(),
            },
            || model_counts(fresh.borrow().as_ref().unwrap_or(&counters), source),
            || host_cpu.sample(),
        );
        self.watched.last = Some(counters);
        self.plug_when_up();
        self.pull_when_due();
    }
}

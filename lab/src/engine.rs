//! The engines that run a cell's VM and watch it: this project's VMM (`driverlab vm run`, read
//! through its control socket) and QEMU (read through its trace file and the model's control
//! socket). Both hand back the same [`Booted`]: how the VM ended, what the virtio-iommu and the
//! device counted, and those counts when the guest agent opened and closed the workload's window.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use vm_spec::control::{LiveCounters, ShutdownRequest};
use vm_spec::counters::{IommuCounts, ModelCounters};
use vm_spec::model_control::ModelReport;
use vm_spec::{ErrorLine, ExitReason, ExitSummary, Kernel, SerialOutput, VmSpec};

use crate::agent::{FrameKind, Header};
use crate::file_watch::{FileWatch, Waker, Woken};
use crate::model_process::ModelProcess;
use crate::qemu::{Accel, Machine, Qemu, Trace};
use crate::vm_control::ControlClient;
use crate::vm_process::VmProcess;

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
        /// Why.
        reason: ExitReason,
        /// Details, for errors.
        detail: Option<String>,
    },
}

/// The counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// What the virtio-iommu had counted.
    pub iommu: Option<IommuCounts>,
    /// What the device model had counted.
    pub model: Option<ModelCounters>,
}

/// The counters when the agent announced the workload's begin and end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    /// At `workload-begin`.
    pub begin: Option<Snapshot>,
    /// At `workload-end`.
    pub end: Option<Snapshot>,
    /// At `done`, after the agent unloaded the driver: what the teardown left.
    pub done: Option<Snapshot>,
    /// When the lab saw the agent's first frame, ms after spawning the VMM: the guest is up.
    pub first_frame_ms: Option<f64>,
    /// When it saw `workload-begin`, ms after spawning the VMM: the cell is ready.
    pub begin_ms: Option<f64>,
}

impl Window {
    /// Notes the agent's fresh frames `kinds`, seen `at_ms` after spawning the VMM, taking a
    /// snapshot of the virtio-iommu's counts (`iommu`) and the model's (`model`) at the
    /// workload's begin and end and at `done`.
    ///
    /// A guest's map reaches the model after the virtio-iommu counted it (in the nested box
    /// through L1's IOMMU and QEMU's vfio-user client, which does not wait for its DMA_MAPs),
    /// so the model is read first at the begin and last at the end: then every map the
    /// virtio-iommu counted in the window is in the model's window too, and the cross-check
    /// (the model never counts fewer) holds however the two reads are spaced.
    fn saw(
        &mut self,
        kinds: &[FrameKind],
        at_ms: f64,
        iommu: impl Fn() -> Option<IommuCounts>,
        model: impl Fn() -> Option<ModelCounters>,
    ) {
        if !kinds.is_empty() {
            self.first_frame_ms.get_or_insert(at_ms);
        }
        let model_first = || {
            let model = model();
            Snapshot { iommu: iommu(), model }
        };
        let iommu_first = || {
            let iommu = iommu();
            Snapshot { iommu, model: model() }
        };
        for kind in kinds {
            match kind {
                FrameKind::WorkloadBegin => {
                    self.begin = Some(model_first());
                    self.begin_ms = Some(at_ms);
                }
                FrameKind::WorkloadEnd => self.end = Some(iommu_first()),
                FrameKind::Done => self.done = Some(iommu_first()),
                _ => {}
            }
        }
    }
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
    pub(crate) fn failed(ending: Ending) -> Booted {
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
}

/// Reads the agent's frames as they arrive, for the window's begin and end.
#[derive(Default)]
struct AgentFrames {
    /// Bytes of the log read up to the end of its last whole line.
    seen: u64,
}

impl AgentFrames {
    /// The kinds of the frames that arrived since the last look. Only whole lines count: a
    /// header line the guest is still writing (COM2 moves a byte per exit) is read next time.
    /// Reads only what is new.
    fn fresh(&mut self, log: Option<&Path>) -> Vec<FrameKind> {
        let Some(mut file) = log.and_then(|l| std::fs::File::open(l).ok()) else { return Vec::new() };
        let mut data = Vec::new();
        if file.seek(SeekFrom::Start(self.seen)).is_err() || file.read_to_end(&mut data).is_err() {
            return Vec::new();
        }
        let Some(end) = data.iter().rposition(|&b| b == b'\n') else { return Vec::new() };
        self.seen += end as u64 + 1;
        data[..end + 1]
            .split(|&b| b == b'\n')
            .filter(|l| l.starts_with(crate::agent::BEGIN.as_bytes()))
            .filter_map(|l| Header::parse(l).map(|h| h.kind))
            .collect()
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Runs `spec` under this project's VMM, its control socket at `socket`.
pub fn run_driverlab(
    driverlab: &Path,
    spec: VmSpec,
    socket: &Path,
    watch: &Watch,
    model: Option<ModelProcess>,
    counters: Option<CounterSource>,
) -> Booted {
    // The agent's log, watched for its frames from before the VMM opens it.
    let (agent_watch, waker) = match FileWatch::new(watch.agent_log.as_deref()) {
        Ok(watched) => watched,
        Err(e) => return Booted::failed(Ending::Refused(format!("watching the guest agent's log: {e}"))),
    };
    let spawned = Instant::now();
    let vm = match VmProcess::new(driverlab, spec, KILL_GRACE).with_control(socket).start() {
        Ok(vm) => vm,
        Err(e) => return Booted::failed(Ending::Refused(e.to_string())),
    };
    let watchdog = Watchdog::start(socket, watch.clone(), spawned, counters.clone(), agent_watch, waker);
    let outcome = vm.wait();
    let watched = watchdog.stop();
    let mut model = model;
    let model_ended = model.as_mut().and_then(ModelProcess::ended_badly);
    drop(model);
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => return Booted::failed(Ending::Refused(e.to_string())),
    };
    let ending = if let Some(error) = &outcome.error {
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
    };
    let (iommu, device_counters, device_error) = match (&outcome.exit, &watched.last) {
        (Some(exit), _) => (
            exit.viommu.clone(),
            exit.devices.first().and_then(|d| d.device.counters),
            exit.devices
                .iter()
                .find_map(|d| d.device.error.as_ref().map(|e| format!("device {}: {e}", d.device.device))),
        ),
        // No exit line (the VMM was killed): the last live counters are what there is.
        (None, Some(live)) => (live.viommu.clone(), live.devices.first().and_then(|d| d.counters), None),
        (None, None) => (None, None, None),
    };
    let device_counters = device_counters.or_else(|| counters.and_then(|source| source()));
    Booted {
        ending,
        run_ms: outcome.exit.as_ref().map(|e| e.run_ms),
        exit: outcome.exit,
        error: outcome.error,
        iommu,
        device_counters,
        device_error,
        window: watched.window,
        silent_for: watched.silent_for,
        answered_ms: watched.answered_ms,
        vmm_stderr: outcome.stderr,
        model_ended,
    }
}

/// What the VMM's watchdog saw.
struct Watched {
    answered_ms: Option<f64>,
    last: Option<LiveCounters>,
    silent_for: Option<Duration>,
    window: Window,
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

impl Watchdog {
    fn start(
        socket: &Path,
        watch: Watch,
        spawned: Instant,
        source: Option<CounterSource>,
        agent_watch: FileWatch,
        waker: Waker,
    ) -> Watchdog {
        let client = ControlClient::new(socket, Duration::from_secs(2));
        let thread = std::thread::spawn(move || {
            let mut watched = Watched { answered_ms: None, last: None, silent_for: None, window: Window::default() };
            let mut bytes_seen = 0u64;
            let mut frames = AgentFrames::default();
            let mut quiet_since = Instant::now();
            let mut looked = Instant::now();
            loop {
                // Often until the socket answers (that is the VM's start time), then calmly; the
                // waker ends the watch at once, a write to the agent's log wakes it at once.
                let period = if watched.answered_ms.is_some() { WATCH_PERIOD } else { Duration::from_millis(2) };
                match agent_watch.wait(period.saturating_sub(looked.elapsed())) {
                    Woken::Stopped => break,
                    Woken::Written if looked.elapsed() < period => {
                        let kinds = frames.fresh(watch.agent_log.as_deref());
                        if !kinds.is_empty() {
                            watched.window.saw(
                                &kinds,
                                ms(spawned.elapsed()),
                                || client.counters().ok().and_then(|c| c.viommu),
                                || client.counters().ok().and_then(|c| model_counts(&c, source.as_ref())),
                            );
                        }
                        continue;
                    }
                    Woken::Written | Woken::TimedOut => {}
                }
                looked = Instant::now();
                let Ok(counters) = client.counters() else { continue };
                watched.answered_ms.get_or_insert(ms(spawned.elapsed()));
                let bytes = counters.serial_bytes + counters.com2_bytes.unwrap_or(0);
                if bytes != bytes_seen {
                    bytes_seen = bytes;
                    quiet_since = Instant::now();
                } else if quiet_since.elapsed() >= watch.silence && watched.silent_for.is_none() {
                    tracing::warn!("the guest has been silent for {:?}; stopping it", watch.silence);
                    watched.silent_for = Some(quiet_since.elapsed());
                    let _ = client.shutdown(ShutdownRequest { grace_s: Some(0.0) });
                }
                let kinds = frames.fresh(watch.agent_log.as_deref());
                // The virtio-iommu's counts as read now, once more when the model is read first.
                let fresh = std::cell::RefCell::new(None::<LiveCounters>);
                watched.window.saw(
                    &kinds,
                    ms(spawned.elapsed()),
                    || match client.counters() {
                        Ok(now) => {
                            let iommu = now.viommu.clone();
                            *fresh.borrow_mut() = Some(now);
                            iommu
                        }
                        Err(_) => counters.viommu.clone(),
                    },
                    || model_counts(fresh.borrow().as_ref().unwrap_or(&counters), source.as_ref()),
                );
                watched.last = Some(counters);
            }
            watched
        });
        Watchdog { waker, thread }
    }

    fn stop(self) -> Watched {
        self.waker.wake();
        self.thread.join().unwrap_or(Watched {
            answered_ms: None,
            last: None,
            silent_for: None,
            window: Window::default(),
        })
    }
}

/// What the QEMU engine needs besides the spec.
#[derive(Debug, Clone)]
pub struct QemuBoot<'a> {
    /// The chroot.
    pub qemu: &'a Qemu,
    /// TCG or KVM.
    pub accel: Accel,
    /// The kernel's bzImage, when the spec's kernel is a kernel image (QEMU boots that).
    pub bzimage: Option<&'a Path>,
    /// The repetition's folder: the probe's ELF, QEMU's trace and its stderr go there.
    pub dir: &'a Path,
}

/// Runs `spec` under QEMU. The model (if any) is asked for its counters over its control socket
/// as the window opens and closes, and stopped when QEMU ends.
pub fn run_qemu(boot: &QemuBoot<'_>, spec: &VmSpec, watch: &Watch, model: Option<ModelProcess>) -> Booted {
    let file = |s: &SerialOutput| match s {
        SerialOutput::File(path) => Some(path.clone()),
        _ => None,
    };
    let (Some(com1), com2) = (file(&spec.serial.com1), spec.serial.com2.as_ref().and_then(file)) else {
        return Booted::failed(Ending::Refused("the QEMU engine writes COM1 to a file".into()));
    };
    let [device] = spec.devices.as_slice() else {
        return Booted::failed(Ending::Refused("the QEMU engine runs one device per VM".into()));
    };
    let kernel = match &spec.kernel {
        Kernel::Probe => {
            let path = boot.dir.join("probe.elf");
            if let Err(e) = std::fs::write(&path, guest_images::PROBE_ELF) {
                return Booted::failed(Ending::Refused(format!("writing {}: {e}", path.display())));
            }
            path
        }
        Kernel::Path(path) => boot.bzimage.map_or(path.clone(), Path::to_path_buf),
    };
    let trace_path = boot.dir.join("qemu-trace.log");
    let stderr_path = boot.dir.join("qemu.log");
    let machine = Machine {
        kernel: &kernel,
        initrd: spec.initrd.as_deref(),
        cmdline: &spec.cmdline,
        memory_mib: spec.memory_mib,
        vcpus: spec.vcpus,
        accel: boot.accel,
        iommu: spec.iommu.is_some(),
        device,
        com1: &com1,
        com2: com2.as_deref(),
        trace: &trace_path,
    };
    let mut command = boot.qemu.machine_command(&machine);
    crate::vm_process::die_with_parent(&mut command);
    let stderr = match std::fs::File::create(&stderr_path) {
        Ok(f) => f,
        Err(e) => return Booted::failed(Ending::Refused(format!("{}: {e}", stderr_path.display()))),
    };
    // The agent's log, watched for its frames from before QEMU opens it.
    let agent_watch = match FileWatch::new(watch.agent_log.as_deref()) {
        Ok((watched, _)) => watched,
        Err(e) => return Booted::failed(Ending::Refused(format!("watching the guest agent's log: {e}"))),
    };
    let spawned = Instant::now();
    let mut child = match command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr).spawn() {
        Ok(child) => child,
        Err(e) => return Booted::failed(Ending::Refused(format!("starting QEMU: {e}"))),
    };
    let timeout = spec.timeout_s.map(Duration::from_secs_f64);
    let mut trace = Trace::default();
    let mut trace_read = 0u64;
    let mut frames = AgentFrames::default();
    let mut window = Window::default();
    let (mut silent_for, mut timed_out, mut killed, mut stopped_at) = (None, false, false, None::<Instant>);
    let serial_files: Vec<PathBuf> = std::iter::once(com1.clone()).chain(com2.clone()).collect();
    let mut serial_seen = 0u64;
    let mut quiet_since = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("waiting for QEMU: {e}");
                break None;
            }
        }
        // Every period, and at once when the agent writes: its frames' counts are then read
        // from the trace as far as QEMU has written it.
        agent_watch.wait(WATCH_PERIOD);
        trace_read += read_more(&trace_path, trace_read, &mut trace);
        let bytes: u64 = serial_files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
        let terminate = |child: &std::process::Child| {
            // SAFETY: kill(2) on our own child's PID, which it stays until we wait for it.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        };
        if bytes != serial_seen {
            serial_seen = bytes;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= watch.silence && silent_for.is_none() && stopped_at.is_none() {
            tracing::warn!("the guest has been silent for {:?}; stopping it", watch.silence);
            silent_for = Some(quiet_since.elapsed());
            terminate(&child);
            stopped_at = Some(Instant::now());
        }
        if let Some(limit) = timeout
            && spawned.elapsed() > limit
            && stopped_at.is_none()
        {
            timed_out = true;
            terminate(&child);
            stopped_at = Some(Instant::now());
        }
        if stopped_at.is_some_and(|at| at.elapsed() > KILL_GRACE) && !killed {
            tracing::warn!("QEMU did not end on SIGTERM; killing it");
            let _ = child.kill();
            killed = true;
        }
        let kinds = frames.fresh(watch.agent_log.as_deref());
        window.saw(
            &kinds,
            ms(spawned.elapsed()),
            || Some(trace.counts()),
            || model.as_ref().and_then(ModelProcess::counters),
        );
    };
    let run_ms = ms(spawned.elapsed());
    let mut model = model;
    let model_ended = model.as_mut().and_then(ModelProcess::ended_badly);
    read_more(&trace_path, trace_read, &mut trace);
    // The model's own counts, as it printed them when QEMU went away.
    let device_counters = model.and_then(|m| m.terminate().ok()).and_then(|(_, out)| final_counters(&out));
    // The trace can be large (a line per map); what the record needs has been read from it.
    if std::env::var_os("DRIVERLAB_KEEP_TRACE").is_none() {
        let _ = std::fs::remove_file(&trace_path);
    }
    let complaint = || {
        let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| l.chars().take(300).collect::<String>())
    };
    let ending = match status {
        _ if killed => Ending::Killed,
        _ if timed_out => Ending::Stopped { reason: ExitReason::Timeout, detail: None },
        None => Ending::Unexplained("QEMU could not be waited for".into()),
        Some(status) if !status.success() && silent_for.is_none() => Ending::Unexplained(format!(
            "QEMU exited with {status}: {}",
            complaint().unwrap_or_else(|| "it printed nothing (qemu.log)".into())
        )),
        Some(_) => match trace.shutdown {
            Some(cause) => Ending::Stopped {
                reason: cause.exit_reason(),
                detail: (cause.exit_reason() == ExitReason::VmmError)
                    .then(|| format!("QEMU stopped for {}", cause.name())),
            },
            None => Ending::Unexplained("QEMU ended without a shutdown request in its trace".into()),
        },
    };
    Booted {
        ending,
        exit: None,
        error: None,
        iommu: Some(trace.counts()),
        device_counters,
        device_error: None,
        window,
        silent_for,
        answered_ms: None,
        run_ms: Some(run_ms),
        vmm_stderr: String::new(),
        model_ended,
    }
}

/// Feeds what `path` has past `from` into `trace`; returns how much that was.
fn read_more(path: &Path, from: u64, trace: &mut Trace) -> u64 {
    let Ok(mut file) = std::fs::File::open(path) else { return 0 };
    if file.seek(SeekFrom::Start(from)).is_err() {
        return 0;
    }
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    trace.feed(&bytes);
    bytes.len() as u64
}

/// The last counters a model printed on its stdout.
fn final_counters(stdout: &str) -> Option<ModelCounters> {
    stdout.lines().rev().find_map(ModelReport::parse).map(|report| report.counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_read_first_at_the_begin_and_last_at_the_end() {
        // A map reaches the model after the virtio-iommu counted it: with this order the
        // model's window holds every map the virtio-iommu's does, whatever the lag.
        let order = std::cell::RefCell::new(Vec::new());
        let iommu = || {
            order.borrow_mut().push("iommu");
            Some(IommuCounts::default())
        };
        let model = || {
            order.borrow_mut().push("model");
            Some(ModelCounters::default())
        };
        let mut window = Window::default();
        window.saw(&[FrameKind::WorkloadBegin], 1.0, iommu, model);
        window.saw(&[FrameKind::WorkloadEnd], 2.0, iommu, model);
        window.saw(&[FrameKind::Done], 3.0, iommu, model);
        assert_eq!(*order.borrow(), ["model", "iommu", "iommu", "model", "iommu", "model"]);
        assert!(window.begin.is_some() && window.end.is_some() && window.done.is_some());
        assert_eq!(window.begin_ms, Some(1.0));
    }

    #[test]
    fn the_model_s_last_printed_counters_are_its_final_ones() {
        let out = "{\"model\":\"aqc100\",\"client\":1,\"counters\":{\"dma_maps\":7,\"dma_unmaps\":7,\"dma_faults\":0,\"interrupts\":2}}\n\
                   {\"model\":\"aqc100\",\"counters\":{\"dma_maps\":9,\"dma_unmaps\":8,\"dma_faults\":0,\"interrupts\":3},\"exit\":\"SIGTERM\"}\n";
        let c = final_counters(out).unwrap();
        assert_eq!((c.dma_maps, c.dma_unmaps, c.interrupts), (9, 8, 3));
        assert_eq!(final_counters("not json\n"), None);
    }

    #[test]
    fn agent_frames_are_read_as_they_arrive() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("agent.log");
        let mut frames = AgentFrames::default();
        assert!(frames.fresh(Some(&log)).is_empty(), "no file yet");
        std::fs::write(&log, crate::agent::encode(1, "workload-begin", false, b"{}")).unwrap();
        assert_eq!(frames.fresh(Some(&log)), [FrameKind::WorkloadBegin]);
        assert!(frames.fresh(Some(&log)).is_empty(), "each frame once");
        // A header line caught half written is read whole the next time.
        let whole = crate::agent::encode(2, "workload-end", false, b"{}");
        let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        std::io::Write::write_all(&mut file, &whole[..9]).unwrap();
        assert!(frames.fresh(Some(&log)).is_empty(), "nothing whole yet");
        std::io::Write::write_all(&mut file, &whole[9..]).unwrap();
        assert_eq!(frames.fresh(Some(&log)), [FrameKind::WorkloadEnd]);
    }
}

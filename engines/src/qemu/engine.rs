//! QEMU as an engine: one `qemu-system-x86_64` process per VM from the forky chroot
//! ([`crate::qemu`]), watched through its trace file (the virtio-iommu's maps, how the guest
//! stopped) and the model's control socket, stopped with SIGTERM when the guest falls silent or
//! its time is up.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vm_spec::counters::ModelCounters;
use vm_spec::model_control::ModelReport;
use vm_spec::{ExitReason, Kernel, SerialOutput, Slot};

use crate::agent::FrameKind;
use crate::file_watch::FileWatch;
use crate::model_process::ModelProcess;
use crate::qemu::{Machine, Qemu, Trace, ssdt};
use crate::window::AgentFrames;
use crate::{BootRequest, Booted, Ending, Engine, HostCpuSource, KILL_GRACE, WATCH_PERIOD, Watch, Window, ms};

/// QEMU from one chroot.
#[derive(Debug, Clone)]
pub struct QemuEngine {
    qemu: Qemu,
}

impl QemuEngine {
    /// The engine that runs the chroot's QEMU.
    pub fn new(qemu: Qemu) -> QemuEngine {
        QemuEngine { qemu }
    }
}

/// A VM ready to start: its command and the files it writes.
struct Prepared {
    command: std::process::Command,
    serial_files: Vec<PathBuf>,
    trace: PathBuf,
    stderr: PathBuf,
}

impl Engine for QemuEngine {
    fn boot(&self, request: BootRequest<'_>) -> Booted {
        if request.start != crate::Start::Boot {
            return Booted::failed(Ending::Refused(
                "the QEMU engine boots its guests; only driverlab's snapshots them".into(),
            ));
        }
        let prepared = match self.prepare(&request) {
            Ok(prepared) => prepared,
            Err(why) => return Booted::failed(Ending::Refused(why)),
        };
        // The agent's log, watched for its frames from before QEMU opens it.
        let agent_watch = match FileWatch::new(request.watch.agent_log.as_deref()) {
            Ok((watched, _)) => watched,
            Err(e) => return Booted::failed(Ending::Refused(format!("watching the guest agent's log: {e}"))),
        };
        let Prepared { mut command, serial_files, trace, stderr } = prepared;
        let stderr_file = match std::fs::File::create(&stderr) {
            Ok(f) => f,
            Err(e) => return Booted::failed(Ending::Refused(format!("{}: {e}", stderr.display()))),
        };
        let spawned = Instant::now();
        let child = match command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr_file).spawn() {
            Ok(child) => child,
            Err(e) => return Booted::failed(Ending::Refused(format!("starting QEMU: {e}"))),
        };
        let mut watching = Watching {
            child,
            spawned,
            watch: request.watch,
            timeout: request.spec.timeout_s.map(Duration::from_secs_f64),
            serial_files,
            trace_path: trace,
            trace: Trace::default(),
            trace_read: 0,
            frames: AgentFrames::default(),
            window: Window::default(),
            silent_for: None,
            timed_out: false,
            killed: false,
            stopped_at: None,
            serial_seen: 0,
            quiet_since: Instant::now(),
        };
        let status = watching.until_exit(&agent_watch, request.model.as_ref());
        finish(watching, status, request.model, &stderr)
    }
}

impl QemuEngine {
    /// The QEMU command for the request, or why it cannot be run.
    fn prepare(&self, request: &BootRequest<'_>) -> Result<Prepared, String> {
        let spec = &request.spec;
        let file = |s: &SerialOutput| match s {
            SerialOutput::File(path) => Some(path.clone()),
            _ => None,
        };
        let (Some(com1), com2) = (file(&spec.serial.com1), spec.serial.com2.as_ref().and_then(file)) else {
            return Err("the QEMU engine writes COM1 to a file".into());
        };
        let [device] = spec.devices.as_slice() else {
            return Err("the QEMU engine runs one device per VM".into());
        };
        if !device.plugged {
            return Err("the QEMU engine's slots are occupied at boot (its root ports hot-plug through ACPI, \
                        not pciehp): a device plugged after boot needs engine = \"driverlab\""
                .into());
        }
        if let Some(unplug) = request.watch.unplug {
            return Err(format!(
                "the QEMU engine takes no device out of its slot: the {}-unplug check needs engine = \"driverlab\"",
                unplug.kind
            ));
        }
        let ssdt = (device.slot == Slot::Thunderbolt)
            .then(|| {
                let path = request.dir.join("thunderbolt-ssdt.aml");
                std::fs::write(&path, ssdt::external_facing_port())
                    .map(|()| path.clone())
                    .map_err(|e| format!("writing {}: {e}", path.display()))
            })
            .transpose()?;
        let kernel = match &spec.kernel {
            Kernel::Probe => {
                let path = request.dir.join("probe.elf");
                std::fs::write(&path, guest_images::PROBE_ELF)
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
                path
            }
            Kernel::Path(path) => request.bzimage.map_or(path.clone(), Path::to_path_buf),
        };
        let trace = request.dir.join("qemu-trace.log");
        let machine = Machine {
            kernel: &kernel,
            initrd: spec.initrd.as_deref(),
            cmdline: &spec.cmdline,
            memory_mib: spec.memory_mib,
            vcpus: spec.vcpus,
            accel: request.accel,
            iommu: spec.iommu.is_some(),
            device,
            ssdt: ssdt.as_deref(),
            com1: &com1,
            com2: com2.as_deref(),
            trace: &trace,
        };
        let mut command = self.qemu.machine_command(&machine);
        crate::vm_process::die_with_parent(&mut command);
        let serial_files = std::iter::once(com1).chain(com2).collect();
        Ok(Prepared { command, serial_files, trace, stderr: request.dir.join("qemu.log") })
    }
}

/// QEMU while it runs.
struct Watching {
    child: Child,
    spawned: Instant,
    watch: Watch,
    timeout: Option<Duration>,
    serial_files: Vec<PathBuf>,
    trace_path: PathBuf,
    trace: Trace,
    trace_read: u64,
    frames: AgentFrames,
    window: Window,
    silent_for: Option<Duration>,
    timed_out: bool,
    killed: bool,
    stopped_at: Option<Instant>,
    serial_seen: u64,
    quiet_since: Instant,
}

impl Watching {
    /// Watches QEMU until it exits: every period, and at once when the agent writes (its
    /// frames' counts are then read from the trace as far as QEMU has written it).
    fn until_exit(&mut self, agent_watch: &FileWatch, model: Option<&ModelProcess>) -> Option<ExitStatus> {
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!("waiting for QEMU: {e}");
                    return None;
                }
            }
            agent_watch.wait(WATCH_PERIOD);
            self.trace_read += read_more(&self.trace_path, self.trace_read, &mut self.trace);
            self.stop_if_due();
            let kinds = self.frames.fresh(self.watch.agent_log.as_deref());
            // The bounce pool, for the window's counts of bounced maps (the trace's maps until
            // now are before the workload's begin, whose counts are taken below).
            if kinds.contains(&FrameKind::WorkloadBegin)
                && let Some(pool) = crate::agent::bounce_pool_in(self.watch.agent_log.as_deref())
            {
                self.trace.set_bounce_pool(pool);
            }
            // The virtio-iommu's counts as QEMU has written them when the window asks (the
            // model is read before them at the begin): a map QEMU traced after the read above
            // is counted on the side of the window it fell on.
            let trace = std::cell::RefCell::new((&mut self.trace, &mut self.trace_read));
            let (trace_path, host_cpu) =
                (&self.trace_path, HostCpuSource { engine: self.child.id(), model: model.map(ModelProcess::pid) });
            self.window.saw(
                &kinds,
                ms(self.spawned.elapsed()),
                || {
                    let (trace, read) = &mut *trace.borrow_mut();
                    **read += read_more(trace_path, **read, trace);
                    Some(trace.counts())
                },
                || model.and_then(ModelProcess::counters),
                || host_cpu.sample(),
            );
        }
    }

    /// Stops QEMU (SIGTERM, then SIGKILL past the grace) when the guest has been silent too long
    /// or its time is up.
    fn stop_if_due(&mut self) {
        let bytes: u64 = self.serial_files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
        if bytes != self.serial_seen {
            self.serial_seen = bytes;
            self.quiet_since = Instant::now();
        } else if self.quiet_since.elapsed() >= self.watch.silence
            && self.silent_for.is_none()
            && self.stopped_at.is_none()
        {
            tracing::warn!("the guest has been silent for {:?}; stopping it", self.watch.silence);
            self.silent_for = Some(self.quiet_since.elapsed());
            self.terminate();
        }
        if self.timeout.is_some_and(|limit| self.spawned.elapsed() > limit) && self.stopped_at.is_none() {
            self.timed_out = true;
            self.terminate();
        }
        if self.stopped_at.is_some_and(|at| at.elapsed() > KILL_GRACE) && !self.killed {
            tracing::warn!("QEMU did not end on SIGTERM; killing it");
            let _ = self.child.kill();
            self.killed = true;
        }
    }

    fn terminate(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id())
            && let Some(pid) = rustix::process::Pid::from_raw(pid)
        {
            // Our own child, which keeps its PID until we wait for it.
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        self.stopped_at = Some(Instant::now());
    }
}

/// What QEMU left: how it ended, the trace's counts, the model's own.
fn finish(mut watching: Watching, status: Option<ExitStatus>, model: Option<ModelProcess>, stderr: &Path) -> Booted {
    let run_ms = ms(watching.spawned.elapsed());
    let mut model = model;
    let model_ended = model.as_mut().and_then(ModelProcess::ended_badly);
    read_more(&watching.trace_path, watching.trace_read, &mut watching.trace);
    // The model's own counts, as it printed them when QEMU went away.
    let device_counters = model.and_then(|m| m.terminate().ok()).and_then(|(_, out)| final_counters(&out));
    // The trace can be large (a line per map); what the record needs has been read from it.
    if std::env::var_os("DRIVERLAB_KEEP_TRACE").is_none() {
        let _ = std::fs::remove_file(&watching.trace_path);
    }
    Booted {
        ending: ending(&watching, status, stderr),
        exit: None,
        error: None,
        iommu: Some(watching.trace.counts()),
        device_counters,
        device_error: None,
        window: watching.window,
        silent_for: watching.silent_for,
        answered_ms: None,
        run_ms: Some(run_ms),
        vmm_stderr: String::new(),
        model_ended,
    }
}

/// How QEMU ended: killed, timed out, failed (its last complaint), or stopped for the cause its
/// trace gives.
fn ending(watching: &Watching, status: Option<ExitStatus>, stderr: &Path) -> Ending {
    let complaint = || {
        let text = std::fs::read_to_string(stderr).unwrap_or_default();
        text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| l.chars().take(300).collect::<String>())
    };
    match status {
        _ if watching.killed => Ending::Killed,
        _ if watching.timed_out => Ending::Stopped { reason: ExitReason::Timeout, detail: None },
        None => Ending::Unexplained("QEMU could not be waited for".into()),
        Some(status) if !status.success() && watching.silent_for.is_none() => Ending::Unexplained(format!(
            "QEMU exited with {status}: {}",
            complaint().unwrap_or_else(|| "it printed nothing (qemu.log)".into())
        )),
        Some(_) => match watching.trace.shutdown {
            Some(cause) => Ending::Stopped {
                reason: cause.exit_reason(),
                detail: (cause.exit_reason() == ExitReason::VmmError)
                    .then(|| format!("QEMU stopped for {}", cause.name())),
            },
            None => Ending::Unexplained("QEMU ended without a shutdown request in its trace".into()),
        },
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
    fn the_model_s_last_printed_counters_are_its_final_ones() {
        let out = "{\"model\":\"aqc100\",\"client\":1,\"counters\":{\"dma_maps\":7,\"dma_unmaps\":7,\"dma_faults\":0,\"interrupts\":2}}\n\
                   {\"model\":\"aqc100\",\"counters\":{\"dma_maps\":9,\"dma_unmaps\":8,\"dma_faults\":0,\"interrupts\":3},\"exit\":\"SIGTERM\"}\n";
        let c = final_counters(out).unwrap();
        assert_eq!((c.dma_maps, c.dma_unmaps, c.interrupts), (9, 8, 3));
        assert_eq!(final_counters("not json\n"), None);
    }
}

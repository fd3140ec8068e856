//! One repetition of one cell: start the device (a fresh model, or the host device), boot the VM
//! with its control socket, watch it (serial silence, total time), collect (live counters, the
//! exit line, the serial log), tear down, and turn it all into a [`Record`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vm_spec::control::{LiveCounters, ShutdownRequest};
use vm_spec::{DeviceSpec, IommuSpec, Kernel, SerialOutput, SerialSpec, VmSpec};

use crate::crash;
use crate::matrix::{Cell, DeviceKind, Plan, Workload};
use crate::model_process::ModelProcess;
use crate::probe_report::ProbeReport;
use crate::record::{Crash, Record, Status, now_rfc3339};
use crate::vm_control::ControlClient;
use crate::vm_process::{VmOutcome, VmProcess};

/// How often the watchdog reads the live counters.
const WATCH_PERIOD: Duration = Duration::from_millis(200);
/// Beyond the spec's own timeout, how long the lab waits before it kills the VMM.
const KILL_GRACE: Duration = Duration::from_secs(30);

/// What every repetition of a run shares.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The `driverlab` binary that runs VMs and models.
    pub driverlab: PathBuf,
    /// The run.
    pub run: String,
    /// Where the run's artifacts go.
    pub artifacts: PathBuf,
}

/// The kernel command line of a cell: the image's words, the variant's, its parameters, then
/// what the workload needs.
pub fn cmdline(plan: &Plan, cell: &Cell) -> String {
    let mut words: Vec<String> = Vec::new();
    if let Some(image) = plan.image(&cell.image) {
        words.extend(image.cmdline.split_whitespace().map(String::from));
    }
    if let Some(variant) = plan.variant(&cell.variant) {
        words.extend(variant.cmdline.split_whitespace().map(String::from));
    }
    words.extend(cell.params.iter().map(|(k, v)| format!("{k}={v}")));
    if let Some(Workload::ProbeRx { frames, .. }) = plan.workload(&cell.workload) {
        words.extend(["probe.viommu_ops=0".into(), "probe.nic=aqc100".into(), format!("probe.frames={frames}")]);
    }
    words.join(" ")
}

/// Runs repetition `repetition` of `cell`.
pub fn run(ctx: &RunContext, plan: &Plan, cell: &Cell, repetition: u32) -> Record {
    let started_at = now_rfc3339();
    let start = Instant::now();
    let rep_dir = ctx.artifacts.join(&cell.id).join(format!("rep{repetition}"));
    let mut record = Record::not_run(&ctx.run, cell, repetition, Status::Error, "");
    record.started_at = started_at;
    let fail = |mut record: Record, status: Status, reason: String| {
        record.status = status;
        record.reason = Some(reason);
        record.timings.total_ms = ms(start.elapsed());
        record
    };
    let (Some(image), Some(device)) = (plan.image(&cell.image), plan.device(&cell.device)) else {
        return fail(record, Status::Error, format!("cell {} names what its matrix lacks", cell.id));
    };
    if let Err(e) = std::fs::create_dir_all(&rep_dir) {
        return fail(record, Status::Error, format!("artifacts folder {}: {e}", rep_dir.display()));
    }

    // The device: a fresh model for this VM, or the host device.
    let mut model = None;
    let device_spec = match device.kind() {
        DeviceKind::Host(bdf) => DeviceSpec::Vfio(bdf),
        DeviceKind::Model { kind, args } => {
            let model_start = Instant::now();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match ModelProcess::start(&ctx.driverlab, &kind, &args) {
                Ok(m) => {
                    record.timings.model_start_ms = Some(ms(model_start.elapsed()));
                    let spec = m.device_spec();
                    model = Some(m);
                    spec
                }
                Err(e) => return fail(record, Status::Error, e.to_string()),
            }
        }
    };

    let serial_log = rep_dir.join("serial.log");
    let kernel = if image.is_probe() { Kernel::Probe } else { Kernel::Path(plan.resolve(Path::new(&image.kernel))) };
    let spec = VmSpec {
        kernel,
        initrd: image.initrd.as_ref().map(|p| plan.resolve(p)),
        cmdline: cmdline(plan, cell),
        memory_mib: image.memory_mib,
        vcpus: image.vcpus,
        iommu: image.iommu.then(IommuSpec::default),
        devices: vec![device_spec],
        serial: SerialSpec {
            com1: SerialOutput::File(serial_log.clone()),
            com2: (!image.is_probe()).then(|| SerialOutput::File(rep_dir.join("agent.log"))),
        },
        timeout_s: Some(plan.matrix.timeout_s),
        ..VmSpec::new(Kernel::Probe)
    };
    let private = match private_dir() {
        Ok(dir) => dir,
        Err(e) => return fail(record, Status::Error, format!("a folder for the control socket: {e}")),
    };
    let socket = private.join("vm.sock");
    let spawned = Instant::now();
    let vm = match VmProcess::new(&ctx.driverlab, spec, KILL_GRACE).with_control(&socket).start() {
        Ok(vm) => vm,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&private);
            return fail(record, Status::Error, e.to_string());
        }
    };
    let watch = Watchdog::start(&socket, Duration::from_secs_f64(plan.matrix.silence_s), spawned);
    let outcome = vm.wait();
    let watched = watch.stop();
    let _ = std::fs::remove_dir_all(&private);
    drop(model);

    record.timings.vm_start_ms = watched.answered_ms;
    record.serial_log = serial_log.strip_prefix(&ctx.artifacts).ok().map(|p| p.display().to_string());
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => return fail(record, Status::Error, e.to_string()),
    };
    let serial = std::fs::read_to_string(&serial_log).unwrap_or_default();
    collect(&mut record, &outcome, &serial, watched.last);
    let (status, reason) = judge(&outcome, &serial, &record, watched.silent_for, plan.matrix.timeout_s);
    if status == Status::Fail
        && record.crash.is_none()
        && let Some(silence) = watched.silent_for
    {
        record.crash = Some(hang(silence));
    }
    record.status = status;
    record.reason = reason;
    record.timings.total_ms = ms(start.elapsed());
    record
}

/// Fills the record from what the VM left behind.
fn collect(record: &mut Record, out: &VmOutcome, serial: &str, last: Option<LiveCounters>) {
    let exit = out.exit.clone();
    record.exit = exit.clone();
    record.error = out.error.clone();
    record.crash = crash::detect(serial);
    if let Some(exit) = &exit {
        record.timings.vm_setup_ms = Some(exit.setup_ms);
        record.timings.vm_run_ms = Some(exit.run_ms);
        record.timings.first_serial_ms = exit.first_serial_ms;
        record.iommu = exit.viommu.clone();
        record.device_counters = exit.devices.first().and_then(|d| d.device.counters);
    } else if let Some(live) = last {
        // No exit line (the VMM was killed): the last live counters are what there is.
        record.iommu = live.viommu;
        record.device_counters = live.devices.first().and_then(|d| d.counters);
    }
    let report = ProbeReport::parse(serial);
    if let Some(nic) = report.section("nic").filter(|n| n.get("error").is_none()) {
        let get = |key: &str| nic.get(key).and_then(|v| v.as_u64());
        let (frames, bytes, elapsed_ns) = (get("rx_frames"), get("rx_bytes"), get("elapsed_ns"));
        record.workload.output = Some(nic.clone());
        record.workload.rx_packets = frames;
        record.workload.rx_bytes = bytes;
        record.interrupts = get("rx_interrupts");
        if let (Some(frames), Some(bytes), Some(ns)) = (frames, bytes, elapsed_ns.filter(|&ns| ns > 0)) {
            record.timings.workload_ms = Some(ns as f64 / 1e6);
            record.workload.gbit_s = Some(bytes as f64 * 8.0 / ns as f64);
            record.workload.packets_per_s = Some(frames as f64 * 1e9 / ns as f64);
        }
        // What the virtual IOMMU counted, less the driver's set-up maps (rings, TX buffers, the
        // first RX fill), over the frames received.
        if let (Some(iommu), Some(initial), Some(frames)) =
            (&record.iommu, get("initial_maps"), frames.filter(|&f| f > 0))
        {
            record.maps_per_packet = Some(iommu.maps.saturating_sub(initial) as f64 / frames as f64);
        }
    } else if let Some(nic) = report.section("nic") {
        record.workload.output = Some(nic.clone());
    }
}

/// The status and its reason.
fn judge(
    out: &VmOutcome,
    serial: &str,
    record: &Record,
    silent_for: Option<Duration>,
    timeout_s: f64,
) -> (Status, Option<String>) {
    if let Some(error) = &out.error {
        return (Status::Error, Some(format!("the VMM could not run the VM ({:?}): {}", error.kind, error.message)));
    }
    if out.killed {
        return (Status::Error, Some("the VMM did not end at its timeout and was killed".into()));
    }
    let Some(exit) = &out.exit else {
        let how = out.signal().map_or(format!("exit code {:?}", out.code()), |s| format!("signal {s}"));
        return (Status::Error, Some(format!("the VMM ended without its exit line ({how})")));
    };
    if let Some(silence) = silent_for {
        return (Status::Fail, Some(format!("hung: no serial output for {:.0} s", silence.as_secs_f64())));
    }
    match exit.reason.as_str() {
        "kvm-internal-error" | "entry-failure" => {
            let detail = exit.detail.clone().unwrap_or_default();
            return (Status::Error, Some(format!("this host's KVM cannot run the guest: {detail}")));
        }
        "vmm-error" | "shutdown" => {
            return (Status::Error, Some(format!("{}: {}", exit.reason, exit.detail.clone().unwrap_or_default())));
        }
        _ => {}
    }
    if let Some(crash) = &record.crash {
        return (Status::Fail, Some(format!("{}: {}", crash.kind, crash.line)));
    }
    match exit.reason.as_str() {
        "poweroff" => {}
        "timeout" => return (Status::Fail, Some(format!("hung: still running after {timeout_s} s"))),
        other => return (Status::Fail, Some(format!("the guest ended with {other}"))),
    }
    if let Some(d) = exit.devices.iter().find(|d| d.device.error.is_some()) {
        return (
            Status::Error,
            Some(format!("device {}: {}", d.device.device, d.device.error.clone().unwrap_or_default())),
        );
    }
    let report = ProbeReport::parse(serial);
    match report.done() {
        None => (Status::Fail, Some("the probe did not finish its report".into())),
        Some(done) if !done.ok => (Status::Fail, Some(done.failures.join("; "))),
        Some(_) if record.workload.rx_packets.is_none() => (Status::Fail, Some("the workload reported nothing".into())),
        Some(_) => (Status::Pass, None),
    }
}

fn hang(silence: Duration) -> Crash {
    Crash {
        kind: "hang".into(),
        line: format!("no serial output for {:.0} s", silence.as_secs_f64()),
        frames: Vec::new(),
        fingerprint: "hang".into(),
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
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

/// What the watchdog saw.
struct Watched {
    /// When the control socket first answered, from the VMM's spawn.
    answered_ms: Option<f64>,
    /// The last live counters read.
    last: Option<LiveCounters>,
    /// Set when the watchdog stopped a silent guest: how long it was silent.
    silent_for: Option<Duration>,
}

/// Reads the live counters while the VM runs; stops a guest whose serial ports stay silent.
struct Watchdog {
    done: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Watched>,
}

impl Watchdog {
    fn start(socket: &Path, silence: Duration, spawned: Instant) -> Watchdog {
        let (done, stop) = std::sync::mpsc::channel::<()>();
        let client = ControlClient::new(socket, Duration::from_secs(2));
        let thread = std::thread::spawn(move || {
            let mut watched = Watched { answered_ms: None, last: None, silent_for: None };
            let mut bytes_seen = 0u64;
            let mut quiet_since = Instant::now();
            loop {
                // Often until the socket answers (that is the VM's start time), then calmly; a
                // word on `stop` (or its sender gone) ends the watch at once.
                let period = if watched.answered_ms.is_some() { WATCH_PERIOD } else { Duration::from_millis(2) };
                match stop.recv_timeout(period) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
                let Ok(counters) = client.counters() else { continue };
                watched.answered_ms.get_or_insert(ms(spawned.elapsed()));
                let bytes = counters.serial_bytes + counters.com2_bytes.unwrap_or(0);
                if bytes != bytes_seen {
                    bytes_seen = bytes;
                    quiet_since = Instant::now();
                } else if quiet_since.elapsed() >= silence && watched.silent_for.is_none() {
                    tracing::warn!("the guest has been silent for {silence:?}; stopping it");
                    watched.silent_for = Some(quiet_since.elapsed());
                    let _ = client.shutdown(ShutdownRequest { grace_s: Some(0.0) });
                }
                watched.last = Some(counters);
            }
            watched
        });
        Watchdog { done, thread }
    }

    fn stop(self) -> Watched {
        let _ = self.done.send(());
        self.thread.join().unwrap_or(Watched { answered_ms: None, last: None, silent_for: None })
    }
}

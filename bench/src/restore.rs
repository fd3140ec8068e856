//! `bench restore`: a cell started from a snapshot against the same cell booted, in the same run.
//!
//! The cell is the probe guest shaped as the lab runs a NIC cell: a virtio-iommu, the AQC100
//! model's Thunderbolt slot empty, the probe holding (its checks done) for the power button.
//! One VM is booted to that point and snapshotted; then, interleaved, each run boots the cell
//! cold or restores it, and plugs the model into the slot. Timed from the VMM's spawn: to the
//! guest running (the control socket says so) and to a ready cell (the guest at its holding
//! point and the NIC plugged). The probe binds no driver and brings no link up; a Linux cell's
//! ready point is the nested box's to measure.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engines::model_process::ModelProcess;
use engines::vm_control::ControlClient;
use engines::vm_process::{RunningVm, VmProcess};
use engines::{Program, Programs};
use vm_spec::ExitReason;
use vm_spec::control::{ShutdownRequest, VmState};

use crate::BenchError;

/// What the restore benchmark runs.
pub struct RestoreBenchConfig<'a> {
    /// The VMM and the model.
    pub programs: &'a Programs,
    /// Runs of each kind.
    pub runs: usize,
    /// Guest memory.
    pub memory_mib: u64,
    /// A folder for the snapshot, sockets and consoles.
    pub dir: &'a Path,
}

/// One run's times from the VMM's spawn, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct RestoreSample {
    /// To the control socket saying the vCPUs run.
    pub running_ms: f64,
    /// To a ready cell: the guest at its holding point, the NIC plugged.
    pub ready_ms: f64,
    /// The VMM's own `setup_ms`.
    pub setup_ms: f64,
}

/// What the restore benchmark measured.
#[derive(Debug)]
pub struct RestoreBench {
    /// Cells booted cold.
    pub cold: Vec<RestoreSample>,
    /// Cells restored from the snapshot.
    pub restored: Vec<RestoreSample>,
    /// The snapshot's exit-line figures.
    pub snapshot: vm_spec::SnapshotWritten,
}

/// How a run starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    Cold,
    Restored,
}

const HOLDING: &str = "{\"probe\":\"holding\"";

/// Takes the snapshot, then times `runs` cold and `runs` restored cells, interleaved.
pub fn restore(config: &RestoreBenchConfig) -> Result<RestoreBench, BenchError> {
    let snapshot_dir = config.dir.join("snapshot");
    let snapshot = take_snapshot(config, &snapshot_dir)?;
    let (mut cold, mut restored) = (Vec::new(), Vec::new());
    for run in 0..config.runs {
        for start in [Start::Cold, Start::Restored] {
            let sample = one_run(config, &snapshot_dir, start, run)?;
            if start == Start::Cold { cold.push(sample) } else { restored.push(sample) }
        }
    }
    Ok(RestoreBench { cold, restored, snapshot })
}

/// The VMM's flags for the cell: booted (`None`) or restored from `snapshot`.
fn cell_args(config: &RestoreBenchConfig, slot: &str, console: &Path, restore: Option<&Path>) -> Vec<String> {
    let mut args: Vec<String> = match restore {
        Some(snapshot) => vec!["--restore".into(), snapshot.display().to_string()],
        None => [
            "--kernel",
            "probe",
            "--iommu",
            "--cmdline",
            "probe.hold=600000",
            "--memory",
            &config.memory_mib.to_string(),
        ]
        .map(String::from)
        .to_vec(),
    };
    args.extend(["--device".into(), slot.into(), "--serial".into(), console.display().to_string()]);
    args
}

fn model(config: &RestoreBenchConfig) -> Result<(ModelProcess, String), BenchError> {
    let model = ModelProcess::start(&config.programs.model, "aqc100", &[])?;
    let device = format!("vfio-user={}", model.socket().display());
    Ok((model, device))
}

/// Boots the cell to its holding point and snapshots it into `dir`.
fn take_snapshot(config: &RestoreBenchConfig, dir: &Path) -> Result<vm_spec::SnapshotWritten, BenchError> {
    let (model, device) = model(config)?;
    let console = config.dir.join("snapshot.log");
    let socket = config.dir.join("snapshot.sock");
    let mut args = cell_args(config, &format!("{device},slot=thunderbolt,plugged=false"), &console, None);
    args.extend(["--snapshot-to".into(), dir.display().to_string()]);
    let vm = start(&config.programs.vmm, args, &socket)?;
    let bad = |detail: String| BenchError::BadRun { engine: "snapshot", run: 0, detail };
    wait_for_console(&console, HOLDING).ok_or_else(|| bad("the probe never held".into()))?;
    ControlClient::new(&socket, Duration::from_secs(5)).snapshot().map_err(|e| bad(e.to_string()))?;
    let out = vm.wait()?;
    drop(model);
    match out.exit.and_then(|e| e.snapshot) {
        Some(written) => Ok(written),
        None => Err(bad(format!("no snapshot written: {}", out.stderr.lines().last().unwrap_or_default()))),
    }
}

fn start(vmm: &Program, args: Vec<String>, socket: &Path) -> Result<RunningVm, BenchError> {
    Ok(VmProcess::with_args(vmm, args, Duration::from_secs(120)).with_control(socket).start()?)
}

/// One cell, booted or restored, timed to running and to ready, then powered off.
fn one_run(config: &RestoreBenchConfig, snapshot: &Path, how: Start, run: usize) -> Result<RestoreSample, BenchError> {
    let name = if how == Start::Cold { "cold" } else { "restored" };
    let bad = |detail: String| BenchError::BadRun { engine: name, run, detail };
    let (model, device) = model(config)?;
    let console = config.dir.join(format!("{name}-{run}.log"));
    let socket = config.dir.join(format!("{name}-{run}.sock"));
    let slot = format!("{device},slot=thunderbolt,plugged=false");
    let restore = (how == Start::Restored).then_some(snapshot);
    let spawned = Instant::now();
    let vm = start(&config.programs.vmm, cell_args(config, &slot, &console, restore), &socket)?;
    let control = ControlClient::new(&socket, Duration::from_secs(5));
    let running = poll(|| control.info().is_ok_and(|i| i.state == VmState::Running))
        .ok_or_else(|| bad("the VM never ran".into()))?;
    let running_ms = ms(running - spawned);
    if how == Start::Cold {
        wait_for_console(&console, HOLDING).ok_or_else(|| bad("the probe never held".into()))?;
    }
    control.plug(&device).map_err(|e| bad(format!("plugging the NIC: {e}")))?;
    let ready_ms = ms(spawned.elapsed());
    control.shutdown(ShutdownRequest::default()).map_err(|e| bad(e.to_string()))?;
    let out = vm.wait()?;
    drop(model);
    let exit = out.exit.ok_or_else(|| bad(format!("no exit line: {}", out.stderr)))?;
    if exit.reason != ExitReason::Poweroff || (how == Start::Restored) != exit.restored.is_some() {
        return Err(bad(format!("ended {} (restored: {:?})", exit.reason, exit.restored)));
    }
    let _ = std::fs::remove_file(&console);
    Ok(RestoreSample { running_ms, ready_ms, setup_ms: exit.setup_ms })
}

/// Polls `ready` every 100 µs for up to a minute; when it became true.
fn poll(mut ready: impl FnMut() -> bool) -> Option<Instant> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if ready() {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

fn wait_for_console(console: &Path, what: &str) -> Option<Instant> {
    poll(|| std::fs::read_to_string(console).is_ok_and(|text| text.contains(what)))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A folder for the benchmark's files.
pub fn scratch_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("driverlab-bench-restore-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

//! Benchmarks that print figures (never assertions): boot-to-poweroff of the probe guest under
//! driverlab, side by side with QEMU and Cloud Hypervisor booting the same ELF in the same run; virtio-iommu round
//! trips; and the NIC ([`nic`]).

pub mod lab_cost;
pub mod linux_boot;
pub mod nic;
pub mod restore;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vm_spec::counters::IommuCounts;
use vm_spec::{IommuSpec, Kernel, VmSpec};

use engines::probe_report::ProbeReport;
use engines::vm_process::{ProcessError, VmProcess};
use lab::stats::Summary;

/// Errors running a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A driverlab run failed to start.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A device model failed to start.
    #[error(transparent)]
    Model(#[from] engines::model_process::ModelError),
    /// A run did not end with the probe's `done` line and a poweroff.
    #[error("{engine} run {run}: {detail}")]
    BadRun {
        /// Which engine.
        engine: &'static str,
        /// Which run.
        run: usize,
        /// What happened.
        detail: String,
    },
    /// An input of the benchmark is missing or unusable.
    #[error("{0}")]
    Input(String),
    /// Another VMM could not be started.
    #[error("cannot run {engine} ({binary}): {source} (scripts/bench-boot.sh installs qemu-system-x86)", binary = binary.display())]
    Engine {
        /// Which engine.
        engine: &'static str,
        /// Its binary.
        binary: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
}

/// What the boot benchmark measured.
#[derive(Debug)]
pub struct BootBench {
    /// driverlab wall times, spawn to exit.
    pub driverlab: Vec<Duration>,
    /// driverlab's own `run_ms` (vCPUs started to poweroff).
    pub driverlab_in_vm: Vec<Duration>,
    /// driverlab wall times with `--no-jail`: what the jail costs, measured in the same run.
    pub driverlab_unjailed: Vec<Duration>,
    /// Wall times of `driverlab vm run` of the one big binary, when `vmm` was the small one:
    /// what the small binary saves, measured in the same run.
    pub driverlab_one_binary: Vec<Duration>,
    /// QEMU wall times, spawn to exit, if QEMU was run.
    pub qemu: Vec<Duration>,
    /// Cloud Hypervisor wall times, spawn to exit, if it was run.
    pub cloud_hypervisor: Vec<Duration>,
}

impl BootBench {
    /// driverlab's median wall time over QEMU's.
    pub fn ratio(&self) -> Option<f64> {
        ratio(&self.driverlab, &self.qemu)
    }

    /// driverlab's median wall time over Cloud Hypervisor's.
    pub fn ratio_to_cloud_hypervisor(&self) -> Option<f64> {
        ratio(&self.driverlab, &self.cloud_hypervisor)
    }
}

fn ratio(ours: &[Duration], theirs: &[Duration]) -> Option<f64> {
    Some(Summary::of_millis(ours)?.median / Summary::of_millis(theirs)?.median)
}

/// How to run the boot benchmark.
pub struct BootBenchConfig<'a> {
    /// driverlab's VMM (`driverlab-vmm`, or `driverlab vm run`).
    pub vmm: &'a engines::Program,
    /// `driverlab vm run` of the big binary, to time beside the small `vmm`.
    pub one_binary: Option<&'a engines::Program>,
    /// The probe ELF, for the other VMMs.
    pub probe_elf: &'a Path,
    /// QEMU, if it should run alongside.
    pub qemu: Option<&'a Path>,
    /// A `cloud-hypervisor` binary, if it should run alongside.
    pub cloud_hypervisor: Option<&'a Path>,
    /// Runs per engine.
    pub runs: usize,
    /// Guest memory in MiB.
    pub memory_mib: u64,
}

/// Boots the probe `runs` times under each engine, interleaved (driverlab, QEMU, Cloud
/// Hypervisor, driverlab, ...), and records wall times.
pub fn boot(config: &BootBenchConfig) -> Result<BootBench, BenchError> {
    let memory = config.memory_mib.to_string();
    let spec = VmSpec { memory_mib: config.memory_mib, ..VmSpec::new(Kernel::Probe) };
    let unjailed = VmSpec { jail: false, ..spec.clone() };
    let one_binary = config.one_binary.map(|program| VmProcess::new(program, spec.clone(), Duration::from_secs(30)));
    let ours = VmProcess::new(config.vmm, spec, Duration::from_secs(30));
    let ours_unjailed = VmProcess::new(config.vmm, unjailed, Duration::from_secs(30));
    let mut result = BootBench {
        driverlab: Vec::new(),
        driverlab_in_vm: Vec::new(),
        driverlab_unjailed: Vec::new(),
        driverlab_one_binary: Vec::new(),
        qemu: Vec::new(),
        cloud_hypervisor: Vec::new(),
    };
    for run in 0..config.runs {
        let out = ours.run()?;
        let done = ProbeReport::parse(&out.serial).done();
        if out.code() != Some(0) || !done.is_some_and(|d| d.ok) {
            return Err(BenchError::BadRun { engine: "driverlab", run, detail: probe_unfinished(&out.stderr) });
        }
        result.driverlab.push(out.wall);
        if let Some(exit) = out.exit {
            result.driverlab_in_vm.push(Duration::from_secs_f64(exit.run_ms / 1e3));
        }
        let out = ours_unjailed.run()?;
        if out.code() != Some(0) {
            let detail = probe_unfinished(&out.stderr);
            return Err(BenchError::BadRun { engine: "driverlab --no-jail", run, detail });
        }
        result.driverlab_unjailed.push(out.wall);
        if let Some(one_binary) = &one_binary {
            let out = one_binary.run()?;
            if out.code() != Some(0) {
                let detail = probe_unfinished(&out.stderr);
                return Err(BenchError::BadRun { engine: "driverlab vm run", run, detail });
            }
            result.driverlab_one_binary.push(out.wall);
        }
        if let Some(qemu) = config.qemu {
            let mut command = Command::new(qemu);
            command
                .args(["-M", "microvm", "-accel", "kvm", "-m", memory.as_str(), "-kernel"])
                .arg(config.probe_elf)
                .args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "stdio"])
                .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"]);
            result.qemu.push(timed_boot("qemu", command, run)?);
        }
        if let Some(ch) = config.cloud_hypervisor {
            let mut command = Command::new(ch);
            command
                .arg("--kernel")
                .arg(config.probe_elf)
                .args(["--cpus", "boot=1", "--memory", &format!("size={memory}M")])
                .args(["--serial", "tty", "--console", "off"]);
            result.cloud_hypervisor.push(timed_boot("cloud-hypervisor", command, run)?);
        }
    }
    Ok(result)
}

/// One boot of the probe by another VMM, spawn to exit; the run counts if the probe finished its
/// report (`done`), whatever its verdict on that VMM's platform.
fn timed_boot(engine: &'static str, mut command: Command, run: usize) -> Result<Duration, BenchError> {
    let start = Instant::now();
    let out = command.stdin(Stdio::null()).output().map_err(|source| BenchError::Engine {
        engine,
        binary: PathBuf::from(command.get_program()),
        source,
    })?;
    let wall = start.elapsed();
    let serial = String::from_utf8_lossy(&out.stdout);
    if ProbeReport::parse(&serial).done().is_none() {
        return Err(BenchError::BadRun {
            engine,
            run,
            detail: probe_unfinished(&String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(wall)
}

/// A run's detail when the probe did not finish its report.
fn probe_unfinished(stderr: &str) -> String {
    format!("the probe did not complete its report: {}", stderr.trim())
}

/// What the virtio-iommu benchmark measured: the probe's `viommu` section and the VMM's counts.
#[derive(Debug)]
pub struct ViommuBench {
    /// The probe's `viommu` section.
    pub guest: serde_json::Value,
    /// The exit line's `viommu` counts.
    pub device: Option<IommuCounts>,
}

/// Boots the probe under Cloud Hypervisor (`ch`, its ELF at `probe_elf`) with a virtio-rng
/// behind its virtio-iommu and `probe.viommu_ops=ops`; returns the probe's `viommu` section. The
/// probe's own verdict on Cloud Hypervisor's platform does not matter here, only that it drove
/// the virtio-iommu.
pub fn viommu_cloud_hypervisor(ch: &Path, probe_elf: &Path, ops: u32) -> Result<serde_json::Value, BenchError> {
    let engine = "cloud-hypervisor";
    let mut command = Command::new(ch);
    command
        .arg("--kernel")
        .arg(probe_elf)
        .args(["--cpus", "boot=1", "--memory", "size=256M", "--serial", "tty", "--console", "off"])
        .args(["--rng", "src=/dev/urandom,iommu=on", "--cmdline", &format!("probe.viommu_ops={ops}")]);
    let out = command.stdin(Stdio::null()).output().map_err(|source| BenchError::Engine {
        engine,
        binary: ch.to_path_buf(),
        source,
    })?;
    let serial = String::from_utf8_lossy(&out.stdout);
    let report = ProbeReport::parse(&serial);
    match report.section("viommu") {
        Some(section) if section["attached"] == true => Ok(section.clone()),
        other => Err(BenchError::BadRun {
            engine,
            run: 0,
            detail: format!(
                "the probe's viommu section: {}; stderr: {}",
                other.map_or("none".to_string(), |s| s.to_string()),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }),
    }
}

/// Boots the probe with `--iommu` and `probe.viommu_ops=ops`; returns its measurements.
pub fn viommu(vmm: &engines::Program, ops: u32) -> Result<ViommuBench, BenchError> {
    let spec = VmSpec {
        cmdline: format!("probe.viommu_ops={ops}"),
        iommu: Some(IommuSpec::default()),
        timeout_s: Some(600.0),
        ..VmSpec::new(Kernel::Probe)
    };
    let out = VmProcess::new(vmm, spec, Duration::from_secs(60)).run()?;
    let report = ProbeReport::parse(&out.serial);
    let done = report.done();
    let guest = report.section("viommu").cloned();
    match (out.code(), done, guest) {
        (Some(0), Some(done), Some(guest)) if done.ok => {
            Ok(ViommuBench { guest, device: out.exit.and_then(|e| e.viommu) })
        }
        (code, done, _) => Err(BenchError::BadRun {
            engine: "driverlab",
            run: 0,
            detail: format!("exit code {code:?}, probe {done:?}, stderr: {}", out.stderr.trim()),
        }),
    }
}

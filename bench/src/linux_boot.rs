//! The Linux boot benchmark: one kernel and one initramfs (whose `/init` prints a line and powers
//! off at once, [`guest_images::boot_initramfs`]) booted under driverlab, QEMU with KVM
//! (`-M microvm`, and `q35` if asked) and Cloud Hypervisor if given, interleaved run by run; for
//! each boot the time from spawning the engine to the init's line on the console and to the
//! engine's exit, and driverlab's exit census.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use guest_images::boot_initramfs::{INIT_LINE, is_init_line, kernel_timestamp};
use serde::{Deserialize, Serialize};
use vm_spec::{ExitCounts, ExitSummary};

use super::BenchError;
use engines::qemu::Qemu;
use lab::stats::Summary;

/// The command line every engine gives the kernel: the console on the first serial port, as
/// every engine has one there, and no messages beyond the kernel's warnings.
pub const CMDLINE: &str = "console=ttyS0 panic=-1 quiet";
/// How many of its console's last lines a failed boot's error quotes.
const CONSOLE_TAIL: usize = 6;
/// The longest one boot may take before it counts as hung (a nested box's take about ten
/// seconds; hardware's well under one).
const BOOT_LIMIT: Duration = Duration::from_secs(120);
/// Most failed boots a benchmark runs again on a host TCG emulates.
const MAX_RERUNS: usize = 3;

/// An engine of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinuxEngine {
    /// `driverlab vm run`.
    Driverlab,
    /// QEMU `-M microvm -accel kvm`.
    QemuMicrovm,
    /// QEMU `-M q35 -accel kvm` (SeaBIOS first).
    QemuQ35,
    /// Cloud Hypervisor.
    CloudHypervisor,
}

impl LinuxEngine {
    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            LinuxEngine::Driverlab => "driverlab",
            LinuxEngine::QemuMicrovm => "qemu -M microvm",
            LinuxEngine::QemuQ35 => "qemu -M q35",
            LinuxEngine::CloudHypervisor => "cloud-hypervisor",
        }
    }
}

/// QEMU as the benchmark runs it: the QEMU engine's chroot, or a binary on this host.
#[derive(Debug, Clone)]
pub enum QemuBinary {
    /// The QEMU engine's forky chroot.
    Chroot(Qemu),
    /// A `qemu-system-x86_64` binary.
    Binary(PathBuf),
}

impl QemuBinary {
    fn command(&self, args: &[String]) -> Command {
        match self {
            QemuBinary::Chroot(qemu) => qemu.command(args),
            QemuBinary::Binary(path) => {
                let mut command = Command::new(path);
                command.args(args);
                command
            }
        }
    }
}

/// What to boot, how often and under what.
#[derive(Debug, Clone)]
pub struct LinuxBootConfig {
    /// driverlab's VMM (`driverlab-vmm`, or `driverlab vm run`).
    pub vmm: engines::Program,
    /// The kernel (an ELF vmlinux with its PVH note, or a bzImage), the same for every engine.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// QEMU, if it runs alongside.
    pub qemu: Option<QemuBinary>,
    /// QEMU's q35 machine as well as microvm.
    pub q35: bool,
    /// A `cloud-hypervisor` binary, if it runs alongside.
    pub cloud_hypervisor: Option<PathBuf>,
    /// Boots per engine.
    pub runs: usize,
    /// Guest memory in MiB.
    pub memory_mib: u64,
    /// Run a boot that failed (hung, or ended without the init's line) once more instead of
    /// giving up: on a host whose CPU TCG emulates, where that may be the emulator's doing
    /// (docs/nested-box.md); each such boot is listed in the result.
    pub rerun_failed: bool,
}

impl LinuxBootConfig {
    /// The engines, in the order each round runs them.
    pub fn engines(&self) -> Vec<LinuxEngine> {
        let mut engines = vec![LinuxEngine::Driverlab];
        if self.qemu.is_some() {
            engines.push(LinuxEngine::QemuMicrovm);
            if self.q35 {
                engines.push(LinuxEngine::QemuQ35);
            }
        }
        if self.cloud_hypervisor.is_some() {
            engines.push(LinuxEngine::CloudHypervisor);
        }
        engines
    }

    fn command(&self, engine: LinuxEngine) -> Command {
        let memory = self.memory_mib.to_string();
        let (kernel, initrd) = (self.kernel.display().to_string(), self.initrd.display().to_string());
        match engine {
            LinuxEngine::Driverlab => {
                let mut command = self.vmm.command(["--kernel", &kernel, "--initrd", &initrd, "--cmdline", CMDLINE]);
                command.args(["--memory", &memory]);
                command
            }
            LinuxEngine::QemuMicrovm | LinuxEngine::QemuQ35 => {
                let machine = if engine == LinuxEngine::QemuQ35 { "q35" } else { "microvm" };
                let args: Vec<String> = [
                    "-M",
                    machine,
                    "-accel",
                    "kvm",
                    "-cpu",
                    "host",
                    "-m",
                    &memory,
                    "-smp",
                    "1",
                    "-nodefaults",
                    "-no-user-config",
                    "-display",
                    "none",
                    "-serial",
                    "stdio",
                    "-no-reboot",
                    "-kernel",
                    &kernel,
                    "-initrd",
                    &initrd,
                    "-append",
                    CMDLINE,
                ]
                .map(String::from)
                .into();
                self.qemu.as_ref().expect("QEMU runs only when given").command(&args)
            }
            LinuxEngine::CloudHypervisor => {
                let mut command = Command::new(self.cloud_hypervisor.as_ref().expect("given"));
                command.args(["--kernel", &kernel, "--initramfs", &initrd, "--cmdline", CMDLINE]);
                command.args(["--cpus", "boot=1", "--memory", &format!("size={memory}M")]);
                command.args(["--serial", "tty", "--console", "off"]);
                command
            }
        }
    }
}

/// One engine's boots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineBoots {
    /// The engine.
    pub engine: LinuxEngine,
    /// Spawn to the init's line, ms, one per boot.
    pub to_init_ms: Vec<f64>,
    /// Spawn to the engine's exit, ms, one per boot.
    pub to_exit_ms: Vec<f64>,
    /// The guest kernel's own clock at the init's line (the line's timestamp), ms, one per boot
    /// whose line had one: the guest's share of the time to init; the rest is the engine's
    /// (process start, set-up, firmware) before the kernel's clock starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guest_ms: Vec<f64>,
    /// driverlab only: its own set-up, ms, one per boot (the exit line's `setup_ms`: the kernel
    /// and initramfs read and loaded, the VM, the platform, the vCPUs, the jail).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup_ms: Vec<f64>,
    /// driverlab only: where each boot's set-up went, phase by phase (the exit line's `setup`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup_phases: Vec<vm_spec::exit::SetupPhases>,
}

impl EngineBoots {
    /// Medians and spread of the time to init.
    pub fn to_init(&self) -> Option<Summary> {
        Summary::of(&self.to_init_ms)
    }

    /// Medians and spread of the time to exit.
    pub fn to_exit(&self) -> Option<Summary> {
        Summary::of(&self.to_exit_ms)
    }

    /// Medians and spread of the guest's own time to init, and of the rest of the time to init
    /// (the engine's), when every boot's line had the kernel's timestamp.
    pub fn split(&self) -> Option<(Summary, Summary)> {
        if self.guest_ms.len() != self.to_init_ms.len() {
            return None;
        }
        let outside: Vec<f64> = self.to_init_ms.iter().zip(&self.guest_ms).map(|(all, guest)| all - guest).collect();
        Some((Summary::of(&self.guest_ms)?, Summary::of(&outside)?))
    }
}

/// What the benchmark measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinuxBootBench {
    /// The kernel command line every engine gave.
    pub cmdline: String,
    /// Boots per engine.
    pub runs: usize,
    /// Guest memory in MiB.
    pub memory_mib: u64,
    /// Each engine's boots, in the order each round ran them.
    pub engines: Vec<EngineBoots>,
    /// driverlab's exit census of its last boot: exits by kind and the busiest ports.
    pub census: Option<ExitCounts>,
    /// Boots that failed and were run again (only on a host TCG emulates), each with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rerun: Vec<String>,
}

impl LinuxBootBench {
    /// An engine's boots.
    pub fn engine(&self, engine: LinuxEngine) -> Option<&EngineBoots> {
        self.engines.iter().find(|e| e.engine == engine)
    }

    /// driverlab's median time to init over `other`'s.
    pub fn ratio_to_init(&self, other: LinuxEngine) -> Option<f64> {
        let median = |e: LinuxEngine| Some(self.engine(e)?.to_init()?.median);
        Some(median(LinuxEngine::Driverlab)? / median(other)?)
    }
}

/// One boot: spawn to the init's line and to the exit, and the engine's stderr.
struct Boot {
    to_init: Duration,
    /// The kernel's timestamp on the init's line, seconds.
    guest_at_init: Option<f64>,
    to_exit: Duration,
    stderr: String,
}

/// Boots `config.runs` times under each engine, interleaved (driverlab, QEMU microvm, QEMU q35,
/// Cloud Hypervisor, driverlab, ...). `progress` hears of each boot.
pub fn run(config: &LinuxBootConfig, progress: &dyn Fn(&str)) -> Result<LinuxBootBench, BenchError> {
    let engines = config.engines();
    let mut result = LinuxBootBench {
        cmdline: CMDLINE.into(),
        runs: config.runs,
        memory_mib: config.memory_mib,
        engines: engines
            .iter()
            .map(|&engine| EngineBoots {
                engine,
                to_init_ms: Vec::new(),
                to_exit_ms: Vec::new(),
                guest_ms: Vec::new(),
                setup_ms: Vec::new(),
                setup_phases: Vec::new(),
            })
            .collect(),
        census: None,
        rerun: Vec::new(),
    };
    for run in 0..config.runs {
        for (i, &engine) in engines.iter().enumerate() {
            let boot = match boot_once(config.command(engine), engine, run) {
                Ok(boot) => boot,
                Err(e) if config.rerun_failed && result.rerun.len() < MAX_RERUNS => {
                    progress(&format!("{e}; booting it again"));
                    result.rerun.push(e.to_string());
                    boot_once(config.command(engine), engine, run)?
                }
                Err(e) => return Err(e),
            };
            let boots = &mut result.engines[i];
            boots.to_init_ms.push(ms(boot.to_init));
            boots.to_exit_ms.push(ms(boot.to_exit));
            boots.guest_ms.extend(boot.guest_at_init.map(|s| s * 1000.0));
            if engine == LinuxEngine::Driverlab {
                let exit = ExitSummary::find_in(&boot.stderr).filter(|e| e.reason == vm_spec::ExitReason::Poweroff);
                let Some(exit) = exit else {
                    return Err(bad_run(engine, run, "it did not end with a poweroff exit line", &boot.stderr));
                };
                result.engines[i].setup_ms.push(exit.setup_ms);
                result.engines[i].setup_phases.extend(exit.setup);
                result.census = Some(exit.exits);
            }
            progress(&format!(
                "run {}/{} {}: init {:.1} ms, exit {:.1} ms",
                run + 1,
                config.runs,
                engine.name(),
                ms(boot.to_init),
                ms(boot.to_exit)
            ));
        }
    }
    Ok(result)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn bad_run(engine: LinuxEngine, run: usize, what: &str, stderr: &str) -> BenchError {
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
    let last: String = last.chars().take(300).collect();
    BenchError::BadRun { engine: engine.name(), run, detail: format!("{what}; its last words: {last}") }
}

/// Spawns `command`, notes when the init's line reaches its stdout and when it exits.
fn boot_once(mut command: Command, engine: LinuxEngine, run: usize) -> Result<Boot, BenchError> {
    let start = Instant::now();
    let mut child =
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|source| {
            BenchError::Engine { engine: engine.name(), binary: command.get_program().into(), source }
        })?;
    let (stdout, mut stderr) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
    let (seen, init_seen) = mpsc::channel();
    // The console's lines are read as they come; the last one is kept for a boot that fails.
    let reader = std::thread::spawn(move || {
        let mut last: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        for line in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            if is_init_line(&line) {
                let _ = seen.send((start.elapsed(), kernel_timestamp(&line)));
            }
            if !line.trim().is_empty() {
                if last.len() == CONSOLE_TAIL {
                    last.pop_front();
                }
                last.push_back(line);
            }
        }
        Vec::from(last).join(" | ")
    });
    let errors = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    // Waited for, not polled: on a host TCG emulates, a poll loop takes CPU from the boot it times.
    let pid = child.id();
    let (ended, exit) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        let _ = ended.send(start.elapsed());
        status
    });
    let to_exit = match exit.recv_timeout(BOOT_LIMIT.saturating_sub(start.elapsed())) {
        Ok(to_exit) => to_exit,
        Err(_) => {
            // The child's PID: it is not reaped until the waiter's wait returns.
            if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            let _ = waiter.join();
            let console = reader.join().unwrap_or_default();
            let stderr = errors.join().unwrap_or_default();
            let what = format!("still running after {BOOT_LIMIT:?}; its console's last lines: {console:?}");
            return Err(bad_run(engine, run, &what, &stderr));
        }
    };
    if let Ok(Err(e)) = waiter.join() {
        return Err(bad_run(engine, run, &format!("waiting for it: {e}"), ""));
    }
    let console = reader.join().unwrap_or_default();
    let stderr = errors.join().unwrap_or_default();
    match init_seen.try_recv() {
        Ok((to_init, guest_at_init)) => Ok(Boot { to_init, guest_at_init, to_exit, stderr }),
        Err(_) => {
            let what = format!("its console never showed {INIT_LINE:?} (its last lines: {console:?})");
            Err(bad_run(engine, run, &what, &stderr))
        }
    }
}

/// The table `driverlab bench boot --linux` prints.
pub fn table(bench: &LinuxBootBench) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Linux boot to init and to exit, {} MiB, {} runs per engine, interleaved; ms from spawning the engine \
         (kernel command line {:?})",
        bench.memory_mib, bench.runs, bench.cmdline
    );
    let _ = writeln!(
        out,
        "{:<20} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "engine", "n", "init p10", "init med", "init p90", "exit med", "exit p90"
    );
    for boots in &bench.engines {
        if let (Some(init), Some(exit)) = (boots.to_init(), boots.to_exit()) {
            let _ = writeln!(
                out,
                "{:<20} {:>4} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                boots.engine.name(),
                init.n,
                init.p10,
                init.median,
                init.p90,
                exit.median,
                exit.p90
            );
        }
    }
    let splits: Vec<String> = bench
        .engines
        .iter()
        .filter_map(|boots| {
            let (guest, outside) = boots.split()?;
            Some(format!("{} {:.1} + {:.1}", boots.engine.name(), outside.median, guest.median))
        })
        .collect();
    if !splits.is_empty() {
        let _ = writeln!(
            out,
            "time to init, the engine's + the guest kernel's own (its clock at the init's line), median ms: {}",
            splits.join(", ")
        );
    }
    if let Some(setup) = bench.engine(LinuxEngine::Driverlab).and_then(|b| Summary::of(&b.setup_ms)) {
        let _ = writeln!(
            out,
            "{:<20} {:>4} {:>10.1} {:>10.1} {:>10.1}",
            "  of which set-up", setup.n, setup.p10, setup.median, setup.p90
        );
    }
    if let Some(boots) = bench.engine(LinuxEngine::Driverlab).filter(|b| !b.setup_phases.is_empty()) {
        type Phase = (&'static str, fn(&vm_spec::exit::SetupPhases) -> f64);
        let phases: [Phase; 6] = [
            ("image", |p| p.image_ms),
            ("load", |p| p.load_ms),
            ("kvm", |p| p.kvm_ms),
            ("platform", |p| p.platform_ms),
            ("vcpus", |p| p.vcpus_ms),
            ("jail", |p| p.jail_ms),
        ];
        let medians: Vec<String> = phases
            .iter()
            .filter_map(|(name, of)| {
                let samples: Vec<f64> = boots.setup_phases.iter().map(of).collect();
                Summary::of(&samples).map(|s| format!("{name} {:.1} (p90 {:.1})", s.median, s.p90))
            })
            .collect();
        let _ = writeln!(out, "driverlab's set-up by phase, median ms: {}", medians.join(", "));
    }
    for other in [LinuxEngine::QemuMicrovm, LinuxEngine::QemuQ35, LinuxEngine::CloudHypervisor] {
        if let Some(ratio) = bench.ratio_to_init(other) {
            let _ = writeln!(out, "driverlab / {} (median time to init): {ratio:.3}", other.name());
        }
    }
    for rerun in &bench.rerun {
        let _ = writeln!(out, "run again after it failed (a host TCG emulates): {rerun}");
    }
    if let Some(census) = &bench.census {
        let _ = writeln!(
            out,
            "driverlab's exit census (last boot): {} port exits, {} MMIO exits, {} unclaimed",
            census.io, census.mmio, census.unclaimed
        );
        let ports: Vec<String> =
            census.top_ports.iter().map(|p| format!("{} {}+{}", p.addr, p.claimed, p.unclaimed)).collect();
        if !ports.is_empty() {
            let _ = writeln!(out, "busiest ports (claimed+unclaimed): {}", ports.join(", "));
        }
    }
    out
}

/// Where the benchmark's inputs are: the kernel given, and the initramfs given or built into
/// `scratch`.
pub fn initramfs_in(scratch: &Path, given: Option<&Path>) -> Result<PathBuf, BenchError> {
    if let Some(path) = given {
        return Ok(path.to_path_buf());
    }
    let archive = guest_images::boot_initramfs::build().map_err(|e| BenchError::Input(e.to_string()))?;
    let path = scratch.join("boot-initramfs.cpio.gz");
    std::fs::write(&path, archive).map_err(|e| BenchError::Input(format!("{}: {e}", path.display())))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(qemu: bool, q35: bool, ch: bool) -> LinuxBootConfig {
        LinuxBootConfig {
            vmm: engines::Program::driverlab_vm("/d/driverlab"),
            kernel: "/k/vmlinux".into(),
            initrd: "/k/init.cpio.gz".into(),
            qemu: qemu.then(|| QemuBinary::Binary("/q/qemu-system-x86_64".into())),
            q35,
            cloud_hypervisor: ch.then(|| PathBuf::from("/c/cloud-hypervisor")),
            runs: 10,
            memory_mib: 256,
            rerun_failed: false,
        }
    }

    fn args(command: &Command) -> String {
        command.get_args().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn every_engine_boots_the_same_kernel_initramfs_and_command_line() {
        let all = config(true, true, true);
        use LinuxEngine::*;
        assert_eq!(all.engines(), [Driverlab, QemuMicrovm, QemuQ35, CloudHypervisor]);
        assert_eq!(config(true, true, false).engines(), [Driverlab, QemuMicrovm, QemuQ35]);
        assert_eq!(config(false, true, false).engines(), [Driverlab], "q35 is QEMU's");
        for engine in all.engines() {
            let a = args(&all.command(engine));
            assert!(a.contains("/k/vmlinux") && a.contains("/k/init.cpio.gz") && a.contains(CMDLINE), "{a}");
        }
        assert!(args(&all.command(QemuMicrovm)).starts_with("-M microvm -accel kvm -cpu host -m 256 -smp 1"));
        assert!(args(&all.command(QemuQ35)).starts_with("-M q35 -accel kvm"));
        assert!(args(&all.command(Driverlab)).starts_with("vm run --kernel /k/vmlinux --initrd /k/init.cpio.gz"));
        assert!(args(&all.command(CloudHypervisor)).contains("--memory size=256M"));
    }

    #[test]
    fn a_boot_is_timed_to_the_init_line_and_one_that_never_shows_it_is_refused() {
        let mut shell = Command::new("sh");
        shell.args([
            "-c",
            &format!("echo kernel says hello; sleep 0.05; echo '[    0.042000] {INIT_LINE}'; sleep 0.05"),
        ]);
        let boot = boot_once(shell, LinuxEngine::Driverlab, 0).unwrap();
        assert!(boot.to_init >= Duration::from_millis(50) && boot.to_exit >= boot.to_init + Duration::from_millis(50));
        assert_eq!(boot.guest_at_init, Some(0.042), "the kernel's timestamp on the line");
        let mut silent = Command::new("sh");
        silent.args(["-c", "echo panic >&2"]);
        let e = boot_once(silent, LinuxEngine::QemuMicrovm, 3).err().unwrap().to_string();
        assert!(e.contains("qemu -M microvm run 3") && e.contains("never showed") && e.contains("panic"), "{e}");
        let mut missing = Command::new("/nonexistent/qemu");
        missing.arg("-M");
        assert!(boot_once(missing, LinuxEngine::QemuQ35, 0).is_err());
    }

    #[test]
    fn the_table_gives_medians_ratios_and_the_census() {
        let boots = |engine, init: &[f64]| EngineBoots {
            engine,
            to_init_ms: init.to_vec(),
            to_exit_ms: init.iter().map(|t| t + 10.0).collect(),
            guest_ms: if engine == LinuxEngine::Driverlab { vec![60.0, 70.0, 80.0] } else { Vec::new() },
            setup_ms: if engine == LinuxEngine::Driverlab { vec![20.0, 30.0, 40.0] } else { Vec::new() },
            setup_phases: if engine == LinuxEngine::Driverlab {
                [2.0, 3.0, 4.0]
                    .map(|k| vm_spec::exit::SetupPhases {
                        image_ms: k,
                        load_ms: 10.0 * k,
                        kvm_ms: 1.0,
                        platform_ms: 2.0,
                        vcpus_ms: 0.5,
                        jail_ms: 3.0,
                    })
                    .to_vec()
            } else {
                Vec::new()
            },
        };
        let census: ExitCounts = serde_json::from_str(
            r#"{"io":900,"mmio":40,"unclaimed":3,"top_ports":[{"addr":"0x3f8","claimed":800,"unclaimed":0}]}"#,
        )
        .unwrap();
        let bench = LinuxBootBench {
            cmdline: CMDLINE.into(),
            runs: 3,
            memory_mib: 256,
            engines: vec![
                boots(LinuxEngine::Driverlab, &[100.0, 110.0, 120.0]),
                boots(LinuxEngine::QemuMicrovm, &[200.0, 220.0, 240.0]),
            ],
            census: Some(census),
            rerun: vec!["qemu -M microvm run 2: still running after 120s".into()],
        };
        assert_eq!(bench.ratio_to_init(LinuxEngine::QemuMicrovm), Some(0.5));
        assert_eq!(bench.ratio_to_init(LinuxEngine::CloudHypervisor), None);
        let table = table(&bench);
        assert!(table.contains("driverlab / qemu -M microvm (median time to init): 0.500"), "{table}");
        assert!(table.contains("900 port exits, 40 MMIO exits, 3 unclaimed"), "{table}");
        assert!(table.contains("  of which set-up       3       22.0       30.0       38.0"), "{table}");
        assert!(
            table.contains(
                "driverlab's set-up by phase, median ms: image 3.0 (p90 3.8), load 30.0 (p90 38.0), kvm 1.0 (p90 1.0), \
                 platform 2.0 (p90 2.0), vcpus 0.5 (p90 0.5), jail 3.0 (p90 3.0)"
            ),
            "{table}"
        );
        assert!(table.contains("0x3f8 800+0"), "{table}");
        // Only where every boot's line had the kernel's timestamp.
        assert!(
            table.contains("time to init, the engine's + the guest kernel's own (its clock at the init's line), median ms: driverlab 40.0 + 70.0\n"),
            "{table}"
        );
        assert!(table.contains("run again after it failed (a host TCG emulates): qemu -M microvm run 2"), "{table}");
        let back: LinuxBootBench = serde_json::from_str(&serde_json::to_string(&bench).unwrap()).unwrap();
        assert_eq!(back, bench);
    }
}

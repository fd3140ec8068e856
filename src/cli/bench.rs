//! `driverlab bench ...`: benchmarks that print figures.

use std::path::PathBuf;

use anyhow::Context;
use bench::{self, BootBenchConfig, linux_boot};
use clap::Subcommand;
use lab::stats::Summary;

/// Benchmarks that print figures next to a reference measured in the same run.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Boot-to-poweroff of the probe guest, many runs, side by side with QEMU
    /// (`-M microvm -accel kvm`) and, with --vs, Cloud Hypervisor booting the same ELF in the same
    /// run, interleaved. With --linux: a Linux kernel and an initramfs whose /init prints a line
    /// and powers off, from spawning each engine to that line and to its exit, with driverlab's
    /// exit census (needs KVM that boots Linux: a lab box, the nested box).
    Boot {
        /// Runs per engine [probe: 30, --linux: 10].
        #[arg(long)]
        runs: Option<usize>,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = 256)]
        memory: u64,
        /// The QEMU binary to compare with [probe: qemu-system-x86_64; --linux: the QEMU
        /// engine's chroot, `driverlab engine setup qemu`].
        #[arg(long, value_name = "PATH")]
        qemu: Option<PathBuf>,
        /// Leave QEMU out.
        #[arg(long)]
        no_qemu: bool,
        /// A `cloud-hypervisor` binary to compare with as well (built from its source).
        #[arg(long, value_name = "PATH")]
        vs: Option<PathBuf>,
        /// Boot this Linux kernel instead of the probe: an ELF vmlinux or a bzImage, or a kernel
        /// image of the store (`kernel-…`, its vmlinux; the only form a daemon takes).
        #[arg(long, value_name = "KERNEL")]
        linux: Option<String>,
        /// The initramfs for --linux [one whose /init prints `driverlab-boot: init` and powers
        /// off, built here].
        #[arg(long, value_name = "PATH", requires = "linux")]
        initrd: Option<PathBuf>,
        /// QEMU's q35 machine as well as microvm (--linux).
        #[arg(long, requires = "linux")]
        q35: bool,
        /// Print the measurements as JSON after the table (--linux).
        #[arg(long, requires = "linux")]
        json: bool,
        /// Run it on a daemon's box instead (--linux with a kernel image's ID).
        #[command(flatten)]
        daemon: super::lab::daemon::DaemonArgs,
    },
    /// virtio-iommu MAP and UNMAP round trips as the probe guest sees them (notify to MSI-X
    /// completion), at 4 KiB and 2 MiB, next to a null request (the transport alone).
    Viommu {
        /// MAP/UNMAP pairs (alternating 4 KiB and 2 MiB).
        #[arg(long, default_value_t = 4000)]
        ops: u32,
        /// A `cloud-hypervisor` binary: the same probe drives its virtio-iommu (a virtio-rng
        /// behind it) in the same run, alternating with driverlab round by round.
        #[arg(long, value_name = "PATH")]
        vs: Option<PathBuf>,
        /// Rounds per engine with --vs.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// The AQC100 model's receive path on this host alone: frames per second one core writes
    /// into mapped guest memory (descriptor read, copy, checksum check, write-back), next to bare
    /// copies of the same frames and to twice 10GbE line rate.
    ModelRx {
        /// Frames per round.
        #[arg(long, default_value_t = 1_000_000)]
        frames: u64,
        /// Rounds (model and reference alternate).
        #[arg(long, default_value_t = 7)]
        rounds: usize,
        /// Frame size in bytes.
        #[arg(long, default_value_t = 1514)]
        size: usize,
    },
    /// The lab's own cost per cell beyond the VM's run (model start, VMM start, watching,
    /// collecting, the database), on a probe matrix of small cells, next to the VM's run time.
    Lab {
        /// Cells to run.
        #[arg(long, default_value_t = 20)]
        cells: usize,
        /// Frames each cell receives.
        #[arg(long, default_value_t = 200)]
        frames: u32,
    },
    /// A cell started from a snapshot against the same cell booted, in the same run: the probe
    /// guest behind the virtio-iommu with the AQC100 model's Thunderbolt slot empty, timed from
    /// the VMM's spawn to the guest running and to a ready cell (the guest at its holding point,
    /// the NIC plugged). With --url: a Linux cell on the daemon's box (the Debian kernel and the
    /// guest agent, the box's card in a Thunderbolt slot), two runs of it through the daemon,
    /// restored then booted; a ready cell has its driver bound and its link up. Last line:
    /// `restore: ready cell R ms restored, C ms cold (Q.QQx)` (medians).
    Restore {
        /// Runs of each kind (interleaved) [here: 20; on a daemon: repetitions of each run, 5].
        #[arg(long)]
        runs: Option<usize>,
        /// Guest memory in MiB [here: 256; on a daemon: 512].
        #[arg(long)]
        memory: Option<u64>,
        /// On a daemon: the device the cell's NIC is (its name on the box; the nested box names
        /// its card after its model).
        #[arg(long, default_value = "aqc100")]
        device: String,
        /// On a daemon: build the image here, for a daemon that reads this host's image store
        /// (the nested box), as `lab run --build-here` does.
        #[arg(long)]
        build_here: bool,
        /// Run it on a daemon's box instead.
        #[command(flatten)]
        daemon: super::lab::daemon::DaemonArgs,
    },
    /// The probe guest receiving from the AQC100 model behind the virtio-iommu, once per RX
    /// buffer strategy: frames per second and IOMMU maps per frame, side by side.
    Nic {
        /// Frames per strategy.
        #[arg(long, default_value_t = 20_000)]
        frames: u32,
        /// Strategies to compare.
        #[arg(long, value_delimiter = ',', default_value = "flip,order3,pool")]
        strategies: Vec<String>,
    },
}

impl BenchCommand {
    /// Runs the benchmark and prints its figures.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            BenchCommand::Boot { runs, memory, qemu, no_qemu, vs, linux, initrd, q35, json, daemon } => match linux {
                Some(kernel) => {
                    let linux = LinuxArgs { kernel, initrd, runs: runs.unwrap_or(10), memory, qemu, no_qemu, vs, q35 };
                    linux_boot(linux, json, &daemon)
                }
                None => {
                    let qemu = qemu.unwrap_or_else(|| PathBuf::from("qemu-system-x86_64"));
                    boot(runs.unwrap_or(30), memory, (!no_qemu).then_some(qemu), vs)
                }
            },
            BenchCommand::Viommu { ops, vs, rounds } => match vs {
                Some(ch) => viommu_vs(ops, &ch, rounds.max(1)),
                None => viommu(ops),
            },
            BenchCommand::ModelRx { frames, size, rounds } => model_rx(frames, size, rounds),
            BenchCommand::Nic { frames, strategies } => nic(frames, &strategies),
            BenchCommand::Lab { cells, frames } => lab_cost(cells, frames),
            BenchCommand::Restore { runs, memory, device, build_here, daemon } => match daemon.client()? {
                Some(client) => super::bench_restore::on_daemon(
                    client,
                    runs.unwrap_or(5).max(1),
                    memory.unwrap_or(512),
                    &device,
                    build_here,
                ),
                None => restore(runs.unwrap_or(20).max(1), memory.unwrap_or(256)),
            },
        }
    }
}

/// One row of a figures table: n, min, p10, median, p90, max.
pub(super) fn row(name: &str, summary: Option<Summary>) {
    match summary {
        Some(s) => println!(
            "{name:<28} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            s.n, s.min, s.p10, s.median, s.p90, s.max
        ),
        None => println!("{name:<28} {:>5}", 0),
    }
}

fn boot(runs: usize, memory: u64, qemu: Option<PathBuf>, cloud_hypervisor: Option<PathBuf>) -> anyhow::Result<u8> {
    let dir = std::env::temp_dir().join(format!("driverlab-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let probe = dir.join("probe.elf");
    std::fs::write(&probe, guest_images::PROBE_ELF)?;
    let programs = super::programs()?;
    let driverlab = std::env::current_exe()?;
    // Where the lab starts the small binary, the big one's `vm run` is timed beside it.
    let one_binary = engines::Program::driverlab_vm(&driverlab);
    let config = BootBenchConfig {
        vmm: &programs.vmm,
        one_binary: (programs.vmm != one_binary).then_some(&one_binary),
        probe_elf: &probe,
        qemu: qemu.as_deref(),
        cloud_hypervisor: cloud_hypervisor.as_deref(),
        runs,
        memory_mib: memory,
    };
    let result = ::bench::boot(&config);
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;

    println!("boot to poweroff of the probe guest, {memory} MiB, {runs} runs per engine, wall ms (spawn to exit)");
    println!("{:<28} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}", "engine", "n", "min", "p10", "median", "p90", "max");
    row("driverlab", Summary::of_millis(&result.driverlab));
    row("  of which in the VM", Summary::of_millis(&result.driverlab_in_vm));
    row("driverlab --no-jail", Summary::of_millis(&result.driverlab_unjailed));
    if !result.driverlab_one_binary.is_empty() {
        row("driverlab vm run", Summary::of_millis(&result.driverlab_one_binary));
    }
    if qemu.is_some() {
        row("qemu -M microvm", Summary::of_millis(&result.qemu));
    }
    if cloud_hypervisor.is_some() {
        row("cloud-hypervisor", Summary::of_millis(&result.cloud_hypervisor));
    }
    if let Some(ratio) = result.ratio() {
        println!("driverlab / qemu (medians): {ratio:.3}   goal: at most 0.5");
    }
    if let Some(ratio) = result.ratio_to_cloud_hypervisor() {
        println!("driverlab / cloud-hypervisor (medians): {ratio:.3}   goal: at most 1.0");
    }
    Ok(0)
}

fn restore(runs: usize, memory: u64) -> anyhow::Result<u8> {
    let dir = ::bench::restore::scratch_dir()?;
    let programs = super::programs()?;
    let config = ::bench::restore::RestoreBenchConfig { programs: &programs, runs, memory_mib: memory, dir: &dir };
    let result = ::bench::restore::restore(&config);
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    let s = &result.snapshot;
    println!(
        "a probe cell (virtio-iommu, the AQC100 model's Thunderbolt slot), {memory} MiB, {runs} runs each, interleaved"
    );
    println!("snapshot: written in {:.1} ms, {} KiB of RAM with data", s.ms, s.ram_data_bytes / 1024);
    println!("{:<28} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}", "ms from spawn", "n", "min", "p10", "median", "p90", "max");
    let series = |samples: &[::bench::restore::RestoreSample], pick: fn(&::bench::restore::RestoreSample) -> f64| {
        Summary::of(&samples.iter().map(pick).collect::<Vec<_>>())
    };
    row("cold: running", series(&result.cold, |s| s.running_ms));
    row("cold: ready cell", series(&result.cold, |s| s.ready_ms));
    row("cold: VMM setup_ms", series(&result.cold, |s| s.setup_ms));
    row("restored: running", series(&result.restored, |s| s.running_ms));
    row("restored: ready cell", series(&result.restored, |s| s.ready_ms));
    row("restored: VMM setup_ms", series(&result.restored, |s| s.setup_ms));
    let (Some(cold), Some(restored)) = (series(&result.cold, |s| s.ready_ms), series(&result.restored, |s| s.ready_ms))
    else {
        anyhow::bail!("no runs");
    };
    println!(
        "restore: ready cell {:.1} ms restored, {:.1} ms cold ({:.2}x)",
        restored.median,
        cold.median,
        cold.median / restored.median
    );
    Ok(0)
}

/// What `bench boot --linux` was given.
struct LinuxArgs {
    kernel: String,
    initrd: Option<PathBuf>,
    runs: usize,
    memory: u64,
    qemu: Option<PathBuf>,
    no_qemu: bool,
    vs: Option<PathBuf>,
    q35: bool,
}

fn linux_boot(args: LinuxArgs, json: bool, daemon: &super::lab::daemon::DaemonArgs) -> anyhow::Result<u8> {
    let bench = match daemon.client()? {
        Some(client) => remote_linux_boot(&client, &args)?,
        None => local_linux_boot(&args)?,
    };
    print!("{}", linux_boot::table(&bench));
    if json {
        println!("{}", serde_json::to_string(&bench)?);
    }
    Ok(0)
}

fn local_linux_boot(args: &LinuxArgs) -> anyhow::Result<linux_boot::LinuxBootBench> {
    let kernel = if guest_images::store::is_image_id(&args.kernel) {
        let store = guest_images::store::ImageStore::new(guest_images::store::default_root());
        let manifest: guest_images::kernel_image::KernelManifest = store.manifest(&args.kernel)?;
        manifest.vmlinux_path(&store)
    } else {
        PathBuf::from(&args.kernel)
    };
    if !kernel.is_file() {
        anyhow::bail!("--linux {}: no such kernel file or image", args.kernel);
    }
    let qemu = match (&args.qemu, args.no_qemu) {
        (_, true) => None,
        (Some(path), false) => Some(linux_boot::QemuBinary::Binary(path.clone())),
        (None, false) => {
            Some(linux_boot::QemuBinary::Chroot(engines::qemu::Qemu::find(&engines::qemu::default_root())?))
        }
    };
    let scratch = tempfile::tempdir().context("a scratch folder")?;
    let config = linux_boot::LinuxBootConfig {
        vmm: super::programs()?.vmm,
        kernel,
        initrd: linux_boot::initramfs_in(scratch.path(), args.initrd.as_deref())?,
        qemu,
        q35: args.q35,
        cloud_hypervisor: args.vs.clone(),
        runs: args.runs,
        memory_mib: args.memory,
        rerun_failed: vm_spec::host::emulated_by_tcg(),
    };
    Ok(linux_boot::run(&config, &|line| eprintln!("{line}"))?)
}

fn remote_linux_boot(client: &api::client::Client, args: &LinuxArgs) -> anyhow::Result<linux_boot::LinuxBootBench> {
    if args.initrd.is_some() || args.vs.is_some() || args.qemu.is_some() || args.memory != 256 {
        anyhow::bail!("through a daemon, --linux takes a kernel image's ID and --runs, --no-qemu, --q35 only");
    }
    let request = api::types::BenchBoot {
        kernel: args.kernel.clone(),
        runs: u32::try_from(args.runs).unwrap_or(u32::MAX),
        qemu: !args.no_qemu,
        q35: args.q35,
    };
    eprintln!("booting {} under each engine on the daemon's box, {} runs each", args.kernel, args.runs);
    let runtime = super::lab::daemon::runtime()?;
    let result = runtime.block_on(client.bench_boot(&request)).map_err(super::lab::daemon::coded)?;
    Ok(serde_json::from_value(result.bench)?)
}

fn viommu(ops: u32) -> anyhow::Result<u8> {
    let result = ::bench::viommu(&super::programs()?.vmm, ops)?;
    let g = &result.guest;
    let value = |key: &str| g[key].as_u64().unwrap_or(0);
    println!("virtio-iommu round trip as the probe guest sees it (notify to MSI-X completion), {ops} pairs");
    println!("{:<34} {:>12} {:>12} {:>10}", "request", "median ns", "p99 ns", "ops/s");
    for (name, key) in VIOMMU_ROWS {
        let median = value(&format!("{key}_ns_median"));
        let ops_per_s = if median > 0 { 1e9 / median as f64 } else { 0.0 };
        println!("{name:<34} {median:>12} {:>12} {ops_per_s:>10.0}", value(&format!("{key}_ns_p99")));
    }
    if let Some(device) = result.device {
        println!(
            "handling in the VMM (all requests): median {} ns, p99 {} ns; {} maps, {} unmaps counted",
            device.request_ns_p50, device.request_ns_p99, device.maps, device.unmaps
        );
    }
    Ok(0)
}

/// The rows the virtio-iommu benchmarks compare: name and the probe's key.
const VIOMMU_ROWS: [(&str, &str); 5] = [
    ("MAP 4 KiB", "map_4k"),
    ("UNMAP 4 KiB", "unmap_4k"),
    ("MAP 2 MiB", "map_2m"),
    ("UNMAP 2 MiB", "unmap_2m"),
    ("null request (transport only)", "null"),
];

fn viommu_vs(ops: u32, ch: &std::path::Path, rounds: usize) -> anyhow::Result<u8> {
    let vmm = super::programs()?.vmm;
    let dir = tempfile::tempdir().context("a scratch folder")?;
    let probe = dir.path().join("probe.elf");
    std::fs::write(&probe, guest_images::PROBE_ELF)?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        ours.push(::bench::viommu(&vmm, ops)?.guest);
        theirs.push(::bench::viommu_cloud_hypervisor(ch, &probe, ops)?);
        eprintln!("round {}/{rounds} done", round + 1);
    }
    // Each row: the median over the rounds of each round's median.
    let median = |sections: &[serde_json::Value], key: &str| {
        let values: Vec<f64> =
            sections.iter().filter_map(|s| s[format!("{key}_ns_median")].as_u64()).map(|v| v as f64).collect();
        Summary::of(&values).map(|s| s.median)
    };
    println!(
        "virtio-iommu round trips as the probe sees them (notify to completion), {ops} pairs, {rounds} rounds per engine alternating, median of the rounds' medians in ns"
    );
    println!("{:<34} {:>12} {:>18} {:>10}", "request", "driverlab", "cloud-hypervisor", "ratio");
    for (name, key) in VIOMMU_ROWS {
        let (a, b) = (median(&ours, key), median(&theirs, key));
        let ratio = a.zip(b).map_or(f64::NAN, |(a, b)| a / b);
        let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        println!("{name:<34} {:>12} {:>18} {ratio:>10.3}", show(a), show(b));
    }
    let completion =
        |s: &[serde_json::Value]| s.first().and_then(|s| s["completion"].as_str()).unwrap_or("?").to_string();
    println!("completions: driverlab {}, cloud-hypervisor {}", completion(&ours), completion(&theirs));
    Ok(0)
}

fn model_rx(frames: u64, size: usize, rounds: usize) -> anyhow::Result<u8> {
    use vm_spec::model_control::{MAX_FRAME, MIN_FRAME};
    if !(MIN_FRAME..=MAX_FRAME).contains(&size) {
        anyhow::bail!("--size {size}: frames are {MIN_FRAME} to {MAX_FRAME} bytes");
    }
    let result = device_models::aqc100::rx_bench::model_rx(frames, size, rounds)?;
    let target = 2.0 * device_models::aqc100::rx_bench::LINE_RATE_1514;
    let gbps = |pps: f64| pps * size as f64 * 8.0 / 1e9;
    println!("AQC100 model receive path, one core, {rounds} rounds of {frames} frames of {size} bytes");
    println!("{:<34} {:>14} {:>14} {:>12}", "", "median fr/s", "best fr/s", "best Gbit/s");
    for (name, (median, best)) in
        [("model (filter, DMA, checks, WB)", result.model_pps()), ("bare DMA copies (reference)", result.copy_pps())]
    {
        println!("{name:<34} {median:>14.0} {best:>14.0} {:>12.2}", gbps(best));
    }
    println!("{:<34} {:>14.0} {:>14.0} {:>12.2}", "2 x 10GbE line rate (1514 B)", target, target, gbps(target));
    let (median, best) = result.model_pps();
    println!(
        "model / target: median {:.2}, best {:.2}   goal: at least 1.00 (1514-byte frames; the best round is \
         what one core can do, the spread is other load on the host)",
        median / target,
        best / target
    );
    Ok(0)
}

fn lab_cost(cells: usize, frames: u32) -> anyhow::Result<u8> {
    let env = super::lab_env()?;
    let dir = std::env::temp_dir().join(format!("driverlab-bench-lab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let result = ::bench::lab_cost::lab_cost(&env, &dir, cells, frames);
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    let column = |f: &dyn Fn(&::bench::lab_cost::CellCost) -> std::time::Duration| {
        Summary::of_millis(&result.cells.iter().map(f).collect::<Vec<_>>())
    };
    println!("lab cost per cell: {cells} probe cells of {frames} frames, each with a fresh AQC100 model, ms");
    println!("{:<28} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}", "", "n", "min", "p10", "median", "p90", "max");
    row("cell, as the lab saw it", column(&|c| c.total));
    row("  the VM's own run", column(&|c| c.vm_run));
    row("  lab cost beyond the VM", column(&|c| c.lab()));
    row("    of which model start", column(&|c| c.model_start));
    row("    of which VMM start", column(&|c| c.vm_start));
    let lab = column(&|c| c.lab()).map_or(f64::NAN, |s| s.median);
    println!(
        "matrix check and run creation {:.1} ms; whole run {:.0} ms (one health check included)",
        result.plan.as_secs_f64() * 1e3,
        result.run.as_secs_f64() * 1e3
    );
    println!("lab cost beyond the VM (median): {lab:.1} ms   goal: at most 100 ms");
    Ok(0)
}

fn nic(frames: u32, strategies: &[String]) -> anyhow::Result<u8> {
    let names: Vec<&str> = strategies.iter().map(String::as_str).collect();
    let runs = ::bench::nic::nic(&super::programs()?, &names, frames)?;
    println!("probe guest receiving {frames} frames of 1514 bytes from the AQC100 model behind the virtio-iommu");
    println!(
        "{:<10} {:>12} {:>10} {:>12} {:>12} {:>10}",
        "strategy", "frames/s", "Gbit/s", "maps/frame", "iommu maps", "vs first"
    );
    let first = runs.first().map(|r| r.pps()).unwrap_or(1.0);
    for run in &runs {
        let pps = run.pps();
        println!(
            "{:<10} {:>12.0} {:>10.3} {:>12.4} {:>12} {:>10.2}",
            run.strategy,
            pps,
            pps * 1514.0 * 8.0 / 1e9,
            run.nic["maps_per_frame"].as_f64().unwrap_or(f64::NAN),
            run.nic["iommu_maps"].as_u64().unwrap_or(0),
            pps / first
        );
    }
    Ok(0)
}

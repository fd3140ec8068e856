//! `driverlab bench ...`: benchmarks that print figures.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use lab::bench::{self, BootBenchConfig};
use lab::stats::Summary;

/// Benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Boot-to-poweroff of the probe guest, many runs, side by side with QEMU
    /// (`-M microvm -accel kvm`) booting the same ELF in the same run.
    Boot {
        /// Runs per engine.
        #[arg(long, default_value_t = 30)]
        runs: usize,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = 256)]
        memory: u64,
        /// The QEMU binary to compare with.
        #[arg(long, default_value = "qemu-system-x86_64")]
        qemu: PathBuf,
        /// Measure driverlab alone.
        #[arg(long)]
        no_qemu: bool,
    },
    /// virtio-iommu MAP and UNMAP round trips as the probe guest sees them (notify to MSI-X
    /// completion), at 4 KiB and 2 MiB, next to a null request (the transport alone).
    Viommu {
        /// MAP/UNMAP pairs (alternating 4 KiB and 2 MiB).
        #[arg(long, default_value_t = 4000)]
        ops: u32,
    },
}

impl BenchCommand {
    /// Runs the benchmark and prints its figures.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            BenchCommand::Boot { runs, memory, qemu, no_qemu } => boot(runs, memory, (!no_qemu).then_some(qemu)),
            BenchCommand::Viommu { ops } => viommu(ops),
        }
    }
}

fn row(name: &str, summary: Option<Summary>) {
    match summary {
        Some(s) => println!(
            "{name:<28} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            s.n, s.min, s.p10, s.median, s.p90, s.max
        ),
        None => println!("{name:<28} {:>5}", 0),
    }
}

fn boot(runs: usize, memory: u64, qemu: Option<PathBuf>) -> anyhow::Result<u8> {
    let dir = std::env::temp_dir().join(format!("driverlab-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let probe = dir.join("probe.elf");
    std::fs::write(&probe, guest_images::PROBE_ELF)?;
    let driverlab = std::env::current_exe().context("locating the driverlab binary")?;
    let config =
        BootBenchConfig { driverlab: &driverlab, probe_elf: &probe, qemu: qemu.as_deref(), runs, memory_mib: memory };
    let result = bench::boot(&config);
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;

    println!("boot to poweroff of the probe guest, {memory} MiB, {runs} runs per engine, wall ms (spawn to exit)");
    println!("{:<28} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}", "engine", "n", "min", "p10", "median", "p90", "max");
    row("driverlab", Summary::of_millis(&result.driverlab));
    row("  of which in the VM", Summary::of_millis(&result.driverlab_in_vm));
    if qemu.is_some() {
        row("qemu -M microvm", Summary::of_millis(&result.qemu));
    }
    if let Some(ratio) = result.ratio() {
        println!("driverlab / qemu (medians): {ratio:.3}   goal: at most 0.5");
    }
    Ok(0)
}

fn viommu(ops: u32) -> anyhow::Result<u8> {
    let driverlab = std::env::current_exe().context("locating the driverlab binary")?;
    let result = bench::viommu(&driverlab, ops)?;
    let g = &result.guest;
    let value = |key: &str| g[key].as_u64().unwrap_or(0);
    println!("virtio-iommu round trip as the probe guest sees it (notify to MSI-X completion), {ops} pairs");
    println!("{:<34} {:>12} {:>12} {:>10}", "request", "median ns", "p99 ns", "ops/s");
    for (name, key) in [
        ("MAP 4 KiB", "map_4k"),
        ("UNMAP 4 KiB", "unmap_4k"),
        ("MAP 2 MiB", "map_2m"),
        ("UNMAP 2 MiB", "unmap_2m"),
        ("null request (transport only)", "null"),
    ] {
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

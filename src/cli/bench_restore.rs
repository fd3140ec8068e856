//! `driverlab bench restore --url URL --token-file FILE`: a Linux cell restored from its
//! snapshot against the same cell booted, on a daemon's box (the nested box, a lab box). Two runs
//! of one small matrix go through the daemon, `boot = "snapshot"` then `boot = "cold"`; their
//! records give each repetition's time from spawning the VMM to its control socket answering
//! and to a ready cell (its NIC plugged, the driver bound, the link up). A restored repetition
//! the lab ran again booted (its guest died: the nested box's TCG now and then) counts in
//! neither series.

use std::path::Path;

use api::client::Client;
use lab::record::{BootKind, Record};
use lab::stats::Summary;

use super::lab::backend::{Backend, Finished, RunOptions};

/// The cell: the Debian kernel with the guest agent, the box's card in a Thunderbolt slot, a
/// second of TCP transmit.
fn matrix(boot: &str, runs: usize, memory_mib: u64, device: &str) -> String {
    format!(
        r#"name = "bench-restore-{boot}"
description = "driverlab bench restore: a Linux cell, boot = {boot}"
repetitions = {runs}
timeout_s = 420
silence_s = 150
boot = "{boot}"

[[device]]
name = "{device}"
slot = "thunderbolt"

[[image]]
name = "debian"
kernel = "debian"
initrd = "agent"
memory_mib = {memory_mib}
cmdline = "loglevel=5"

[[variant]]
name = "stock"
image = "debian"

[[workload]]
name = "tx"
kind = "iperf3"
direction = "tx"
duration_s = 1
ip = 4
"#
    )
}

/// One kind of start's repetitions, as their records tell.
struct Starts {
    run: String,
    answering_ms: Vec<f64>,
    ready_ms: Vec<f64>,
    /// Repetitions that passed started some other way (a restored one run again booted).
    other: usize,
}

impl Starts {
    /// The passed repetitions of `run` that started as `kind`.
    fn of(run: String, records: &[Record], kind: BootKind) -> Starts {
        let passed = records.iter().filter(|r| r.status == lab::record::Status::Pass);
        let (mut answering_ms, mut ready_ms, mut other) = (Vec::new(), Vec::new(), 0);
        for r in passed {
            if r.boot != Some(kind) {
                other += 1;
                continue;
            }
            let (Some(start), Some(link)) = (r.timings.vm_start_ms, r.timings.link_up_ms) else { continue };
            answering_ms.push(start);
            // The link's time counts from the guest's start (a restored guest's: its restore).
            ready_ms.push(start + link);
        }
        Starts { run, answering_ms, ready_ms, other }
    }
}

/// Runs the two matrices on the daemon `client` talks to and prints the figures; the last line
/// is `restore: ready cell R ms restored, C ms cold (Q.QQx)` (medians).
pub fn on_daemon(client: Client, runs: usize, memory_mib: u64, device: &str, build_here: bool) -> anyhow::Result<u8> {
    let dir = tempfile::tempdir()?;
    let backend = Backend::Remote(client);
    let options = RunOptions { build_here, ..RunOptions::default() };
    let run = |boot: &str, kind: BootKind| {
        eprintln!("bench restore: {runs} repetitions with boot = \"{boot}\" on the daemon's box");
        run_one(&backend, &options, dir.path(), &matrix(boot, runs, memory_mib, device), kind)
    };
    let restored = run("snapshot", BootKind::Restored)?;
    let cold = run("cold", BootKind::Booted)?;
    println!(
        "a Linux cell (the Debian kernel, the guest agent, {device} in a Thunderbolt slot), {memory_mib} MiB, \
         {runs} repetitions each: runs {} (snapshot; {} passed restored, {} run again booted) and {} (cold)",
        restored.run,
        restored.ready_ms.len(),
        restored.other,
        cold.run
    );
    println!("{:<28} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}", "ms from spawn", "n", "min", "p10", "median", "p90", "max");
    super::bench::row("cold: control socket", Summary::of(&cold.answering_ms));
    super::bench::row("cold: ready cell", Summary::of(&cold.ready_ms));
    super::bench::row("restored: control socket", Summary::of(&restored.answering_ms));
    super::bench::row("restored: ready cell", Summary::of(&restored.ready_ms));
    let (Some(c), Some(r)) = (Summary::of(&cold.ready_ms), Summary::of(&restored.ready_ms)) else {
        anyhow::bail!(
            "run {} or {}: no repetition passed with its link up, started as asked (`lab show RUN`)",
            restored.run,
            cold.run
        );
    };
    println!("restore: ready cell {:.1} ms restored, {:.1} ms cold ({:.2}x)", r.median, c.median, c.median / r.median);
    Ok(0)
}

/// Runs `text` as a matrix through `backend` to its end; what its records say.
fn run_one(backend: &Backend, options: &RunOptions, dir: &Path, text: &str, kind: BootKind) -> anyhow::Result<Starts> {
    let path = dir.join("bench-restore.toml");
    std::fs::write(&path, text)?;
    let run = match backend.run(&path, options)? {
        Finished::Ended(status) => status.id,
        Finished::Interrupted { run, why } => anyhow::bail!("run {run}: {why}"),
    };
    let shown = backend.show(&run)?;
    Ok(Starts::of(run, &shown.records, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_s_matrices_are_valid_and_differ_only_in_their_boot() {
        let dir = tempfile::tempdir().unwrap();
        let texts = ["snapshot", "cold"].map(|boot| matrix(boot, 3, 512, "aqc100"));
        for (boot, text) in ["snapshot", "cold"].iter().zip(&texts) {
            // The daemon's box knows its device by name; here the model stands in for it.
            let here = text.replace("slot = \"thunderbolt\"", "slot = \"thunderbolt\"\nmodel = \"aqc100\"");
            let plan = lab::matrix::Plan::parse(&dir.path().join(format!("{boot}.toml")), &here).unwrap();
            assert_eq!((plan.cells.len(), plan.matrix.repetitions), (1, 3));
            let expected = if *boot == "cold" { lab::matrix::BootMode::Cold } else { lab::matrix::BootMode::Snapshot };
            assert_eq!(plan.matrix.boot, expected);
        }
        let differing: Vec<(&str, &str)> = texts[0].lines().zip(texts[1].lines()).filter(|(a, b)| a != b).collect();
        assert_eq!(differing.len(), 3, "the name, the description and the boot: {differing:?}");
    }
}

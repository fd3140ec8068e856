//! `driverlab lab try PATCH...`: the common case in one command. It writes the matrix a user
//! would have written for the patch (stock against patched) or the series (every prefix),
//! shows it on stderr and keeps it in a file to edit and run again, and runs it as `lab run`
//! does: the same stdout, report and last line.

use std::path::PathBuf;

use clap::Args;
use lab::matrix::{EngineKind, PatchRef};
use lab::trial::{Trial, TrialWorkload};

use super::{DbArgs, Format, RunArgs};
use crate::cli::CodedError;

/// Options of `lab try`.
#[derive(Args)]
pub struct TryArgs {
    /// A patch, an mbox of a series, several patch files (a series, in order) or a folder of
    /// them.
    #[arg(required = true, value_name = "PATCH")]
    pub patches: Vec<PathBuf>,
    /// The device model: `aqc100` (atlantic) or `lan743x`.
    #[arg(long, default_value = "aqc100", value_parser = nic)]
    pub device: vm_spec::NicKind,
    /// The workload, with the lab's defaults: `iperf3`, `packet-rate`, `latency`, `xdp` or
    /// `kselftest`.
    #[arg(long, default_value = "iperf3", value_parser = workload)]
    pub workload: TrialWorkload,
    /// Repetitions of each cell.
    #[arg(long, default_value_t = 3)]
    pub repetitions: u32,
    /// What runs the guests: `driverlab` or `qemu` [default: driverlab where this host's KVM
    /// boots Linux, else qemu].
    #[arg(long, value_parser = engine)]
    pub engine: Option<EngineKind>,
    /// Where the matrix is kept [default: try-NAME.toml here, NAME the first patch's].
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The report's format.
    #[arg(long, value_enum, default_value = "md")]
    pub format: Format,
    /// The daemon to go through.
    #[command(flatten)]
    pub daemon: super::daemon::DaemonArgs,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

fn nic(name: &str) -> Result<vm_spec::NicKind, String> {
    vm_spec::NicKind::ALL
        .into_iter()
        .find(|n| n.name() == name)
        .ok_or_else(|| format!("{name:?}: give one of {}", vm_spec::NicKind::names()))
}

fn workload(name: &str) -> Result<TrialWorkload, String> {
    name.parse().map_err(|_| format!("{name:?}: give iperf3, packet-rate, latency, xdp or kselftest"))
}

fn engine(name: &str) -> Result<EngineKind, String> {
    match name {
        "driverlab" => Ok(EngineKind::Driverlab),
        "qemu" => Ok(EngineKind::Qemu),
        _ => Err(format!("{name:?}: give driverlab or qemu")),
    }
}

/// Writes the matrix, shows it, and runs it as `lab run`.
pub fn try_patches(args: TryArgs) -> anyhow::Result<u8> {
    let refused = |message: String| CodedError { message, code: 2 };
    let refs: Vec<PatchRef> = args.patches.iter().cloned().map(PatchRef::Path).collect();
    let files = lab::recipe::read_patches(&refs, &|p| p.to_path_buf()).map_err(|e| refused(e.to_string()))?;
    let mut count = 0;
    for file in &files {
        count += file.parse().map_err(|e| refused(e.to_string()))?.len();
    }
    let engine = args.engine.unwrap_or_else(|| {
        if vm_spec::host::virtualization().boots_linux() { EngineKind::Driverlab } else { EngineKind::Qemu }
    });
    let trial = Trial {
        patches: args.patches.clone(),
        count,
        nic: args.device,
        workload: args.workload,
        repetitions: args.repetitions,
        engine,
    };
    let text = trial.matrix();
    let out = args.out.clone().unwrap_or_else(|| {
        let name = text.lines().find_map(|l| l.strip_prefix("name = \"")?.strip_suffix('"')).unwrap_or("try");
        PathBuf::from(format!("{name}.toml"))
    });
    std::fs::write(&out, &text).map_err(|e| CodedError { message: format!("{}: {e}", out.display()), code: 1 })?;
    eprintln!("# the matrix, kept in {}:\n{text}", out.display());
    super::run_matrix(RunArgs {
        matrix: out,
        skip_unrunnable: false,
        build_here: false,
        every_prefix: false,
        shard: None,
        fleet: None,
        format: args.format,
        daemon: args.daemon,
        db: args.db,
    })
}

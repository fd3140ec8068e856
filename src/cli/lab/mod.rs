//! `driverlab lab ...`: run a matrix, list and show runs, report, compare, resume, export,
//! import; and the devices' leases and quarantines. Each command works in this process or
//! through a daemon ([`backend`]) and prints the same either way ([`output`]).

pub(crate) mod backend;
mod bisect;
pub mod daemon;
mod output;
mod trial;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use lab::record::Status;
use lab::results_db::{self, ResultsDb};
use lab::run::{self, RunPhase};

use super::CodedError;
use backend::{Backend, Finished, Shown};
use daemon::DaemonArgs;
use output::{last_line, list_header, list_row, record_line};

/// Lab commands.
#[derive(Subcommand)]
pub enum LabCommand {
    /// Run a matrix: every cell, every repetition, then its report. The first line is
    /// `run ID started`, the last `run ID: N cells, P passed, F failed, E errors` (repetitions).
    /// Exit code 0 when every repetition passed (or was skipped), 1 otherwise, 2 for a matrix that
    /// is invalid or cannot run here.
    Run(RunArgs),
    /// Find the patch of a series that first moves a figure (or breaks the cell): a bisection
    /// over the series' prefixes with the lab's statistical verdict at each step, repetitions
    /// added where it cannot tell, up to a budget. Steps on stdout as they are judged; the last
    /// line is `bisect ID: first change at patch K/N "SUBJECT"` (or `no change across N
    /// patches`, `undecided between K/N and L/N`). The bisection is a run: `lab report ID`.
    Bisect(bisect::BisectArgs),
    /// Try a patch or a series in one command: write the matrix a user would (the stock driver
    /// against the patched one, or every prefix of a series, on a model of its device under a
    /// workload with the lab's defaults), show it on stderr and keep it in a file, and run it
    /// as `lab run` does (the same stdout, report and last line).
    Try(trial::TryArgs),
    /// Finish an interrupted or cancelled run: only the repetitions without a result run.
    Resume(ResumeArgs),
    /// Build a matrix's image recipes (`kernel = "debian"`, `initrd = "agent"`, `patches`) in this
    /// host's image store or, with --url or --socket, on the daemon, and print the matrix with the
    /// images' IDs in their place (TOML on stdout; progress on stderr): a matrix whose images are
    /// fixed, for CI to run and keep. The same inputs give the same IDs.
    Pin(PinArgs),
    /// List the runs, newest first.
    List(ListArgs),
    /// Show one run: its state and every repetition's record.
    Show(ShowArgs),
    /// A run's report: per cell n, mean, stddev, min, max, 95% interval, and the change and
    /// verdict against the baseline.
    Report(ReportArgs),
    /// Run B against run A, cell by cell (cells match on image, variant, parameters, workload and
    /// device).
    Compare(CompareArgs),
    /// Export a run for other systems: `--format kcidb` writes KCIDB v4 JSON (KernelCI).
    Export(ExportArgs),
    /// Merge the runs of another box's results database into this one (idempotent).
    Import(ImportArgs),
    /// The devices' leases and quarantines.
    Devices(DbArgs),
    /// Lift a device's quarantine (after fixing it), e.g. `vfio=0000:63:00.0`.
    Release(ReleaseArgs),
    /// Delete the oldest ended runs, with their results and artifacts, keeping the newest N
    /// (runs queued or running are kept and not counted). The last line is `pruned K runs (R
    /// results, M MiB of artifacts), kept N`.
    Prune(PruneArgs),
}

/// Options of `lab prune`.
#[derive(Args)]
pub struct PruneArgs {
    /// Ended runs to keep, the newest.
    #[arg(long, value_name = "N")]
    pub keep: usize,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// The results database.
#[derive(Args, Clone)]
pub struct DbArgs {
    /// The results database [default: $DRIVERLAB_DB, else ~/.local/share/driverlab/lab.db].
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
}

impl DbArgs {
    /// The database's path.
    fn path(&self) -> PathBuf {
        self.db.clone().unwrap_or_else(results_db::default_path)
    }

    fn open(&self) -> anyhow::Result<ResultsDb> {
        Ok(ResultsDb::open(&self.path())?)
    }
}

/// Report formats.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// A markdown table.
    Md,
    /// The JSON report (docs/lab.md).
    Json,
    /// CSV, one row per cell and metric.
    Csv,
    /// An SVG chart of throughput and maps per packet per cell.
    Svg,
    /// A page with the tables and the chart (what the API's report page is).
    Html,
}

impl Format {
    /// Its media type, as the API's report takes it in `Accept`.
    pub fn media_type(self) -> &'static str {
        match self {
            Format::Md => "text/markdown",
            Format::Json => "application/json",
            Format::Csv => "text/csv",
            Format::Svg => "image/svg+xml",
            Format::Html => "text/html",
        }
    }
}

/// Options of `lab run`.
#[derive(Args)]
pub struct RunArgs {
    /// The matrix (TOML, docs/lab.md).
    #[arg(value_name = "MATRIX.toml")]
    pub matrix: PathBuf,
    /// Record cells this host cannot run as SKIP (with the reason) instead of refusing the matrix.
    #[arg(long)]
    pub skip_unrunnable: bool,
    /// Build the matrix's image recipes (`kernel = "debian"`, `initrd = "agent"`, `patches`) on
    /// this host, into its image store, and send the daemon their IDs: for a daemon that reads
    /// this host's store, such as the nested box.
    #[arg(long)]
    pub build_here: bool,
    /// Before any other workload, run every prefix of the matrix's series once through a short
    /// check (load, link, 2 s of traffic, unload; no warning, no mapping left): a series that
    /// breaks in the middle and mends later is caught.
    #[arg(long)]
    pub every_prefix: bool,
    /// Run shard K of N of the matrix's repetitions, this box's share of a fleet run (with
    /// --fleet): repetition r of cell c is shard (c x repetitions + r) mod N + 1, so with N
    /// repetitions or more every cell has repetitions on every shard.
    #[arg(long, value_name = "K/N", requires = "fleet")]
    pub shard: Option<lab::fleet::Shard>,
    /// The fleet run the shard belongs to: an ID the caller gives (a CI run's, say), the same on
    /// every box; `lab report --fleet ID` reports the shards as one run.
    #[arg(long, value_name = "ID", requires = "shard")]
    pub fleet: Option<lab::fleet::FleetId>,
    /// The report's format.
    #[arg(long, value_enum, default_value = "md")]
    pub format: Format,
    /// The daemon to go through.
    #[command(flatten)]
    pub daemon: daemon::DaemonArgs,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// Options of `lab pin`.
#[derive(Args)]
pub struct PinArgs {
    /// The matrix (TOML, docs/lab.md).
    #[arg(value_name = "MATRIX.toml")]
    pub matrix: PathBuf,
    /// The daemon that builds the images.
    #[command(flatten)]
    pub daemon: daemon::DaemonArgs,
}

/// Options of `lab resume`.
#[derive(Args)]
pub struct ResumeArgs {
    /// The run.
    pub run: String,
    /// The report's format.
    #[arg(long, value_enum, default_value = "md")]
    pub format: Format,
    /// The daemon to go through.
    #[command(flatten)]
    pub daemon: daemon::DaemonArgs,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// Options of `lab list`.
#[derive(Args)]
pub struct ListArgs {
    /// JSON, one object per run.
    #[arg(long)]
    pub json: bool,
    /// The daemon to go through.
    #[command(flatten)]
    pub daemon: daemon::DaemonArgs,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// Options of `lab show`.
#[derive(Args)]
pub struct ShowArgs {
    /// The run.
    pub run: String,
    /// JSON: the run and every record.
    #[arg(long)]
    pub json: bool,
    /// The daemon to go through.
    #[command(flatten)]
    pub daemon: daemon::DaemonArgs,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// Options of `lab report`.
#[derive(Args)]
pub struct ReportArgs {
    /// The run.
    #[arg(required_unless_present = "fleet")]
    pub run: Option<String>,
    /// Report fleet run ID as one run: its shards' runs in this database (`lab import` each
    /// box's first), with the boxes and each cell's box effect.
    #[arg(long, value_name = "ID", conflicts_with = "run")]
    pub fleet: Option<lab::fleet::FleetId>,
    /// Judge against this variant instead of the matrix's baseline.
    #[arg(long, value_name = "VARIANT")]
    pub baseline: Option<String>,
    /// Where the report goes.
    #[command(flatten)]
    pub output: ReportOutput,
    /// The daemon to go through.
    #[command(flatten)]
    pub daemon: daemon::DaemonArgs,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// A report's format and destination.
#[derive(Args)]
pub struct ReportOutput {
    /// The report's format.
    #[arg(long, value_enum, default_value = "md")]
    pub format: Format,
    /// Write to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Options of `lab compare`.
#[derive(Args)]
pub struct CompareArgs {
    /// The run compared against.
    pub a: String,
    /// The run judged.
    pub b: String,
    /// Where the report goes.
    #[command(flatten)]
    pub output: ReportOutput,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// Export formats.
#[derive(Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    /// KCIDB v4 JSON (schema 4.5).
    Kcidb,
}

/// Options of `lab export`.
#[derive(Args)]
pub struct ExportArgs {
    /// The run.
    pub run: String,
    /// The export's format.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Write to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// Options of `lab import`.
#[derive(Args)]
pub struct ImportArgs {
    /// The other database (an existing results database); or, with --url, none: the daemon's.
    #[arg(value_name = "DB", required_unless_present = "url")]
    pub other: Option<PathBuf>,
    /// Import the database of the daemon at this URL (`GET /v1/database`), e.g. a lab box's.
    #[arg(long, value_name = "URL", env = "DRIVERLAB_URL", requires = "token_file", conflicts_with = "other")]
    pub url: Option<String>,
    /// The file whose first line is the daemon's bearer token (for --url).
    #[arg(long, value_name = "FILE", env = "DRIVERLAB_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// Options of `lab release`.
#[derive(Args)]
pub struct ReleaseArgs {
    /// The device, as `lab devices` lists it.
    pub device: String,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

impl LabCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            LabCommand::Run(args) => run_matrix(args),
            LabCommand::Bisect(args) => bisect::bisect(args),
            LabCommand::Try(args) => trial::try_patches(args),
            LabCommand::Resume(args) => resume(args),
            LabCommand::Pin(args) => {
                let backend = Backend::of(&args.daemon, &DbArgs { db: None })?;
                print!("{}", backend.pin(&args.matrix)?);
                Ok(0)
            }
            LabCommand::List(args) => list(args),
            LabCommand::Show(args) => show(args),
            LabCommand::Report(args) => report(args),
            LabCommand::Compare(args) => compare(args),
            LabCommand::Export(args) => export(args),
            LabCommand::Import(args) => import(args),
            LabCommand::Devices(db) => devices(db),
            LabCommand::Prune(args) => prune(args),
            LabCommand::Release(args) => release(args),
        }
    }
}

/// `lab report`: a run's or a fleet run's report.
fn report(args: ReportArgs) -> anyhow::Result<u8> {
    let backend = Backend::of(&args.daemon, &args.db)?;
    let baseline = args.baseline.as_deref();
    let text = match (&args.fleet, &args.run) {
        (Some(fleet), _) => backend.fleet_report(fleet, baseline, args.output.format)?,
        (None, Some(run)) => backend.report(run, baseline, args.output.format)?,
        (None, None) => unreachable!("clap requires RUN or --fleet"),
    };
    write_out(&text, args.output.out.as_deref())?;
    Ok(0)
}

/// `lab compare`: run B against run A.
fn compare(args: CompareArgs) -> anyhow::Result<u8> {
    let store = args.db.open()?;
    let report = run::compare(&store, &args.a, &args.b).map_err(backend::coded)?;
    write_report(&report, args.output.format, args.output.out.as_deref())
}

/// `lab export`: a run as KCIDB JSON.
fn export(args: ExportArgs) -> anyhow::Result<u8> {
    let store = args.db.open()?;
    let info = store.run(&args.run)?;
    let records = store.records(&args.run)?;
    let doc = match args.format {
        ExportFormat::Kcidb => lab::kcidb::export(&info, &records, &store.artifacts(&args.run)),
    };
    write_out(&serde_json::to_string_pretty(&doc)?, args.out.as_deref())?;
    Ok(0)
}

/// `lab import`: another box's database merged into this one.
fn import(args: ImportArgs) -> anyhow::Result<u8> {
    let scratch = tempfile::tempdir()?;
    let (other, from) = match (&args.url, &args.other) {
        (Some(url), _) => {
            let daemon = DaemonArgs { socket: None, url: Some(url.clone()), token_file: args.token_file.clone() };
            let client = daemon.client()?.context("no daemon")?;
            let copy = scratch.path().join("lab.db");
            daemon::runtime()?.block_on(client.database(&copy)).map_err(daemon::coded)?;
            (copy, url.clone())
        }
        (None, Some(other)) => {
            if !other.is_file() {
                return Err(
                    CodedError { message: format!("{}: no such results database", other.display()), code: 2 }.into()
                );
            }
            (other.clone(), other.display().to_string())
        }
        (None, None) => unreachable!("clap requires DB or --url"),
    };
    let mut store = args.db.open()?;
    let (runs, results) = store.import(&other)?;
    println!("imported {runs} runs and {results} results from {from}");
    Ok(0)
}

/// `lab devices`: leases and quarantines.
fn devices(db: DbArgs) -> anyhow::Result<u8> {
    let store = db.open()?;
    for (device, holder) in store.leases()? {
        println!("leased      {device}: run {} (pid {} on {})", holder.run, holder.pid, holder.host);
    }
    for (device, reason, since) in store.quarantine_list()? {
        println!("quarantined {device}: {reason} (since {since}; `driverlab lab release {device}`)");
    }
    Ok(0)
}

/// `lab prune`: the oldest ended runs deleted.
fn prune(args: PruneArgs) -> anyhow::Result<u8> {
    let mut store = args.db.open()?;
    let pruned = store.prune(args.keep)?;
    for run in &pruned.runs {
        println!("deleted run {run}");
    }
    let snapshots = lab::runner::snapshots_dir(&guest_images::store::default_root());
    let deleted = lab::runner::prune_snapshots(&snapshots, lab::runner::SNAPSHOT_LEFTOVER_AGE);
    for snapshot in &deleted {
        println!("deleted snapshot {}: {}", snapshot.name, snapshot.why);
    }
    if !deleted.is_empty() {
        let bytes: u64 = deleted.iter().map(|s| s.bytes).sum();
        println!("pruned {} snapshots ({} MiB) in {}", deleted.len(), bytes >> 20, snapshots.display());
    }
    println!(
        "pruned {} runs ({} results, {} MiB of artifacts), kept {}",
        pruned.runs.len(),
        pruned.results,
        pruned.artifact_bytes >> 20,
        args.keep
    );
    Ok(0)
}

/// `lab release`: a quarantine lifted.
fn release(args: ReleaseArgs) -> anyhow::Result<u8> {
    let store = args.db.open()?;
    if store.unquarantine(&args.device)? {
        println!("{} is no longer quarantined", args.device);
        Ok(0)
    } else {
        Err(CodedError { message: format!("{} is not quarantined", args.device), code: 2 }.into())
    }
}

fn write_out(text: &str, out: Option<&Path>) -> anyhow::Result<()> {
    match out {
        Some(path) => std::fs::write(path, text).with_context(|| path.display().to_string()),
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(text.as_bytes())?;
            if !text.ends_with('\n') {
                stdout.write_all(b"\n")?;
            }
            Ok(())
        }
    }
}

/// A report rendered in `format`.
fn render(report: &lab::report::Report, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Md => report.to_markdown(),
        Format::Json => report.to_json(),
        Format::Csv => report.to_csv(),
        Format::Svg => lab::chart::svg(report)?,
        Format::Html => report.to_html(&lab::chart::svg(report)?),
    })
}

fn write_report(report: &lab::report::Report, format: Format, out: Option<&Path>) -> anyhow::Result<u8> {
    write_out(&render(report, format)?, out)?;
    Ok(0)
}

/// A followed run's end: its report, then its last line; exit code 0 when every repetition
/// passed (or was skipped) and the run is done.
fn finish(backend: &Backend, finished: Finished, format: Format) -> anyhow::Result<u8> {
    let status = match finished {
        Finished::Ended(status) => *status,
        Finished::Interrupted { run, why } => {
            println!("{}", output::interrupted_line(&run, &why));
            return Ok(1);
        }
    };
    write_out(&backend.report(&status.id, None, format)?, None)?;
    let count = |s: Status| status.counts.get(&s).copied().unwrap_or(0);
    println!("{}", last_line(&status.id, status.cells_total, count, status.state == RunPhase::Cancelled));
    let clean = count(Status::Fail) + count(Status::Error) + count(Status::Miss) == 0;
    Ok(if clean && status.state == RunPhase::Done { 0 } else { 1 })
}

fn run_matrix(args: RunArgs) -> anyhow::Result<u8> {
    let backend = Backend::of(&args.daemon, &args.db)?;
    let options = backend::RunOptions {
        skip_unrunnable: args.skip_unrunnable,
        build_here: args.build_here,
        every_prefix: args.every_prefix,
        share: args.fleet.zip(args.shard).map(|(fleet, shard)| lab::fleet::FleetShard { fleet, shard }),
    };
    let finished = backend.run(&args.matrix, &options)?;
    finish(&backend, finished, args.format)
}

fn resume(args: ResumeArgs) -> anyhow::Result<u8> {
    let backend = Backend::of(&args.daemon, &args.db)?;
    let finished = backend.resume(&args.run)?;
    finish(&backend, finished, args.format)
}

fn list(args: ListArgs) -> anyhow::Result<u8> {
    let runs = Backend::of(&args.daemon, &args.db)?.list()?;
    if args.json {
        for r in &runs {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(0);
    }
    println!("{}", list_header());
    for r in &runs {
        println!("{}", list_row(&r.id, r.state, r.cells_total, r.results, r.results_total, &r.created_at, &r.matrix));
    }
    Ok(0)
}

fn show(args: ShowArgs) -> anyhow::Result<u8> {
    let Shown { status, records, artifacts } = Backend::of(&args.daemon, &args.db)?.show(&args.run)?;
    if args.json {
        let doc = serde_json::json!({"run": status, "artifacts": artifacts, "records": records});
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
    }
    println!("run {}: matrix {} ({}), {}", status.id, status.matrix, status.matrix_file, status.state);
    println!(
        "created {} on {}, {} cells x {} repetitions, {} results",
        status.created_at, status.host, status.cells_total, status.repetitions, status.results
    );
    match artifacts {
        Some(dir) => println!("artifacts in {}", dir.display()),
        None => println!("artifacts on the daemon's host"),
    }
    for r in &records {
        println!("{}", record_line(r));
    }
    Ok(0)
}

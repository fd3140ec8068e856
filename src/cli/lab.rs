//! `driverlab lab ...`: run a matrix, list and show runs, report, compare, resume, export,
//! import; and the devices' leases and quarantines.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use lab::env::LabEnv;
use lab::images::RunPlan;
use lab::matrix::Plan;
use lab::record::{Record, Status};
use lab::run::{self, RunError};
use lab::scheduler::Progress;
use lab::store::{self, Store};

use super::CodedError;

/// Lab commands.
#[derive(Subcommand)]
pub enum LabCommand {
    /// Run a matrix: every cell, every repetition, then its report. The first line is
    /// `run ID started`, the last `run ID: N cells, P passed, F failed, E errors` (repetitions).
    /// Exit code 0 when every repetition passed (or was skipped), 1 otherwise, 2 for a matrix that
    /// is invalid or cannot run here.
    Run(RunArgs),
    /// Finish an interrupted or cancelled run: only the repetitions without a result run.
    Resume(ResumeArgs),
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
}

/// The results database.
#[derive(Args, Clone)]
pub struct DbArgs {
    /// The results database [default: $DRIVERLAB_DB, else ~/.local/share/driverlab/lab.db].
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
}

impl DbArgs {
    fn open(&self) -> anyhow::Result<Store> {
        let path = self.db.clone().unwrap_or_else(store::default_path);
        Ok(Store::open(&path)?)
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
    /// The report's format.
    #[arg(long, value_enum, default_value = "md")]
    pub format: Format,
    /// The daemon to go through.
    #[command(flatten)]
    pub daemon: super::lab_remote::DaemonArgs,
    /// Database.
    #[command(flatten)]
    pub db: DbArgs,
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
    pub daemon: super::lab_remote::DaemonArgs,
    /// Database.
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
    pub daemon: super::lab_remote::DaemonArgs,
    /// Database.
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
    pub daemon: super::lab_remote::DaemonArgs,
    /// Database.
    #[command(flatten)]
    pub db: DbArgs,
}

/// Options of `lab report`.
#[derive(Args)]
pub struct ReportArgs {
    /// The run.
    pub run: String,
    /// Judge against this variant instead of the matrix's baseline.
    #[arg(long, value_name = "VARIANT")]
    pub baseline: Option<String>,
    /// Where the report goes.
    #[command(flatten)]
    pub output: ReportOutput,
    /// The daemon to go through.
    #[command(flatten)]
    pub daemon: super::lab_remote::DaemonArgs,
    /// Database.
    #[command(flatten)]
    pub db: DbArgs,
}

/// A report's format and destination.
#[derive(Args)]
pub struct ReportOutput {
    /// Format.
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
    /// Database.
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
    /// Format.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Write to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Database.
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
    /// Database.
    #[command(flatten)]
    pub db: DbArgs,
}

/// Options of `lab release`.
#[derive(Args)]
pub struct ReleaseArgs {
    /// The device, as `lab devices` lists it.
    pub device: String,
    /// Database.
    #[command(flatten)]
    pub db: DbArgs,
}

impl LabCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            LabCommand::Run(args) => run_matrix(args),
            LabCommand::Resume(args) => resume(args),
            LabCommand::List(args) => list(args),
            LabCommand::Show(args) => show(args),
            LabCommand::Report(args) => {
                if let Some(client) = args.daemon.client()? {
                    let text =
                        super::lab_remote::report(&client, &args.run, args.baseline.as_deref(), args.output.format)?;
                    write_out(&text, args.output.out.as_deref())?;
                    return Ok(0);
                }
                let store = args.db.open()?;
                let report = run::report(&store, &args.run, args.baseline.as_deref()).map_err(coded)?;
                write_report(&report, args.output.format, args.output.out.as_deref())
            }
            LabCommand::Compare(args) => {
                let store = args.db.open()?;
                let report = run::compare(&store, &args.a, &args.b).map_err(coded)?;
                write_report(&report, args.output.format, args.output.out.as_deref())
            }
            LabCommand::Export(args) => {
                let store = args.db.open()?;
                let info = store.run(&args.run)?;
                let records = store.records(&args.run)?;
                let doc = match args.format {
                    ExportFormat::Kcidb => lab::kcidb::export(&info, &records, &store.artifacts(&args.run)),
                };
                write_out(&serde_json::to_string_pretty(&doc)?, args.out.as_deref())?;
                Ok(0)
            }
            LabCommand::Import(args) => {
                let scratch = tempfile::tempdir()?;
                let (other, from) = match (&args.url, &args.other) {
                    (Some(url), _) => {
                        let daemon = super::lab_remote::DaemonArgs {
                            socket: None,
                            url: Some(url.clone()),
                            token_file: args.token_file.clone(),
                        };
                        let client = daemon.client()?.context("no daemon")?;
                        let copy = scratch.path().join("lab.db");
                        super::lab_remote::download_database(&client, &copy)?;
                        (copy, url.clone())
                    }
                    (None, Some(other)) => {
                        if !other.is_file() {
                            return Err(CodedError {
                                message: format!("{}: no such results database", other.display()),
                                code: 2,
                            }
                            .into());
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
            LabCommand::Devices(db) => {
                let store = db.open()?;
                for (device, holder) in store.leases()? {
                    println!("leased      {device}: run {} (pid {} on {})", holder.run, holder.pid, holder.host);
                }
                for (device, reason, since) in store.quarantine_list()? {
                    println!("quarantined {device}: {reason} (since {since}; `driverlab lab release {device}`)");
                }
                Ok(0)
            }
            LabCommand::Release(args) => {
                let store = args.db.open()?;
                if store.unquarantine(&args.device)? {
                    println!("{} is no longer quarantined", args.device);
                    Ok(0)
                } else {
                    Err(CodedError { message: format!("{} is not quarantined", args.device), code: 2 }.into())
                }
            }
        }
    }
}

fn coded(e: RunError) -> anyhow::Error {
    let code = if e.is_bad_input() { 2 } else { 1 };
    CodedError { message: e.to_string(), code }.into()
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

fn render(report: &lab::report::Report, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Md => report.to_markdown(),
        Format::Json => report.to_json(),
        Format::Csv => report.to_csv(),
        Format::Svg => lab::chart::svg(report)?,
    })
}

fn write_report(report: &lab::report::Report, format: Format, out: Option<&Path>) -> anyhow::Result<u8> {
    write_out(&render(report, format)?, out)?;
    Ok(0)
}

/// Progress on stderr: a bar with an ETA on a terminal, one line per repetition otherwise.
struct Console {
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
}

impl Console {
    fn new(total: usize, done: usize) -> Console {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} repetitions, ETA {eta} {msg}")
                    .expect("a valid template"),
            );
            bar.set_position(done as u64);
            bar
        });
        Console { bar, started: Instant::now() }
    }

    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}

impl Progress for Console {
    fn recorded(&self, r: &Record, done: usize, total: usize) {
        let text = repetition_line(
            (done, total),
            (&r.cell.id, &r.cell.label(), r.repetition),
            r.status,
            r.reason.as_deref(),
            (r.workload.gbit_s, r.shown_maps()),
        );
        match &self.bar {
            Some(bar) => {
                bar.set_position(done as u64);
                bar.set_message(format!("{} {}", r.cell.id, r.status));
                bar.println(text);
            }
            None => {
                let elapsed = self.started.elapsed().as_secs_f64();
                eprintln!("{text} ({elapsed:.1} s)");
            }
        }
    }

    fn note(&self, line: &str) {
        self.line(line);
    }
}

/// A repetition's progress line: `[done/total] CELL LABEL rep N: STATUS figures-or-reason`.
pub fn repetition_line(
    (done, total): (usize, usize),
    (cell, label, repetition): (&str, &str, u32),
    status: Status,
    reason: Option<&str>,
    (gbit_s, maps_per_packet): (Option<f64>, Option<f64>),
) -> String {
    let mut figures = Vec::new();
    if let Some(g) = gbit_s {
        figures.push(format!("{g:.3} Gbit/s"));
    }
    if let Some(m) = maps_per_packet {
        figures.push(format!("{m:.4} maps/packet"));
    }
    let what = match reason {
        Some(reason) if status != Status::Pass => reason.to_string(),
        _ => figures.join(", "),
    };
    format!("[{done}/{total}] {cell} {label} rep {}: {status} {what}", repetition + 1)
}

/// The last line of `lab run` and `lab resume`, from the run's counts by status.
pub fn last_line(run: &str, cells: usize, count: impl Fn(Status) -> usize, cancelled: bool) -> String {
    let mut last = format!(
        "run {run}: {cells} cells, {} passed, {} failed, {} errors",
        count(Status::Pass),
        count(Status::Fail),
        count(Status::Error)
    );
    for (status, word) in [(Status::Skip, "skipped"), (Status::Miss, "missed")] {
        if count(status) > 0 {
            last.push_str(&format!(", {} {word}", count(status)));
        }
    }
    if cancelled {
        last.push_str(" (cancelled)");
    }
    last
}

/// Ctrl-C: finish the repetitions running, record the rest as MISS, mark the run cancelled.
static CANCEL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    CANCEL.store(true, Ordering::SeqCst);
}

fn catch_interrupt() {
    // SAFETY: installing a handler that only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t) };
}

fn run_matrix(args: RunArgs) -> anyhow::Result<u8> {
    if let Some(client) = args.daemon.client()? {
        let text = std::fs::read_to_string(&args.matrix)
            .map_err(|e| CodedError { message: format!("{}: {e}", args.matrix.display()), code: 2 })?;
        let text = if args.build_here {
            let images = guest_images::store::ImageStore::new(guest_images::store::default_root());
            lab::images::pin_recipes(&args.matrix, &text, &images, &|line| eprintln!("{line}"))
                .map_err(|message| CodedError { message, code: 1 })?
        } else {
            text
        };
        return super::lab_remote::run(&client, text.into_bytes(), args.skip_unrunnable, args.format);
    }
    let plan = Plan::load(&args.matrix).map_err(|e| CodedError { message: e.to_string(), code: 2 })?;
    let env = super::lab_env()?;
    let mut store = args.db.open()?;
    // Images the lab builds (recipes) come first: the first time, a download and a build.
    let (run, plan) =
        run::create(&mut store, &env, plan, args.skip_unrunnable, &|line| eprintln!("{line}")).map_err(coded)?;
    println!("run {run} started");
    execute(store, &env, &plan, &run, args.format)
}

fn resume(args: ResumeArgs) -> anyhow::Result<u8> {
    if let Some(client) = args.daemon.client()? {
        return super::lab_remote::resume(&client, &args.run, args.format);
    }
    let env = super::lab_env()?;
    let mut store = args.db.open()?;
    let plan = run::resumable(&store, &env, &args.run, &|line| eprintln!("{line}")).map_err(coded)?;
    store.claim_run(&args.run)?;
    println!("run {} resumed", args.run);
    execute(store, &env, &plan, &args.run, args.format)
}

fn execute(store: Store, env: &LabEnv, plan: &RunPlan, run: &str, format: Format) -> anyhow::Result<u8> {
    let done = store.done(run)?.len();
    let total = plan.plan.cells.len() * plan.plan.matrix.repetitions as usize;
    let store = Arc::new(Mutex::new(store));
    let console = Console::new(total, done);
    catch_interrupt();
    let outcome = run::execute(store.clone(), env, plan, run, &console, &CANCEL).map_err(coded)?;
    if let Some(bar) = &console.bar {
        bar.finish_and_clear();
    }
    let store = store.lock().unwrap_or_else(|p| p.into_inner());
    let report = run::report(&store, run, None).map_err(coded)?;
    write_out(&render(&report, format)?, None)?;
    let count = |s: Status| outcome.counts.get(&s).copied().unwrap_or(0);
    let last = last_line(run, plan.plan.cells.len(), count, outcome.cancelled);
    println!("{last}");
    let clean = count(Status::Fail) + count(Status::Error) + count(Status::Miss) == 0;
    Ok(if clean { 0 } else { 1 })
}

fn list(args: ListArgs) -> anyhow::Result<u8> {
    if let Some(client) = args.daemon.client()? {
        return super::lab_remote::list(&client, args.json);
    }
    let store = args.db.open()?;
    let runs = store.runs()?;
    if args.json {
        for r in &runs {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(0);
    }
    println!("{}", list_header());
    for r in &runs {
        let total = r.cells_total * r.repetitions as usize;
        println!("{}", list_row(&r.id, r.state, r.cells_total, r.results, total, &r.created_at, &r.matrix));
    }
    Ok(0)
}

/// The header of `lab list`.
pub fn list_header() -> String {
    format!("{:<22} {:<12} {:>5} {:>9}  {:<24} matrix", "run", "state", "cells", "results", "created")
}

/// One run's line of `lab list`.
pub fn list_row(
    id: &str,
    state: impl std::fmt::Display,
    cells: usize,
    results: usize,
    total: usize,
    created: &str,
    matrix: &str,
) -> String {
    let results = format!("{results}/{total}");
    let state = state.to_string();
    format!("{id:<22} {state:<12} {cells:>5} {results:>9}  {created:<24} {matrix}")
}

/// One record's line of `lab show`.
pub fn record_line(r: &Record) -> String {
    let mut figures = Vec::new();
    if let Some(g) = r.workload.gbit_s {
        figures.push(format!("{g:.3} Gbit/s"));
    }
    if let Some(m) = r.shown_maps() {
        figures.push(format!("{m:.4} maps/packet"));
    }
    if let Some(reason) = &r.reason {
        figures.push(reason.clone());
    }
    format!("  {} rep {} {:<5} {}: {}", r.cell.id, r.repetition + 1, r.status.name(), r.cell.key(), figures.join(", "))
}

fn show(args: ShowArgs) -> anyhow::Result<u8> {
    if let Some(client) = args.daemon.client()? {
        return super::lab_remote::show(&client, &args.run, args.json);
    }
    let store = args.db.open()?;
    let info = store.run(&args.run)?;
    let records = store.records(&args.run)?;
    if args.json {
        let doc = serde_json::json!({"run": info, "artifacts": store.artifacts(&args.run), "records": records});
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
    }
    println!("run {}: matrix {} ({}), {}", info.id, info.matrix, info.matrix_file, info.state);
    println!(
        "created {} on {}, {} cells x {} repetitions, {} results",
        info.created_at, info.host, info.cells_total, info.repetitions, info.results
    );
    println!("artifacts in {}", store.artifacts(&args.run).display());
    for r in &records {
        println!("{}", record_line(r));
    }
    Ok(0)
}

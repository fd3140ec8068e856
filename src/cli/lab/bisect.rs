//! `driverlab lab bisect`: the patch of a series that first moves a figure (or breaks the
//! cell), found by bisection over its prefixes in a run of this process. Each step is printed
//! as it is judged (stdout), each repetition as it ends (stderr); the last line is the
//! contract of docs/lab.md: `bisect ID: first change at patch K/N "SUBJECT"`, `bisect ID: no
//! change across N patches`, `bisect ID: undecided between K/N and L/N`, or `bisect ID: the
//! base fails: WHY`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Args;
use lab::bisect::run::{BisectError, BisectOptions, BisectProgress, BisectRun};
use lab::bisect::{Bisection, Direction, Outcome, Step, StepVerdict};
use lab::matrix::{Plan, SeriesStep};
use lab::metric::Metric;
use lab::record::Record;
use lab::scheduler::Progress;
use lab::stats::Moments;

use super::DbArgs;
use super::output::Console;
use crate::cli::CodedError;

/// Options of `lab bisect`.
#[derive(Args)]
pub struct BisectArgs {
    /// The matrix: one image with `series`, one variant on it, one workload, one device; its
    /// `repetitions` are what each step starts with.
    #[arg(value_name = "MATRIX.toml")]
    pub matrix: PathBuf,
    /// The figure, as the JSON report names it (e.g. `rx_maps_per_packet`, `gbit_s`).
    #[arg(long, value_name = "NAME", value_parser = metric)]
    pub metric: Metric,
    /// Which way the figure must move to count: `up`, `down` or `any`.
    #[arg(long, default_value = "any", value_parser = direction)]
    pub direction: Direction,
    /// A change smaller than this many percent is no change [default: 5].
    #[arg(long, value_name = "PCT")]
    pub threshold: Option<f64>,
    /// Most repetitions of one prefix, where the lab's rule cannot tell a change from the noise
    /// [default: 10, or the matrix's repetitions if more].
    #[arg(long, value_name = "N")]
    pub budget: Option<u32>,
    /// The daemon to go through (`POST /v1/bisects`).
    #[command(flatten)]
    pub daemon: super::daemon::DaemonArgs,
    /// The results database (`--db`).
    #[command(flatten)]
    pub db: DbArgs,
}

/// A metric by its report name, or the names there are.
fn metric(name: &str) -> Result<Metric, String> {
    name.parse().map_err(|_| {
        let names: Vec<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
        format!("no metric {name:?}; the report's are {}", names.join(", "))
    })
}

/// A direction by its name.
fn direction(name: &str) -> Result<Direction, String> {
    name.parse().map_err(|_| format!("{name:?}: give up, down or any"))
}

/// Runs `lab bisect`, here or through the daemon; the exit code: 0 for a verdict, 1 undecided
/// or a failing base, 2 for a matrix or options that make no bisection.
pub fn bisect(args: BisectArgs) -> anyhow::Result<u8> {
    let refused = |message: String| CodedError { message, code: 2 };
    let text = std::fs::read_to_string(&args.matrix).map_err(|e| refused(format!("{}: {e}", args.matrix.display())))?;
    match args.daemon.client()? {
        Some(client) => through_daemon(&args, &client, &text),
        None => here(&args, &text),
    }
}

/// The bisection in this process.
fn here(args: &BisectArgs, text: &str) -> anyhow::Result<u8> {
    let refused = |message: String| CodedError { message, code: 2 };
    let text = lab::recipe::inline_series(&args.matrix, text).map_err(|e| refused(e.to_string()))?;
    let plan = Plan::parse(&args.matrix, &text).map_err(|e| refused(e.to_string()))?;
    let env = crate::cli::lab_env()?;
    let store = Arc::new(Mutex::new(args.db.open()?));
    let options = BisectOptions {
        metric: args.metric,
        direction: args.direction,
        threshold_pct: args.threshold,
        budget: args.budget,
    };
    let console = StepConsole { console: Console::plain(), metric: args.metric, steps: Mutex::new(0) };
    let coded = |e: BisectError| {
        let bad_input = matches!(e, BisectError::Refused(_)) || matches!(&e, BisectError::Run(r) if r.is_bad_input());
        CodedError { message: e.to_string(), code: if bad_input { 2 } else { 1 } }
    };
    let made = {
        let mut db = store.lock().unwrap_or_else(|p| p.into_inner());
        BisectRun::create(&mut db, &env, plan, &options, &|line| console.note(line)).map_err(coded)?
    };
    println!("bisect {} started", made.run);
    super::backend::catch_interrupt();
    let bisection = match made.execute(store.clone(), &env, &console, &super::backend::CANCEL) {
        Ok(bisection) => bisection,
        Err(BisectError::Cancelled) => {
            println!("bisect {}: ended cancelled before it decided", made.run);
            return Ok(1);
        }
        Err(e) => return Err(coded(e).into()),
    };
    let run = made.run;
    let store = store.lock().unwrap_or_else(|p| p.into_inner());
    let report = lab::run::report(&store, &run, None).map_err(super::backend::coded)?;
    print!("{}", report.to_markdown());
    let steps: Vec<SeriesStep> = store.run_plan(&run)?.2.into_iter().filter_map(|c| c.step).collect();
    let (line, code) = last_line(&run, &bisection, &steps, args.metric);
    println!("{line}");
    Ok(code)
}

/// The bisection through the daemon (`POST /v1/bisects`): its steps from the run's events, its
/// report and outcome once it ends.
fn through_daemon(args: &BisectArgs, client: &api::client::Client, text: &str) -> anyhow::Result<u8> {
    let text =
        lab::recipe::inline_patches(&args.matrix, text).map_err(|e| CodedError { message: e.to_string(), code: 2 })?;
    let mut query = format!("metric={}&direction={}", args.metric, args.direction);
    if let Some(threshold) = args.threshold {
        query.push_str(&format!("&threshold={threshold}"));
    }
    if let Some(budget) = args.budget {
        query.push_str(&format!("&budget={budget}"));
    }
    let runtime = super::daemon::runtime()?;
    let run = runtime.block_on(client.submit_bisect(text.into_bytes(), &query)).map_err(super::daemon::coded)?;
    println!("bisect {run} started");
    let console = StepConsole { console: Console::plain(), metric: args.metric, steps: Mutex::new(0) };
    let finished = runtime.block_on(super::backend::follow(client, &run, &|at, step| console.step(step, at)))?;
    if let super::backend::Finished::Interrupted { why, .. } = finished {
        println!("bisect {run}: interrupted: {why}");
        return Ok(1);
    }
    let status = runtime.block_on(client.bisect_status(&run)).map_err(super::daemon::coded)?;
    let Ok(bisection) = serde_json::from_value::<Bisection>(status.bisection) else {
        println!("bisect {run}: ended {} before it decided", status.run.state);
        return Ok(1);
    };
    let report = runtime.block_on(client.report(&run, None, "application/json")).map_err(super::daemon::coded)?;
    let report: serde_json::Value = serde_json::from_str(&report)?;
    let steps: Vec<SeriesStep> = (report["cells"].as_array().into_iter().flatten())
        .filter_map(|c| serde_json::from_value(c["step"].clone()).ok())
        .collect();
    print!("{}", runtime.block_on(client.report(&run, None, "text/markdown")).map_err(super::daemon::coded)?);
    let (line, code) = last_line(&run, &bisection, &steps, args.metric);
    println!("{line}");
    Ok(code)
}

/// The evidence and the last line of a bisection, and its exit code.
fn last_line(run: &str, b: &Bisection, steps: &[SeriesStep], metric: Metric) -> (String, u8) {
    let n = b.patches;
    match &b.outcome {
        Outcome::FirstChange { patch, before, after, broken } => {
            let step = &steps[*patch];
            let mut evidence = format!("patch {}: \"{}\"", step.position(), step.subject);
            if !step.author.is_empty() {
                evidence.push_str(&format!(" by {}", step.author));
            }
            if !step.message_id.is_empty() {
                evidence.push_str(&format!(" <{}>", step.message_id));
            }
            println!("\n{evidence}");
            println!("{metric} before it ({}/{n}): {}", patch - 1, figures(before.as_ref()));
            match broken {
                Some(why) => println!("with it: the cell fails: {why}"),
                None => println!("{metric} with it ({}/{n}): {}", patch, figures(after.as_ref())),
            }
            (format!("bisect {run}: first change at patch {patch}/{n} \"{}\"", step.subject), 0)
        }
        Outcome::NoChange => (format!("bisect {run}: no change across {n} patches"), 0),
        Outcome::Undecided { from, to } => (format!("bisect {run}: undecided between {from}/{n} and {to}/{n}"), 1),
        Outcome::BaseBroken { why } => (format!("bisect {run}: the base fails: {why}"), 1),
    }
}

/// `mean ± half-width (n N)`, or `none`.
fn figures(m: Option<&Moments>) -> String {
    match m {
        Some(m) => match m.ci95 {
            Some([lo, hi]) => format!("{:.4} ± {:.4} (n {})", m.mean, (hi - lo) / 2.0, m.n),
            None => format!("{:.4} (n {})", m.mean, m.n),
        },
        None => "none".into(),
    }
}

/// The run's progress on stderr, the bisection's steps on stdout.
struct StepConsole {
    console: Console,
    metric: Metric,
    steps: Mutex<usize>,
}

impl Progress for StepConsole {
    fn recorded(&self, record: &Record, done: usize, total: usize) {
        self.console.recorded(record, done, total);
    }

    fn note(&self, line: &str) {
        self.console.note(line);
    }
}

impl BisectProgress for StepConsole {
    fn step(&self, step: &Step, at: &SeriesStep) {
        let mut count = self.steps.lock().unwrap_or_else(|p| p.into_inner());
        *count += 1;
        let verdict = match &step.verdict {
            StepVerdict::Broken { why } => format!("broken: {why}"),
            other => other.word().to_string(),
        };
        let change = step.change.and_then(|c| c.change_pct).map(|pct| format!(", {pct:+.1} %")).unwrap_or_default();
        let p = step.change.and_then(|c| c.p_value).map(|p| format!(", p {p:.2e}")).unwrap_or_default();
        println!(
            "step {count}: {} \"{}\": {verdict} ({} {} against the base's {}{change}{p}; {} repetitions)",
            at.position(),
            at.subject,
            self.metric,
            figures(step.figures.as_ref()),
            figures(step.base.as_ref()),
            step.runs
        );
    }
}

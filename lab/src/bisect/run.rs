//! A bisection as a run. `lab bisect`'s matrix names one series (one image with `series`, one
//! variant on it with one value per parameter), one workload and one device; it is created as
//! a run whose repetitions are the budget, with every prefix a cell. The bisection runs the
//! repetitions it asks for; those it did not need are recorded as SKIP at the end, so that the
//! run is whole and `lab report` and `lab compare` show every prefix it measured. What it
//! decided is kept beside the run's artifacts (`bisect.json`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{Bisection, Direction, Goal, Measured, Prober, Step, bisect};
use crate::env::LabEnv;
use crate::failure::Failure;
use crate::images::RunPlan;
use crate::matrix::{Cell, Plan, SeriesStep};
use crate::metric::Metric;
use crate::record::{Record, Status};
use crate::results_db::{ResultsDb, ResultsDbError};
use crate::run::RunError;
use crate::scheduler::{self, LabError, Progress};
use crate::stats::VerdictRule;

/// The file beside a bisection's artifacts that holds what it decided.
pub const BISECT_FILE: &str = "bisect.json";

/// Why a bisection did not end with a verdict.
#[derive(Debug, thiserror::Error)]
pub enum BisectError {
    /// The matrix or the options do not make a bisection: what to change.
    #[error("{0}")]
    Refused(String),
    /// The run could not be made or run.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The lab failed.
    #[error(transparent)]
    Lab(#[from] LabError),
    /// The database failed.
    #[error(transparent)]
    ResultsDb(#[from] ResultsDbError),
    /// It was cancelled.
    #[error("the bisection was cancelled")]
    Cancelled,
}

/// What a bisection is asked for, beyond its matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BisectOptions {
    /// The figure.
    pub metric: Metric,
    /// Which way it must move.
    pub direction: Direction,
    /// The change in percent below which a figure is the same [default: the lab's 5 %].
    pub threshold_pct: Option<f64>,
    /// Most repetitions of one prefix [default: 10, or the matrix's repetitions if more].
    pub budget: Option<u32>,
}

/// A series' cells, one per prefix (the base first), checked to make a bisection.
#[derive(Debug, Clone)]
pub struct SeriesCells {
    /// Each prefix's cell.
    pub cells: Vec<Cell>,
    /// Each prefix's place in the series.
    pub steps: Vec<SeriesStep>,
}

impl SeriesCells {
    /// The cells of `plan`'s one series, refused with what to change when the plan is not one
    /// series under one workload on one device, or its workload does not give `metric`.
    pub fn of(plan: &Plan, metric: Metric) -> Result<SeriesCells, BisectError> {
        let refused = |why: String| Err(BisectError::Refused(format!("{}: {why}", plan.file.display())));
        let (devices, workloads) = (plan.matrix.devices.len(), plan.matrix.workloads.len());
        if devices != 1 || workloads != 1 {
            return refused(format!(
                "a bisection runs one workload on one device; the matrix has {workloads} workload(s) and {devices} device(s)"
            ));
        }
        let Some(step) = plan.cells.first().and_then(|c| c.step.clone()) else {
            return refused("a bisection needs an image with `series` and one variant on it".into());
        };
        if plan
            .cells
            .iter()
            .any(|c| c.step.as_ref().is_none_or(|s| s.series != step.series || s.variant != step.variant))
            || plan.cells.len() != step.count + 1
        {
            return refused(format!(
                "a bisection runs one series, one variant with one value per parameter: {} cells for a series of {}",
                plan.cells.len(),
                step.count
            ));
        }
        let workload = &plan.matrix.workloads[0];
        if !metric.produced_by(workload.get_ref()) {
            return refused(format!("workload {:?} gives no {metric}", workload.get_ref().name()));
        }
        let steps = plan.cells.iter().filter_map(|c| c.step.clone()).collect();
        Ok(SeriesCells { cells: plan.cells.clone(), steps })
    }

    /// Patches in the series.
    pub fn patches(&self) -> usize {
        self.cells.len() - 1
    }
}

/// The goal `options` ask for on a matrix of `repetitions` repetitions; refused for a budget
/// below them or of zero, or a threshold that is no percentage.
pub fn goal(options: &BisectOptions, repetitions: u32) -> Result<Goal, BisectError> {
    let budget = options.budget.unwrap_or(repetitions.max(10));
    if budget == 0 || budget < repetitions || budget > crate::matrix::MAX_REPETITIONS {
        return Err(BisectError::Refused(format!(
            "--budget {budget}: give the most repetitions of one prefix, from the matrix's {repetitions} to {}",
            crate::matrix::MAX_REPETITIONS
        )));
    }
    let mut rule = VerdictRule::default();
    if let Some(pct) = options.threshold_pct {
        if !(pct.is_finite() && pct > 0.0 && pct < 1000.0) {
            return Err(BisectError::Refused(format!("--threshold {pct}: a percentage above 0")));
        }
        rule.threshold_pct = pct;
    }
    Ok(Goal { metric: options.metric, direction: options.direction, rule, repetitions, budget })
}

/// What a bisection reports as it goes.
pub trait BisectProgress: Progress {
    /// A step was judged.
    fn step(&self, step: &Step, at: &SeriesStep);
}

/// A bisection's run, made and ready to execute.
#[derive(Debug, Clone)]
pub struct BisectRun {
    /// The run.
    pub run: String,
    /// What it executes.
    pub plan: RunPlan,
    /// The series' cells, by prefix.
    pub series: SeriesCells,
    /// What it looks for.
    pub goal: Goal,
}

impl BisectRun {
    /// Checks that `plan` and `options` make a bisection, builds the prefixes' images and
    /// creates the run in `store` (its repetitions the budget), progress through `note`.
    pub fn create(
        store: &mut ResultsDb,
        env: &LabEnv,
        mut plan: Plan,
        options: &BisectOptions,
        note: &dyn Fn(&str),
    ) -> Result<BisectRun, BisectError> {
        let series = SeriesCells::of(&plan, options.metric)?;
        let goal = goal(options, plan.matrix.repetitions)?;
        plan.matrix.repetitions = goal.budget;
        let (run, plan) = crate::run::create(store, env, plan, false, note)?;
        // The run is a bisection's from the start: it is not resumed as a plain run.
        let begun =
            serde_json::json!({"metric": goal.metric, "patches": series.patches(), "steps": [], "outcome": null});
        keep(store, &run, &begun).map_err(|e| BisectError::Refused(format!("{BISECT_FILE}: {e}")))?;
        Ok(BisectRun { run, plan, series, goal })
    }

    /// Bisects: runs the repetitions the search asks for, records those it did not need as
    /// SKIP, keeps what it decided beside the run's artifacts, and ends the run.
    pub fn execute(
        &self,
        store: Arc<Mutex<ResultsDb>>,
        env: &LabEnv,
        progress: &dyn BisectProgress,
        cancel: &AtomicBool,
    ) -> Result<Bisection, BisectError> {
        let (series, goal, run) = (&self.series, &self.goal, self.run.as_str());
        let mut prober = RunProber {
            store: &store,
            env,
            plan: &self.plan,
            run,
            series,
            goal,
            progress,
            cancel,
            ran: vec![0; series.cells.len()],
        };
        let searched =
            bisect(series.patches(), goal, &mut prober, &mut |step| progress.step(step, &series.steps[step.prefix]));
        let bisection = match searched {
            Ok(bisection) => bisection,
            Err(e) => {
                if matches!(e, BisectError::Cancelled) {
                    scheduler::finish(&store, run, cancel)?;
                }
                return Err(e);
            }
        };
        let unneeded: Vec<(Cell, Failure)> = series
            .cells
            .iter()
            .map(|c| (c.clone(), Failure::Unrunnable { why: "not needed by the bisection".into() }))
            .collect();
        scheduler::record_unrun(&mut lock(&store), run, &self.plan.plan, &unneeded)?;
        if let Err(e) = keep(&lock(&store), run, &bisection) {
            progress.note(&format!("{BISECT_FILE}: {e}"));
        }
        scheduler::finish(&store, run, cancel)?;
        Ok(bisection)
    }
}

/// Writes what a bisection decided (or that it began) beside `run`'s artifacts.
fn keep(store: &ResultsDb, run: &str, what: &impl serde::Serialize) -> std::io::Result<()> {
    let dir = store.artifacts(run);
    std::fs::create_dir_all(&dir)?;
    let json = serde_json::to_string_pretty(what).expect("a bisection always serializes");
    std::fs::write(dir.join(BISECT_FILE), json)
}

/// What the bisection of `run` decided (`outcome` null until it ends), if `run` is one.
pub fn stored(store: &ResultsDb, run: &str) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(store.artifacts(run).join(BISECT_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Runs a series' prefixes as repetitions of the run's cells.
struct RunProber<'a> {
    store: &'a Arc<Mutex<ResultsDb>>,
    env: &'a LabEnv,
    plan: &'a RunPlan,
    run: &'a str,
    series: &'a SeriesCells,
    goal: &'a Goal,
    progress: &'a dyn Progress,
    cancel: &'a AtomicBool,
    /// Repetitions asked of each prefix so far.
    ran: Vec<u32>,
}

impl Prober for RunProber<'_> {
    type Error = BisectError;

    fn probe(&mut self, prefix: usize, more: u32) -> Result<Measured, BisectError> {
        let cell = &self.series.cells[prefix];
        let (from, to) = (self.ran[prefix], (self.ran[prefix] + more).min(self.goal.budget));
        let wanted = |c: &Cell, rep: u32| c.index == cell.index && (from..to).contains(&rep);
        scheduler::execute_some(self.store, self.env, self.plan, self.run, &wanted, self.progress, self.cancel)?;
        if self.cancel.load(Ordering::SeqCst) {
            return Err(BisectError::Cancelled);
        }
        self.ran[prefix] = to;
        let mut measured = Measured::default();
        lock(self.store).visit_records(self.run, |r| {
            if r.cell.index == cell.index && r.repetition < to {
                take(&mut measured, &r, self.goal.metric);
            }
            true
        })?;
        Ok(measured)
    }
}

/// Counts a prefix's record: a passing one's figure, a failed or skipped one's reason (its
/// patch broke the cell, or a prefix before it did not build).
fn take(measured: &mut Measured, record: &Record, metric: Metric) {
    measured.runs += 1;
    match record.status {
        Status::Pass => measured.values.extend(metric.read(record)),
        Status::Fail | Status::Skip => {
            measured.broken.get_or_insert_with(|| record.reason.clone().unwrap_or_else(|| record.status.to_string()));
        }
        Status::Error | Status::Miss => {}
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

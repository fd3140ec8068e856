//! A lab run from start to report: check the matrix against this host, create the run, execute
//! it, and build its report; and the same for a run to resume. What the CLI and, later, the HTTP
//! API call.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::env::LabEnv;
use crate::images::{ImagesError, RunPlan};
use crate::matrix::{MatrixError, Plan};
use crate::report::{Report, RunRecords};
use crate::scheduler::{self, LabError, Outcome, Progress};
use crate::stats::VerdictRule;
use crate::store::{RunState, Store, StoreError};

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The matrix does not check out.
    #[error(transparent)]
    Matrix(#[from] MatrixError),
    /// The lab failed.
    #[error(transparent)]
    Lab(#[from] LabError),
    /// The matrix's images cannot be had.
    #[error(transparent)]
    Images(#[from] ImagesError),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A baseline the run's matrix has no variant of.
    #[error("run {run} has no variant {baseline:?} to judge against; it has {variants}")]
    NoBaseline {
        /// The run.
        run: String,
        /// The baseline asked for.
        baseline: String,
        /// Its variants.
        variants: String,
    },
    /// The run cannot be resumed.
    #[error("run {run} is {state:?}: {why}")]
    NotResumable {
        /// The run.
        run: String,
        /// Its state.
        state: RunState,
        /// What to do instead.
        why: &'static str,
    },
}

impl RunError {
    /// True for the user's mistakes (a bad matrix, a cell this host cannot run).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            RunError::Matrix(_)
                | RunError::NoBaseline { .. }
                | RunError::Lab(LabError::Unrunnable(_))
                | RunError::Images(ImagesError::Missing(_))
        )
    }
}

/// Makes `plan` ready to run (its images built and resolved, progress through `note`), checks
/// it against the host of `env`, and creates its run; returns the run's ID and what it
/// executes. Cells this host cannot run are refused, or recorded as SKIP with `skip_unrunnable`.
pub fn create(
    store: &mut Store,
    env: &LabEnv,
    plan: Plan,
    skip_unrunnable: bool,
    note: &dyn Fn(&str),
) -> Result<(String, RunPlan), RunError> {
    let plan = RunPlan::prepare(plan, &env.images, note)?;
    let refused = scheduler::refusals(env, &plan);
    if !refused.is_empty() && !skip_unrunnable {
        return Err(LabError::Unrunnable(refused).into());
    }
    let run = store.create_run(&plan.plan)?;
    scheduler::record_skips(store, &run, &plan.plan, &refused)?;
    Ok((run, plan))
}

/// Runs what `run` has left to run.
pub fn execute(
    store: Arc<Mutex<Store>>,
    env: &LabEnv,
    plan: &RunPlan,
    run: &str,
    progress: &dyn Progress,
    cancel: &AtomicBool,
) -> Result<Outcome, RunError> {
    Ok(scheduler::execute(store, env, plan, run, progress, cancel)?)
}

/// The plan of a stored run, ready to resume (its images resolved, progress through `note`):
/// refused unless it was interrupted or cancelled.
pub fn resumable(store: &Store, env: &LabEnv, run: &str, note: &dyn Fn(&str)) -> Result<RunPlan, RunError> {
    let info = store.run(run)?;
    match info.state {
        RunState::Interrupted | RunState::Cancelled => {}
        RunState::Done => {
            return Err(RunError::NotResumable {
                run: run.into(),
                state: info.state,
                why: "every repetition has a result; start a new run to measure again",
            });
        }
        RunState::Running => {
            return Err(RunError::NotResumable {
                run: run.into(),
                state: info.state,
                why: "its lab process is still working on it",
            });
        }
    }
    let (file, text, cells) = store.run_plan(run)?;
    let plan = Plan::parse(Path::new(&file), &text)?;
    if plan.cells != cells {
        return Err(StoreError::Corrupt {
            run: run.into(),
            what: "cells",
            reason: "they differ from the matrix's".into(),
        }
        .into());
    }
    Ok(RunPlan::prepare(plan, &env.images, note)?)
}

/// The report of `run`, judged against `baseline` (the matrix's own when none is given).
pub fn report(store: &Store, run: &str, baseline: Option<&str>) -> Result<Report, RunError> {
    let info = store.run(run)?;
    let (_, _, cells) = store.run_plan(run)?;
    let records = store.records(run)?;
    let records = RunRecords { run, matrix: &info.matrix, state: info.state, cells: &cells, records: &records };
    if let Some(asked) = baseline
        && !cells.iter().any(|c| c.variant == asked)
    {
        let mut variants: Vec<&str> = cells.iter().map(|c| c.variant.as_str()).collect();
        variants.dedup();
        return Err(RunError::NoBaseline {
            run: run.to_string(),
            baseline: asked.to_string(),
            variants: variants.join(", "),
        });
    }
    let baseline = baseline.or(info.baseline.as_deref());
    Ok(Report::of_run(&records, baseline, &VerdictRule::default()))
}

/// Run `b` against run `a`, cell by cell.
pub fn compare(store: &Store, a: &str, b: &str) -> Result<Report, RunError> {
    let (info_a, info_b) = (store.run(a)?, store.run(b)?);
    let (cells_a, cells_b) = (store.run_plan(a)?.2, store.run_plan(b)?.2);
    let (records_a, records_b) = (store.records(a)?, store.records(b)?);
    let run_a =
        RunRecords { run: a, matrix: &info_a.matrix, state: info_a.state, cells: &cells_a, records: &records_a };
    let run_b =
        RunRecords { run: b, matrix: &info_b.matrix, state: info_b.state, cells: &cells_b, records: &records_b };
    Ok(Report::compare(&run_a, &run_b, &VerdictRule::default()))
}

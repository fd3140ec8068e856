//! A lab run from start to report: check the matrix against this host, create the run, execute
//! it, and build its report; and the same for a run to resume. What the CLI and, later, the HTTP
//! API call.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::env::LabEnv;
use crate::fleet::{BoxIdentity, FleetShard};
use crate::images::{ImagesError, RunPlan};
use crate::matrix::{MatrixError, Plan};
use crate::report::{Report, RunRecords, RunSamples};
use crate::results_db::{ResultsDb, ResultsDbError, RunState};
use crate::scheduler::{self, LabError, Outcome, Progress};
use crate::stats::VerdictRule;

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
    ResultsDb(#[from] ResultsDbError),
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
    /// The fleet run's shard is a run here already.
    #[error("shard {} of fleet run {} is run {run} here already ({state}): {}", .share.shard, .share.fleet,
        if matches!(.state, RunState::Done) { "its results are in; a shard runs once per fleet run".to_string() }
        else { format!("`driverlab lab resume {run}` finishes it") })]
    ShardTaken {
        /// The fleet run and shard.
        share: FleetShard,
        /// The run that is that shard.
        run: String,
        /// Its state.
        state: RunState,
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
                | RunError::ShardTaken { .. }
                | RunError::Lab(LabError::Unrunnable(_))
                | RunError::Images(
                    ImagesError::Missing(_) | ImagesError::Build(crate::recipe::RecipeError::Refused(_))
                )
        )
    }
}

/// Where a run is: its stored state, or `queued` for a run waiting in a daemon's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum RunPhase {
    /// Waiting in the daemon's queue.
    Queued,
    /// Running.
    Running,
    /// Every repetition has a result.
    Done,
    /// Stopped on request; what did not run is MISS.
    Cancelled,
    /// Its lab process went away before it finished; it can be resumed.
    Interrupted,
}

impl RunPhase {
    /// Whether the run has ended (done, cancelled or interrupted).
    pub fn ended(self) -> bool {
        !matches!(self, RunPhase::Queued | RunPhase::Running)
    }
}

impl From<RunState> for RunPhase {
    fn from(state: RunState) -> RunPhase {
        match state {
            RunState::Running => RunPhase::Running,
            RunState::Done => RunPhase::Done,
            RunState::Interrupted => RunPhase::Interrupted,
            RunState::Cancelled => RunPhase::Cancelled,
        }
    }
}

/// A run's state and progress, as `lab list`, `lab show` and the API give it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct RunStatus {
    /// The run.
    pub id: String,
    /// The matrix's name.
    pub matrix: String,
    /// The matrix's file (`request.toml` for matrices from the API).
    pub matrix_file: String,
    /// Repetitions per cell.
    pub repetitions: u32,
    /// The host it runs on.
    pub host: String,
    /// The fleet run and shard it is, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetShard>,
    /// Where it is.
    pub state: RunPhase,
    /// Cells whose every repetition has a result.
    pub cells_done: usize,
    /// Cells in the run's plan.
    pub cells_total: usize,
    /// Repetitions with a result.
    pub results: usize,
    /// Repetitions in all.
    pub results_total: usize,
    /// Seconds left, estimated from the repetitions so far (running runs).
    pub eta_s: Option<f64>,
    /// Results by status.
    #[schema(value_type = Object)]
    pub counts: std::collections::BTreeMap<crate::record::Status, usize>,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When it finished.
    pub finished_at: Option<String>,
}

/// A run's status as its database has it: counted by the database, per cell and status, so that
/// its cost is the run's cells, not its stored records. Not queued, and no ETA: those are a
/// daemon's to add.
pub fn status(db: &ResultsDb, run: &str) -> Result<RunStatus, ResultsDbError> {
    let info = db.run(run)?;
    let counted = db.result_counts(run)?;
    // A shard's cells are done with the shard's repetitions of them.
    let shard = info.fleet.as_ref().map(|f| f.shard);
    let wanted = |cell: usize| match shard {
        Some(shard) => shard.repetitions_of(cell, info.repetitions).count(),
        None => info.repetitions as usize,
    };
    Ok(RunStatus {
        cells_done: (0..info.cells_total)
            .filter(|&c| counted.per_cell.get(&c).copied().unwrap_or(0) >= wanted(c))
            .count(),
        results: counted.total(),
        results_total: shard
            .map_or(info.cells_total * info.repetitions as usize, |s| s.share(info.cells_total, info.repetitions)),
        fleet: info.fleet,
        eta_s: None,
        counts: counted.by_status,
        state: info.state.into(),
        id: info.id,
        matrix: info.matrix,
        matrix_file: info.matrix_file,
        repetitions: info.repetitions,
        host: info.host,
        cells_total: info.cells_total,
        created_at: info.created_at,
        finished_at: info.finished_at,
    })
}

/// Makes `plan` ready to run (its images built and resolved, progress through `note`), checks
/// it against the host of `env`, and creates its run; returns the run's ID and what it
/// executes. Cells this host cannot run are refused, or recorded as SKIP with `skip_unrunnable`.
pub fn create(
    store: &mut ResultsDb,
    env: &LabEnv,
    plan: Plan,
    skip_unrunnable: bool,
    note: &dyn Fn(&str),
) -> Result<(String, RunPlan), RunError> {
    if let Some(share) = plan.share()
        && let Some(taken) = store.shard_run(share)?
    {
        return Err(RunError::ShardTaken { share: share.clone(), run: taken.id, state: taken.state });
    }
    let plan = RunPlan::prepare(plan, &env.images, note)?;
    let refused = scheduler::refusals(env, &plan);
    if !refused.is_empty() && !skip_unrunnable {
        return Err(LabError::Unrunnable(refused).into());
    }
    let run = store.create_run(&plan.plan)?;
    store.set_box(&run, &BoxIdentity::collect(&plan.plan))?;
    scheduler::record_unrun(store, &run, &plan.plan, &plan.unbuilt())?;
    scheduler::record_checks_once(store, &run, &plan.plan)?;
    scheduler::record_skips(store, &run, &plan.plan, &refused)?;
    Ok((run, plan))
}

/// Runs what `run` has left to run.
pub fn execute(
    store: Arc<Mutex<ResultsDb>>,
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
pub fn resumable(store: &ResultsDb, env: &LabEnv, run: &str, note: &dyn Fn(&str)) -> Result<RunPlan, RunError> {
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
    if crate::bisect::run::stored(store, run).is_some() {
        return Err(RunError::NotResumable {
            run: run.into(),
            state: info.state,
            why: "it is a bisection, whose repetitions follow its steps: bisect again (`lab bisect`, POST /v1/bisects); its prefixes' images are built",
        });
    }
    let (file, text, cells) = store.run_plan(run)?;
    let plan = Plan::parse(Path::new(&file), &text)?.with_share(info.fleet);
    if plan.cells != cells {
        return Err(ResultsDbError::Corrupt {
            run: run.into(),
            what: "cells",
            reason: "they differ from the matrix's".into(),
        }
        .into());
    }
    Ok(RunPlan::prepare(plan, &env.images, note)?)
}

/// Takes `run` (of `plan`) to resume it in this process, on this box: its MISS records go, and
/// its box is this one.
pub fn claim(store: &mut ResultsDb, run: &str, plan: &RunPlan) -> Result<(), RunError> {
    store.claim_run(run)?;
    store.set_box(run, &BoxIdentity::collect(&plan.plan))?;
    Ok(())
}

/// The report of `run`, judged against `baseline` (the matrix's own when none is given).
pub fn report(store: &ResultsDb, run: &str, baseline: Option<&str>) -> Result<Report, RunError> {
    let info = store.run(run)?;
    let (_, _, cells) = store.run_plan(run)?;
    let samples = samples(store, run, cells.len())?;
    let records = RunRecords { run, matrix: &info.matrix, state: info.state, cells: &cells, samples: &samples };
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
    let mut report = Report::of_run(&records, baseline, &VerdictRule::default());
    report.box_identity = info.box_identity;
    Ok(report)
}

/// Run `b` against run `a`, cell by cell.
pub fn compare(store: &ResultsDb, a: &str, b: &str) -> Result<Report, RunError> {
    let (info_a, info_b) = (store.run(a)?, store.run(b)?);
    let (cells_a, cells_b) = (store.run_plan(a)?.2, store.run_plan(b)?.2);
    let (samples_a, samples_b) = (samples(store, a, cells_a.len())?, samples(store, b, cells_b.len())?);
    let run_a =
        RunRecords { run: a, matrix: &info_a.matrix, state: info_a.state, cells: &cells_a, samples: &samples_a };
    let run_b =
        RunRecords { run: b, matrix: &info_b.matrix, state: info_b.state, cells: &cells_b, samples: &samples_b };
    Ok(Report::compare(&run_a, &run_b, &VerdictRule::default()))
}

/// A run's records as a report keeps them, read one at a time: a report's memory is its cells'
/// samples, not the run's records.
fn samples(store: &ResultsDb, run: &str, cells: usize) -> Result<RunSamples, RunError> {
    let mut samples = RunSamples::new(cells);
    store.visit_records(run, |r| {
        samples.add(&r);
        true
    })?;
    Ok(samples)
}

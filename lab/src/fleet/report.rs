//! A fleet run's report: the shards' runs in one results database (merged from the boxes' with
//! `lab import`), checked to be one matrix with each shard once, reported as one run with the
//! usual tables and verdicts, plus the boxes and, per cell, the box effect. Built one record at
//! a time, as a run's report is: its memory is the cells' samples per box.

use super::{BoxEffect, FleetBox, FleetId, Shard};
use crate::report::samples::CellSamples;
use crate::report::{Report, RunRecords, RunSamples};
use crate::results_db::{ResultsDb, ResultsDbError, RunInfo, RunState};
use crate::stats::VerdictRule;

/// Errors of a fleet report.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The database failed.
    #[error(transparent)]
    ResultsDb(#[from] ResultsDbError),
    /// No run of the fleet run.
    #[error("no run of fleet run {0} in the results database (`driverlab lab import` each box's database first)")]
    NoFleet(FleetId),
    /// Shards of different matrices.
    #[error("fleet run {fleet}: its shards are of different matrices ({runs}): a fleet run is one matrix")]
    Matrices {
        /// The fleet run.
        fleet: FleetId,
        /// Each run with its shard and matrix hash.
        runs: String,
    },
    /// Shards cut in different numbers.
    #[error("fleet run {fleet}: its shards were cut in different numbers ({runs})")]
    ShardCounts {
        /// The fleet run.
        fleet: FleetId,
        /// Each run with its shard.
        runs: String,
    },
    /// Two runs claim one shard.
    #[error("fleet run {fleet}: runs {first} and {second} both claim shard {shard}; keep one (a database per shard)")]
    SameShard {
        /// The fleet run.
        fleet: FleetId,
        /// The shard.
        shard: Shard,
        /// One run.
        first: String,
        /// The other.
        second: String,
    },
    /// A baseline the matrix has no variant of.
    #[error("fleet run {fleet} has no variant {baseline:?} to judge against")]
    NoBaseline {
        /// The fleet run.
        fleet: FleetId,
        /// The baseline asked for.
        baseline: String,
    },
    /// A run holds a repetition of another shard.
    #[error(
        "fleet run {fleet}: run {run} (shard {shard}) holds repetition {repetition} of cell {cell}, which is another shard's"
    )]
    Foreign {
        /// The fleet run.
        fleet: FleetId,
        /// The run.
        run: String,
        /// Its shard.
        shard: Shard,
        /// The cell.
        cell: String,
        /// The repetition, from 1.
        repetition: u32,
    },
}

impl FleetError {
    /// True for what the user can fix (no such fleet run, shards that do not belong together).
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, FleetError::ResultsDb(_))
    }
}

/// The report of fleet run `fleet` in `store`, judged against `baseline` (the matrix's own when
/// none is given).
pub fn fleet_report(store: &ResultsDb, fleet: &FleetId, baseline: Option<&str>) -> Result<Report, FleetError> {
    let runs = store.fleet_runs(fleet)?;
    let first = runs.first().ok_or_else(|| FleetError::NoFleet(fleet.clone()))?;
    check_shards(fleet, &runs)?;
    let (_, _, cells) = store.run_plan(&first.id)?;
    let repetitions = first.repetitions;
    if let Some(asked) = baseline.filter(|b| !cells.iter().any(|c| c.variant == *b)) {
        return Err(FleetError::NoBaseline { fleet: fleet.clone(), baseline: asked.to_string() });
    }
    let mut union = RunSamples::new(cells.len());
    let mut per_box: Vec<(Shard, RunSamples)> = Vec::new();
    for run in &runs {
        let shard = shard_of(run);
        let mut mine = RunSamples::new(cells.len());
        let mut foreign = None;
        store.visit_records(&run.id, |r| {
            if !shard.holds(r.cell.index, r.repetition, repetitions) {
                foreign = Some((r.cell.id.clone(), r.repetition + 1));
                return false;
            }
            union.add(&r);
            mine.add(&r);
            true
        })?;
        if let Some((cell, repetition)) = foreign {
            return Err(FleetError::Foreign { fleet: fleet.clone(), run: run.id.clone(), shard, cell, repetition });
        }
        per_box.push((shard, mine));
    }
    let state = fleet_state(&runs);
    let records = RunRecords { run: fleet.as_str(), matrix: &first.matrix, state, cells: &cells, samples: &union };
    let baseline = baseline.or(first.baseline.as_deref());
    let rule = VerdictRule::default();
    let mut report = Report::of_run(&records, baseline, &rule);
    for (i, cell) in cells.iter().enumerate() {
        let boxes: Vec<(Shard, &CellSamples)> =
            per_box.iter().map(|(s, samples)| (*s, samples.cell(cell.index))).collect();
        report.cells[i].box_effect = BoxEffect::of(&boxes, &rule);
    }
    report.boxes = runs
        .iter()
        .map(|r| FleetBox {
            shard: shard_of(r),
            run: r.id.clone(),
            state: r.state,
            results: r.results,
            share: shard_of(r).share(r.cells_total, r.repetitions),
            identity: r.box_identity.clone(),
        })
        .collect();
    let count = shard_of(first).count();
    report.missing_shards = (1..=count)
        .filter_map(|k| Shard::new(k, count).ok())
        .filter(|s| !runs.iter().any(|r| shard_of(r) == *s))
        .collect();
    Ok(report)
}

/// The shard of a run of a fleet run (every run [`ResultsDb::fleet_runs`] gives has one).
fn shard_of(run: &RunInfo) -> Shard {
    run.fleet.as_ref().map_or(Shard::new(1, 1).expect("1/1 is a shard"), |f| f.shard)
}

/// Refuses shards of different matrices, cut in different numbers, or one shard twice.
fn check_shards(fleet: &FleetId, runs: &[RunInfo]) -> Result<(), FleetError> {
    let listed = |what: &dyn Fn(&RunInfo) -> String| {
        runs.iter().map(|r| format!("{} {}", r.id, what(r))).collect::<Vec<_>>().join(", ")
    };
    if runs.windows(2).any(|w| w[0].matrix_hash != w[1].matrix_hash) {
        let runs =
            listed(&|r| format!("shard {} matrix {}", shard_of(r), r.matrix_hash.as_deref().unwrap_or("unknown")));
        return Err(FleetError::Matrices { fleet: fleet.clone(), runs });
    }
    if runs.windows(2).any(|w| shard_of(&w[0]).count() != shard_of(&w[1]).count()) {
        return Err(FleetError::ShardCounts {
            fleet: fleet.clone(),
            runs: listed(&|r| format!("shard {}", shard_of(r))),
        });
    }
    // Sorted by shard: a shard claimed twice is two neighbours.
    if let Some(w) = runs.windows(2).find(|w| shard_of(&w[0]) == shard_of(&w[1])) {
        return Err(FleetError::SameShard {
            fleet: fleet.clone(),
            shard: shard_of(&w[0]),
            first: w[0].id.clone(),
            second: w[1].id.clone(),
        });
    }
    Ok(())
}

/// The fleet run's state: running while a shard runs, interrupted while a shard is missing or
/// interrupted, cancelled when one was, else done.
fn fleet_state(runs: &[RunInfo]) -> RunState {
    let any = |state: RunState| runs.iter().any(|r| r.state == state);
    let count = runs.first().map_or(1, |r| shard_of(r).count()) as usize;
    if any(RunState::Running) {
        RunState::Running
    } else if runs.len() < count || any(RunState::Interrupted) {
        RunState::Interrupted
    } else if any(RunState::Cancelled) {
        RunState::Cancelled
    } else {
        RunState::Done
    }
}

//! What a report keeps of a run's records: per cell its counts by status, its first reasons,
//! crashes and notes, what its repetitions ran under, and each metric's passing samples. Built
//! in one pass over the records, one at a time (`ResultsDb::visit_records`), so that a report
//! holds its cells' samples (at most the matrix's repetitions per metric), never the run's
//! records with their outputs.

use std::collections::BTreeMap;

use super::CrashCount;
use crate::matrix::{Direction, EngineKind};
use crate::metric::Metric;
use crate::record::{Crash, GuestDma, Record, Status};

/// Most distinct reasons, crashes and notes a cell lists; past them the report says how many it
/// left out.
pub const MAX_LISTED: usize = 20;

/// Most distinct selftest subtests a cell tallies (6.12's NIC suite has about 60).
pub const MAX_SUBTESTS: usize = 1000;

/// One cell's share of a run's records.
#[derive(Debug, Clone, Default)]
pub struct CellSamples {
    pub(super) status: BTreeMap<Status, usize>,
    pub(super) reasons: Vec<String>,
    pub(super) crashes: Vec<CrashCount>,
    pub(super) notes: Vec<String>,
    /// Distinct reasons, crashes and notes past [`MAX_LISTED`] each.
    pub(super) left_out: usize,
    /// The engine of its first repetition that was not skipped, and of its first at all.
    pub(super) engine: Option<EngineKind>,
    pub(super) first_engine: Option<EngineKind>,
    pub(super) direction: Option<Direction>,
    pub(super) guest_dma: Option<GuestDma>,
    pub(super) link: Option<String>,
    pub(super) link_profile: Option<vm_spec::pcie_link::LinkProfile>,
    /// Passing repetitions.
    pub(super) passing: usize,
    /// Each metric's values over the passing repetitions, in order.
    pub(super) samples: BTreeMap<Metric, Vec<f64>>,
    /// The selftests' subtests (kselftest cells) by name: their results over the repetitions.
    pub(super) subtests: BTreeMap<String, SubtestTally>,
    /// Whether its image (a series' prefix) did not build.
    pub(super) build_failed: bool,
}

/// One subtest's results over a cell's repetitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SubtestTally {
    /// Repetitions it passed in.
    pub pass: usize,
    /// Repetitions it failed in.
    pub fail: usize,
    /// Repetitions it was skipped in.
    pub skip: usize,
    /// Repetitions it failed in as expected.
    pub xfail: usize,
}

impl SubtestTally {
    /// Whether it always passed (or failed as expected) and ran at least once.
    pub fn clean(&self) -> bool {
        self.fail == 0 && self.pass + self.xfail > 0
    }
}

impl CellSamples {
    /// Takes in one of the cell's records.
    pub fn add(&mut self, r: &Record) {
        *self.status.entry(r.status).or_default() += 1;
        self.build_failed |= matches!(r.failure, Some(crate::failure::Failure::BuildFailed { .. }));
        if let Some(reason) = r.reason.as_ref().filter(|_| r.status != Status::Pass)
            && !self.reasons.contains(reason)
        {
            self.list_reason(reason);
        }
        if let Some(crash) = &r.crash {
            self.count_crash(crash);
        }
        for attempt in &r.retried {
            let kept = attempt.artifacts.as_ref().map(|p| format!(" (its artifacts: {p})")).unwrap_or_default();
            let note = format!(
                "rep {} was run again after an attempt that did not count: {}{kept}",
                r.repetition + 1,
                attempt.reason
            );
            self.list_note(note);
        }
        self.first_engine.get_or_insert(r.engine);
        if r.status != Status::Skip {
            self.engine.get_or_insert(r.engine);
        }
        self.direction = self.direction.or(r.workload.direction);
        self.guest_dma = self.guest_dma.or(r.guest_dma);
        if let Some(link) = &r.link {
            self.link.get_or_insert_with(|| link.link.clone());
            if self.link_profile.is_none() {
                self.link_profile.clone_from(&link.profile);
            }
        }
        self.tally_subtests(r);
        if r.status == Status::Pass {
            self.passing += 1;
            for &metric in Metric::ALL {
                if let Some(value) = metric.read(r) {
                    self.samples.entry(metric).or_default().push(value);
                }
            }
        }
    }

    /// Counts the record's subtests' results (a program that failed with no failed subtest
    /// counts under its own name).
    fn tally_subtests(&mut self, r: &Record) {
        use crate::measure::ktap::KtapStatus;
        for program in r.workload.kselftest.iter().flat_map(|k| &k.tests) {
            let failed_inside = program.subtests.iter().any(|t| t.status == KtapStatus::Fail);
            let own = (program.subtests.is_empty() || (program.status == KtapStatus::Fail && !failed_inside))
                .then(|| (program.short_name().to_string(), program.status));
            for (name, status) in program.subtests.iter().map(|t| (t.name.clone(), t.status)).chain(own) {
                if self.subtests.len() >= MAX_SUBTESTS && !self.subtests.contains_key(&name) {
                    self.left_out += 1;
                    continue;
                }
                let tally = self.subtests.entry(name).or_default();
                match status {
                    KtapStatus::Pass => tally.pass += 1,
                    KtapStatus::Fail => tally.fail += 1,
                    KtapStatus::Skip => tally.skip += 1,
                    KtapStatus::Xfail => tally.xfail += 1,
                }
            }
        }
    }

    fn list_reason(&mut self, reason: &str) {
        if self.reasons.len() < MAX_LISTED {
            self.reasons.push(reason.to_string());
        } else {
            self.left_out += 1;
        }
    }

    fn list_note(&mut self, note: String) {
        if self.notes.len() < MAX_LISTED {
            self.notes.push(note);
        } else {
            self.left_out += 1;
        }
    }

    fn count_crash(&mut self, crash: &Crash) {
        if let Some(c) = self.crashes.iter_mut().find(|c| c.fingerprint == crash.fingerprint) {
            c.count += 1;
        } else if self.crashes.len() < MAX_LISTED {
            let (fingerprint, line) = (crash.fingerprint.clone(), crash.line.clone());
            self.crashes.push(CrashCount { fingerprint, kind: crash.kind, line, count: 1 });
        } else {
            self.left_out += 1;
        }
    }

    /// The engine its repetitions ran under: that of the first one not skipped, else the first's.
    pub(super) fn engine(&self) -> Option<EngineKind> {
        self.engine.or(self.first_engine)
    }

    /// The passing values of `metric`.
    pub fn of(&self, metric: Metric) -> &[f64] {
        self.samples.get(&metric).map_or(&[], Vec::as_slice)
    }
}

/// Every cell's samples of one run, by cell index.
#[derive(Debug, Clone, Default)]
pub struct RunSamples {
    cells: Vec<CellSamples>,
}

impl RunSamples {
    /// Room for `cells` cells.
    pub fn new(cells: usize) -> RunSamples {
        RunSamples { cells: vec![CellSamples::default(); cells] }
    }

    /// The samples of `records` (of a run of `cells` cells), as a report keeps them.
    pub fn of_records<'a>(cells: usize, records: impl IntoIterator<Item = &'a Record>) -> RunSamples {
        let mut samples = RunSamples::new(cells);
        for r in records {
            samples.add(r);
        }
        samples
    }

    /// Takes in one record (one of a cell the run does not have is left out).
    pub fn add(&mut self, r: &Record) {
        if let Some(cell) = self.cells.get_mut(r.cell.index) {
            cell.add(r);
        }
    }

    /// Cell `index`'s samples (none for a cell without records).
    pub fn cell(&self, index: usize) -> &CellSamples {
        static EMPTY: std::sync::LazyLock<CellSamples> = std::sync::LazyLock::new(CellSamples::default);
        self.cells.get(index).unwrap_or(&EMPTY)
    }
}

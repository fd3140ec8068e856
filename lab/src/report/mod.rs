//! Reports: per cell n, mean, standard deviation, min, max and a 95% confidence interval of every
//! metric, and against the baseline the change and a verdict (`summary`). Rendered as JSON (the
//! contract in `docs/lab.md`, here), as tables (`tables`) in markdown (`markdown`) and HTML
//! (`html`), and as CSV (`csv`); `chart` draws the SVG.

mod boxes;
pub mod csv;
mod html;
mod markdown;
pub mod samples;
mod summary;
mod tables;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::matrix::{Cell, Direction, EngineKind};
use crate::metric::Metric;
use crate::record::Status;
use crate::results_db::RunState;
use crate::stats::{Change, Moments, Verdict, VerdictRule};
pub use samples::RunSamples;
use summary::{judge, summarise};

/// One metric of one cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricSummary {
    /// Its summary over the cell's passing repetitions.
    #[serde(flatten)]
    pub moments: Moments,
    /// The change against the baseline cell and its verdict.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
}

/// A crash seen in a cell, and how often.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CrashCount {
    /// The fingerprint.
    pub fingerprint: String,
    /// The kind.
    pub kind: crate::failure::CrashKind,
    /// The line that gave it away (from its first occurrence).
    pub line: String,
    /// Repetitions that showed it.
    pub count: usize,
}

/// One cell of a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellReport {
    /// `c01`, ...
    pub cell: String,
    /// The image.
    pub image: String,
    /// The variant.
    pub variant: String,
    /// Its parameters.
    pub params: BTreeMap<String, String>,
    /// The workload.
    pub workload: String,
    /// The device.
    pub device: String,
    /// The engine its repetitions ran under; none before any ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineKind>,
    /// The workload's direction, for Linux cells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// Passing repetitions: what the metrics summarise.
    pub n: usize,
    /// Repetitions by status.
    pub status: BTreeMap<Status, usize>,
    /// Metrics by name.
    pub metrics: BTreeMap<Metric, MetricSummary>,
    /// The verdict on the primary metric (throughput), or the first metric judged; `baseline` for
    /// the baseline's cells; none without a baseline.
    pub verdict: Option<Verdict>,
    /// The baseline cell compared against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub against: Option<String>,
    /// Why repetitions did not pass, each reason once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Crashes by fingerprint.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub crashes: Vec<CrashCount>,
    /// What the comparison left out, and why (throughput across engines).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// How the guest treated the device's DMA (Linux cells): its slot, IOMMU domain, whether it
    /// was untrusted and had a bounce pool, as the first repetition that reported it saw it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_dma: Option<crate::record::GuestDma>,
    /// The link the `bus_*` metrics' cost model assumed (models' cells): those figures are
    /// modelled, not measured.
    #[serde(rename = "bus_link", skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// Every parameter of that model.
    #[serde(rename = "bus_profile", skip_serializing_if = "Option::is_none")]
    pub link_profile: Option<vm_spec::pcie_link::LinkProfile>,
    /// The selftests' subtests (kselftest cells), by name, with their verdicts against the
    /// baseline cell's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub subtests: Vec<SubtestSummary>,
    /// Where in its patch series the cell's image is (a cell of a series' prefix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<crate::matrix::SeriesStep>,
    /// Whether the prefix's image did not build (its repetitions are its BUILD-FAIL).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub build_failed: bool,
    /// Against the previous prefix's cell (a series' prefix past the base): the change of the
    /// metric the verdict is about, and its verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<StepChange>,
    /// A fleet run's cell: how its boxes' figures spread, and whether a box differs from the
    /// others ([`crate::fleet::effect`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub box_effect: Option<crate::fleet::BoxEffect>,
}

/// A prefix's change against the previous prefix of its series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepChange {
    /// The previous prefix's cell.
    pub cell: String,
    /// The metric compared: Gbit/s when both have it, else the first they share.
    pub metric: Metric,
    /// The change and its verdict.
    #[serde(flatten)]
    pub change: Change,
}

/// One selftest subtest of a cell: its results over the repetitions and, against the baseline
/// cell, whether it broke or was fixed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubtestSummary {
    /// Its name (`ping.test_v4`; a program's, `queues.py`, when it failed outside its subtests).
    pub name: String,
    /// Its results.
    #[serde(flatten)]
    pub tally: samples::SubtestTally,
    /// Against the baseline cell; none for the baseline and where nothing changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<SubtestVerdict>,
}

/// A subtest's verdict against the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum SubtestVerdict {
    /// It passed in every repetition of the baseline and failed here.
    Regression,
    /// It failed in the baseline and passed in every repetition here.
    Fixed,
}

/// A run's report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The run.
    pub run: String,
    /// The matrix's name.
    pub matrix: String,
    /// The run's state.
    pub state: RunState,
    /// The engine that ran the VMs, or `mixed` when cells ran under different ones.
    pub engine: RunEngine,
    /// The baseline variant (or, for `compare`, the run compared against).
    pub baseline: Option<String>,
    /// The cells.
    pub cells: Vec<CellReport>,
    /// A run's report: the box it ran on, as the run stored it.
    #[serde(rename = "box", skip_serializing_if = "Option::is_none")]
    pub box_identity: Option<crate::fleet::BoxIdentity>,
    /// A fleet run's report: its shards, each with its run and the box it ran on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub boxes: Vec<crate::fleet::FleetBox>,
    /// A fleet run's report: the shards no database imported so far has.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing_shards: Vec<crate::fleet::Shard>,
}

/// The engine of a run's VMs: one, or `mixed` when cells ran under different ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum RunEngine {
    /// driverlab's VMM (also a run with no repetition yet).
    Driverlab,
    /// QEMU.
    Qemu,
    /// Cells ran under different engines.
    Mixed,
}

impl From<EngineKind> for RunEngine {
    fn from(engine: EngineKind) -> RunEngine {
        match engine {
            EngineKind::Driverlab => RunEngine::Driverlab,
            EngineKind::Qemu => RunEngine::Qemu,
        }
    }
}

/// What a report is built from: a run's identity, cells and their samples.
pub struct RunRecords<'a> {
    /// The run.
    pub run: &'a str,
    /// Its matrix's name.
    pub matrix: &'a str,
    /// Its state.
    pub state: RunState,
    /// Its cells.
    pub cells: &'a [Cell],
    /// Its records, as a report keeps them.
    pub samples: &'a RunSamples,
}

impl Report {
    /// A short label for `cell` among this report's cells: its variant, with its parameters when
    /// other cells share the variant, with its workload and device when they differ across cells.
    pub fn label(&self, cell: &CellReport) -> String {
        let mut label = cell.variant.clone();
        if self.cells.iter().filter(|c| c.variant == cell.variant).count() > 1 {
            for (k, v) in &cell.params {
                label.push_str(&format!(" {k}={v}"));
            }
        }
        if self.cells.iter().any(|c| c.workload != cell.workload) {
            label.push_str(&format!(" {}", cell.workload));
        }
        if self.cells.iter().any(|c| c.device != cell.device) {
            label.push_str(&format!(" @{}", cell.device));
        }
        label
    }

    /// The report of one run; cells are judged against the baseline variant's cell with the same
    /// workload and device (and the same parameters, where the baseline has several).
    pub fn of_run(run: &RunRecords<'_>, baseline: Option<&str>, rule: &VerdictRule) -> Report {
        let mut cells: Vec<CellReport> = run.cells.iter().map(|c| summarise(c, run.samples.cell(c.index))).collect();
        if let Some(baseline) = baseline {
            let snapshot = cells.clone();
            for (i, cell) in run.cells.iter().enumerate() {
                if cell.variant == baseline {
                    cells[i].verdict = Some(Verdict::Baseline);
                    continue;
                }
                let candidates: Vec<&Cell> = run
                    .cells
                    .iter()
                    .filter(|b| b.variant == baseline && b.workload == cell.workload && b.device == cell.device)
                    .collect();
                let chosen = candidates.iter().find(|b| b.params == cell.params).or(candidates.first());
                if let Some(b) = chosen {
                    let (mine, base) = (run.samples.cell(cell.index), run.samples.cell(b.index));
                    judge(&mut cells[i], mine, &snapshot[b.index], base, rule);
                    summary::judge_subtests(&mut cells[i], base);
                }
            }
        }
        summary::judge_steps(&mut cells, run, rule);
        let engines: std::collections::BTreeSet<EngineKind> = cells.iter().filter_map(|c| c.engine).collect();
        let engine = match engines.len() {
            0 => RunEngine::Driverlab,
            1 => engines.into_iter().next().map_or(RunEngine::Driverlab, RunEngine::from),
            _ => RunEngine::Mixed,
        };
        Report {
            run: run.run.to_string(),
            matrix: run.matrix.to_string(),
            state: run.state,
            engine,
            baseline: baseline.map(String::from),
            cells,
            box_identity: None,
            boxes: Vec::new(),
            missing_shards: Vec::new(),
        }
    }

    /// Run `b` against run `a`: each of `b`'s cells is judged against the cell of `a` with the
    /// same key (image, variant, parameters, workload, device).
    pub fn compare(a: &RunRecords<'_>, b: &RunRecords<'_>, rule: &VerdictRule) -> Report {
        let a_report = Report::of_run(a, None, rule);
        let mut report = Report::of_run(b, None, rule);
        for (i, cell) in b.cells.iter().enumerate() {
            if let Some(base) = a.cells.iter().find(|c| c.key() == cell.key()) {
                let (mine, theirs) = (b.samples.cell(cell.index), a.samples.cell(base.index));
                judge(&mut report.cells[i], mine, &a_report.cells[base.index], theirs, rule);
                summary::judge_subtests(&mut report.cells[i], theirs);
                report.cells[i].against = Some(format!("{}/{}", a.run, base.id));
            }
        }
        report.baseline = Some(a.run.to_string());
        report
    }

    /// The report as JSON (the contract of `docs/lab.md`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }
}

#[cfg(test)]
mod tests;

//! A cell's summary from its samples, and its judgement against a baseline cell.

use std::collections::BTreeMap;

use super::samples::CellSamples;
use super::{CellReport, MetricSummary, RunRecords, StepChange, SubtestSummary, SubtestVerdict};
use crate::matrix::{Cell, EngineKind};
use crate::metric::Metric;
use crate::record::Status;
use crate::stats::{Moments, VerdictRule};

/// A cell's report from its samples.
pub(super) fn summarise(cell: &Cell, s: &CellSamples) -> CellReport {
    let mut status: BTreeMap<Status, usize> = Status::ALL.iter().map(|&st| (st, 0)).collect();
    status.extend(s.status.iter().map(|(&st, &n)| (st, n)));
    let metrics = (s.samples.iter())
        .filter_map(|(&metric, values)| {
            Moments::of(values).map(|moments| (metric, MetricSummary { moments, change: None }))
        })
        .collect();
    let mut notes = s.notes.clone();
    if s.left_out > 0 {
        notes.push(format!("{} more distinct reasons, crashes or notes are not listed", s.left_out));
    }
    CellReport {
        cell: cell.id.clone(),
        image: cell.image.clone(),
        variant: cell.variant.clone(),
        params: cell.params.clone(),
        workload: cell.workload.clone(),
        device: cell.device.clone(),
        engine: s.engine(),
        direction: s.direction,
        n: s.passing,
        status,
        metrics,
        verdict: None,
        against: None,
        reasons: s.reasons.clone(),
        crashes: s.crashes.clone(),
        notes,
        guest_dma: s.guest_dma,
        link: s.link.clone(),
        link_profile: s.link_profile.clone(),
        subtests: (s.subtests.iter())
            .map(|(name, &tally)| SubtestSummary { name: name.clone(), tally, verdict: None })
            .collect(),
        step: cell.step.clone(),
        build_failed: s.build_failed,
        previous: None,
        box_effect: None,
    }
}

/// Each series prefix's cell against the previous prefix's cell with the same variant as
/// written, parameters, workload and device: the change of Gbit/s (or the first metric both
/// have) and its verdict.
pub(super) fn judge_steps(reports: &mut [CellReport], run: &RunRecords<'_>, rule: &VerdictRule) {
    // A prefix's cell by what it shares with the next prefix's, and its position.
    let key = |cell: &Cell, index: usize| {
        cell.step.as_ref().map(|s| (s.series.clone(), s.variant.clone(), index, cell.key_without_image()))
    };
    let by_key: BTreeMap<_, &Cell> =
        run.cells.iter().filter_map(|c| Some((key(c, c.step.as_ref()?.index)?, c))).collect();
    for cell in run.cells {
        let Some(step) = cell.step.as_ref().filter(|s| s.index > 0) else { continue };
        let Some(previous) = key(cell, step.index - 1).and_then(|k| by_key.get(&k)) else { continue };
        let (mine, theirs) = (run.samples.cell(cell.index), run.samples.cell(previous.index));
        let shared = |m: &Metric| theirs.samples.contains_key(m);
        let metric = Some(Metric::PRIMARY)
            .filter(|m| mine.samples.contains_key(m) && shared(m))
            .or_else(|| mine.samples.keys().copied().find(|m| shared(m)));
        let Some(metric) = metric else { continue };
        if let Some(change) = rule.judge(theirs.of(metric), mine.of(metric), metric.higher_is_better()) {
            reports[cell.index].previous = Some(StepChange { cell: previous.id.clone(), metric, change });
        }
    }
}

/// Each subtest's verdict against the baseline cell's samples `base`: a regression where it
/// always passed there and failed here, fixed where it failed there and always passes here.
pub(super) fn judge_subtests(report: &mut CellReport, base: &CellSamples) {
    for subtest in &mut report.subtests {
        let Some(before) = base.subtests.get(&subtest.name) else { continue };
        subtest.verdict = match (before.clean(), subtest.tally.clean()) {
            (true, false) if subtest.tally.fail > 0 => Some(SubtestVerdict::Regression),
            (false, true) if before.fail > 0 => Some(SubtestVerdict::Fixed),
            _ => None,
        };
    }
}

/// Judges `report` (its samples `mine`) against `baseline` (its samples `base`).
pub(super) fn judge(
    report: &mut CellReport,
    mine: &CellSamples,
    baseline: &CellReport,
    base: &CellSamples,
    rule: &VerdictRule,
) {
    let engines_differ = report.engine != baseline.engine;
    for (&name, metric) in report.metrics.iter_mut() {
        if engines_differ && name.engine_bound() {
            continue;
        }
        metric.change = rule.judge(base.of(name), mine.of(name), name.higher_is_better());
    }
    if engines_differ {
        let named = |e: Option<EngineKind>| e.map_or("no engine", EngineKind::name);
        report.notes.push(format!(
            "throughput and time not compared with {}: it ran under {}, this cell under {}, and each engine runs \
             guests at its own speed; maps per packet compare",
            baseline.cell,
            named(baseline.engine),
            named(report.engine)
        ));
    }
    let primary = report
        .metrics
        .get(&Metric::PRIMARY)
        .filter(|m| m.change.is_some())
        .or_else(|| report.metrics.values().find(|m| m.change.is_some()));
    report.verdict = primary.and_then(|m| m.change).map(|c| c.verdict);
    report.against = Some(baseline.cell.clone());
}

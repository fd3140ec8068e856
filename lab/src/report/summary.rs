//! A cell's summary from its records, and its judgement against a baseline cell.

use std::collections::BTreeMap;

use super::{CellReport, CrashCount, MetricSummary};
use crate::matrix::{Cell, EngineKind};
use crate::metric::Metric;
use crate::record::{Crash, Record, Status};
use crate::stats::{Moments, VerdictRule};

/// One note per attempt the host spoiled and the lab ran again: why, and where its artifacts are.
fn retried_notes(records: &[&Record]) -> Vec<String> {
    records
        .iter()
        .flat_map(|r| r.retried.iter().map(move |a| (r.repetition, a)))
        .map(|(rep, a)| {
            let kept = a.artifacts.as_ref().map(|p| format!(" (its artifacts: {p})")).unwrap_or_default();
            format!("rep {} was run again after an attempt that did not count: {}{kept}", rep + 1, a.reason)
        })
        .collect()
}

/// A cell's report from its records.
pub(super) fn summarise(cell: &Cell, records: &[&Record]) -> CellReport {
    let mut status: BTreeMap<Status, usize> = Status::ALL.iter().map(|&s| (s, 0)).collect();
    let mut reasons: Vec<String> = Vec::new();
    let mut crashes: Vec<CrashCount> = Vec::new();
    for r in records {
        *status.entry(r.status).or_default() += 1;
        if let Some(reason) = r.reason.as_ref().filter(|_| r.status != Status::Pass)
            && !reasons.contains(reason)
        {
            reasons.push(reason.clone());
        }
        if let Some(Crash { fingerprint, kind, line, .. }) = &r.crash {
            match crashes.iter_mut().find(|c| c.fingerprint == *fingerprint) {
                Some(c) => c.count += 1,
                None => crashes.push(CrashCount {
                    fingerprint: fingerprint.clone(),
                    kind: *kind,
                    line: line.clone(),
                    count: 1,
                }),
            }
        }
    }
    let passing: Vec<&&Record> = records.iter().filter(|r| r.status == Status::Pass).collect();
    let engine = records.iter().find(|r| r.status != Status::Skip).or(records.first()).map(|r| r.engine);
    let mut metrics = BTreeMap::new();
    for &metric in Metric::ALL {
        let samples: Vec<f64> = passing.iter().filter_map(|r| metric.read(r)).collect();
        if let Some(moments) = Moments::of(&samples) {
            metrics.insert(metric, MetricSummary { moments, change: None });
        }
    }
    CellReport {
        cell: cell.id.clone(),
        image: cell.image.clone(),
        variant: cell.variant.clone(),
        params: cell.params.clone(),
        workload: cell.workload.clone(),
        device: cell.device.clone(),
        engine,
        direction: records.iter().find_map(|r| r.workload.direction),
        n: passing.len(),
        status,
        metrics,
        verdict: None,
        against: None,
        reasons,
        crashes,
        notes: retried_notes(records),
        guest_dma: records.iter().find_map(|r| r.guest_dma),
        link: records.iter().find_map(|r| r.link.as_ref().map(|b| b.link.clone())),
        link_profile: records.iter().find_map(|r| r.link.as_ref().and_then(|b| b.profile.clone())),
    }
}

/// The passing samples of `metric` in `records` of cell `index`.
fn samples(records: &[Record], index: usize, metric: Metric) -> Vec<f64> {
    records
        .iter()
        .filter(|r| r.cell.index == index && r.status == Status::Pass)
        .filter_map(|r| metric.read(r))
        .collect()
}

/// Judges `report` against `baseline` (its samples in `baseline_records`, cell `baseline_index`).
pub(super) fn judge(
    report: &mut CellReport,
    records: &[Record],
    index: usize,
    baseline_records: &[Record],
    baseline: &CellReport,
    baseline_index: usize,
    rule: &VerdictRule,
) {
    let engines_differ = report.engine != baseline.engine;
    for (&name, metric) in report.metrics.iter_mut() {
        if engines_differ && name.engine_bound() {
            continue;
        }
        let base = samples(baseline_records, baseline_index, name);
        let mine = samples(records, index, name);
        metric.change = rule.judge(&base, &mine, name.higher_is_better());
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

//! The report as CSV: one row per cell and metric.

use super::{MetricSummary, Report};
use crate::record::Status;

/// The header row.
const COLUMNS: [&str; 22] = [
    "cell",
    "image",
    "variant",
    "params",
    "workload",
    "device",
    "n",
    "pass",
    "fail",
    "error",
    "miss",
    "skip",
    "metric",
    "mean",
    "stddev",
    "min",
    "max",
    "ci95_low",
    "ci95_high",
    "change_pct",
    "p_value",
    "verdict",
];

impl Report {
    /// The report as CSV: one row per cell and metric (one row with empty figures for a cell
    /// without metrics).
    pub fn to_csv(&self) -> String {
        let mut out = csv::Writer::from_writer(Vec::new());
        // Writing to memory fails only on a row of the wrong length, which these are not.
        let _ = out.write_record(COLUMNS);
        for c in &self.cells {
            let params: Vec<String> = c.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let mut head = vec![
                c.cell.clone(),
                c.image.clone(),
                c.variant.clone(),
                params.join(" "),
                c.workload.clone(),
                c.device.clone(),
                c.n.to_string(),
            ];
            head.extend(Status::ALL.iter().map(|s| c.status.get(s).copied().unwrap_or(0).to_string()));
            let rows: Vec<(&str, Option<&MetricSummary>)> = if c.metrics.is_empty() {
                vec![("", None)]
            } else {
                c.metrics.iter().map(|(k, m)| (k.name(), Some(m))).collect()
            };
            for (name, metric) in rows {
                let _ = out.write_record(head.iter().cloned().chain(figures(name, metric)));
            }
        }
        String::from_utf8(out.into_inner().unwrap_or_default()).unwrap_or_default()
    }
}

/// A metric's columns: its name, its moments, its change against the baseline.
fn figures(name: &str, metric: Option<&MetricSummary>) -> [String; 10] {
    let num = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
    let (m, ch) = (metric.map(|m| m.moments), metric.and_then(|m| m.change));
    [
        name.to_string(),
        num(m.map(|m| m.mean)),
        num(m.map(|m| m.stddev)),
        num(m.map(|m| m.min)),
        num(m.map(|m| m.max)),
        num(m.and_then(|m| m.ci95).map(|c| c[0])),
        num(m.and_then(|m| m.ci95).map(|c| c[1])),
        num(ch.and_then(|c| c.change_pct)),
        num(ch.and_then(|c| c.p_value)),
        ch.map_or(String::new(), |c| c.verdict.to_string()),
    ]
}

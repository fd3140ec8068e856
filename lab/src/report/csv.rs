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
                text_cell(&c.cell),
                text_cell(&c.image),
                text_cell(&c.variant),
                text_cell(&params.join(" ")),
                text_cell(&c.workload),
                text_cell(&c.device),
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

/// A text cell as a spreadsheet may open it: one beginning with `=`, `+`, `-`, `@`, a tab or a
/// carriage return would be taken for a formula, so it gets a leading `'` (OWASP's advice on
/// CSV injection). Figures are written as numbers and are not text cells.
pub fn text_cell(text: &str) -> String {
    match text.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{text}"),
        _ => text.to_string(),
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

#[cfg(test)]
mod tests {
    use super::text_cell;

    #[test]
    fn a_text_cell_that_a_spreadsheet_would_take_for_a_formula_is_quoted() {
        for (text, cell) in [
            ("=HYPERLINK(1)", "'=HYPERLINK(1)"),
            ("+1", "'+1"),
            ("-x", "'-x"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\tx", "'\tx"),
            ("stock", "stock"),
            ("a=b", "a=b"),
            ("", ""),
        ] {
            assert_eq!(text_cell(text), cell, "{text:?}");
        }
    }
}

//! The report as markdown.

use std::fmt::Write as _;

use super::Report;
use super::boxes::{BOX_EFFECT_NOTE, BOXES_NOTE};
use super::tables::{CPU_NOTE, DMA_NOTE, LATENCY_NOTE, LINK_NOTE, READY_NOTE, SERIES_NOTE, SUBTEST_NOTE};

/// A markdown table of `rows` under `columns`, after `intro`; nothing for no rows but the
/// cells' own table (which has no intro).
fn table<const N: usize>(out: &mut String, intro: Option<&str>, columns: &[&str; N], rows: &[[String; N]]) {
    if let Some(intro) = intro {
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(out, "\n{intro}");
    }
    let _ = writeln!(out, "\n| {} |", columns.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(N));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
}

impl Report {
    /// The report as a markdown table (and the bus and readiness tables, when cells have their
    /// figures).
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## {} — run {} ({})", self.matrix, self.run, self.state);
        if let Some(rule) = self.rule() {
            let _ = writeln!(out, "\n{rule}");
        }
        table(&mut out, None, &Report::COLUMNS, &self.rows());
        table(&mut out, Some(DMA_NOTE), &Report::DMA_COLUMNS, &self.dma_rows());
        table(&mut out, Some(CPU_NOTE), &Report::CPU_COLUMNS, &self.cpu_rows());
        table(&mut out, Some(LATENCY_NOTE), &Report::LATENCY_COLUMNS, &self.latency_rows());
        table(&mut out, Some(SERIES_NOTE), &Report::SERIES_COLUMNS, &self.series_rows());
        table(&mut out, Some(SUBTEST_NOTE), &Report::SUBTEST_COLUMNS, &self.subtest_rows());
        let bus = self.link_rows();
        if !bus.is_empty() {
            table(&mut out, Some(LINK_NOTE), &Report::LINK_COLUMNS, &bus);
            for parameters in self.link_parameters() {
                let _ = writeln!(out, "\n{parameters}");
            }
        }
        table(&mut out, Some(READY_NOTE), &Report::READY_COLUMNS, &self.ready_rows());
        table(&mut out, Some(BOXES_NOTE), &Report::BOX_COLUMNS, &self.box_rows());
        table(&mut out, Some(BOX_EFFECT_NOTE), &Report::BOX_EFFECT_COLUMNS, &self.box_effect_rows());
        if let Some(identity) = &self.box_identity {
            let _ = writeln!(out, "\nRan on {}.", identity.summary());
        }
        for c in self.cells.iter().filter(|c| !c.notes.is_empty()) {
            let _ = writeln!(out, "\n{}: {}", c.cell, c.notes.join("; "));
        }
        for c in self.cells.iter().filter(|c| !c.reasons.is_empty()) {
            let _ = writeln!(out, "\n{} did not always pass: {}", c.cell, c.reasons.join("; "));
        }
        out
    }
}

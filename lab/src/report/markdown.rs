//! The report as markdown.

use std::fmt::Write as _;

use super::Report;
use super::tables::LINK_NOTE;

impl Report {
    /// The report as a markdown table (and the bus and readiness tables, when cells have their
    /// figures).
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## {} — run {} ({})", self.matrix, self.run, self.state);
        if let Some(rule) = self.rule() {
            let _ = writeln!(out, "\n{rule}");
        }
        let _ = writeln!(out, "\n| {} |", Report::COLUMNS.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(Report::COLUMNS.len()));
        for row in self.rows() {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        let bus = self.link_rows();
        if !bus.is_empty() {
            let _ = writeln!(out, "\n{LINK_NOTE}\n\n| {} |", Report::LINK_COLUMNS.join(" | "));
            let _ = writeln!(out, "|{}", "---|".repeat(Report::LINK_COLUMNS.len()));
            for row in bus {
                let _ = writeln!(out, "| {} |", row.join(" | "));
            }
            for parameters in self.link_parameters() {
                let _ = writeln!(out, "\n{parameters}");
            }
        }
        let ready = self.ready_rows();
        if !ready.is_empty() {
            let _ = writeln!(
                out,
                "\nTime to a ready cell (from spawning the VMM):\n\n| {} |",
                Report::READY_COLUMNS.join(" | ")
            );
            let _ = writeln!(out, "|{}", "---|".repeat(Report::READY_COLUMNS.len()));
            for row in ready {
                let _ = writeln!(out, "| {} |", row.join(" | "));
            }
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

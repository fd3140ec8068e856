//! The report as an HTML page.

use std::fmt::Write as _;

use super::Report;
use super::boxes::{BOX_EFFECT_NOTE, BOXES_NOTE};
use super::tables::{CPU_NOTE, DMA_NOTE, LATENCY_NOTE, LINK_NOTE, SERIES_NOTE, SUBTEST_NOTE};

/// An HTML table `id` of `rows` under `columns`, after `intro`; nothing for no rows but the
/// cells' own table (which has no intro).
fn table<const N: usize>(out: &mut String, id: &str, intro: Option<&str>, columns: &[&str; N], rows: &[[String; N]]) {
    if let Some(intro) = intro {
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(out, "<p>{}</p>", escape(intro));
    }
    let _ = writeln!(out, "<table id=\"{id}\">\n<thead><tr>");
    for column in columns {
        let _ = write!(out, "<th>{}</th>", escape(column));
    }
    let _ = writeln!(out, "</tr></thead>\n<tbody>");
    for row in rows {
        let cells: String = row.iter().map(|v| format!("<td>{}</td>", escape(v))).collect();
        let _ = writeln!(out, "<tr>{cells}</tr>");
    }
    let _ = writeln!(out, "</tbody>\n</table>");
}

impl Report {
    /// The report as a page for a browser: the table and `chart` (an SVG document), with no
    /// script and nothing fetched from elsewhere.
    pub fn to_html(&self, chart: &str) -> String {
        let mut out = String::new();
        let title = format!("{} — run {} ({})", self.matrix, self.run, self.state);
        let _ = write!(
            out,
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n\
             <link rel=\"icon\" href=\"data:,\">\n<style>\n\
             body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}\n\
             table {{ border-collapse: collapse; }}\n\
             th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }}\n\
             th {{ background: #f3f3f3; }}\n\
             td:nth-child(-n+4), td:nth-child(6), td:last-child {{ text-align: left; }}\n\
             </style>\n</head>\n<body>\n<h1>{}</h1>\n",
            escape(&title),
            escape(&title)
        );
        if let Some(rule) = self.rule() {
            let _ = writeln!(out, "<p>{}</p>", escape(&rule));
        }
        table(&mut out, "cells", None, &Report::COLUMNS, &self.rows());
        table(&mut out, "dma", Some(DMA_NOTE), &Report::DMA_COLUMNS, &self.dma_rows());
        table(&mut out, "cpu", Some(CPU_NOTE), &Report::CPU_COLUMNS, &self.cpu_rows());
        table(&mut out, "latency", Some(LATENCY_NOTE), &Report::LATENCY_COLUMNS, &self.latency_rows());
        table(&mut out, "series", Some(SERIES_NOTE), &Report::SERIES_COLUMNS, &self.series_rows());
        table(&mut out, "subtests", Some(SUBTEST_NOTE), &Report::SUBTEST_COLUMNS, &self.subtest_rows());
        let bus = self.link_rows();
        if !bus.is_empty() {
            table(&mut out, "bus", Some(LINK_NOTE), &Report::LINK_COLUMNS, &bus);
            for parameters in self.link_parameters() {
                let _ = writeln!(out, "<p>{}</p>", escape(&parameters));
            }
        }
        table(&mut out, "boxes", Some(BOXES_NOTE), &Report::BOX_COLUMNS, &self.box_rows());
        table(&mut out, "box-effects", Some(BOX_EFFECT_NOTE), &Report::BOX_EFFECT_COLUMNS, &self.box_effect_rows());
        if let Some(identity) = &self.box_identity {
            let _ = writeln!(out, "<p>Ran on {}.</p>", escape(&identity.summary()));
        }
        for c in self.cells.iter().filter(|c| !c.notes.is_empty()) {
            let _ = writeln!(out, "<p>{}: {}</p>", escape(&c.cell), escape(&c.notes.join("; ")));
        }
        for c in self.cells.iter().filter(|c| !c.reasons.is_empty()) {
            let _ = writeln!(out, "<p>{} did not always pass: {}</p>", escape(&c.cell), escape(&c.reasons.join("; ")));
        }
        // The chart inline, without its XML declaration.
        let svg = chart.find("<svg").map_or("", |i| &chart[i..]);
        let _ = writeln!(out, "<figure id=\"chart\">\n{svg}\n</figure>\n</body>\n</html>");
        out
    }
}

/// Text safe inside HTML elements and attribute values.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

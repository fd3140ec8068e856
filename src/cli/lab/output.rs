//! What the `lab` commands print, the same whichever backend ran them: the progress line per
//! repetition, the last line of a run, `lab list`'s rows and `lab show`'s record lines.

use std::io::IsTerminal;
use std::time::Instant;

use lab::record::{Record, Status};
use lab::scheduler::Progress;

/// A repetition's progress line: `[done/total] CELL LABEL rep N: STATUS figures-or-reason`.
pub fn repetition_line(
    (done, total): (usize, usize),
    (cell, label, repetition): (&str, &str, u32),
    status: Status,
    reason: Option<&str>,
    (gbit_s, maps_per_packet): (Option<f64>, Option<f64>),
) -> String {
    let mut figures = Vec::new();
    if let Some(g) = gbit_s {
        figures.push(format!("{g:.3} Gbit/s"));
    }
    if let Some(m) = maps_per_packet {
        figures.push(format!("{m:.4} maps/packet"));
    }
    let what = match reason {
        Some(reason) if status != Status::Pass => reason.to_string(),
        _ => figures.join(", "),
    };
    format!("[{done}/{total}] {cell} {label} rep {}: {status} {what}", repetition + 1)
}

/// The last line of `lab run` and `lab resume`, from the run's counts by status.
pub fn last_line(run: &str, cells: usize, count: impl Fn(Status) -> usize, cancelled: bool) -> String {
    let mut last = format!(
        "run {run}: {cells} cells, {} passed, {} failed, {} errors",
        count(Status::Pass),
        count(Status::Fail),
        count(Status::Error)
    );
    for (status, word) in [(Status::Skip, "skipped"), (Status::Miss, "missed")] {
        if count(status) > 0 {
            last.push_str(&format!(", {} {word}", count(status)));
        }
    }
    if cancelled {
        last.push_str(" (cancelled)");
    }
    last
}

/// The header of `lab list`.
pub fn list_header() -> String {
    format!("{:<22} {:<12} {:>5} {:>9}  {:<24} matrix", "run", "state", "cells", "results", "created")
}

/// One run's line of `lab list`.
pub fn list_row(
    id: &str,
    state: impl std::fmt::Display,
    cells: usize,
    results: usize,
    total: usize,
    created: &str,
    matrix: &str,
) -> String {
    let results = format!("{results}/{total}");
    let state = state.to_string();
    format!("{id:<22} {state:<12} {cells:>5} {results:>9}  {created:<24} {matrix}")
}

/// One record's line of `lab show`.
pub fn record_line(r: &Record) -> String {
    let mut figures = Vec::new();
    if let Some(g) = r.workload.gbit_s {
        figures.push(format!("{g:.3} Gbit/s"));
    }
    if let Some(m) = r.shown_maps() {
        figures.push(format!("{m:.4} maps/packet"));
    }
    if let Some(reason) = &r.reason {
        figures.push(reason.clone());
    }
    format!("  {} rep {} {:<5} {}: {}", r.cell.id, r.repetition + 1, r.status.name(), r.cell.key(), figures.join(", "))
}

/// Progress on stderr: a bar with an ETA on a terminal, one line per repetition otherwise.
pub struct Console {
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
}

impl Console {
    /// Progress for a run of `total` repetitions, `done` of them recorded already.
    pub fn new(total: usize, done: usize) -> Console {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} repetitions, ETA {eta} {msg}")
                    .expect("a valid template"),
            );
            bar.set_position(done as u64);
            bar
        });
        Console { bar, started: Instant::now() }
    }

    /// Progress as lines only, without a bar (a run followed through a daemon, whose size comes
    /// with its events).
    pub fn plain() -> Console {
        Console { bar: None, started: Instant::now() }
    }

    /// A line between the progress.
    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}

impl Console {
    /// A repetition's line (`text`), `done` of the run's recorded, `short` for the bar's message.
    pub fn repetition(&self, text: &str, done: usize, short: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(done as u64);
                bar.set_message(short.to_string());
                bar.println(text);
            }
            None => eprintln!("{text} ({:.1} s)", self.started.elapsed().as_secs_f64()),
        }
    }

    /// Clears the bar, when there is one.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Progress for Console {
    fn recorded(&self, r: &Record, done: usize, total: usize) {
        let text = repetition_line(
            (done, total),
            (&r.cell.id, &r.cell.label(), r.repetition),
            r.status,
            r.reason.as_deref(),
            (r.workload.gbit_s, r.shown_maps()),
        );
        self.repetition(&text, done, &format!("{} {}", r.cell.id, r.status));
    }

    fn note(&self, line: &str) {
        self.line(line);
    }
}
/// The last line of a run the CLI stopped following because its daemon went away (docs/lab.md:
/// `run ID: interrupted: WHY; ...resume...`).
pub fn interrupted_line(run: &str, why: &str) -> String {
    format!("run {run}: interrupted: {why}; `driverlab lab resume {run}` once the daemon is back")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_lines_are_the_documented_ones() {
        let count = |s: Status| match s {
            Status::Pass => 5,
            Status::Skip => 1,
            _ => 0,
        };
        assert_eq!(last_line("r1", 3, count, false), "run r1: 3 cells, 5 passed, 0 failed, 0 errors, 1 skipped");
        assert_eq!(
            interrupted_line("r1", "HTTP: gone"),
            "run r1: interrupted: HTTP: gone; `driverlab lab resume r1` once the daemon is back"
        );
    }
}

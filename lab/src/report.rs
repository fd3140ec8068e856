//! Reports: per cell n, mean, standard deviation, min, max and a 95% confidence interval of every
//! metric, and against the baseline the change and a verdict. Rendered as JSON (the contract in
//! `docs/lab.md`), markdown and CSV; `chart` draws the SVG.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::matrix::{Cell, Direction, EngineKind};
use crate::metric::Metric;
use crate::record::{Crash, Record, Status};
use crate::results_db::RunState;
use crate::stats::{Change, Moments, Verdict, VerdictRule};

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
    /// The link the `bus_*` metrics' cost model assumed (models' cells): those figures are
    /// modelled, not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus_link: Option<String>,
    /// Every parameter of that model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus_profile: Option<vm_spec::pcie_link::LinkProfile>,
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

/// What a report is built from: a run's identity, cells and records.
pub struct RunRecords<'a> {
    /// The run.
    pub run: &'a str,
    /// Its matrix's name.
    pub matrix: &'a str,
    /// Its state.
    pub state: RunState,
    /// Its cells.
    pub cells: &'a [Cell],
    /// Its records.
    pub records: &'a [Record],
}

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

fn summarise(cell: &Cell, records: &[&Record]) -> CellReport {
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
        bus_link: records.iter().find_map(|r| r.link.as_ref().map(|b| b.link.clone())),
        bus_profile: records.iter().find_map(|r| r.link.as_ref().and_then(|b| b.profile.clone())),
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
fn judge(
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
        let mut cells: Vec<CellReport> = run
            .cells
            .iter()
            .map(|c| summarise(c, &run.records.iter().filter(|r| r.cell.index == c.index).collect::<Vec<_>>()))
            .collect();
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
                    judge(&mut cells[i], run.records, cell.index, run.records, &snapshot[b.index], b.index, rule);
                }
            }
        }
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
        }
    }

    /// Run `b` against run `a`: each of `b`'s cells is judged against the cell of `a` with the
    /// same key (image, variant, parameters, workload, device).
    pub fn compare(a: &RunRecords<'_>, b: &RunRecords<'_>, rule: &VerdictRule) -> Report {
        let a_report = Report::of_run(a, None, rule);
        let mut report = Report::of_run(b, None, rule);
        for (i, cell) in b.cells.iter().enumerate() {
            if let Some(base) = a.cells.iter().find(|c| c.key() == cell.key()) {
                judge(
                    &mut report.cells[i],
                    b.records,
                    cell.index,
                    a.records,
                    &a_report.cells[base.index],
                    base.index,
                    rule,
                );
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

    /// The table's header: what [`Report::rows`] gives for each cell.
    pub const COLUMNS: [&'static str; 11] = [
        "cell",
        "variant",
        "workload",
        "device",
        "n",
        "status",
        "Gbit/s",
        "change",
        "maps/packet",
        "change",
        "verdict",
    ];

    /// One row per cell, as the markdown and HTML tables show them.
    pub fn rows(&self) -> Vec<[String; 11]> {
        self.cells
            .iter()
            .map(|c| {
                let status: Vec<String> =
                    c.status.iter().filter(|(_, n)| **n > 0).map(|(s, n)| format!("{n} {s}")).collect();
                let (gbit, gbit_change) = cell_metric(c, Metric::GbitS, 3);
                // Maps per packet of the side the workload moves, where a cell splits them.
                let side = match c.direction {
                    Some(Direction::Tx) => Metric::TxMapsPerPacket,
                    _ => Metric::RxMapsPerPacket,
                };
                let maps_metric = if c.metrics.contains_key(&side) { side } else { Metric::MapsPerPacket };
                let (maps, maps_change) = cell_metric(c, maps_metric, 4);
                let verdict = c.verdict.map_or(String::from("-"), |v| v.to_string());
                [
                    c.cell.clone(),
                    self.label(c),
                    c.workload.clone(),
                    c.device.clone(),
                    c.n.to_string(),
                    status.join(", "),
                    gbit,
                    gbit_change,
                    maps,
                    maps_change,
                    verdict,
                ]
            })
            .collect()
    }

    fn rule(&self) -> Option<String> {
        self.baseline.as_ref().map(|b| {
            format!(
                "Against {b}; a change is called real at 5 % or more with Welch's p < 0.05 (and, below 10 samples, non-overlapping ranges)."
            )
        })
    }

    /// The bus table's header: what [`Report::bus_rows`] gives for each cell with bus figures.
    pub const BUS_COLUMNS: [&'static str; 11] = [
        "cell",
        "variant",
        "link (modelled)",
        "RX TLPs/packet",
        "RX descriptor reads/packet",
        "TX TLPs/packet",
        "TX descriptor reads/packet",
        "partial writes/packet RX, TX",
        "RX bus ns/packet (modelled)",
        "TX bus ns/packet (modelled)",
        "bus ns/packet, both (modelled)",
    ];

    /// One row per cell that has bus figures: what its model put on the link per packet, and
    /// the bus time the cost model gives (with what bounds it).
    pub fn bus_rows(&self) -> Vec<[String; 11]> {
        self.cells
            .iter()
            .filter_map(|c| {
                let link = c.bus_link.clone()?;
                let value = |name: Metric, digits: usize| cell_metric(c, name, digits).0;
                Some([
                    c.cell.clone(),
                    self.label(c),
                    link,
                    value(Metric::BusRxTlpsPerPacket, 2),
                    value(Metric::BusRxDescriptorReadsPerPacket, 3),
                    value(Metric::BusTxTlpsPerPacket, 2),
                    value(Metric::BusTxDescriptorReadsPerPacket, 3),
                    format!(
                        "{}, {}",
                        value(Metric::BusRxPartialWritesPerPacket, 2),
                        value(Metric::BusTxPartialWritesPerPacket, 2)
                    ),
                    value(Metric::BusRxNsPerPacket, 1),
                    value(Metric::BusTxNsPerPacket, 1),
                    value(Metric::BusNsPerPacket, 1),
                ])
            })
            .collect()
    }

    /// The readiness table's header: what [`Report::ready_rows`] gives for each Linux cell.
    pub const READY_COLUMNS: [&'static str; 5] =
        ["cell", "variant", "agent up, median ms", "workload start, median ms", "VM run, median ms"];

    /// One row per cell whose repetitions timed the guest's way to its workload (Linux cells):
    /// the medians from spawning the VMM to the agent's first frame and to `workload-begin`,
    /// and of the VM's run.
    pub fn ready_rows(&self) -> Vec<[String; 5]> {
        let median = |c: &CellReport, name: Metric| {
            c.metrics.get(&name).map_or("-".into(), |m| format!("{:.0}", m.moments.median))
        };
        self.cells
            .iter()
            .filter(|c| c.metrics.contains_key(&Metric::WorkloadStartMs))
            .map(|c| {
                [
                    c.cell.clone(),
                    self.label(c),
                    median(c, Metric::AgentReadyMs),
                    median(c, Metric::WorkloadStartMs),
                    median(c, Metric::VmRunMs),
                ]
            })
            .collect()
    }

    /// The cost model's parameters, one sentence per link the cells' models assumed.
    pub fn bus_parameters(&self) -> Vec<String> {
        let mut seen: Vec<&vm_spec::pcie_link::LinkProfile> = Vec::new();
        for p in self.cells.iter().filter_map(|c| c.bus_profile.as_ref()) {
            if !seen.contains(&p) {
                seen.push(p);
            }
        }
        seen.iter()
            .map(|p| {
                format!(
                    "Modelled {}: {} GT/s x{} at {:.3} payload per bit, {} bytes per TLP beyond its payload, \
                     {}-byte read requests, {}-byte lines, {}-byte descriptor bursts, a {} ns read round trip, \
                     {} reads in flight.",
                    p.link,
                    p.gt_per_s,
                    p.lanes,
                    p.encoding,
                    p.tlp_overhead,
                    p.max_read_request,
                    p.cache_line,
                    p.descriptor_burst,
                    p.read_latency_ns,
                    p.outstanding_reads
                )
            })
            .collect()
    }

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
        let bus = self.bus_rows();
        if !bus.is_empty() {
            let _ = writeln!(out, "\n{BUS_NOTE}\n\n| {} |", Report::BUS_COLUMNS.join(" | "));
            let _ = writeln!(out, "|{}", "---|".repeat(Report::BUS_COLUMNS.len()));
            for row in bus {
                let _ = writeln!(out, "| {} |", row.join(" | "));
            }
            for parameters in self.bus_parameters() {
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
        let _ = writeln!(out, "<table id=\"cells\">\n<thead><tr>");
        for column in Report::COLUMNS {
            let _ = write!(out, "<th>{}</th>", escape(column));
        }
        let _ = writeln!(out, "</tr></thead>\n<tbody>");
        for row in self.rows() {
            let cells: String = row.iter().map(|v| format!("<td>{}</td>", escape(v))).collect();
            let _ = writeln!(out, "<tr>{cells}</tr>");
        }
        let _ = writeln!(out, "</tbody>\n</table>");
        let bus = self.bus_rows();
        if !bus.is_empty() {
            let _ = writeln!(out, "<p>{}</p>\n<table id=\"bus\">\n<thead><tr>", escape(BUS_NOTE));
            for column in Report::BUS_COLUMNS {
                let _ = write!(out, "<th>{}</th>", escape(column));
            }
            let _ = writeln!(out, "</tr></thead>\n<tbody>");
            for row in bus {
                let cells: String = row.iter().map(|v| format!("<td>{}</td>", escape(v))).collect();
                let _ = writeln!(out, "<tr>{cells}</tr>");
            }
            let _ = writeln!(out, "</tbody>\n</table>");
            for parameters in self.bus_parameters() {
                let _ = writeln!(out, "<p>{}</p>", escape(&parameters));
            }
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

    /// The report as CSV: one row per cell and metric.
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "cell,image,variant,params,workload,device,n,pass,fail,error,miss,skip,metric,mean,stddev,min,max,ci95_low,ci95_high,change_pct,p_value,verdict\n",
        );
        for c in &self.cells {
            let params: Vec<String> = c.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let head = [
                c.cell.clone(),
                c.image.clone(),
                c.variant.clone(),
                params.join(" "),
                c.workload.clone(),
                c.device.clone(),
                c.n.to_string(),
            ]
            .map(|f| csv_field(&f))
            .join(",");
            let counts: Vec<String> =
                Status::ALL.iter().map(|s| c.status.get(s).copied().unwrap_or(0).to_string()).collect();
            let rows: Vec<(&str, Option<&MetricSummary>)> = if c.metrics.is_empty() {
                vec![("", None)]
            } else {
                c.metrics.iter().map(|(k, m)| (k.name(), Some(m))).collect()
            };
            for (name, metric) in rows {
                let num = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
                let (m, ch) = (metric.map(|m| m.moments), metric.and_then(|m| m.change));
                let _ = writeln!(
                    out,
                    "{head},{},{name},{},{},{},{},{},{},{},{},{}",
                    counts.join(","),
                    num(m.map(|m| m.mean)),
                    num(m.map(|m| m.stddev)),
                    num(m.map(|m| m.min)),
                    num(m.map(|m| m.max)),
                    num(m.and_then(|m| m.ci95).map(|c| c[0])),
                    num(m.and_then(|m| m.ci95).map(|c| c[1])),
                    num(ch.and_then(|c| c.change_pct)),
                    num(ch.and_then(|c| c.p_value)),
                    ch.map_or(String::new(), |c| c.verdict.to_string()),
                );
            }
        }
        out
    }
}

/// What the bus table is.
const BUS_NOTE: &str = "What the device model put on its PCIe link per packet, counted as the chip would issue it, \
     and the link time a cost model of that link gives for it (modelled, not measured; docs/lab.md has the rules).";

/// `mean ± ci half-width` and `+12.3 %` of a metric, or dashes.
fn cell_metric(c: &CellReport, name: Metric, digits: usize) -> (String, String) {
    let Some(m) = c.metrics.get(&name) else { return ("-".into(), "-".into()) };
    let value = match m.moments.ci95 {
        Some([lo, hi]) => format!("{:.digits$} ± {:.digits$}", m.moments.mean, (hi - lo) / 2.0),
        None => format!("{:.digits$}", m.moments.mean),
    };
    let change = match m.change.and_then(|c| c.change_pct) {
        Some(pct) => format!("{pct:+.1} %"),
        None if m.change.is_some() => "from 0".into(),
        None => "-".into(),
    };
    (value, change)
}

/// Text safe inside HTML elements and attribute values.
fn escape(text: &str) -> String {
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

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;

    fn cell(index: usize, variant: &str) -> Cell {
        Cell {
            index,
            id: format!("c{:02}", index + 1),
            image: "probe".into(),
            variant: variant.into(),
            params: BTreeMap::new(),
            workload: "rx".into(),
            device: "aq".into(),
        }
    }

    fn record(cell: &Cell, rep: u32, gbit: f64, maps: f64, status: Status) -> Record {
        let mut r = crate::record::test_record("r1", cell, rep, status, "it broke");
        r.workload.gbit_s = Some(gbit);
        r.maps_per_packet = Some(maps);
        r
    }

    fn records(cells: &[Cell]) -> Vec<Record> {
        let mut out = Vec::new();
        for rep in 0..5 {
            let wobble = rep as f64 * 0.01;
            out.push(record(&cells[0], rep, 2.2 + wobble, 0.5, Status::Pass));
            out.push(record(&cells[1], rep, 9.1 + wobble, 0.0625, Status::Pass));
            out.push(record(&cells[2], rep, 2.21 - wobble, 0.5, if rep == 4 { Status::Fail } else { Status::Pass }));
        }
        out
    }

    #[test]
    fn throughput_is_not_compared_across_engines_and_maps_per_packet_is() {
        let cells = [cell(0, "flip"), cell(1, "order3"), cell(2, "same")];
        let mut records = records(&cells);
        for r in records.iter_mut().filter(|r| r.cell.index == 1) {
            r.engine = EngineKind::Qemu;
        }
        let run = RunRecords { run: "r1", matrix: "m", state: RunState::Done, cells: &cells, records: &records };
        let report = Report::of_run(&run, Some("flip"), &VerdictRule::default());
        let order3 = &report.cells[1];
        assert_eq!((report.engine, order3.engine), (RunEngine::Mixed, Some(EngineKind::Qemu)));
        assert!(order3.metrics[&Metric::GbitS].change.is_none(), "no throughput change across engines");
        let maps = order3.metrics[&Metric::MapsPerPacket].change.unwrap();
        assert_eq!((maps.verdict, maps.change_pct), (Verdict::Better, Some(-87.5)));
        assert_eq!(order3.verdict, Some(Verdict::Better), "the verdict falls to the maps");
        assert!(order3.notes[0].contains("throughput and time not compared with c01: it ran under driverlab"));
        assert!(report.to_markdown().contains("c02: throughput and time not compared"));
        assert!(report.cells[2].notes.is_empty() && report.cells[2].metrics[&Metric::GbitS].change.is_some());
    }

    #[test]
    fn cells_are_summarised_and_judged_against_the_baseline() {
        let cells = [cell(0, "flip"), cell(1, "order3"), cell(2, "same")];
        let records = records(&cells);
        let run = RunRecords { run: "r1", matrix: "m", state: RunState::Done, cells: &cells, records: &records };
        let report = Report::of_run(&run, Some("flip"), &VerdictRule::default());
        let [flip, order3, same] = [&report.cells[0], &report.cells[1], &report.cells[2]];
        assert_eq!((flip.n, flip.verdict), (5, Some(Verdict::Baseline)));
        assert_eq!(order3.verdict, Some(Verdict::Better));
        let maps = &order3.metrics[&Metric::MapsPerPacket];
        assert_eq!(maps.change.unwrap().verdict, Verdict::Better, "fewer maps per packet");
        assert_eq!(maps.change.unwrap().change_pct, Some(-87.5));
        assert_eq!((same.n, same.status[&Status::Fail], same.verdict), (4, 1, Some(Verdict::Same)));
        assert_eq!(same.reasons, vec!["it broke".to_string()]);

        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        let c = &json["cells"][1];
        assert_eq!(
            (c["cell"].as_str(), c["variant"].as_str(), c["n"].as_u64()),
            (Some("c02"), Some("order3"), Some(5))
        );
        assert_eq!(c["status"]["PASS"], 5);
        for key in ["mean", "stddev", "min", "max", "ci95", "change_pct", "verdict"] {
            assert!(c["metrics"]["gbit_s"].get(key).is_some(), "{key} in {c}");
        }
        assert_eq!(c["verdict"], "better");
        let md = report.to_markdown();
        assert!(md.contains("| c02 | order3 | rx | aq | 5 | 5 PASS |"), "{md}");
        assert!(md.contains("|---|---|---|---|---|---|---|---|---|---|---|\n"), "{md}");
        let html = report.to_html("<?xml version=\"1.0\"?>\n<svg id=\"s\"></svg>");
        assert!(html.starts_with("<!doctype html>") && html.ends_with("</html>\n"), "{html}");
        assert!(html.contains("<tr><td>c02</td><td>order3</td><td>rx</td><td>aq</td><td>5</td><td>5 PASS</td>"));
        assert!(html.contains("<figure id=\"chart\">\n<svg id=\"s\"></svg>") && !html.contains("<?xml"));
        assert!(html.contains("<p>c03 did not always pass: it broke</p>"), "{html}");
        assert!(!html.contains("<script"), "no script");
        assert_eq!(escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
        let csv = report.to_csv();
        assert_eq!(csv.lines().count(), 1 + 3 * 2, "{csv}");
        assert!(csv.lines().nth(3).unwrap().starts_with("c02,probe,order3,,rx,aq,5,5,0,0,0,0,gbit_s,"), "{csv}");
    }

    #[test]
    fn the_bus_and_the_time_to_a_ready_cell_get_their_tables() {
        let cells = [cell(0, "flip"), cell(1, "order3"), cell(2, "same")];
        let mut records = records(&cells);
        let before = vm_spec::counters::ModelCounters::default();
        for r in records.iter_mut().filter(|r| r.cell.index < 2) {
            let mut after = vm_spec::counters::ModelCounters { rx_frames: 100, ..Default::default() };
            after.link.rx.buffer_writes = vm_spec::pcie_link::Transactions { tlps: 2400, bytes: 151_400 };
            after.link.rx.descriptor_reads =
                vm_spec::pcie_link::Transactions { tlps: 25 * (r.cell.index as u64 + 1), bytes: 1600 };
            r.link = crate::pcie_link::figures(vm_spec::NicKind::Lan743x, &before, &after);
            r.timings.agent_ready_ms = Some(4000.0 + r.repetition as f64);
            r.timings.workload_start_ms = Some(7000.0 + r.repetition as f64);
        }
        let run = RunRecords { run: "r1", matrix: "m", state: RunState::Done, cells: &cells, records: &records };
        let report = Report::of_run(&run, Some("flip"), &VerdictRule::default());
        let rows = report.bus_rows();
        assert_eq!(rows.len(), 2, "the cells with bus figures");
        assert_eq!(rows[0][..5], ["c01", "flip", "PCIe Gen2 x1", "24.25 ± 0.00", "0.250 ± 0.000"]);
        assert_eq!(rows[1][4], "0.500 ± 0.000", "order3's records fetch twice as often");
        let md = report.to_markdown();
        assert!(md.contains("modelled, not measured"), "{md}");
        assert!(md.contains("Modelled PCIe Gen2 x1: 5 GT/s x1"), "the parameters: {md}");
        assert_eq!(md.matches("Modelled PCIe Gen2 x1").count(), 1, "once per link");
        let ready = report.ready_rows();
        assert_eq!(ready[0], ["c01", "flip", "4002", "7002", "-"].map(String::from), "the medians of 5");
        assert!(md.contains("Time to a ready cell"), "{md}");
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["cells"][0]["bus_profile"]["outstanding_reads"], 4);
        assert_eq!(json["cells"][0]["metrics"]["agent_ready_ms"]["median"], 4002.0);
        assert!(json["cells"][2].get("bus_link").is_none(), "no figures, no link");
    }

    #[test]
    fn two_runs_compare_cell_by_cell() {
        let cells = [cell(0, "flip"), cell(1, "order3"), cell(2, "same")];
        let a = records(&cells);
        let mut b = records(&cells);
        for r in b.iter_mut().filter(|r| r.cell.index == 0) {
            r.workload.gbit_s = r.workload.gbit_s.map(|g| g * 2.0);
        }
        let run_a = RunRecords { run: "a", matrix: "m", state: RunState::Done, cells: &cells, records: &a };
        let run_b = RunRecords { run: "b", matrix: "m", state: RunState::Done, cells: &cells, records: &b };
        let report = Report::compare(&run_a, &run_b, &VerdictRule::default());
        assert_eq!(report.cells[0].verdict, Some(Verdict::Better));
        assert_eq!(report.cells[0].against.as_deref(), Some("a/c01"));
        assert_eq!(report.cells[1].verdict, Some(Verdict::Same));
    }
}

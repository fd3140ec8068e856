//! The report's tests.

use super::html::escape;
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
        step: None,
    }
}

fn record(cell: &Cell, rep: u32, gbit: f64, maps: f64, status: Status) -> Record {
    let mut r = crate::record::test_record("r1", cell, rep, status, "it broke");
    r.workload.gbit_s = Some(gbit);
    r.maps_per_packet = Some(maps);
    r
}

/// The report of a done run of `cells` with `records`, judged against the variant `flip`.
fn against_flip(cells: &[Cell], records: &[Record]) -> Report {
    let run = RunRecords {
        run: "r1",
        matrix: "m",
        state: RunState::Done,
        cells,
        samples: &RunSamples::of_records(cells.len(), records),
    };
    Report::of_run(&run, Some("flip"), &VerdictRule::default())
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
    let report = against_flip(&cells, &records);
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
    let report = against_flip(&cells, &records);
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
    assert_eq!((c["cell"].as_str(), c["variant"].as_str(), c["n"].as_u64()), (Some("c02"), Some("order3"), Some(5)));
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
    let report = against_flip(&cells, &records);
    let rows = report.link_rows();
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
fn how_the_guest_treated_the_devices_dma_gets_its_table() {
    use crate::record::{GuestDma, IommuDomain};
    let cells = [cell(0, "flip"), cell(1, "order3"), cell(2, "same")];
    let mut records = records(&cells);
    for r in records.iter_mut().filter(|r| r.cell.index == 1) {
        let slot = vm_spec::Slot::Thunderbolt;
        r.guest_dma = Some(GuestDma { slot, domain: IommuDomain::Dma, untrusted: true, swiotlb: true });
        r.rx_bounced_maps_per_packet = Some(0.0);
        r.tx_bounced_maps_per_packet = Some(1.0);
    }
    let report = against_flip(&cells, &records);
    let rows = report.dma_rows();
    assert_eq!(rows.len(), 1, "only the cell whose guest said");
    let expected = ["c02", "order3", "thunderbolt", "DMA", "yes", "yes", "0.0000 ± 0.0000", "1.0000 ± 0.0000"];
    assert_eq!(rows[0], expected.map(String::from));
    let md = report.to_markdown();
    assert!(md.contains("| c02 | order3 | thunderbolt | DMA | yes | yes |"), "{md}");
    assert!(report.to_html("").contains("<table id=\"dma\">"));
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["cells"][1]["guest_dma"]["domain"], "DMA");
    assert_eq!(json["cells"][1]["metrics"]["tx_bounced_maps_per_packet"]["mean"], 1.0);
    assert!(json["cells"][0].get("guest_dma").is_none());
    let plain = Report::of_run(
        &RunRecords {
            run: "r1",
            matrix: "m",
            state: RunState::Done,
            cells: &cells,
            samples: &RunSamples::of_records(cells.len(), &self::records(&cells)),
        },
        None,
        &VerdictRule::default(),
    );
    assert!(!plain.to_markdown().contains("How the guest treated"), "no table without figures");
}

#[test]
fn two_runs_compare_cell_by_cell() {
    let cells = [cell(0, "flip"), cell(1, "order3"), cell(2, "same")];
    let a = records(&cells);
    let mut b = records(&cells);
    for r in b.iter_mut().filter(|r| r.cell.index == 0) {
        r.workload.gbit_s = r.workload.gbit_s.map(|g| g * 2.0);
    }
    let run_a = RunRecords {
        run: "a",
        matrix: "m",
        state: RunState::Done,
        cells: &cells,
        samples: &RunSamples::of_records(cells.len(), &a),
    };
    let run_b = RunRecords {
        run: "b",
        matrix: "m",
        state: RunState::Done,
        cells: &cells,
        samples: &RunSamples::of_records(cells.len(), &b),
    };
    let report = Report::compare(&run_a, &run_b, &VerdictRule::default());
    assert_eq!(report.cells[0].verdict, Some(Verdict::Better));
    assert_eq!(report.cells[0].against.as_deref(), Some("a/c01"));
    assert_eq!(report.cells[1].verdict, Some(Verdict::Same));
}

#[test]
fn cpu_per_packet_gets_its_table_with_changes_against_the_baseline() {
    use crate::measure::cpu::CpuCost;
    let cells = [cell(0, "flip"), cell(1, "order3"), cell(2, "same")];
    let mut records = records(&cells);
    for r in records.iter_mut().filter(|r| r.cell.index < 2) {
        // order3 pays half the host's CPU per packet and a quarter of the round trips
        let (host, requests) = if r.cell.index == 0 { (4000.0, 1.0) } else { (2000.0, 0.25) };
        let wobble = f64::from(r.repetition);
        r.cpu = Some(CpuCost {
            guest_ns_per_packet: Some(900.0 + wobble),
            host_ns_per_packet: Some(host + wobble),
            ..CpuCost::default()
        });
        r.viommu_requests_per_packet = Some(requests);
    }
    let report = against_flip(&cells, &records);
    let rows = report.cpu_rows();
    assert_eq!(rows.len(), 2, "only the cells with CPU figures");
    assert_eq!(rows[1][..2], ["c02", "order3"].map(String::from));
    assert!(rows[1][2].starts_with("902 ± "), "{:?}", rows[1]);
    assert_eq!(rows[1][3], "+0.0 %");
    assert_eq!(rows[1][5], "-50.0 %");
    assert_eq!(rows[1][6], "0.250 ± 0.000");
    assert_eq!(rows[1][7], "-75.0 %");
    let host = &report.cells[1].metrics[&Metric::HostCpuNsPerPacket];
    assert_eq!(host.change.unwrap().verdict, Verdict::Better, "less CPU per packet is better");
    assert!(report.to_markdown().contains("| c02 | order3 | 902 ± "));
    assert!(report.to_html("").contains("<table id=\"cpu\">"));
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["cells"][0]["metrics"]["viommu_requests_per_packet"]["mean"], 1.0);
}

#[test]
fn round_trips_get_their_table_and_less_is_better() {
    use crate::matrix::Protocol;
    use crate::measure::latency::Latency;
    let cells = [cell(0, "flip"), cell(1, "order3"), cell(2, "same")];
    let mut records = records(&cells);
    for r in records.iter_mut().filter(|r| r.cell.index < 2) {
        // order3 answers in half the time
        let scale = if r.cell.index == 0 { 2.0 } else { 1.0 };
        let wobble = f64::from(r.repetition) * 0.01;
        r.workload.latency = Some(Latency {
            protocol: Protocol::Udp,
            message_bytes: 64,
            seconds: 10.0,
            messages: 1000,
            dropped: 0,
            mean_us: 30.0 * scale + wobble,
            stddev_us: 1.0,
            min_us: 20.0 * scale,
            p50_us: 28.0 * scale + wobble,
            p90_us: 35.0 * scale,
            p99_us: 60.0 * scale + wobble,
            p99_9_us: 90.0 * scale,
            max_us: 200.0 * scale,
        });
    }
    let report = against_flip(&cells, &records);
    let rows = report.latency_rows();
    assert_eq!(rows.len(), 2, "only the cells with round trips");
    assert_eq!(rows[1][..2], ["c02", "order3"].map(String::from));
    assert!(
        rows[1][2].starts_with("30.0 ± ") && rows[1][3].starts_with("28.0") && rows[1][4].starts_with("60.0 ± "),
        "{rows:?}"
    );
    assert_eq!(rows[1][5..], ["-50.0 %", "-50.0 %"].map(String::from));
    let p99 = &report.cells[1].metrics[&Metric::LatencyP99Us];
    assert_eq!(p99.change.unwrap().verdict, Verdict::Better, "shorter round trips are better");
    assert!(report.to_markdown().contains("| c02 | order3 | 30.0 ± "));
    assert!(report.to_html("").contains("<table id=\"latency\">"));
}

/// A record of a kselftest cell whose ping.py ran its three subtests with `tcp` as the third's
/// result.
fn selftest_record(cell: &Cell, rep: u32, tcp: &str) -> Record {
    let status = if tcp.starts_with("not ok") { Status::Fail } else { Status::Pass };
    let mut r = crate::record::test_record("r1", cell, rep, status, "selftests failed: ping.test_tcp");
    let program = if status == Status::Fail {
        "not ok 1 selftests: drivers/net: ping.py # exit=1"
    } else {
        "ok 1 selftests: drivers/net: ping.py"
    };
    r.workload.kselftest = Some(crate::measure::ktap::Ktap::parse(&format!(
        "TAP version 13\n1..1\n# selftests: drivers/net: ping.py\n# KTAP version 1\n# 1..3\n# ok 1 ping.test_v4\n\
         # ok 2 ping.test_v6 # SKIP Test requires IPv6 connectivity\n# {tcp} 3 ping.test_tcp\n{program}\n"
    )));
    r
}

#[test]
fn a_subtest_that_passes_on_the_baseline_and_fails_on_a_variant_is_a_regression() {
    let cells = [cell(0, "flip"), cell(1, "pool"), cell(2, "fixed")];
    let mut records = Vec::new();
    for rep in 0..3 {
        records.push(selftest_record(&cells[0], rep, "ok"));
        records.push(selftest_record(&cells[1], rep, if rep == 1 { "not ok" } else { "ok" }));
        records.push(selftest_record(&cells[2], rep, "ok"));
    }
    let report = against_flip(&cells, &records);
    let tcp = |c: usize| report.cells[c].subtests.iter().find(|s| s.name == "ping.test_tcp").unwrap().clone();
    assert_eq!((tcp(0).tally.pass, tcp(0).verdict), (3, None), "the baseline has no verdict");
    assert_eq!((tcp(1).tally.pass, tcp(1).tally.fail, tcp(1).verdict), (2, 1, Some(SubtestVerdict::Regression)));
    assert_eq!(tcp(2).verdict, None, "passing on both is no change");
    let v6 = report.cells[1].subtests.iter().find(|s| s.name == "ping.test_v6").unwrap();
    assert_eq!((v6.tally.skip, v6.verdict), (3, None));
    // Against a baseline where it failed, always passing is a fix.
    let failing: Vec<Record> = (0..2).map(|rep| selftest_record(&cells[0], rep, "not ok")).collect();
    let fixed =
        against_flip(&cells, &[failing, records.iter().filter(|r| r.cell.index == 2).cloned().collect()].concat());
    let fixed_tcp = fixed.cells[2].subtests.iter().find(|s| s.name == "ping.test_tcp").unwrap();
    assert_eq!((fixed_tcp.tally.pass, fixed_tcp.verdict), (3, Some(SubtestVerdict::Fixed)));
    let markdown = report.to_markdown();
    assert!(markdown.contains("| ping.test_tcp | c02 | pool | 2 PASS, 1 FAIL | regression |"), "{markdown}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["cells"][1]["subtests"][0]["name"], "ping.test_tcp");
    assert_eq!(json["cells"][1]["subtests"][0]["verdict"], "regression");
    assert!(report.to_html("").contains("ping.test_tcp"));
}

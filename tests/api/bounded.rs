//! The way out bounded: a run of 100,000 records (made in the database directly, for speed) is
//! reported, exported, paged and copied eight requests at once, under a ceiling on the daemon's
//! address space that loading the run into memory per request would break. Each answer is whole
//! or a 429 with `Retry-After`; the daemon lives; what was refused is answered when asked again.

use std::path::Path;
use std::time::Instant;

use lab::matrix::Plan;
use lab::record::Record;
use lab::results_db::ResultsDb;
use serde_json::Value;

use crate::fixture::*;

/// Cells and repetitions of the run: the most results a matrix may have.
const CELLS: usize = 100;
const REPETITIONS: u32 = 1000;
/// The ceiling on the daemon's address space (virtual memory, `prlimit --as`).
const CEILING: &str = "--as=3221225472";

/// A run of `CELLS` x `REPETITIONS` passing records, each with an output of about 2 KB (a real
/// record's iperf3 output is larger), written to the database at `db`; its ID.
fn big_run(db: &Path) -> String {
    let params: Vec<String> = (0..CELLS).map(|i| i.to_string()).collect();
    let matrix = format!(
        "name = \"big\"\nrepetitions = {REPETITIONS}\nbaseline = \"v\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n\
         [[image]]\nname = \"probe\"\nkernel = \"probe\"\n[[variant]]\nname = \"v\"\nimage = \"probe\"\n\
         params = {{ \"m.p\" = [{}] }}\n[[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n",
        params.join(", ")
    );
    let plan = Plan::parse(Path::new("big.toml"), &matrix).unwrap();
    let mut store = ResultsDb::open(db).unwrap();
    let run = store.create_run(&plan).unwrap();
    let output: Value = serde_json::json!({ "lines": vec!["x".repeat(100); 20] });
    for cell in &plan.cells {
        let records: Vec<Record> = (0..REPETITIONS)
            .map(|rep| {
                let mut r = Record::begun(&run, cell, rep).judged(None);
                r.workload.gbit_s = Some(1.0 + f64::from(rep % 7) * 0.01 + cell.index as f64 * 0.001);
                r.maps_per_packet = Some(0.5);
                r.workload.output = Some(output.clone());
                r
            })
            .collect();
        store.record_all(&records).unwrap();
    }
    assert_eq!(records_of(&store, &run), CELLS * REPETITIONS as usize);
    run
}

fn records_of(store: &ResultsDb, run: &str) -> usize {
    store.count_records(run, &lab::results_db::RecordFilter::default()).unwrap()
}

#[test]
fn a_huge_run_is_reported_exported_and_copied_eight_at_once_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let made = Instant::now();
    let run = big_run(&dir.path().join("lab.db"));
    eprintln!("a run of {} records made in {:.1} s", CELLS * REPETITIONS as usize, made.elapsed().as_secs_f64());
    let daemon = Daemon::start_under(&["prlimit", CEILING], dir.path(), &[]);
    let report = format!("/v1/runs/{run}/report");
    let asks: Vec<(&str, String)> = vec![
        ("application/json", report.clone()),
        ("text/html", report.clone()),
        ("text/csv", report),
        ("*/*", format!("/v1/results?run={run}&format=kcidb")),
        ("*/*", format!("/v1/results?run={run}&format=csv")),
        ("*/*", format!("/v1/results?run={run}")),
        ("*/*", "/v1/database".into()),
        ("*/*", format!("/v1/results?offset={}", u64::MAX)),
    ];
    let threads: Vec<_> = asks
        .iter()
        .cloned()
        .map(|(accept, path)| {
            let socket = daemon.socket.clone();
            std::thread::spawn(move || {
                (
                    accept,
                    path.clone(),
                    call(&api::client::Client::new(&socket), "GET", &path, &[("accept", accept)], None),
                )
            })
        })
        .collect();
    let mut refused = Vec::new();
    for thread in threads {
        let (accept, path, answer) = thread.join().unwrap();
        match answer.status {
            200 => check(&run, accept, &path, &answer),
            429 => {
                assert!(answer.retry_after.is_some(), "a 429 says when to come back: {path}");
                refused.push((accept, path));
            }
            other => panic!("{path}: {other} {}", String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])),
        }
    }
    assert!(refused.len() < asks.len(), "some were answered at once");
    for (accept, path) in refused {
        let answer = call(&daemon.client(), "GET", &path, &[("accept", accept)], None);
        assert_eq!(answer.status, 200, "{path} asked again");
        check(&run, accept, &path, &answer);
    }
    assert_eq!(call(&daemon.client(), "GET", "/v1/version", &[], None).status, 200, "the daemon lives");
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.child.id())).unwrap_or_default();
    let peak = status.lines().find(|l| l.starts_with("VmHWM")).unwrap_or("VmHWM: unknown");
    eprintln!("the daemon's peak resident memory: {}", peak.trim_start_matches("VmHWM:").trim());
}

/// That `answer` to `path` is whole: every cell, every record, the whole database.
fn check(run: &str, accept: &str, path: &str, answer: &api::client::Answer) {
    let text = || String::from_utf8_lossy(&answer.body);
    let all = CELLS * REPETITIONS as usize;
    if path.ends_with("/report") {
        match accept {
            "application/json" => {
                let report: Value = serde_json::from_slice(&answer.body).unwrap();
                let cells = report["cells"].as_array().unwrap();
                assert_eq!(cells.len(), CELLS);
                assert_eq!(cells[1]["n"], REPETITIONS, "{}", cells[1]);
                assert_eq!(cells[1]["verdict"], "baseline", "{}", cells[1]);
            }
            "text/html" => assert!(text().contains("</html>") && text().contains("c100"), "a whole page"),
            _ => {
                assert_eq!(text().lines().filter(|l| l.contains(",gbit_s,")).count(), CELLS, "a row per cell's Gbit/s")
            }
        }
    } else if path.contains("format=kcidb") {
        let doc: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(doc["tests"].as_array().unwrap().len(), all);
    } else if path.contains("format=csv") {
        assert_eq!(text().lines().count(), 10_001, "a page of 10,000 and the header");
        assert!(answer.link.as_deref().is_some_and(|l| l.contains("offset=10000")), "{:?}", answer.link);
    } else if path.contains("offset=") {
        assert_eq!(answer.body, b"[]", "an offset past every record: an empty page");
        assert!(answer.link.is_none());
    } else if path == "/v1/database" {
        let copy = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(copy.path(), &answer.body).unwrap();
        let store = ResultsDb::open(copy.path()).unwrap();
        assert_eq!(records_of(&store, run), all, "the copy has every record");
    } else {
        let page: Vec<Value> = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(page.len(), 10_000);
        assert_eq!((page[0]["cell"]["id"].as_str(), page[9_999]["repetition"].as_u64()), (Some("c01"), Some(999)));
    }
}

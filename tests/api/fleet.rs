//! A fleet on one machine: three daemons with their own databases stand for three boxes that
//! hold the same card (the AQC100 model, registered on each; the second box's generator is
//! paced, a slower box), a probe matrix run as three shards through them (the third killed with
//! -9 mid-shard and resumed), the databases merged with `lab import` and reported as one run:
//! every repetition once, the layout of the same matrix run whole, the slow box a box effect on
//! throughput and not on maps per packet. Bad shards are refused up front.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{driverlab, kvm_available};
use crate::fixture::*;

/// Two RX strategies of the probe, nine repetitions: three per box and cell over three shards.
const MATRIX: &str = r#"name = "fleet-probe"
repetitions = 9
baseline = "flip"
timeout_s = 60
silence_s = 30

[[device]]
name = "aqc100"

[[image]]
name = "probe"
kernel = "probe"

[[variant]]
name = "flip"
image = "probe"
params = { "probe.rx" = "flip" }

[[variant]]
name = "pool"
image = "probe"
params = { "probe.rx" = "pool" }

[[workload]]
name = "rx"
kind = "probe-rx"
frames = 3000
"#;

const FLEET: &str = "ci-42-aqc100";

fn lab(args: &[&str]) -> Output {
    Command::new(driverlab()).arg("lab").args(args).output().unwrap()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// A box: a daemon with the card registered under `aqc100` on `generate`.
fn start_box(dir: &Path, generate: &str) -> Daemon {
    let daemon = Daemon::start(dir, &[]);
    let body = format!(r#"{{"name":"aqc100","model":"aqc100","generate":"{generate}"}}"#);
    let answer =
        call(&daemon.client(), "POST", "/v1/devices", &[("content-type", "application/json")], Some(body.as_bytes()));
    assert_eq!(answer.status, 201, "{}", text(&answer.body));
    daemon
}

fn socket(daemon: &Daemon) -> String {
    daemon.socket.display().to_string()
}

/// `lab run` of shard `shard` through `daemon`: its run's ID, after it ended.
fn run_shard(daemon: &Daemon, matrix: &Path, shard: &str) -> String {
    let out =
        lab(&["run", &matrix.display().to_string(), "--shard", shard, "--fleet", FLEET, "--socket", &socket(daemon)]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let first = stdout.lines().next().unwrap();
    first.strip_prefix("run ").and_then(|l| l.strip_suffix(" started")).expect(first).to_string()
}

fn report_json(args: &[&str]) -> Value {
    let out = lab(&[&["report", "--format", "json"], args].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_matrix_run_as_three_shards_on_three_boxes_is_one_report_with_the_slow_box_shown() {
    let test = "a_matrix_run_as_three_shards_on_three_boxes_is_one_report_with_the_slow_box_shown";
    if !kvm_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("fleet.toml");
    std::fs::write(&matrix, MATRIX).unwrap();
    let box_dirs: Vec<PathBuf> = (1..=3).map(|k| dir.path().join(format!("box{k}"))).collect();
    for d in &box_dirs {
        std::fs::create_dir(d).unwrap();
    }
    // The guest takes about 6 000 frames/s here; the second box's wire gives 1 500.
    let box1 = start_box(&box_dirs[0], "size=1514");
    let box2 = start_box(&box_dirs[1], "size=1514,pps=1500");
    let mut box3 = start_box(&box_dirs[2], "size=1514");

    // Bad shards are refused before anything runs.
    for bad in ["0/3", "4/3", "three"] {
        let out =
            lab(&["run", &matrix.display().to_string(), "--shard", bad, "--fleet", FLEET, "--socket", &socket(&box1)]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(&format!("shard {bad:?}")) || text(&out.stderr).contains("count from 1"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = lab(&["run", &matrix.display().to_string(), "--shard", "1/3", "--socket", &socket(&box1)]);
    assert_eq!(out.status.code(), Some(2), "a shard needs its fleet run: {}", text(&out.stderr));
    let answer = call(
        &box1.client(),
        "POST",
        &format!("/v1/runs?shard=4/3&fleet={FLEET}"),
        &[("content-type", "application/toml")],
        Some(MATRIX.as_bytes()),
    );
    assert_eq!(answer.status, 400, "{}", text(&answer.body));
    assert_eq!(call(&box1.client(), "GET", "/v1/runs", &[], None).body, b"[]", "nothing was made");

    // The whole matrix on box 1, for the layout; then the shards.
    let out = lab(&["run", &matrix.display().to_string(), "--socket", &socket(&box1), "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let whole = text(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .strip_prefix("run ")
        .unwrap()
        .strip_suffix(" started")
        .unwrap()
        .to_string();
    let shard1 = run_shard(&box1, &matrix, "1/3");
    let shard2 = run_shard(&box2, &matrix, "2/3");

    // Shard 3: its box dies with -9 after its first repetitions, comes back, and the shard is
    // resumed (run again, it is refused with the command that resumes it).
    let client3 = box3.client();
    let submitted = call(
        &client3,
        "POST",
        &format!("/v1/runs?shard=3/3&fleet={FLEET}"),
        &[("content-type", "application/toml")],
        Some(MATRIX.as_bytes()),
    );
    assert_eq!(submitted.status, 201, "{}", text(&submitted.body));
    let shard3 = json_of(&submitted)["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = json_of(&call(&client3, "GET", &format!("/v1/runs/{shard3}"), &[], None));
        if status["results"].as_u64().unwrap() >= 2 {
            assert!(status["results"].as_u64().unwrap() < 6, "killed before its end: {status}");
            assert_eq!(status["results_total"], 6, "{status}");
            assert_eq!(status["fleet"]["shard"], "3/3", "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "shard 3 records a repetition: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
    box3.child.kill().unwrap();
    box3.child.wait().unwrap();
    drop(box3);
    let box3 = Daemon::start(&box_dirs[2], &[]);
    let again =
        lab(&["run", &matrix.display().to_string(), "--shard", "3/3", "--fleet", FLEET, "--socket", &socket(&box3)]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains(&format!("driverlab lab resume {shard3}")), "{}", text(&again.stderr));
    let resumed = lab(&["resume", &shard3, "--socket", &socket(&box3)]);
    assert!(resumed.status.success(), "{}{}", text(&resumed.stdout), text(&resumed.stderr));

    // The boxes' databases, merged: the fleet's report is one run.
    let fleet_db = dir.path().join("fleet.db").display().to_string();
    for d in &box_dirs {
        let out = lab(&["import", &d.join("lab.db").display().to_string(), "--db", &fleet_db]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let report = report_json(&["--fleet", FLEET, "--db", &fleet_db]);
    let whole_report = report_json(&[&whole, "--db", &fleet_db]);
    assert_eq!(report["run"], FLEET);
    assert!(
        whole_report["box"]["cpu"].is_string() && whole_report["box"]["devices"][0]["name"] == "aqc100",
        "{whole_report}"
    );
    assert_eq!(report["state"], "done", "{report}");
    let layout = |r: &Value| -> Vec<(Value, Value, Value, Vec<String>)> {
        r["cells"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["cell"].clone(),
                    c["variant"].clone(),
                    c["n"].clone(),
                    c["metrics"].as_object().unwrap().keys().cloned().collect(),
                )
            })
            .collect()
    };
    assert_eq!(layout(&report), layout(&whole_report), "the layout of the matrix run whole");
    for cell in report["cells"].as_array().unwrap() {
        assert_eq!(
            (cell["n"].as_u64(), cell["status"]["PASS"].as_u64()),
            (Some(9), Some(9)),
            "every repetition once: {cell}"
        );
        let effect = &cell["box_effect"];
        let worse: Vec<&str> = effect["metrics"]["gbit_s"]["boxes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["verdict"] == "worse")
            .map(|b| b["shard"].as_str().unwrap())
            .collect();
        assert_eq!(worse, ["2/3"], "the paced box is slower: {effect}");
        let maps = effect["metrics"]["maps_per_packet"]["boxes"].as_array().unwrap();
        assert!(maps.iter().all(|b| b["verdict"] == "same"), "maps per packet are the driver's: {effect}");
    }
    let boxes = report["boxes"].as_array().unwrap();
    let runs: Vec<&str> = boxes.iter().map(|b| b["run"].as_str().unwrap()).collect();
    assert_eq!(runs, [shard1.as_str(), shard2.as_str(), shard3.as_str()]);
    for b in boxes {
        assert_eq!(
            (b["results"].as_u64(), b["share"].as_u64(), b["state"].as_str()),
            (Some(6), Some(6), Some("done")),
            "{b}"
        );
        assert!(
            !b["box"]["host"].as_str().unwrap().is_empty() && !b["box"]["kernel"].as_str().unwrap().is_empty(),
            "{b}"
        );
        assert_eq!(b["box"]["devices"][0]["pci"], "model aqc100", "{b}");
    }
    assert!(boxes[1]["box"]["devices"][0]["peer"].as_str().unwrap().contains("pps=1500"), "{}", boxes[1]);
    assert!(boxes[0]["box"]["devices"][0]["firmware"].as_str().is_some(), "the health check's firmware: {}", boxes[0]);

    // The same through a daemon whose database holds the shards: GET /v1/fleets/ID/report.
    for d in &box_dirs[1..] {
        let out = lab(&[
            "import",
            &d.join("lab.db").display().to_string(),
            "--db",
            &box_dirs[0].join("lab.db").display().to_string(),
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let answer =
        call(&box1.client(), "GET", &format!("/v1/fleets/{FLEET}/report"), &[("accept", "application/json")], None);
    assert_eq!(answer.status, 200, "{}", text(&answer.body));
    assert_eq!(layout(&json_of(&answer)), layout(&report));
    let markdown = lab(&["report", "--fleet", FLEET, "--socket", &socket(&box1)]);
    assert!(
        text(&markdown.stdout).contains("| 2/3 | ") && text(&markdown.stdout).contains("gbit_s: shard 2/3"),
        "{}",
        text(&markdown.stdout)
    );
    let missing = call(&box1.client(), "GET", "/v1/fleets/no-such-fleet/report", &[], None);
    assert_eq!(missing.status, 404, "{}", text(&missing.body));
    let bad = call(&box1.client(), "GET", "/v1/fleets/a%20b/report", &[], None);
    assert_eq!(bad.status, 400, "{}", text(&bad.body));
}

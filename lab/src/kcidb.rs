//! Export of a run as KCIDB v4 JSON (schema 4.5), so results can go to KernelCI: the run is a
//! checkout, each image a build, each repetition a test with its status, its throughput as the
//! test's number, and the rest (maps per packet, the cell, the crash fingerprint) under `misc`;
//! a kselftest repetition's subtests follow it as tests of their own below its path.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::measure::ktap::KtapStatus;
use crate::record::{Record, Status};
use crate::results_db::RunInfo;

/// The origin of every object driverlab submits.
pub const ORIGIN: &str = "driverlab";

/// A path segment: letters, digits, `_` and `-` only.
fn segment(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}

/// The run `info` with its `records` as one KCIDB v4 document; `artifacts` is the run's artifacts
/// folder, for the serial logs' URLs.
pub fn export(info: &RunInfo, records: &[Record], artifacts: &Path) -> Value {
    let images: BTreeSet<&str> = records.iter().map(|r| r.cell.image.as_str()).collect();
    let unbuilt = unbuilt_images(records);
    let mut doc = head(info, images.into_iter().map(|i| (i, !unbuilt.contains(i))));
    let checkout_id = checkout_id(info);
    doc["tests"] = records.iter().flat_map(|r| tests(&checkout_id, r, artifacts)).collect();
    doc
}

fn checkout_id(info: &RunInfo) -> String {
    format!("{ORIGIN}:{}", info.id)
}

/// The images of `records` that did not build (a series' prefix with a BUILD-FAIL): their
/// builds are not valid.
pub fn unbuilt_images<'a>(records: impl IntoIterator<Item = &'a Record>) -> BTreeSet<String> {
    records
        .into_iter()
        .filter(|r| matches!(r.failure, Some(crate::failure::Failure::BuildFailed { .. })))
        .map(|r| r.cell.image.clone())
        .collect()
}

/// The document but its tests: the schema's version, the run as a checkout, each image a build
/// (with whether it built).
fn head<'a>(info: &RunInfo, images: impl IntoIterator<Item = (&'a str, bool)>) -> Value {
    let checkout_id = checkout_id(info);
    let builds: Vec<Value> = images
        .into_iter()
        .map(|(image, valid)| {
            json!({
                "id": format!("{checkout_id}:{}", segment(image)),
                "origin": ORIGIN,
                "checkout_id": checkout_id,
                "comment": format!("image {image}"),
                "architecture": "x86_64",
                "valid": valid,
            })
        })
        .collect();
    json!({
        "version": {"major": 4, "minor": 5},
        "checkouts": [{
            "id": checkout_id,
            "origin": ORIGIN,
            "comment": format!("matrix {} ({})", info.matrix, info.matrix_file),
            "start_time": info.created_at,
            "misc": {
                "host": info.host,
                "repetitions": info.repetitions,
                "cells": info.cells_total,
                "matrix_hash": info.matrix_hash,
                "fleet": info.fleet,
                "box": info.box_identity,
            },
        }],
        "builds": builds,
    })
}

/// One repetition as a test, and its selftests' subtests as tests below it.
fn tests(checkout_id: &str, r: &Record, artifacts: &Path) -> Vec<Value> {
    let repetition = test(checkout_id, r, artifacts);
    let mut all = vec![repetition.clone()];
    for program in r.workload.kselftest.iter().flat_map(|k| &k.tests) {
        let program_path = segment(program.short_name().trim_end_matches(".py"));
        for sub in &program.subtests {
            let mut test = json!({
                "id": format!("{}:{}:{}", repetition["id"].as_str().unwrap_or_default(), program_path, segment(&sub.name)),
                "origin": ORIGIN,
                "build_id": repetition["build_id"],
                "path": format!("{}.kselftest.{program_path}.{}", repetition["path"].as_str().unwrap_or_default(), segment(&sub.name)),
                "comment": format!("{}: {}", program.short_name(), sub.name),
                // KCIDB has no XFAIL: an expected failure is a skip that says so.
                "status": match sub.status {
                    KtapStatus::Pass => "PASS",
                    KtapStatus::Fail => "FAIL",
                    KtapStatus::Skip | KtapStatus::Xfail => "SKIP",
                },
                "start_time": r.started_at,
                "misc": {"ktap": sub.status.to_string(), "reason": sub.reason, "cell": r.cell.id, "repetition": r.repetition},
            });
            if let Some(log) = &repetition.get("output_files") {
                test["output_files"] = (*log).clone();
            }
            all.push(test);
        }
    }
    all
}

/// One repetition as a test.
fn test(checkout_id: &str, r: &Record, artifacts: &Path) -> Value {
    let mut test = json!({
        "id": format!("{checkout_id}:{}:{}", r.cell.id, r.repetition),
        "origin": ORIGIN,
        "build_id": format!("{checkout_id}:{}", segment(&r.cell.image)),
        "path": format!("driverlab.{}.{}", segment(&r.cell.workload), segment(&r.cell.variant)),
        "comment": r.cell.key(),
        "status": r.status.name(),
        "start_time": r.started_at,
        "duration": r.timings.total_ms / 1e3,
        "environment": {"comment": format!("device {}", r.cell.device)},
        "misc": {
            "run": r.run,
            "cell": r.cell.id,
            "repetition": r.repetition,
            "params": r.cell.params,
            "device": r.cell.device,
            "engine": r.engine,
            "reason": r.reason,
            "maps_per_packet": r.maps_per_packet,
            "packets_per_s": r.workload.packets_per_s,
            "crash_fingerprint": r.crash.as_ref().map(|c| c.fingerprint.clone()),
        },
    });
    if let (Status::Pass, Some(gbit)) = (r.status, r.workload.gbit_s) {
        test["number"] = json!({"value": gbit, "unit": "Gbit/s"});
    }
    if let Some(log) = &r.serial_log {
        let url = format!("file://{}", artifacts.join(log).display());
        test["output_files"] = json!([{"name": "serial.log", "url": url}]);
    }
    test
}

/// The same document written as it is made, a test at a time, so that an export of any size
/// holds one record: [`KcidbWriter::start`] with the run's images (its cells'), then
/// [`KcidbWriter::test`] per record, then [`KcidbWriter::finish`].
pub struct KcidbWriter<'w> {
    out: &'w mut dyn Write,
    checkout_id: String,
    artifacts: PathBuf,
    tests: usize,
}

impl<'w> KcidbWriter<'w> {
    /// Writes the document's head for the run `info` and its `images`, each with whether it
    /// built.
    pub fn start<'a>(
        out: &'w mut dyn Write,
        info: &RunInfo,
        images: impl IntoIterator<Item = (&'a str, bool)>,
        artifacts: &Path,
    ) -> std::io::Result<KcidbWriter<'w>> {
        let head = serde_json::to_string(&head(info, images)).map_err(std::io::Error::other)?;
        // The head object, left open for its tests.
        out.write_all(head.strip_suffix('}').unwrap_or(&head).as_bytes())?;
        out.write_all(br#","tests":["#)?;
        Ok(KcidbWriter { out, checkout_id: checkout_id(info), artifacts: artifacts.to_path_buf(), tests: 0 })
    }

    /// Writes one repetition's test (and its subtests').
    pub fn test(&mut self, r: &Record) -> std::io::Result<()> {
        for test in tests(&self.checkout_id, r, &self.artifacts) {
            if self.tests > 0 {
                self.out.write_all(b",")?;
            }
            serde_json::to_writer(&mut *self.out, &test).map_err(std::io::Error::other)?;
            self.tests += 1;
        }
        Ok(())
    }

    /// Closes the document.
    pub fn finish(self) -> std::io::Result<()> {
        self.out.write_all(b"]}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Cell;
    use crate::results_db::RunState;
    use std::collections::BTreeMap;

    const ARTIFACTS: &str = "/var/lib/driverlab/artifacts/20261201-120000-abcd";

    fn document() -> Value {
        let (info, records) = run();
        export(&info, &records, Path::new(ARTIFACTS))
    }

    fn run() -> (RunInfo, Vec<Record>) {
        let info = RunInfo {
            id: "20261201-120000-abcd".into(),
            matrix: "probe-rx".into(),
            matrix_file: "examples/probe-matrix.toml".into(),
            baseline: Some("flip".into()),
            repetitions: 2,
            cells_total: 1,
            results: 2,
            state: RunState::Done,
            host: "lab1".into(),
            matrix_hash: Some("0123456789abcdef".into()),
            fleet: Some(crate::fleet::FleetShard { fleet: "ci-1".parse().unwrap(), shard: "2/3".parse().unwrap() }),
            box_identity: Some(crate::fleet::BoxIdentity {
                host: "lab1".into(),
                cpu: "AMD RYZEN AI MAX+ 395".into(),
                ..Default::default()
            }),
            created_at: "2026-12-01T12:00:00.000Z".into(),
            finished_at: None,
        };
        let cell = Cell {
            index: 0,
            id: "c01".into(),
            image: "probe".into(),
            variant: "order 3".into(),
            params: BTreeMap::from([("probe.rx".to_string(), "order3".to_string())]),
            workload: "rx".into(),
            device: "aqc100".into(),
            step: None,
        };
        let mut pass = crate::record::test_record(&info.id, &cell, 0, Status::Pass, "");
        pass.workload.gbit_s = Some(0.35);
        pass.maps_per_packet = Some(0.0625);
        pass.serial_log = Some("c01/rep0/serial.log".into());
        let mut fail = crate::record::test_record(&info.id, &cell, 1, Status::Fail, "selftests failed: ping.test_tcp");
        fail.workload.kselftest = Some(crate::measure::ktap::Ktap::parse(
            "TAP version 13\n1..1\n# selftests: drivers/net: ping.py\n# KTAP version 1\n# 1..3\n# ok 1 ping.test_v4\n\
             # ok 2 ping.test_v6 # XFAIL no v6\n# not ok 3 ping.test_tcp\nnot ok 1 selftests: drivers/net: ping.py # exit=1\n",
        ));
        (info, vec![pass, fail])
    }

    #[test]
    fn the_streamed_document_is_the_same_document() {
        let (info, records) = run();
        let mut out = Vec::new();
        let mut writer = KcidbWriter::start(&mut out, &info, [("probe", true)], Path::new(ARTIFACTS)).unwrap();
        for r in &records {
            writer.test(r).unwrap();
        }
        writer.finish().unwrap();
        let streamed: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(streamed, export(&info, &records, Path::new(ARTIFACTS)));
        let mut empty = Vec::new();
        KcidbWriter::start(&mut empty, &info, [("probe", true)], Path::new(ARTIFACTS)).unwrap().finish().unwrap();
        let empty: Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(empty["tests"], serde_json::json!([]));
    }

    #[test]
    fn the_document_has_a_checkout_a_build_and_a_test_per_repetition() {
        let doc = document();
        assert_eq!(doc["version"]["major"], 4);
        assert_eq!(doc["tests"].as_array().unwrap().len(), 5, "two repetitions and three subtests");
        let test = &doc["tests"][0];
        assert_eq!(test["id"], "driverlab:20261201-120000-abcd:c01:0");
        assert_eq!(test["path"], "driverlab.rx.order_3");
        assert_eq!(test["number"]["value"], 0.35);
        assert_eq!(test["build_id"], doc["builds"][0]["id"]);
        assert!(doc["tests"][1].get("number").is_none(), "no figure from a failed run");
        let subtests: Vec<(&str, &str)> = doc["tests"].as_array().unwrap()[2..]
            .iter()
            .map(|t| (t["path"].as_str().unwrap(), t["status"].as_str().unwrap()))
            .collect();
        assert_eq!(
            subtests,
            [
                ("driverlab.rx.order_3.kselftest.ping.ping_test_v4", "PASS"),
                ("driverlab.rx.order_3.kselftest.ping.ping_test_v6", "SKIP"),
                ("driverlab.rx.order_3.kselftest.ping.ping_test_tcp", "FAIL"),
            ]
        );
        assert_eq!(doc["tests"][3]["misc"]["ktap"], "XFAIL");
        assert_eq!(doc["tests"][4]["id"], "driverlab:20261201-120000-abcd:c01:1:ping:ping_test_tcp");
        // The box it ran on, and the fleet run's shard.
        let misc = &doc["checkouts"][0]["misc"];
        assert_eq!(misc["box"]["cpu"], "AMD RYZEN AI MAX+ 395");
        assert_eq!((misc["fleet"]["fleet"].as_str(), misc["fleet"]["shard"].as_str()), (Some("ci-1"), Some("2/3")));
        assert_eq!(misc["matrix_hash"], "0123456789abcdef");
    }

    #[test]
    fn a_prefix_that_did_not_build_is_a_build_that_is_not_valid() {
        let (info, mut records) = run();
        let mut unbuilt = records[1].clone();
        unbuilt.cell.image = "probe@2".into();
        unbuilt.failure =
            Some(crate::failure::Failure::BuildFailed { first_error: "error: x".into(), detail: String::new() });
        records.push(unbuilt);
        let doc = export(&info, &records, Path::new(ARTIFACTS));
        let valid: Vec<(&str, bool)> = doc["builds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["comment"].as_str().unwrap(), b["valid"].as_bool().unwrap()))
            .collect();
        assert_eq!(valid, [("image probe", true), ("image probe@2", false)]);
    }

    #[test]
    fn the_document_validates_against_kcidb_s_schema() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kcidb.json");
        std::fs::write(&file, document().to_string()).unwrap();
        let check =
            "import json, sys, kcidb_io; kcidb_io.schema.V4_5.validate(json.load(open(sys.argv[1]))); print('valid')";
        let out = std::process::Command::new("python3").args(["-c", check]).arg(&file).output();
        match out {
            Ok(out) if String::from_utf8_lossy(&out.stderr).contains("No module named 'kcidb_io'") => {
                let why = "no kcidb_io (pip install kcidb-io)";
                testkit::skip("the_document_validates_against_kcidb_s_schema", testkit::Lacks::Setup, why);
            }
            Err(e) => testkit::skip(
                "the_document_validates_against_kcidb_s_schema",
                testkit::Lacks::Setup,
                format!("no python3 ({e})"),
            ),
            Ok(out) => assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr)),
        }
    }
}

//! Export of a run as KCIDB v4 JSON (schema 4.5), so results can go to KernelCI: the run is a
//! checkout, each image a build, each repetition a test with its status, its throughput as the
//! test's number, and the rest (maps per packet, the cell, the crash fingerprint) under `misc`.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

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
    let mut doc = head(info, images);
    let checkout_id = checkout_id(info);
    doc["tests"] = records.iter().map(|r| test(&checkout_id, r, artifacts)).collect();
    doc
}

fn checkout_id(info: &RunInfo) -> String {
    format!("{ORIGIN}:{}", info.id)
}

/// The document but its tests: the schema's version, the run as a checkout, each image a build.
fn head<'a>(info: &RunInfo, images: impl IntoIterator<Item = &'a str>) -> Value {
    let checkout_id = checkout_id(info);
    let builds: Vec<Value> = images
        .into_iter()
        .map(|image| {
            json!({
                "id": format!("{checkout_id}:{}", segment(image)),
                "origin": ORIGIN,
                "checkout_id": checkout_id,
                "comment": format!("image {image}"),
                "architecture": "x86_64",
                "valid": true,
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
            "misc": {"host": info.host, "repetitions": info.repetitions, "cells": info.cells_total},
        }],
        "builds": builds,
    })
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
    /// Writes the document's head for the run `info` and its `images`.
    pub fn start<'a>(
        out: &'w mut dyn Write,
        info: &RunInfo,
        images: impl IntoIterator<Item = &'a str>,
        artifacts: &Path,
    ) -> std::io::Result<KcidbWriter<'w>> {
        let head = serde_json::to_string(&head(info, images)).map_err(std::io::Error::other)?;
        // The head object, left open for its tests.
        out.write_all(head.strip_suffix('}').unwrap_or(&head).as_bytes())?;
        out.write_all(br#","tests":["#)?;
        Ok(KcidbWriter { out, checkout_id: checkout_id(info), artifacts: artifacts.to_path_buf(), tests: 0 })
    }

    /// Writes one repetition's test.
    pub fn test(&mut self, r: &Record) -> std::io::Result<()> {
        if self.tests > 0 {
            self.out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *self.out, &test(&self.checkout_id, r, &self.artifacts))
            .map_err(std::io::Error::other)?;
        self.tests += 1;
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
        };
        let mut pass = crate::record::test_record(&info.id, &cell, 0, Status::Pass, "");
        pass.workload.gbit_s = Some(0.35);
        pass.maps_per_packet = Some(0.0625);
        pass.serial_log = Some("c01/rep0/serial.log".into());
        let fail = crate::record::test_record(&info.id, &cell, 1, Status::Fail, "hung: no serial output for 60 s");
        (info, vec![pass, fail])
    }

    #[test]
    fn the_streamed_document_is_the_same_document() {
        let (info, records) = run();
        let mut out = Vec::new();
        let mut writer = KcidbWriter::start(&mut out, &info, ["probe"], Path::new(ARTIFACTS)).unwrap();
        for r in &records {
            writer.test(r).unwrap();
        }
        writer.finish().unwrap();
        let streamed: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(streamed, export(&info, &records, Path::new(ARTIFACTS)));
        let mut empty = Vec::new();
        KcidbWriter::start(&mut empty, &info, ["probe"], Path::new(ARTIFACTS)).unwrap().finish().unwrap();
        let empty: Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(empty["tests"], serde_json::json!([]));
    }

    #[test]
    fn the_document_has_a_checkout_a_build_and_a_test_per_repetition() {
        let doc = document();
        assert_eq!(doc["version"]["major"], 4);
        assert_eq!(doc["tests"].as_array().unwrap().len(), 2);
        let test = &doc["tests"][0];
        assert_eq!(test["id"], "driverlab:20261201-120000-abcd:c01:0");
        assert_eq!(test["path"], "driverlab.rx.order_3");
        assert_eq!(test["number"]["value"], 0.35);
        assert_eq!(test["build_id"], doc["builds"][0]["id"]);
        assert!(doc["tests"][1].get("number").is_none(), "no figure from a failed run");
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

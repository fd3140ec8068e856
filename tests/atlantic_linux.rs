//! The model's fidelity test, and one Linux cell of the lab end to end under its QEMU engine:
//! Debian's unmodified atlantic driver (Linux 6.12) probes the AQC100 model under QEMU 11.1 (TCG)
//! behind a virtio-iommu, reads its firmware version and MAC, brings the link up at 10G, passes a
//! ping and iperf3 from a peer over a TAP, goes down and up again and unloads, with no kernel
//! warning, no IOMMU fault and no mapping left: `examples/atlantic-check.toml`, run by the lab,
//! its verdict read back from the results store and the repetition's artifacts.
//!
//! The guest boots driverlab's images (the lab builds them: Debian's kernel, the guest agent as
//! /init). It needs root (network namespaces, TAP) and the forky chroot with QEMU 11.1 that
//! `scripts/test.sh` prepares; it runs where `DRIVERLAB_LINUX_CHECK=1` says that was done.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::process::Command;

#[test]
fn stock_atlantic_drives_the_model_under_qemu() {
    if std::env::var_os("DRIVERLAB_LINUX_CHECK").is_none() {
        common::skip(
            "stock_atlantic_drives_the_model_under_qemu",
            common::Lacks::Setup,
            "DRIVERLAB_LINUX_CHECK is not set (scripts/test.sh sets it after preparing QEMU 11.1; or run \
             `driverlab lab run examples/atlantic-check.toml` as root)",
        );
        return;
    }
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        common::skip(
            "stock_atlantic_drives_the_model_under_qemu",
            common::Lacks::Setup,
            "the Linux check needs root for its network namespace and TAP device",
        );
        return;
    }
    let driverlab = env!("CARGO_BIN_EXE_driverlab");
    let matrix = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/atlantic-check.toml");
    let logs = tempfile::tempdir().unwrap();
    let db = logs.path().join("lab.db");
    let out = Command::new(driverlab).args(["lab", "run", matrix, "--db"]).arg(&db).output().expect("driverlab runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Linux check failed:\n{stdout}\n{stderr}");
    let run = stdout.lines().next().and_then(|l| l.strip_prefix("run ")?.strip_suffix(" started")).unwrap_or_default();
    assert_eq!(
        stdout.lines().last(),
        Some(format!("run {run}: 1 cells, 1 passed, 0 failed, 0 errors").as_str()),
        "{stdout}\n{stderr}"
    );

    // Its verdict and figures, from the results store.
    let show = Command::new(driverlab).args(["lab", "show", run, "--json", "--db"]).arg(&db).output().unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    // The guest agent's steps, from the repetition's artifacts.
    let rep = std::path::Path::new(shown["artifacts"].as_str().expect("artifacts")).join("c01").join("rep0");
    let verdict = Command::new(driverlab).args(["agent", "verdict"]).arg(&rep).output().unwrap();
    let verdict = String::from_utf8_lossy(&verdict.stdout);
    for step in ["probe", "link-up", "ping", "iperf-rx", "link-down", "link-up-again", "ping-again", "unload"] {
        assert!(
            verdict.lines().any(|l| l.trim_start().starts_with(step) && l.contains(" ok ")),
            "step {step} not ok:\n{verdict}"
        );
    }
    assert!(verdict.contains("speed=10000"), "link at 10G:\n{verdict}");
    assert!(verdict.contains("mac_source=permanent"), "the MAC came from the firmware:\n{verdict}");
    assert!(verdict.contains("kernel faults: none"), "{verdict}");
    assert_eq!(verdict.lines().last(), Some("result: PASS"), "{verdict}");

    let record = &shown["records"][0];
    assert_eq!((record["engine"].as_str(), record["status"].as_str()), (Some("qemu"), Some("PASS")), "{record}");
    assert_eq!(record["device_counters"]["dma_faults"], 0, "no DMA outside the guest's mappings: {record}");
    assert_eq!(record["iommu"]["faults"], 0, "no translation fault: {record}");
    assert_eq!(record["mappings_after_unload"], 0, "the teardown unmapped everything: {record}");
    let rx_maps = record["rx_maps_per_packet"].as_f64().unwrap_or(-1.0);
    // Stock atlantic at MTU 1500 maps a 4 KiB page per two RX buffers, and reuses some.
    assert!((0.1..=0.75).contains(&rx_maps), "RX maps per received packet {rx_maps}: {record}");
    assert!(record["page_reuse"].as_f64().is_some(), "atlantic's page counters: {record}");
    // QEMU's vfio-user client made every access a standard client makes, and the model
    // answered each as a device would: its log (an artifact of the repetition) has no error.
    let model_log = rep.join("model.log");
    let model_log = std::fs::read_to_string(&model_log).unwrap_or_else(|e| panic!("{}: {e}", model_log.display()));
    assert!(!model_log.contains("ERROR"), "the model logged an error:\n{model_log}");
    // The bus: what the model put on its link per packet over the workload.
    let bus = &record["bus"];
    assert_eq!(bus["link"], "PCIe Gen3 x2", "{record}");
    let rx_tlps = bus["rx"]["tlps"].as_f64().unwrap_or(0.0);
    // Mostly full-size frames of iperf3's stream (24 line writes and a write-back each).
    assert!(rx_tlps >= 10.0, "{bus}");
    assert!(bus["modelled"]["ns_per_packet"].as_f64().is_some_and(|ns| ns > 0.0), "{bus}");
}

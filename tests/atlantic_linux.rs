//! The model's fidelity test, and one Linux cell of the lab end to end under its QEMU engine:
//! Debian's unmodified atlantic driver (Linux 6.12) probes the AQC100 model under QEMU 11.1 (TCG)
//! behind a virtio-iommu, reads its firmware version and MAC, brings the link up at 10G, passes a
//! ping and iperf3 from a peer over a TAP, goes down and up again and unloads, with no kernel
//! warning, no IOMMU fault and no mapping left (`scripts/atlantic-check.sh`, a one-cell matrix).
//!
//! The guest boots driverlab's images (the lab builds them: Debian's kernel, the guest agent as
//! /init). It needs root (network namespaces, TAP) and the forky chroot with QEMU 11.1 that
//! `scripts/test.sh` prepares; it runs where `DRIVERLAB_LINUX_CHECK=1` says that was done.

use std::process::Command;

#[test]
fn stock_atlantic_drives_the_model_under_qemu() {
    if std::env::var_os("DRIVERLAB_LINUX_CHECK").is_none() {
        eprintln!(
            "SKIP stock_atlantic_drives_the_model_under_qemu: DRIVERLAB_LINUX_CHECK is not set (scripts/test.sh \
             sets it after preparing QEMU 11.1; or run scripts/atlantic-check.sh as root)"
        );
        return;
    }
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!(
            "SKIP stock_atlantic_drives_the_model_under_qemu: the Linux check needs root for its network namespace \
             and TAP device"
        );
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let logs = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/atlantic-check.sh"))
        .args(["--duration", "10", "--logs"])
        .arg(logs.path())
        .env("DRIVERLAB_BIN", env!("CARGO_BIN_EXE_driverlab"))
        .output()
        .expect("running scripts/atlantic-check.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Linux check failed:\n{stdout}\n{stderr}");
    assert!(stdout.lines().last() == Some("result: PASS"), "{stdout}");
    for step in ["probe", "link-up", "ping", "iperf-rx", "link-down", "link-up-again", "ping-again", "unload"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(step) && l.contains(" ok ")),
            "step {step} not ok:\n{stdout}"
        );
    }
    assert!(stdout.contains("speed=10000"), "link at 10G:\n{stdout}");
    assert!(stdout.contains("mac_source=permanent"), "the MAC came from the firmware:\n{stdout}");
    assert!(stdout.contains("kernel faults: none"), "{stdout}");

    // It is a lab cell: its record says what the engine and the model counted.
    let run = stdout.lines().next().and_then(|l| l.split_whitespace().nth(4)).unwrap_or_default().to_string();
    let show = Command::new(env!("CARGO_BIN_EXE_driverlab"))
        .args(["lab", "show", &run, "--json", "--db"])
        .arg(logs.path().join("lab.db"))
        .output()
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
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
    let model_log = logs.path().join("artifacts").join(&run).join("c01").join("rep0").join("model.log");
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

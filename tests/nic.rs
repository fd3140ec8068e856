//! The AQC100 end to end: the real binary serves the NIC model with its frame generator over
//! vfio-user, another boots the probe against it behind the virtio-iommu, and the probe's
//! atlantic-style driver receives frames with each RX buffer strategy while the maps are counted
//! on three sides: the probe, the VMM's virtio-iommu, and the model.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::process::Command;
use std::time::Duration;

use common::{driverlab, kvm_available, start_model, vm_run};
use engines::{ModelProcess, ProbeReport};

const FRAMES: u64 = 20_000;
const MAC: &str = "02:aa:bb:cc:dd:01";

fn start_aqc100(extra: &[&str]) -> ModelProcess {
    let mut args = vec!["--mac", MAC];
    args.extend_from_slice(extra);
    start_model("aqc100", &args)
}

/// Runs the probe with `probe.rx=strategy` and checks everything the three sides report;
/// returns the NIC section.
fn receive_with(strategy: &str) -> serde_json::Value {
    let model = start_aqc100(&["--generate", "size=1514"]);
    let device = model.device_arg();
    let cmdline = format!("probe.nic=aqc100 probe.rx={strategy} probe.frames={FRAMES}");
    let out = vm_run(&["--kernel", "probe", "--iommu", "--device", &device, "--cmdline", &cmdline]);
    assert_eq!(out.code(), Some(0), "stderr: {}\nserial: {}", out.stderr, out.serial);
    let report = ProbeReport::parse(&out.serial);
    assert!(report.done().unwrap().ok, "{:?}", report.done());
    let nic = report.section("nic").expect("nic section").clone();
    assert_eq!(nic["id"], "1d6a:00b1");
    assert_eq!(nic["fw"], "3.1.38");
    assert_eq!(nic["mac"], MAC, "the configured MAC, read through the firmware's MIF window");
    assert_eq!(nic["link_mbps"], 10_000);
    assert_eq!(nic["rx_strategy"], strategy);
    assert_eq!(nic["rx_frames"], FRAMES, "every frame received");
    assert_eq!(nic["rx_bytes"], FRAMES * 1514);
    for key in ["iommu", "in_order", "checksums_ok", "msix"] {
        assert_eq!(nic[key], true, "{key}: {nic}");
    }
    assert_eq!(nic["tx_counted"], nic["tx_frames"], "the NIC counted what the probe sent");

    let exit = out.exit.unwrap();
    let viommu = exit.viommu.expect("viommu counts");
    let probe_viommu_maps = report.section("viommu").unwrap()["maps"].as_u64().unwrap();
    let nic_maps = nic["iommu_maps"].as_u64().unwrap();
    assert_eq!(viommu.maps, probe_viommu_maps + nic_maps, "the VMM counted every map the probe made");
    assert_eq!(viommu.unmaps, viommu.maps, "everything was unmapped again");
    assert_eq!(viommu.faults, 0, "no IOMMU fault");
    let counters = exit.devices[0].device.counters.expect("model counters");
    assert_eq!(counters.dma_faults, 0);
    // The model saw the NIC's maps as vfio-user DMA_MAPs, plus the identity map of RAM while the
    // endpoint was still in bypass.
    assert!((nic_maps..=nic_maps + 2).contains(&counters.dma_maps), "{counters:?} vs {nic_maps}");
    assert!(counters.rx_frames >= FRAMES);
    assert_eq!(counters.tx_frames, nic["tx_frames"].as_u64().unwrap());
    // On the bus: each 1,514-byte frame is 24 line writes into its 2 KiB-aligned buffer (the
    // last partial) and one descriptor write-back; descriptors come in fetches of up to 8.
    let rx = counters.link.rx;
    assert_eq!(rx.buffer_writes.tlps, counters.rx_frames * 24, "{rx:?}");
    assert_eq!(rx.buffer_writes.bytes, counters.rx_frames * 1514);
    assert_eq!(rx.descriptor_writes.tlps, counters.rx_frames);
    assert_eq!(rx.partial_writes, counters.rx_frames * 2, "the frame's last line and the descriptor");
    assert!(rx.descriptor_reads.bytes >= counters.rx_frames * 16, "every descriptor fetched: {rx:?}");
    assert!((counters.rx_frames.div_ceil(8)..=counters.rx_frames).contains(&rx.descriptor_reads.tlps), "{rx:?}");
    nic
}

#[test]
fn flip_maps_half_a_page_per_frame() {
    if !kvm_available("flip_maps_half_a_page_per_frame") {
        return;
    }
    let nic = receive_with("flip");
    assert_eq!(nic["maps_per_frame"].as_f64(), Some(0.5));
}

#[test]
fn order3_maps_once_per_sixteen_frames() {
    if !kvm_available("order3_maps_once_per_sixteen_frames") {
        return;
    }
    let nic = receive_with("order3");
    assert_eq!(nic["maps_per_frame"].as_f64(), Some(0.0625));
}

#[test]
fn pool_maps_nothing_after_its_fill() {
    if !kvm_available("pool_maps_nothing_after_its_fill") {
        return;
    }
    let nic = receive_with("pool");
    assert_eq!(nic["maps_per_frame"].as_f64(), Some(0.0));
    assert_eq!(nic["iommu_maps"], nic["initial_maps"]);
}

#[test]
fn frames_dropped_by_a_generator_faster_than_the_guest_are_gaps_not_a_failure() {
    if !kvm_available("frames_dropped_by_a_generator_faster_than_the_guest_are_gaps_not_a_failure") {
        return;
    }
    // A million frames a second: far more than the probe takes, so frames find no descriptor
    // and the model drops them, as a wire would.
    let model = start_aqc100(&["--generate", "size=1514,pps=1000000"]);
    let device = model.device_arg();
    let cmdline = "probe.nic=aqc100 probe.rx=flip probe.frames=5000";
    let out = vm_run(&["--kernel", "probe", "--iommu", "--device", &device, "--cmdline", cmdline]);
    assert_eq!(out.code(), Some(0), "stderr: {}\nserial: {}", out.stderr, out.serial);
    let report = ProbeReport::parse(&out.serial);
    assert!(report.done().unwrap().ok, "gaps do not fail the probe: {:?}", report.done());
    let nic = report.section("nic").expect("nic section");
    assert_eq!(nic["rx_frames"], 5000);
    assert_eq!((nic["in_order"].as_bool(), nic["reordered_frames"].as_u64()), (Some(true), Some(0)), "{nic}");
    let missing = nic["missing_frames"].as_u64().unwrap();
    assert!(missing > 0, "the generator outran the guest: {nic}");
}

#[test]
fn control_socket_reports_and_takes_the_link_down() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control");
    let model = start_aqc100(&["--control", control.to_str().unwrap()]);
    for _ in 0..200 {
        if control.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let run = |command: &str| {
        let out = Command::new(driverlab()).args(["model", "control"]).arg(&control).arg(command).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let status = run("status");
    assert_eq!(status["status"]["mac"], MAC);
    assert_eq!(status["counters"]["dma_maps"], 0);
    let down = run("link-down");
    assert_eq!(down["status"]["link_mbps"], 0);
    drop(model);
    let out = Command::new(driverlab()).args(["model", "control"]).arg(&control).output().unwrap();
    assert!(!out.status.success(), "no model: an error, not a hang");
}

#[test]
fn bad_model_arguments_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    for (args, expect) in [
        (vec!["--generate", "size=10"], "60 to"),
        (vec!["--generate", "rate=5"], "unknown"),
        (vec!["--mac", "01:00:00:00:00:01"], "group address"),
        (vec!["--tap", "this-name-is-far-too-long"], "interface name"),
    ] {
        let out = Command::new(driverlab())
            .args(["model", "aqc100", "--once", "--socket"])
            .arg(&socket)
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
}

#[test]
fn sigterm_prints_the_final_counters_and_removes_the_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control");
    let model = start_aqc100(&["--control", control.to_str().unwrap(), "--generate", "count=10"]);
    let socket = model.socket().to_path_buf();
    let (code, stdout) = model.terminate().unwrap();
    assert_eq!(code, Some(0));
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().expect("a final line")).unwrap();
    assert_eq!(last["exit"], "SIGTERM");
    assert_eq!(last["counters"]["dma_faults"], 0);
    assert!(!socket.exists() && !control.exists(), "sockets removed");
}

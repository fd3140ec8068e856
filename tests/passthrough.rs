//! Passthrough end to end: the real binary serves the conformance device over vfio-user, another
//! boots the probe against it, with and without the virtio-iommu in front.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::path::Path;
use std::time::Duration;

use common::{driverlab_cmd, kvm_available, start_model, vm_run};
use engines::{ModelProcess, ProbeReport};

fn start_testdev() -> ModelProcess {
    start_model("testdev", &[])
}

#[test]
fn testdev_behind_the_virtio_iommu() {
    if !kvm_available("testdev_behind_the_virtio_iommu") {
        return;
    }
    let model = start_testdev();
    let device = model.device_arg();
    let out = vm_run(&["--kernel", "probe", "--iommu", "--device", &device, "--cmdline", "probe.viommu_ops=10"]);
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    let report = ProbeReport::parse(&out.serial);
    assert!(report.done().unwrap().ok, "{:?}", report.done());
    let t = report.section("testdev").expect("testdev section");
    for key in ["iommu", "bar0_ok", "bar2_ok", "msix", "dma_write_ok", "dma_read_ok", "unmapped_dma_refused"] {
        assert_eq!(t[key], true, "{key}: {t}");
    }
    let pci = report.section("pci").unwrap();
    assert!(pci["devices"].as_array().unwrap().iter().any(|d| d["bdf"] == "00:02.0" && d["id"] == "d1ab:7e57"));

    let exit = out.exit.unwrap();
    let viommu = exit.viommu.expect("viommu counts");
    assert_eq!((viommu.maps, viommu.unmaps), (11, 11), "10 timed pairs and the test device's buffer");
    assert_eq!(viommu.faults, 1, "the refused DMA is counted as an IOMMU fault");
    let dev = &exit.devices[0];
    assert_eq!((dev.device.bdf.as_str(), dev.reset_ok, dev.device.error.as_deref()), ("00:02.0", true, None));
    let counters = dev.device.counters.expect("model counters");
    assert_eq!(counters.dma_faults, 1);
    assert_eq!(counters.interrupts, 3, "one MSI-X interrupt per DMA command");
    // The identity map while in bypass, then the guest's one buffer.
    assert_eq!(counters.dma_maps, 2);
}

#[test]
fn testdev_without_iommu_gets_identity_dma() {
    if !kvm_available("testdev_without_iommu_gets_identity_dma") {
        return;
    }
    let model = start_testdev();
    let device = model.device_arg();
    let out = vm_run(&["--kernel", "probe", "--device", &device]);
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    let report = ProbeReport::parse(&out.serial);
    assert!(report.done().unwrap().ok, "{:?}", report.done());
    let t = report.section("testdev").unwrap();
    assert_eq!(t["iommu"], false);
    for key in ["bar0_ok", "bar2_ok", "msix", "dma_write_ok", "dma_read_ok", "unmapped_dma_refused"] {
        assert_eq!(t[key], true, "{key}: {t}");
    }
    let exit = out.exit.unwrap();
    assert!(exit.viommu.is_none());
    assert_eq!(exit.devices[0].device.counters.unwrap().dma_maps, 1, "all of RAM, once");
}

#[test]
fn a_model_that_dies_mid_run_ends_the_devices_use_not_the_vm() {
    if !kvm_available("a_model_that_dies_mid_run_ends_the_devices_use_not_the_vm") {
        return;
    }
    let mut model = start_testdev();
    let device = model.device_arg();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vm.sock");
    let socket_arg = socket.display().to_string();
    // The virtio-iommu exercise keeps the guest busy (without touching the model) while the model
    // is killed; the test device is driven afterwards.
    let args = [
        "--kernel",
        "probe",
        "--iommu",
        "--device",
        &device,
        "--cmdline",
        "probe.viommu_ops=20000",
        "--control",
        &socket_arg,
    ];
    let run = std::thread::spawn({
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        move || vm_run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    });
    // The model dies once the exercise is under way: the virtio-iommu has counted maps.
    let control = engines::vm_control::ControlClient::new(&socket, Duration::from_secs(5));
    let exercising = || control.counters().ok().and_then(|c| c.viommu).is_some_and(|v| v.maps > 0);
    assert!(
        common::wait_until(Duration::from_secs(60), Duration::from_millis(5), exercising),
        "the virtio-iommu exercise started"
    );
    model.kill();
    let out = run.join().unwrap();
    assert_eq!(out.code(), Some(0), "the VM went on: {}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    let report = ProbeReport::parse(&out.serial);
    let done = report.done().unwrap();
    assert!(!done.ok && done.failures.iter().any(|f| f.starts_with("testdev")), "{done:?}");
    let dev = &out.exit.unwrap().devices[0];
    assert!(dev.device.error.is_some(), "{dev:?}");
    assert!(!dev.reset_ok);
}

/// The error line a VMM that could not run ends its stderr with.
fn error_line(stderr: &str) -> vm_spec::ErrorLine {
    let last = stderr.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("the last line is not an error line ({e}): {stderr}"))
}

#[test]
fn unusable_devices_are_refused_before_the_guest_runs() {
    let (code, stdout, stderr) =
        driverlab_cmd(&["vm", "run", "--kernel", "probe", "--device", "vfio-user=/nonexistent/model.sock"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stdout.is_empty());
    let line = error_line(&stderr);
    assert_eq!((line.kind, line.exit_code), (vm_spec::ErrorKind::Device, 2), "{stderr}");
    assert!(line.message.contains("device vfio-user=/nonexistent/model.sock"), "{stderr}");

    let (code, _, stderr) = driverlab_cmd(&["vm", "run", "--kernel", "probe", "--device", "vfio=0000:7f:1f.7"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(error_line(&stderr).message.contains("vfio=0000:7f:1f.7"), "{stderr}");

    let (code, _, stderr) = driverlab_cmd(&["vm", "run", "--kernel", "probe", "--device", "vfio=63:00"]);
    assert_eq!(code, Some(2));
    let line = error_line(&stderr);
    assert!(line.kind == vm_spec::ErrorKind::Usage && line.message.contains("not a PCI address"), "{stderr}");
}

#[test]
fn a_peer_that_is_gone_or_hangs_up_is_not_bad_input() {
    if !kvm_available("a_peer_that_is_gone_or_hangs_up_is_not_bad_input") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A socket left behind by a model that exited: nobody accepts.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let device = format!("vfio-user={}", stale.display());
    let (code, _, stderr) = driverlab_cmd(&["vm", "run", "--kernel", "probe", "--device", &device]);
    let line = error_line(&stderr);
    assert_eq!((code, line.kind), (Some(1), vm_spec::ErrorKind::Peer), "{stderr}");

    // A peer that accepts and hangs up at once.
    let rude = dir.path().join("rude.sock");
    let listener = std::os::unix::net::UnixListener::bind(&rude).unwrap();
    let hang_up = std::thread::spawn(move || drop(listener.accept()));
    let device = format!("vfio-user={}", rude.display());
    let (code, _, stderr) = driverlab_cmd(&["vm", "run", "--kernel", "probe", "--device", &device]);
    hang_up.join().unwrap();
    let line = error_line(&stderr);
    assert_eq!((code, line.kind, line.exit_code), (Some(1), vm_spec::ErrorKind::Peer, 1), "{stderr}");
}

#[test]
fn doctor_says_plainly_whether_vfio_is_there() {
    let (code, stdout, _) = driverlab_cmd(&["doctor"]);
    let vfio = Path::new("/dev/vfio/vfio").exists() || Path::new("/dev/iommu").exists();
    let line = stdout.lines().find(|l| l.contains(" vfio ")).expect("a vfio check");
    if vfio {
        assert!(line.starts_with("PASS"), "{line}");
    } else {
        assert!(line.starts_with("FAIL") && stdout.contains("modprobe vfio-pci"), "{stdout}");
        assert_eq!(code, Some(1), "a failed check fails the command");
    }
    let (_, json, _) = driverlab_cmd(&["doctor", "--json"]);
    let checks: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(checks.as_array().unwrap().iter().any(|c| c["name"] == "vfio"));
}

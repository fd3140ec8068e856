//! The VMM process contract, through the real binary: the JSON spec boots what the flags boot,
//! the control socket answers while the guest runs and stops it on request, COM2 carries what the
//! guest sends it.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::time::{Duration, Instant};

use common::{driverlab_cmd, kvm_available, start_model, tiny_elf, vm_run, write_file};
use engines::{ControlClient, ProbeReport, VmProcess};
use vm_spec::control::{ShutdownRequest, VmState};
use vm_spec::{IommuSpec, Kernel, SerialOutput, VmSpec};

/// The probe's `nic` section without what depends on timing (elapsed time, how many frames one
/// interrupt announced), and the probe's verdict.
fn nic_counts(serial: &str) -> (serde_json::Value, bool) {
    let report = ProbeReport::parse(serial);
    let mut nic = report.section("nic").cloned().unwrap_or_default();
    if let Some(object) = nic.as_object_mut() {
        object.retain(|key, _| !key.contains("ns") && !key.contains("per_s") && key != "rx_interrupts");
    }
    (nic, report.done().is_some_and(|d| d.ok))
}

#[test]
fn a_json_spec_boots_exactly_what_the_flags_boot() {
    if !kvm_available("a_json_spec_boots_exactly_what_the_flags_boot") {
        return;
    }
    let cmdline = "probe.nic=aqc100 probe.rx=order3 probe.frames=2000";
    let model = start_model("aqc100", &["--generate", "size=1514"]);
    let device = model.device_arg();
    let flags = ["--kernel", "probe", "--iommu", "--device", &device, "--cmdline", cmdline];
    let mut print = vec!["vm", "run", "--print-spec"];
    print.extend_from_slice(&flags);
    let (code, printed, _) = driverlab_cmd(&print);
    assert_eq!(code, Some(0));
    let from_flags = VmSpec::from_json(&printed).expect("--print-spec prints a valid spec");
    let expected = VmSpec {
        cmdline: cmdline.into(),
        iommu: Some(IommuSpec { bypass: true }),
        devices: vec![model.device_spec()],
        ..VmSpec::new(Kernel::Probe)
    };
    assert_eq!(from_flags, expected);
    let by_flags = vm_run(&flags);
    drop(model);

    // A fresh model for each run: a model serves one VM.
    let model = start_model("aqc100", &["--generate", "size=1514"]);
    let spec = VmSpec { devices: vec![model.device_spec()], ..expected.clone() };
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(dir.path(), "spec.json", spec.to_json().as_bytes());
    let by_file = vm_run(&["--config", &file]);
    drop(model);
    let model = start_model("aqc100", &["--generate", "size=1514"]);
    let spec = VmSpec { devices: vec![model.device_spec()], ..expected };
    let by_stdin = VmProcess::new(&common::programs().vmm, spec, Duration::from_secs(60)).run().unwrap();
    drop(model);

    let (flags_nic, flags_ok) = nic_counts(&by_flags.serial);
    assert!(flags_ok, "{}", by_flags.serial);
    assert_eq!(flags_nic["maps_per_frame"], 0.0625, "order3 maps once per 16 frames: {flags_nic}");
    for (name, out) in [("--config FILE", &by_file), ("--config -", &by_stdin)] {
        assert_eq!(out.code(), Some(0), "{name}: {}", out.stderr);
        assert_eq!(nic_counts(&out.serial), (flags_nic.clone(), true), "{name}");
        let (a, b) = (by_flags.exit.as_ref().unwrap(), out.exit.as_ref().unwrap());
        assert_eq!(a.viommu.as_ref().map(|v| v.maps), b.viommu.as_ref().map(|v| v.maps), "{name}");
        // The generator runs flat out, so frames received after the probe's last differ; maps do not.
        let maps =
            |s: &vm_spec::ExitSummary| s.devices[0].device.counters.map(|c| (c.dma_maps, c.dma_unmaps, c.dma_faults));
        assert_eq!(maps(a), maps(b), "{name}");
    }
}

#[test]
fn the_control_socket_answers_while_the_guest_runs_and_stops_it() {
    if !kvm_available("the_control_socket_answers_while_the_guest_runs_and_stops_it") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vm.sock");
    let console = dir.path().join("com1.log");
    let model = start_model("aqc100", &["--generate", "size=1514"]);
    // flip maps every other frame: long enough (seconds) to watch the counters move. The console
    // goes to a file, read while the guest runs.
    let spec = VmSpec {
        cmdline: "probe.viommu_ops=0 probe.nic=aqc100 probe.rx=flip probe.frames=20000 probe.hold=60000".into(),
        iommu: Some(IommuSpec::default()),
        devices: vec![model.device_spec()],
        serial: vm_spec::SerialSpec { com1: SerialOutput::File(console.clone()), com2: None },
        timeout_s: Some(120.0),
        ..VmSpec::new(Kernel::Probe)
    };
    let vm = VmProcess::new(&common::programs().vmm, spec.clone(), Duration::from_secs(30))
        .with_control(&socket)
        .start()
        .unwrap();
    let control = ControlClient::new(&socket, Duration::from_secs(5));
    let info = control.wait_until_serving(Duration::from_secs(10)).expect("the control socket serves");
    assert_eq!((info.pid, &info.config), (vm.pid(), &spec));

    // Counters move while the probe receives.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let counters = control.counters().unwrap();
        let maps = counters.viommu.as_ref().map_or(0, |v| v.maps);
        if counters.state != VmState::Running {
            continue;
        }
        assert_eq!(counters.devices.len(), 1, "{counters:?}");
        let receiving = counters.devices[0].counters.is_some_and(|c| c.rx_frames > 0);
        if receiving && maps > seen.last().copied().unwrap_or(0) + 100 {
            seen.push(maps);
        }
    }
    assert_eq!(seen.len(), 2, "two growing readings of the live counters");

    // The probe then reports and holds for the power button (its IOAPIC pin is programmed only
    // then, so an earlier press would be lost, as on hardware): once it says it is holding, a
    // shutdown presses the button and the guest powers off.
    let holding = || std::fs::read_to_string(&console).unwrap_or_default().contains("{\"probe\":\"holding\"");
    assert!(
        common::wait_until(Duration::from_secs(60), Duration::from_millis(20), holding),
        "the probe holds for the power button: {}",
        std::fs::read_to_string(&console).unwrap()
    );
    let accepted = control.shutdown(ShutdownRequest::default()).unwrap();
    assert_eq!(accepted.state, VmState::Stopping);
    let out = vm.wait().unwrap();
    let exit = out.exit.clone().expect("an exit line");
    assert_eq!((exit.reason.name(), out.code()), ("poweroff", Some(0)), "{}", out.stderr);
    let serial = std::fs::read_to_string(&console).unwrap();
    let report = ProbeReport::parse(&serial);
    assert_eq!(report.section("hold").map(|h| h["power_button"].clone()), Some(serde_json::json!(true)));
    assert!(report.done().is_some_and(|d| d.ok), "{serial}");
    assert!(!socket.exists(), "the VMM removes its socket");
    drop(model);
}

#[test]
fn a_guest_that_ignores_the_power_button_is_stopped_after_the_grace() {
    if !kvm_available("a_guest_that_ignores_the_power_button_is_stopped_after_the_grace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = write_file(dir.path(), "spin.elf", &tiny_elf(&[0xeb, 0xfe]));
    let socket = dir.path().join("vm.sock");
    let spec = VmSpec { timeout_s: Some(60.0), memory_mib: 16, ..VmSpec::new(Kernel::Path(kernel.into())) };
    let vm =
        VmProcess::new(&common::programs().vmm, spec, Duration::from_secs(30)).with_control(&socket).start().unwrap();
    let control = ControlClient::new(&socket, Duration::from_secs(5));
    common::wait_until(Duration::from_secs(10), Duration::from_millis(5), || {
        control.info().is_ok_and(|i| i.state == VmState::Running)
    });
    let refused = control.shutdown(ShutdownRequest { grace_s: Some(-1.0) }).unwrap_err();
    assert!(matches!(refused, engines::vm_control::ControlError::Refused { status: 400, .. }), "{refused}");
    control.shutdown(ShutdownRequest { grace_s: Some(0.2) }).unwrap();
    let out = vm.wait().unwrap();
    let exit = out.exit.clone().expect("an exit line");
    assert_eq!((exit.reason.name(), exit.exit_code, out.code()), ("shutdown", 7, Some(7)), "{}", out.stderr);
    assert!(exit.detail.unwrap_or_default().contains("vCPU 0 at rip 0x100000"));
    assert!(out.wall < Duration::from_secs(20), "stopped after the grace, not the timeout");
}

#[test]
fn com2_carries_the_report_apart_from_the_console() {
    if !kvm_available("com2_carries_the_report_apart_from_the_console") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let com2 = dir.path().join("agent.log");
    let spec = VmSpec {
        cmdline: "probe.out=com2".into(),
        serial: vm_spec::SerialSpec { com1: SerialOutput::Stdout, com2: Some(SerialOutput::File(com2.clone())) },
        ..VmSpec::new(Kernel::Probe)
    };
    let out = VmProcess::new(&common::programs().vmm, spec, Duration::from_secs(60)).run().unwrap();
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(out.serial.trim(), r#"{"probe":"report","port":"com2"}"#, "the console has only the pointer");
    let agent = std::fs::read_to_string(&com2).unwrap();
    let report = ProbeReport::parse(&agent);
    assert!(report.section("boot").is_some() && report.done().is_some_and(|d| d.ok), "{agent}");
    let exit = out.exit.unwrap();
    assert_eq!(exit.com2_bytes, Some(agent.len() as u64));
    assert_eq!(exit.serial_bytes, out.serial.len() as u64);

    // Without a COM2 the probe says so on COM1.
    let out = vm_run(&["--kernel", "probe", "--cmdline", "probe.out=com2"]);
    let done = ProbeReport::parse(&out.serial).done().unwrap();
    assert!(!done.ok && done.failures.iter().any(|f| f.contains("no UART at 0x2f8")), "{done:?}");
    assert_eq!(out.exit.unwrap().com2_bytes, None);
}

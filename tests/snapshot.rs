//! Snapshots through the real binary: the probe guest, holding for the power button, is
//! snapshotted over the control socket (`--snapshot-to`), restored twice (`--restore`) into
//! guests that go on from where it was; snapshots that cannot be used, and VMs that cannot be
//! snapshotted, are refused with what to do.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{kvm_available, start_model, vm_run};
use engines::vm_control::ControlError;
use engines::{ControlClient, ProbeReport, RunningVm, VmOutcome, VmProcess};
use vm_spec::control::{AfterSnapshot, ShutdownRequest, VmState};
use vm_spec::{ErrorKind, ExitReason, RestoredRam};

/// The probe's command line: a failure recorded before the snapshot (an unknown option), whose
/// report only comes after it, shows that guest memory went through.
const CMDLINE: &str = "probe.hold=60000 probe.bogus=1";

/// Waits until the console file at `console` has `what`.
fn wait_for(console: &Path, what: &str) {
    let seen = || std::fs::read_to_string(console).unwrap_or_default().contains(what);
    assert!(
        common::wait_until(Duration::from_secs(60), Duration::from_millis(20), seen),
        "the console shows {what}: {}",
        std::fs::read_to_string(console).unwrap_or_default()
    );
}

/// Boots the holding probe with `--snapshot-to DIR/name`, snapshots it; the directory and the
/// VMM's outcome.
fn take_snapshot(dir: &Path, name: &str) -> (PathBuf, VmOutcome) {
    let (snapshot, _, vm, control) = holding_probe(dir, name);
    let accepted = control.snapshot().unwrap();
    assert_eq!((accepted.state, accepted.dir.as_str()), (VmState::Stopping, snapshot.to_str().unwrap()));
    (snapshot, vm.wait().unwrap())
}

/// The probe with [`CMDLINE`], started with `--snapshot-to DIR/NAME` and its console in
/// `DIR/NAME.boot.log`, once it holds: the snapshot's directory, the console, the VM and its
/// control socket's client.
fn holding_probe(dir: &Path, name: &str) -> (PathBuf, PathBuf, RunningVm, ControlClient) {
    holding_probe_with(dir, name, &[])
}

/// [`holding_probe`] with more flags.
fn holding_probe_with(dir: &Path, name: &str, extra: &[&str]) -> (PathBuf, PathBuf, RunningVm, ControlClient) {
    let snapshot = dir.join(name);
    let console = dir.join(format!("{name}.boot.log"));
    let socket = dir.join(format!("{name}.sock"));
    let args = [
        "--kernel".as_ref(),
        "probe".as_ref(),
        "--cmdline".as_ref(),
        CMDLINE.as_ref(),
        "--memory".as_ref(),
        "64".as_ref(),
        "--serial".as_ref(),
        console.as_os_str(),
        "--snapshot-to".as_ref(),
        snapshot.as_os_str(),
    ];
    let args = args.into_iter().chain(extra.iter().map(std::ffi::OsStr::new));
    let (vm, control) = start_vm(args, &socket);
    wait_for(&console, "{\"probe\":\"holding\"");
    (snapshot, console, vm, control)
}

/// Starts the VMM with `args` and its control socket at `socket`; the process and a client of
/// the socket.
fn start_vm(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString>>,
    socket: &Path,
) -> (RunningVm, ControlClient) {
    let vm = VmProcess::with_args(&common::driverlab_vm(), args, Duration::from_secs(120))
        .with_control(socket)
        .start()
        .unwrap();
    (vm, ControlClient::new(socket, Duration::from_secs(5)))
}

/// Restores `snapshot`, presses the power button once the VM runs; the outcome and its console.
fn restore(snapshot: &Path, dir: &Path, name: &str) -> (VmOutcome, String) {
    let console = dir.join(format!("{name}.log"));
    let socket = dir.join(format!("{name}.sock"));
    let args = ["--restore".as_ref(), snapshot.as_os_str(), "--serial".as_ref(), console.as_os_str()];
    let (vm, control) = start_vm(args, &socket);
    let running = || control.info().is_ok_and(|i| i.state == VmState::Running);
    assert!(common::wait_until(Duration::from_secs(30), Duration::from_millis(5), running), "the restored VM runs");
    control.shutdown(ShutdownRequest::default()).unwrap();
    let out = vm.wait().unwrap();
    (out, std::fs::read_to_string(&console).unwrap_or_default())
}

/// The report without what depends on time: each section but `hold`'s wait.
fn untimed(console: &str) -> Vec<serde_json::Value> {
    console
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|mut section| {
            if let Some(object) = section.as_object_mut() {
                object.remove("waited_ms");
            }
            section
        })
        .collect()
}

#[test]
fn a_snapshot_of_the_probe_restored_twice_goes_on_from_where_it_was() {
    if !kvm_available("a_snapshot_of_the_probe_restored_twice_goes_on_from_where_it_was") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (snapshot, taken) = take_snapshot(dir.path(), "snap");
    let exit = taken.exit.clone().expect("an exit line");
    assert_eq!((exit.reason, taken.code()), (ExitReason::Snapshot, Some(0)), "{}", taken.stderr);
    let written = exit.snapshot.expect("the exit line's snapshot");
    assert!(written.ram_data_bytes > 0 && written.ram_data_bytes < 64 << 20, "{written:?}");
    assert_eq!(written.state_bytes, std::fs::metadata(snapshot.join("state")).unwrap().len());
    let boot_console = std::fs::read_to_string(dir.path().join("snap.boot.log")).unwrap();
    assert!(!boot_console.contains("\"done\""), "the booted VM stopped before its report's end: {boot_console}");
    let state_before = std::fs::read(snapshot.join("state")).unwrap();

    let mut reports = Vec::new();
    for name in ["first", "second"] {
        let (out, console) = restore(&snapshot, dir.path(), name);
        let exit = out.exit.clone().unwrap_or_else(|| panic!("an exit line: {}", out.stderr));
        assert_eq!((exit.reason, out.code()), (ExitReason::Poweroff, Some(0)), "{}", out.stderr);
        let restored = exit.restored.expect("the exit line says it was restored");
        assert_eq!(restored.ram_data_bytes, written.ram_data_bytes);
        assert_eq!(restored.ram, RestoredRam::Mapped, "nothing shares this VM's RAM");
        assert!(restored.ms > 0.0 && restored.ms <= exit.setup_ms + 50.0, "{restored:?} of {}", exit.setup_ms);
        assert!(exit.confinement.is_some_and(|c| c.jailed), "a restored VM is jailed as any VM");
        let report = ProbeReport::parse(&console);
        let hold = report.section("hold").unwrap_or_else(|| panic!("the restored probe reports its hold: {console}"));
        assert_eq!((hold["power_button"].as_bool(), hold["gsi"].as_u64()), (Some(true), Some(20)), "{console}");
        let done = report.done().unwrap();
        assert_eq!(done.failures, ["unknown option probe.bogus"], "a failure recorded before the snapshot");
        assert!(report.section("boot").is_none(), "no second boot: {console}");
        reports.push(untimed(&console));
    }
    assert_eq!(reports[0], reports[1], "both restored guests report the same");
    assert_eq!(std::fs::read(snapshot.join("state")).unwrap(), state_before, "a snapshot is never written after");

    // A restored VM is a new generation: snapshotted again, its VM generation ID (ACPI VGEN's
    // 16 bytes at 0xff000) is not the first snapshot's.
    let again = dir.path().join("again");
    let socket = dir.path().join("again.sock");
    let args = [
        "--restore".as_ref(),
        snapshot.as_os_str(),
        "--serial".as_ref(),
        "discard".as_ref(),
        "--snapshot-to".as_ref(),
        again.as_os_str(),
    ];
    let (vm, control) = start_vm(args, &socket);
    let running = || control.info().is_ok_and(|i| i.state == VmState::Running);
    assert!(common::wait_until(Duration::from_secs(30), Duration::from_millis(5), running));
    control.snapshot().unwrap();
    let out = vm.wait().unwrap();
    assert_eq!(out.exit.map(|e| e.reason), Some(ExitReason::Snapshot), "a restored VM snapshots too: {}", out.stderr);
    let generation = |dir: &Path| {
        let mut id = [0u8; 16];
        std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(dir.join("ram")).unwrap(), &mut id, 0xff000)
            .unwrap();
        id
    };
    let (first, second) = (generation(&snapshot), generation(&again));
    assert!(first != [0; 16] && second != [0; 16] && first != second, "{first:x?} then {second:x?}");
}

#[test]
fn a_snapshot_taken_with_resume_lets_the_vm_go_on_and_restores_to_the_same_end() {
    if !kvm_available("a_snapshot_taken_with_resume_lets_the_vm_go_on_and_restores_to_the_same_end") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (snapshot, console, vm, control) = holding_probe(dir.path(), "snap");
    let answer = control.snapshot_then(AfterSnapshot::Resume).unwrap();
    assert_eq!((answer.state, answer.dir.as_str()), (VmState::Running, snapshot.to_str().unwrap()));
    let written = answer.written.expect("what was written");
    assert_eq!(written.state_bytes, std::fs::metadata(snapshot.join("state")).unwrap().len());
    assert_eq!(control.info().unwrap().state, VmState::Running, "the VM goes on");
    let again = control.snapshot().unwrap_err();
    assert!(
        matches!(&again, ControlError::Refused { status: 409, message, .. } if message.contains("already")),
        "{again}"
    );
    control.shutdown(ShutdownRequest::default()).unwrap();
    let out = vm.wait().unwrap();
    let exit = out.exit.clone().expect("an exit line");
    assert_eq!((exit.reason, out.code()), (ExitReason::Poweroff, Some(0)), "{}", out.stderr);
    assert_eq!(exit.snapshot, Some(written), "the exit line tells of the snapshot taken on the way");
    let went_on = std::fs::read_to_string(&console).unwrap();
    assert!(ProbeReport::parse(&went_on).done().is_some(), "the probe finished after the snapshot: {went_on}");

    // The snapshot restores to the end the VM that went on reached.
    let (out, restored) = restore(&snapshot, dir.path(), "restored");
    assert_eq!(out.exit.map(|e| e.reason), Some(ExitReason::Poweroff), "{}", out.stderr);
    let (went_on, restored) = (untimed(&went_on), untimed(&restored));
    assert!(!restored.is_empty() && went_on.ends_with(&restored), "{went_on:?}\nends otherwise than\n{restored:?}");
}

#[test]
fn a_restored_vm_gets_its_payload_in_the_window_its_snapshot_set_aside() {
    if !kvm_available("a_restored_vm_gets_its_payload_in_the_window_its_snapshot_set_aside") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (snapshot, console, vm, control) = holding_probe_with(dir.path(), "snap", &["--payload-window", "16"]);
    control.snapshot().unwrap();
    assert_eq!(vm.wait().unwrap().exit.map(|e| e.reason), Some(ExitReason::Snapshot));
    // 64 MiB of RAM: the window is the 16 MiB below the last 2, reserved in the guest's E820 map.
    let window = (64 - 2 - 16) << 20;
    let boot = ProbeReport::parse(&std::fs::read_to_string(&console).unwrap()).boot().expect("a boot section");
    let reserved = boot.e820.iter().find(|e| e.addr == window).map(|e| (e.size, e.kind));
    assert_eq!(reserved, Some((16 << 20, 2)), "{:?}", boot.e820);
    assert!(boot.e820.iter().any(|e| e.kind == 1 && e.addr == window + (16 << 20)), "usable RAM above it");

    // Restored with a payload (and --snapshot-to, so that its RAM is a file of its own): a
    // snapshot of the restored VM holds the payload at the window.
    let payload: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let file = dir.path().join("payload");
    std::fs::write(&file, &payload).unwrap();
    let again = dir.path().join("again");
    let console = dir.path().join("restored.log");
    let args: [&std::ffi::OsStr; 8] = [
        "--restore".as_ref(),
        snapshot.as_os_str(),
        "--payload".as_ref(),
        file.as_os_str(),
        "--serial".as_ref(),
        console.as_os_str(),
        "--snapshot-to".as_ref(),
        again.as_os_str(),
    ];
    let (vm, control) = start_vm(args, &dir.path().join("restored.sock"));
    let running = || control.info().is_ok_and(|i| i.state == VmState::Running);
    assert!(common::wait_until(Duration::from_secs(30), Duration::from_millis(5), running), "the restored VM runs");
    control.snapshot().unwrap();
    assert_eq!(vm.wait().unwrap().exit.map(|e| e.reason), Some(ExitReason::Snapshot));
    let mut held = vec![0u8; payload.len()];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(again.join("ram")).unwrap(), &mut held, window)
        .unwrap();
    assert!(held == payload, "the window holds the payload");

    // A payload larger than the window, and one for a snapshot without a window: refused.
    std::fs::write(&file, vec![1u8; (16 << 20) + 1]).unwrap();
    let out = vm_run(&["--restore", snapshot.to_str().unwrap(), "--payload", file.to_str().unwrap()]);
    let line = out.error.unwrap_or_else(|| panic!("an error line: {}", out.stderr));
    assert_eq!(line.kind, ErrorKind::Usage);
    assert!(line.message.contains("larger than the snapshot's payload window of 16 MiB"), "{}", line.message);
    let (plain, _) = take_snapshot(dir.path(), "plain");
    let out = vm_run(&["--restore", plain.to_str().unwrap(), "--payload", file.to_str().unwrap()]);
    let line = out.error.unwrap_or_else(|| panic!("an error line: {}", out.stderr));
    assert!(line.message.contains("has no payload window (boot it with --payload-window)"), "{}", line.message);
}

/// A copy of the snapshot at `from` as `to`, with `change` applied to the file `name`.
fn changed_copy(from: &Path, to: &Path, name: &str, change: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    std::fs::create_dir(to).unwrap();
    for file in ["state", "ram"] {
        std::fs::copy(from.join(file), to.join(file)).unwrap();
    }
    let mut bytes = std::fs::read(to.join(name)).unwrap();
    change(&mut bytes);
    std::fs::write(to.join(name), bytes).unwrap();
    to.to_path_buf()
}

fn refused_restore(snapshot: &Path) -> (i32, ErrorKind, String) {
    let out = vm_run(&["--restore", snapshot.to_str().unwrap()]);
    let line = out.error.clone().unwrap_or_else(|| panic!("an error line: {}", out.stderr));
    (out.code().unwrap(), line.kind, line.message)
}

#[test]
fn snapshots_that_cannot_be_used_and_vms_that_cannot_be_snapshotted_are_refused() {
    if !kvm_available("snapshots_that_cannot_be_used_and_vms_that_cannot_be_snapshotted_are_refused") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (snapshot, _) = take_snapshot(dir.path(), "snap");
    let state = std::fs::read_to_string(snapshot.join("state")).unwrap();
    let (header, _) = state.split_once('\n').unwrap();

    let body_changed = changed_copy(&snapshot, &dir.path().join("body"), "state", |bytes| {
        let at = bytes.len() - 10;
        bytes[at] ^= 0x01;
    });
    let (code, kind, message) = refused_restore(&body_changed);
    assert_eq!((code, kind), (2, ErrorKind::Image), "{message}");
    assert!(message.contains("does not match its checksum"), "{message}");

    // Text for the guest to read on COM2 needs a COM2 in the snapshot's VM.
    let out = vm_run(&["--restore", snapshot.to_str().unwrap(), "--com2-input", "driverlab.nic=atlantic"]);
    let line = out.error.clone().unwrap_or_else(|| panic!("an error line: {}", out.stderr));
    assert_eq!((out.code(), line.kind), (Some(2), ErrorKind::Usage), "{}", line.message);
    assert!(line.message.contains("the snapshot's VM has no COM2"), "{}", line.message);

    let version = env!("CARGO_PKG_VERSION");
    let older = changed_copy(&snapshot, &dir.path().join("older"), "state", |bytes| {
        let text = String::from_utf8(bytes.clone()).unwrap();
        *bytes = text.replacen(&format!("\"vmm_version\":\"{version}\""), "\"vmm_version\":\"0.0.1\"", 1).into_bytes();
    });
    let (code, _, message) = refused_restore(&older);
    assert!(code == 2 && message.contains("written by driverlab 0.0.1") && message.contains("take a new snapshot"));
    assert!(header.contains(version), "{header}");

    let ram_changed = changed_copy(&snapshot, &dir.path().join("ram"), "ram", |bytes| {
        let first_data = bytes.iter().position(|&b| b != 0).unwrap();
        bytes[first_data] ^= 0xff;
    });
    // Mapped (no device model shares this VM's RAM) or copied (with --snapshot-to), the RAM
    // file is checked while the VM runs: the VM stops, an error.
    let again = dir.path().join("again");
    for (extra, how) in
        [(vec![], RestoredRam::Mapped), (vec!["--snapshot-to", again.to_str().unwrap()], RestoredRam::Copied)]
    {
        let out = vm_run(&[&["--restore", ram_changed.to_str().unwrap()], &extra[..]].concat());
        let exit = out.exit.clone().unwrap_or_else(|| panic!("an exit line: {}", out.stderr));
        assert_eq!((exit.reason, out.code()), (ExitReason::VmmError, Some(1)), "{}", out.stderr);
        assert!(exit.detail.unwrap_or_default().contains("RAM was changed"), "{}", out.stderr);
        assert_eq!(exit.restored.map(|r| r.ram), Some(how));
    }

    // A VM that ended before its snapshot; a directory that exists already.
    let unwritten = dir.path().join("unwritten");
    let out = vm_run(&[
        "--kernel",
        "probe",
        "--memory",
        "64",
        "--serial",
        "discard",
        "--snapshot-to",
        unwritten.to_str().unwrap(),
    ]);
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let (_, _, message) = refused_restore(&unwritten);
    assert!(message.contains("no snapshot was written"), "{message}");
    let out = vm_run(&["--kernel", "probe", "--snapshot-to", unwritten.to_str().unwrap()]);
    let line = out.error.clone().expect("an error line");
    assert_eq!((out.code(), line.kind), (Some(2), ErrorKind::Spec), "{}", line.message);
    assert!(line.message.contains("does not exist yet"), "{}", line.message);
}

/// Starts the holding probe with `extra` flags and asks for a snapshot; the refusal.
fn snapshot_refusal(dir: &Path, name: &str, extra: &[&str]) -> (u16, String) {
    let console = dir.join(format!("{name}.log"));
    let socket = dir.join(format!("{name}.sock"));
    let mut args: Vec<String> = ["--kernel", "probe", "--cmdline", "probe.hold=60000 probe.viommu_ops=0", "--serial"]
        .map(String::from)
        .to_vec();
    args.push(console.to_str().unwrap().into());
    args.extend(extra.iter().map(|s| s.to_string()));
    let (vm, control) = start_vm(args, &socket);
    wait_for(&console, "{\"probe\":\"holding\"");
    let refused = control.snapshot().unwrap_err();
    control.shutdown(ShutdownRequest::default()).unwrap();
    let out = vm.wait().unwrap();
    assert_eq!(out.exit.map(|e| e.reason), Some(ExitReason::Poweroff), "a refused snapshot leaves the VM running");
    match refused {
        ControlError::Refused { status, message, .. } => (status, message),
        other => panic!("a refusal, not {other}"),
    }
}

#[test]
fn a_vm_with_a_passed_through_device_or_nowhere_to_write_is_not_snapshotted() {
    if !kvm_available("a_vm_with_a_passed_through_device_or_nowhere_to_write_is_not_snapshotted") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (status, message) = snapshot_refusal(dir.path(), "nowhere", &[]);
    assert_eq!(status, 409);
    assert!(message.contains("without --snapshot-to"), "{message}");

    let model = start_model("testdev", &[]);
    let device = format!("vfio-user={}", model.socket().display());
    let target = dir.path().join("with-device");
    let extra = ["--device", device.as_str(), "--snapshot-to", target.to_str().unwrap()];
    let (status, message) = snapshot_refusal(dir.path(), "device", &extra);
    assert_eq!(status, 409);
    assert!(message.contains("passed-through device") && message.contains("00:02.0, on the root bus"), "{message}");
    let (_, _, message) = refused_restore(&target);
    assert!(message.contains("no snapshot was written"), "{message}");
    drop(model);
}

/// Starts the holding probe shaped like a lab cell (virtio-iommu, the model's Thunderbolt slot
/// empty) with `snapshot-to`; the running VM and its control client.
fn cell(dir: &Path, name: &str, device: &str, snapshot_to: &Path) -> (RunningVm, ControlClient) {
    let console = dir.join(format!("{name}.log"));
    let socket = dir.join(format!("{name}.sock"));
    let slot = format!("{device},slot=thunderbolt,plugged=false");
    let args = [
        "--kernel",
        "probe",
        "--iommu",
        "--cmdline",
        "probe.hold=60000",
        "--memory",
        "128",
        "--device",
        &slot,
        "--serial",
        console.to_str().unwrap(),
        "--snapshot-to",
        snapshot_to.to_str().unwrap(),
    ];
    let (vm, control) = start_vm(args, &socket);
    wait_for(&console, "{\"probe\":\"holding\"");
    (vm, control)
}

#[test]
fn a_cell_with_its_slot_empty_is_snapshotted_and_its_restore_takes_a_new_device_into_the_slot() {
    if !kvm_available("a_cell_with_its_slot_empty_is_snapshotted_and_its_restore_takes_a_new_device_into_the_slot") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first = start_model("testdev", &[]);
    let device = format!("vfio-user={}", first.socket().display());
    let snapshot = dir.path().join("cell");
    let (vm, control) = cell(dir.path(), "boot", &device, &snapshot);

    // Plugged, the device is in the guest: refused. Pulled again, the VM is snapshotted.
    control.plug(&device).unwrap();
    let refused = control.snapshot().unwrap_err();
    assert!(
        matches!(&refused, ControlError::Refused { status: 409, message, .. } if message.contains("plugged into its slot")),
        "{refused}"
    );
    control.unplug(&device, true).unwrap();
    control.snapshot().unwrap();
    let taken = vm.wait().unwrap();
    assert_eq!(taken.exit.as_ref().map(|e| e.reason), Some(ExitReason::Snapshot), "{}", taken.stderr);
    drop(first);

    // Restored with another model (another socket) in the same slot: it plugs, its DMA goes
    // through the restored virtio-iommu, the guest goes on and powers off at the button.
    let second = start_model("testdev", &[]);
    let device = format!("vfio-user={}", second.socket().display());
    let slot = format!("{device},slot=thunderbolt,plugged=false");
    let console = dir.path().join("restored.log");
    let socket = dir.path().join("restored.sock");
    let args = ["--restore", snapshot.to_str().unwrap(), "--device", &slot, "--serial", console.to_str().unwrap()];
    let (vm, control) = start_vm(args, &socket);
    let info = control.wait_until_serving(Duration::from_secs(10)).unwrap();
    assert_eq!(info.slots.len(), 1);
    assert_eq!(info.slots[0].state, vm_spec::control::SlotState::Empty, "the slot as the snapshot had it");
    let plugged = control.plug(&device).unwrap();
    assert_eq!((plugged.state, plugged.bdf.as_str()), (vm_spec::control::SlotState::Occupied, "01:00.0"));
    let counters = control.counters().unwrap();
    let model = counters.devices[0].counters.expect("the model's counters");
    assert!(model.dma_maps > 0, "the endpoint's DMA is routed by the restored IOMMU: {model:?}");
    control.shutdown(ShutdownRequest::default()).unwrap();
    let out = vm.wait().unwrap();
    let exit = out.exit.clone().expect("an exit line");
    assert_eq!((exit.reason, out.code()), (ExitReason::Poweroff, Some(0)), "{}", out.stderr);
    assert_eq!(exit.restored.map(|r| r.ram), Some(vm_spec::RestoredRam::Copied), "a device model shares it");
    assert!(exit.devices.iter().all(|d| d.reset_ok), "{}", out.stderr);
    let report = ProbeReport::parse(&std::fs::read_to_string(&console).unwrap());
    assert!(report.done().is_some_and(|d| d.ok), "the restored probe finishes clean");

    // Other devices than the snapshot's slots: refused before anything runs.
    let out = vm_run(&["--restore", snapshot.to_str().unwrap(), "--device", &device]);
    let line = out.error.clone().expect("an error line");
    assert_eq!((out.code(), line.kind), (Some(2), ErrorKind::Usage), "{}", line.message);
    assert!(line.message.contains("slot=thunderbolt,plugged=false"), "{}", line.message);
    drop(second);
}

//! `driverlab vm run` end to end: the real binary boots the probe guest (and tiny hand-made
//! guests) under KVM; exit codes, the exit line and the probe's report are checked.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use common::{driverlab_cmd, kvm_available, tiny_elf, vm_run, write_file};
use engines::ProbeReport;

/// Legacy hole the VMM documents: the EBDA at 0x9fc00 up to 1 MiB is reserved.
const LEGACY_HOLE: u64 = 0x10_0000 - 0x9_fc00;
const MIB: u64 = 1 << 20;

#[test]
fn probe_boots_via_pvh_and_reports_what_it_was_given() {
    if !kvm_available("probe_boots_via_pvh_and_reports_what_it_was_given") {
        return;
    }
    let out = vm_run(&["--kernel", "probe", "--memory", "256", "--vcpus", "2", "--cmdline", "probe.echo=1"]);
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    let exit = out.exit.as_ref().expect("exit line");
    assert_eq!((exit.reason.name(), exit.exit_code, exit.entry.as_str(), exit.vcpus), ("poweroff", 0, "pvh", 2));
    assert_eq!(exit.serial_bytes as usize, out.serial.len());

    let report = ProbeReport::parse(&out.serial);
    let boot = report.boot().expect("boot section");
    assert_eq!(boot.entry, "pvh");
    assert_eq!(boot.cmdline, "probe.echo=1");
    assert_eq!(boot.usable_ram(), 256 * MIB - LEGACY_HOLE, "e820: {:?}", boot.e820);
    assert_eq!(report.section("options").unwrap()["echo"], true);
    let cpus = report.section("cpus").expect("cpus section");
    assert_eq!((cpus["expected"].as_u64(), cpus["started"].as_u64()), (Some(2), Some(2)), "{cpus}");
    assert_eq!(cpus["apic_ids"], serde_json::json!([0, 1]));
    let done = report.done().expect("done section");
    assert!(done.ok, "failures: {:?}", done.failures);
    assert_eq!(report.sections().last().unwrap()["probe"], "done", "done comes last");
}

#[test]
fn probe_boots_via_the_64_bit_entry() {
    if !kvm_available("probe_boots_via_the_64_bit_entry") {
        return;
    }
    let out = vm_run(&["--kernel", "probe", "--entry", "linux64", "--memory", "64", "--cmdline", "x probe.echo=0 y"]);
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    assert_eq!(out.exit.as_ref().unwrap().entry, "linux64");
    let report = ProbeReport::parse(&out.serial);
    let boot = report.boot().unwrap();
    assert_eq!((boot.entry.as_str(), boot.cmdline.as_str()), ("linux64", "x probe.echo=0 y"));
    assert_eq!(boot.usable_ram(), 64 * MIB - LEGACY_HOLE);
    assert!(report.section("options").is_none(), "echo=0 prints no options");
    assert!(report.done().unwrap().ok);
}

#[test]
fn memory_above_the_hole_appears_at_4_gib() {
    if !kvm_available("memory_above_the_hole_appears_at_4_gib") {
        return;
    }
    let out = vm_run(&["--kernel", "probe", "--memory", "4096"]);
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    let boot = ProbeReport::parse(&out.serial).boot().unwrap();
    assert_eq!(boot.usable_ram(), 4096 * MIB - LEGACY_HOLE);
    let high = boot.e820.iter().find(|e| e.addr == 4 << 30).expect("RAM at 4 GiB");
    assert_eq!((high.size, high.kind), (1 << 30, 1));
    let ram = boot.e820.iter().filter(|e| e.kind == 1);
    assert!(ram.clone().all(|e| e.addr + e.size <= 0xc000_0000 || e.addr >= 1 << 32), "no RAM in the MMIO hole");
    let ecam = boot.e820.iter().find(|e| e.addr == 0xe000_0000).expect("the ECAM window is reserved");
    assert_eq!((ecam.size, ecam.kind), (32 << 20, 2), "buses 0 to 31: bus 0 and the root ports' buses");
}

#[test]
fn secondary_vcpus_come_up_through_init_and_sipi() {
    if !kvm_available("secondary_vcpus_come_up_through_init_and_sipi") {
        return;
    }
    let out = vm_run(&["--kernel", "probe", "--vcpus", "8", "--memory", "64"]);
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let report = ProbeReport::parse(&out.serial);
    let cpus = report.section("cpus").unwrap();
    assert_eq!(cpus["started"].as_u64(), Some(8), "{cpus}");
    let mut ids: Vec<u64> = cpus["apic_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, (0..8).collect::<Vec<u64>>());
    assert!(report.done().unwrap().ok);
}

#[test]
fn unknown_probe_option_is_a_reported_failure() {
    if !kvm_available("unknown_probe_option_is_a_reported_failure") {
        return;
    }
    let out = vm_run(&["--kernel", "probe", "--cmdline", "probe.frobnicate=3 probe.echo=maybe"]);
    assert_eq!(out.code(), Some(0));
    let done = ProbeReport::parse(&out.serial).done().unwrap();
    assert!(!done.ok);
    assert_eq!(done.failures, vec!["unknown option probe.frobnicate", "option needs 0 or 1: probe.echo"]);
}

#[test]
fn each_way_of_ending_has_its_exit_code() {
    if !kvm_available("each_way_of_ending_has_its_exit_code") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &[u8], i32, &str)] = &[
        // mov al, 0x34; mov dx, 0x600; out dx, al (ACPI S5); jmp $
        ("poweroff", &[0xb0, 0x34, 0x66, 0xba, 0x00, 0x06, 0xee, 0xeb, 0xfe], 0, "poweroff"),
        // mov al, 0xfe; out 0x64, al (i8042 reset); jmp $
        ("reset", &[0xb0, 0xfe, 0xe6, 0x64, 0xeb, 0xfe], 3, "reset"),
        // ud2 with an empty IDT: #UD, #GP, double fault, triple fault
        ("triple", &[0x0f, 0x0b], 3, "triple-fault"),
        // mov al, 1; mov dx, 0x505; out dx, al (pvpanic); jmp $
        ("panic", &[0xb0, 0x01, 0x66, 0xba, 0x05, 0x05, 0xee, 0xeb, 0xfe], 5, "panic"),
        // jmp $
        ("hang", &[0xeb, 0xfe], 6, "timeout"),
    ];
    for &(name, code, want_code, want_reason) in cases {
        let kernel = write_file(dir.path(), name, &tiny_elf(code));
        let out = vm_run(&["--kernel", &kernel, "--memory", "16", "--timeout", "1"]);
        assert_eq!(out.code(), Some(want_code), "{name}: stderr {}", out.stderr);
        let exit = out.exit.as_ref().unwrap_or_else(|| panic!("{name}: no exit line in {}", out.stderr));
        assert_eq!((exit.reason.name(), exit.exit_code), (want_reason, want_code), "{name}");
        assert_eq!(exit.entry, "linux64", "{name}: an ELF without a PVH note takes the 64-bit entry");
        if name == "hang" {
            let detail = exit.detail.as_deref().unwrap_or_default();
            // Where, and what code the guest's page tables map there (the `jmp $`).
            assert!(
                detail.contains("vCPU 0 at rip 0x100000 (gpa 0x100000, code eb fe "),
                "a hang says where: {detail}"
            );
        }
    }
}

/// Runs `driverlab vm run ARGS`, expects exit code 2 with an `error:` line and the JSON error line
/// after it, both naming `needle`.
fn assert_bad_input(args: &[&str], needle: &str) {
    let mut full = vec!["vm", "run"];
    full.extend_from_slice(args);
    let (code, stdout, stderr) = driverlab_cmd(&full);
    assert_eq!(code, Some(2), "{args:?}: stderr {stderr}");
    assert!(stdout.is_empty(), "{args:?}: no guest ran, yet stdout has {stdout}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    assert!(lines.len() <= 3, "{args:?}: a message (and clap's hint) and the error line, got {stderr}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains(needle), "{args:?}: {stderr} lacks {needle:?}");
    let line: vm_spec::ErrorLine = serde_json::from_str(lines[lines.len() - 1]).expect("the error line last");
    assert_eq!((line.vmm.as_str(), line.exit_code), ("error", 2), "{stderr}");
    assert!(line.message.contains(needle), "{stderr}");
}

#[test]
fn bad_input_is_one_line_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let text = write_file(dir.path(), "notes.txt", b"this is not a kernel\n");
    let empty = write_file(dir.path(), "empty", b"");
    let truncated = write_file(dir.path(), "truncated", &guest_images::PROBE_ELF[..3000]);
    let mut big = tiny_elf(&[0xeb, 0xfe]);
    big[64 + 40..64 + 48].copy_from_slice(&(64u64 << 20).to_le_bytes()); // p_memsz 64 MiB
    let big = write_file(dir.path(), "big", &big);
    let initrd = write_file(dir.path(), "initrd", &vec![0u8; 40 << 20]);
    let long_cmdline = "x".repeat(3000);

    assert_bad_input(&["--kernel", "/nonexistent/vmlinux"], "/nonexistent/vmlinux");
    assert_bad_input(&["--kernel", &text], "not an ELF or bzImage");
    assert_bad_input(&["--kernel", &empty], "empty");
    assert_bad_input(&["--kernel", &truncated], "truncated ELF");
    assert_bad_input(&["--kernel", &big, "--memory", "32"], "does not fit in guest memory");
    assert_bad_input(&["--kernel", "probe", "--memory", "32", "--initrd", &initrd], "does not fit");
    assert_bad_input(&["--kernel", "probe", "--initrd", "/nonexistent/initrd"], "initrd /nonexistent/initrd");
    assert_bad_input(&["--kernel", "probe", "--memory", "0"], "(--memory) 0");
    assert_bad_input(&["--kernel", "probe", "--memory", "1048576"], "the host has only");
    assert_bad_input(&["--kernel", "probe", "--memory", "100000000"], "at most 1048576 MiB");
    assert_bad_input(&["--kernel", "probe", "--cmdline", &long_cmdline], "at most 2047");
    assert_bad_input(&["--kernel", "probe", "--vcpus", "0"], "(--vcpus) 0");
    assert_bad_input(&["--kernel", "probe", "--timeout", "0"], "--timeout");
    assert_bad_input(&["--kernel", "probe", "--serial", "/nonexistent/dir/serial.log"], "serial output /nonexistent");
    assert_bad_input(&["--kernel", "probe", "--com2", "unix:/nonexistent/agent.sock"], "serial output /nonexistent");
    assert_bad_input(&["--kernel", "probe", "--iommu-bypass", "false"], "--iommu-bypass needs --iommu");
    assert_bad_input(&["--kernel", "probe", "--memory", "lots"], "invalid value 'lots'");
    assert_bad_input(&["--config", "/nonexistent/spec.json"], "--config /nonexistent/spec.json");
    let spec = write_file(dir.path(), "spec.json", br#"{"kernel":"probe","vcpus":"two"}"#);
    assert_bad_input(&["--config", &spec], "vcpus: invalid type");
    let spec = write_file(dir.path(), "unknown.json", br#"{"kernel":"probe","colour":"red"}"#);
    assert_bad_input(&["--config", &spec], "unknown field `colour`");
    assert_bad_input(&["--kernel", &text, "--entry", "pvh"], "not an ELF or bzImage");
}

#[test]
fn serial_output_can_go_to_a_file() {
    if !kvm_available("serial_output_can_go_to_a_file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serial.log");
    let out = vm_run(&["--kernel", "probe", "--serial", log.to_str().unwrap()]);
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert!(out.serial.is_empty(), "stdout stays empty");
    let report = ProbeReport::parse(&std::fs::read_to_string(&log).unwrap());
    assert!(report.done().unwrap().ok);
}

#[test]
fn image_probe_writes_the_embedded_guest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe.elf");
    let (code, stdout, stderr) = driverlab_cmd(&["image", "probe", "--out", path.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("probe guest"));
    assert_eq!(std::fs::read(&path).unwrap(), guest_images::PROBE_ELF);
}

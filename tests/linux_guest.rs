//! A real Linux kernel (Debian's 6.12 amd64) under `driverlab vm run`.
//!
//! Needs the kernel: `DRIVERLAB_TEST_BZIMAGE` names Debian's vmlinuz (scripts/test.sh fetches it).
//! What the test can expect depends on the host:
//! - with hardware virtualization both the vmlinux (PVH) and the bzImage (64-bit entry) must reach
//!   an initramfs, which prints a marker and reboots;
//! - on PVM hosts guest ring 0 is emulated: the vmlinux prints its banner and the E820 map, then
//!   dies in KVM's emulator; the bzImage's decompressor dies early. Both must end cleanly with the
//!   `kvm-internal-error` exit reason.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::path::{Path, PathBuf};

use common::{kvm_available, vm_run, write_file};
use vm_spec::host::Virtualization;

const INITRAMFS_MARKER: &str = "DRIVERLAB-INITRAMFS-REACHED";

fn debian_bzimage(test: &str) -> Option<Vec<u8>> {
    let Some(path) = std::env::var_os("DRIVERLAB_TEST_BZIMAGE").map(PathBuf::from) else {
        let why = "set DRIVERLAB_TEST_BZIMAGE to Debian's linux-image-6.12 vmlinuz (scripts/test.sh fetches it)";
        common::skip(test, common::Lacks::Setup, why);
        return None;
    };
    Some(std::fs::read(&path).unwrap_or_else(|e| panic!("DRIVERLAB_TEST_BZIMAGE={}: {e}", path.display())))
}

/// An initramfs whose init prints the marker and reboots (through the i8042 with `reboot=k`).
fn marker_initramfs(test: &str) -> Option<Vec<u8>> {
    let Ok(busybox) = std::fs::read("/bin/busybox") else {
        common::skip(test, common::Lacks::Setup, "needs a static /bin/busybox (Debian package busybox-static)");
        return None;
    };
    let init = format!("#!/bin/busybox sh\n/bin/busybox echo {INITRAMFS_MARKER}\n/bin/busybox reboot -f\n");
    let mut archive = guest_images::initramfs::Initramfs::new();
    archive.dir("bin").dir("dev").dir("proc").file("bin/busybox", 0o755, &busybox).file("init", 0o755, init.as_bytes());
    Some(archive.finish())
}

/// With hardware virtualization: `kernel` reaches the marker initramfs through `entry`, and the
/// initramfs's `reboot -f` ends the VM as a reset.
fn boots_to_initramfs(test: &str, dir: &Path, kernel: &str, entry: &str) {
    let Some(initramfs) = marker_initramfs(test) else {
        return;
    };
    let initrd = write_file(dir, "initramfs.cpio", &initramfs);
    let out = vm_run(&[
        "--kernel",
        kernel,
        "--initrd",
        &initrd,
        "--memory",
        "512",
        "--cmdline",
        "console=ttyS0 reboot=k panic=-1",
        "--timeout",
        "120",
    ]);
    assert!(out.serial.contains(INITRAMFS_MARKER), "initramfs not reached; serial:\n{}", out.serial);
    assert_eq!(out.exit.as_ref().map(|e| e.entry.as_str()), Some(entry));
    assert_eq!(out.code(), Some(3), "reboot -f resets: {}", out.stderr);
}

#[test]
fn debian_vmlinux_boots_via_pvh() {
    let test = "debian_vmlinux_boots_via_pvh";
    if !kvm_available(test) {
        return;
    }
    let Some(bzimage) = debian_bzimage(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let vmlinux = guest_images::kernel::extract_vmlinux(&bzimage).expect("Debian's bzImage holds a vmlinux");
    let vmlinux = write_file(dir.path(), "vmlinux", &vmlinux);
    let virt = vm_spec::host::virtualization();

    if virt.boots_linux() {
        return boots_to_initramfs(test, dir.path(), &vmlinux, "pvh");
    }

    assert_eq!(virt, Virtualization::Pvm, "this test knows hardware virtualization and PVM hosts");
    let out = vm_run(&[
        "--kernel",
        &vmlinux,
        "--memory",
        "128",
        "--cmdline",
        "console=ttyS0 earlyprintk=serial",
        "--timeout",
        "600",
    ]);
    assert!(out.serial.contains("Linux version 6.12"), "no banner; serial:\n{}", out.serial);
    assert!(out.serial.contains("Command line: console=ttyS0 earlyprintk=serial"));
    let e820: Vec<&str> =
        out.serial.lines().filter_map(|l| l.split_once("BIOS-e820: ").map(|(_, rest)| rest.trim())).collect();
    assert_eq!(
        e820,
        vec![
            "[mem 0x0000000000000000-0x000000000009fbff] usable",
            "[mem 0x000000000009fc00-0x00000000000fffff] reserved",
            "[mem 0x0000000000100000-0x0000000007ffffff] usable",
            "[mem 0x00000000e0000000-0x00000000e1ffffff] reserved",
        ],
        "the kernel's E820 lines must match the VMM's map for 128 MiB"
    );
    let exit = out.exit.as_ref().expect("the VMM ends the VM and prints its exit line");
    assert_eq!((exit.reason.name(), exit.exit_code, exit.entry.as_str()), ("kvm-internal-error", 4, "pvh"));
    assert!(exit.detail.as_deref().unwrap_or_default().contains("emulation failure"), "{:?}", exit.detail);
}

#[test]
fn debian_bzimage_is_entered_at_its_64_bit_entry() {
    let test = "debian_bzimage_is_entered_at_its_64_bit_entry";
    if !kvm_available(test) {
        return;
    }
    let Some(bzimage) = debian_bzimage(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kernel = write_file(dir.path(), "vmlinuz", &bzimage);
    let virt = vm_spec::host::virtualization();

    if virt.boots_linux() {
        return boots_to_initramfs(test, dir.path(), &kernel, "linux64");
    }

    assert_eq!(virt, Virtualization::Pvm);
    let out = vm_run(&["--kernel", &kernel, "--memory", "256", "--cmdline", "console=ttyS0", "--timeout", "120"]);
    let exit = out.exit.as_ref().expect("exit line");
    assert_eq!((exit.reason.name(), exit.exit_code, exit.entry.as_str()), ("kvm-internal-error", 4, "linux64"));
    let detail = exit.detail.as_deref().unwrap_or_default();
    assert!(detail.contains("emulation failure"), "{detail}");
    assert!(!detail.contains("rip 0x100200 "), "the decompressor ran past its entry point: {detail}");
}

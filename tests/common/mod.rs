//! Helpers shared by the integration tests: running the real `driverlab` binary and building
//! tiny guests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use engines::{ModelProcess, VmOutcome, VmProcess};

/// The driverlab binary cargo built for these tests.
pub fn driverlab() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_driverlab"))
}

/// `driverlab vm run`: the user's command, whose contract the tests check.
pub fn driverlab_vm() -> engines::Program {
    engines::Program::driverlab_vm(driverlab())
}

/// The programs the lab starts: the small `driverlab-vmm` and `driverlab-model` binaries.
pub fn programs() -> engines::Programs {
    engines::Programs::beside(&driverlab())
}

pub use testkit::{Lacks, skip};

/// True if /dev/kvm can be opened; otherwise says why the calling test skips.
pub fn kvm_available(test: &str) -> bool {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        Ok(_) => true,
        Err(e) => {
            skip(test, Lacks::Setup, format!("/dev/kvm is not usable here ({e}); KVM tests need it"));
            false
        }
    }
}

/// Runs `driverlab vm run ARGS` with a generous backstop deadline.
pub fn vm_run(args: &[&str]) -> VmOutcome {
    VmProcess::with_args(&driverlab_vm(), args, Duration::from_secs(300)).run().expect("driverlab starts")
}

/// Runs `driverlab ARGS` (any subcommand) and returns (exit code, stdout, stderr).
pub fn driverlab_cmd(args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(driverlab()).args(args).output().expect("driverlab starts");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A minimal x86-64 ELF (no PVH note) whose single segment holds `code` at 1 MiB, entered in
/// 64-bit mode at its first byte.
pub fn tiny_elf(code: &[u8]) -> Vec<u8> {
    const LOAD: u64 = 0x10_0000;
    const OFFSET: u64 = 0x1000;
    let mut elf = vec![0u8; OFFSET as usize];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2; // 64-bit
    elf[5] = 1; // little-endian
    elf[6] = 1; // version
    elf[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    elf[20..24].copy_from_slice(&1u32.to_le_bytes());
    elf[24..32].copy_from_slice(&LOAD.to_le_bytes()); // e_entry
    elf[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    elf[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    elf[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    elf[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
    let ph = &mut elf[64..120];
    ph[0..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    ph[4..8].copy_from_slice(&5u32.to_le_bytes()); // R+X
    ph[8..16].copy_from_slice(&OFFSET.to_le_bytes());
    ph[16..24].copy_from_slice(&LOAD.to_le_bytes());
    ph[24..32].copy_from_slice(&LOAD.to_le_bytes());
    ph[32..40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    ph[40..48].copy_from_slice(&(code.len() as u64).to_le_bytes());
    elf.extend_from_slice(code);
    elf
}

/// Writes `bytes` to `dir/name` and returns the path as a string.
pub fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_string()
}

/// Starts `driverlab model KIND --once` with `extra` arguments and waits until it serves.
pub fn start_model(kind: &str, extra: &[&str]) -> ModelProcess {
    ModelProcess::start(&programs().model, kind, extra).expect("the model starts serving")
}

/// Waits up to `limit` for `ready`, looking every `every`; whether it became true (the caller
/// asserts, with what it was waiting for).
#[allow(dead_code)]
pub fn wait_until(limit: Duration, every: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while !ready() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(every);
    }
    true
}

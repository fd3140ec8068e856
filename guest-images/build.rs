//! Builds the probe guest (`probe/`, a `no_std` crate for x86_64-unknown-none) with a nested
//! cargo in its own target directory, and leaves the ELF in OUT_DIR for `include_bytes!`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const TARGET: &str = "x86_64-unknown-none";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("set by cargo"));
    let probe_dir = manifest_dir.join("probe");
    for path in ["src", "Cargo.toml", "build.rs", "linker.ld", ".cargo/config.toml"] {
        println!("cargo:rerun-if-changed={}", probe_dir.join(path).display());
    }

    let target_dir = out_dir.join("probe-target");
    let mut cargo = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .current_dir(&probe_dir)
        .args(["build", "--release", "--locked", "--target", TARGET, "--target-dir"])
        .arg(&target_dir);
    // The outer build's flags, wrappers (clippy, coverage) and target settings are for host code.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        let host_only = (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || matches!(key.as_ref(), "RUSTFLAGS" | "RUSTDOCFLAGS" | "RUSTC_WRAPPER" | "RUSTC_WORKSPACE_WRAPPER");
        if host_only {
            cargo.env_remove(key.as_ref());
        }
    }
    let status = cargo.status().expect("cannot run cargo to build the probe guest");
    if !status.success() {
        panic!(
            "building the probe guest failed; if the target is missing, run `rustup target add {TARGET}` \
             (rust-toolchain.toml lists it)"
        );
    }
    let elf = target_dir.join(TARGET).join("release").join("probe");
    std::fs::copy(&elf, out_dir.join("probe.elf")).expect("the probe guest ELF was not produced");
}

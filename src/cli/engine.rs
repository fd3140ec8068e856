//! `driverlab engine ...`: the engines a lab image can run under (`engine = "driverlab"`, the
//! default, or `engine = "qemu"`), and setting QEMU up.

use std::process::Command;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};

/// The script that makes the forky chroot, and the helpers it sources, embedded so that an
/// installed binary can set QEMU up without the source tree.
const FETCH_SCRIPT: &str = include_str!("../../scripts/fetch-forky-qemu.sh");
const SCRIPT_LIB: &str = include_str!("../../scripts/lib.sh");

/// Engine commands.
#[derive(Subcommand)]
pub enum EngineCommand {
    /// Make an engine ready. `qemu`: a Debian forky chroot with QEMU 11 (vfio-user-pci,
    /// virtio-iommu-pci) in driverlab's cache, made once with debootstrap (root, about 75 s and
    /// 410 MB); a complete one is kept. Prints the chroot's path last.
    Setup {
        /// Which engine.
        #[arg(value_enum)]
        engine: EngineName,
    },
    /// Whether each engine can run here, and with what.
    Show,
}

/// Engines that need setting up.
#[derive(Clone, Copy, ValueEnum)]
pub enum EngineName {
    /// QEMU 11 from Debian forky.
    Qemu,
}

impl EngineCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            EngineCommand::Setup { engine: EngineName::Qemu } => {
                let dir = tempfile::tempdir().context("a folder for the set-up script")?;
                std::fs::create_dir(dir.path().join("scripts"))?;
                let script = dir.path().join("scripts/fetch-forky-qemu.sh");
                std::fs::write(&script, FETCH_SCRIPT)?;
                std::fs::write(dir.path().join("scripts/lib.sh"), SCRIPT_LIB)?;
                // Its progress goes to stderr as it comes; the chroot's path is its last line.
                let out = Command::new("bash")
                    .arg(&script)
                    .stderr(std::process::Stdio::inherit())
                    .output()
                    .context("running bash")?;
                if !out.status.success() {
                    eprintln!("setting QEMU up failed (the lines above say why)");
                    return Ok(1);
                }
                let root = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim().to_string();
                let qemu = lab::qemu::Qemu::find(std::path::Path::new(&root))?;
                eprintln!("{}", qemu.version()?);
                println!("{root}");
                Ok(0)
            }
            EngineCommand::Show => {
                let virt = vm_spec::host::virtualization();
                let driverlab = if virt.boots_linux() {
                    "probe and Linux guests".to_string()
                } else {
                    format!(
                        "the probe guest only (Linux needs hardware virtualization; this host has {})",
                        virt.describe()
                    )
                };
                println!("driverlab: {driverlab}");
                let root = lab::qemu::default_root();
                match lab::qemu::Qemu::find(&root).and_then(|q| q.version()) {
                    Ok(version) => {
                        println!("qemu: {version} at {} (accel tcg; kvm where KVM runs Linux)", root.display())
                    }
                    Err(e) => println!("qemu: not ready: {e}"),
                }
                Ok(0)
            }
        }
    }
}

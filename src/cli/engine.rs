//! `driverlab engine ...`: the engines a lab image can run under (`engine = "driverlab"`, the
//! default, or `engine = "qemu"`), and setting QEMU up.

use clap::{Subcommand, ValueEnum};

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
                let root = engines::qemu::default_root();
                // Progress on stderr as it comes; the chroot's path is the last line on stdout.
                let qemu = engines::qemu::setup::set_up(&root, None, &|line| eprintln!("{line}"))?;
                eprintln!("{}", qemu.version()?);
                println!("{}", root.display());
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
                let root = engines::qemu::default_root();
                match engines::qemu::Qemu::find(&root).and_then(|q| q.version()) {
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

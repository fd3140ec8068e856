//! `driverlab image ...`

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;

/// Guest image commands.
#[derive(Subcommand)]
pub enum ImageCommand {
    /// Write the embedded probe guest (an ELF with a PVH note) to a file, e.g. to boot it under
    /// QEMU with `-kernel`.
    Probe {
        /// Where to write it.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Extract the ELF vmlinux (with its PVH note) from a bzImage such as Debian's
    /// /boot/vmlinuz-*.
    Vmlinux {
        /// The bzImage.
        #[arg(long, value_name = "BZIMAGE")]
        from: PathBuf,
        /// Where to write the vmlinux.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

impl ImageCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            ImageCommand::Probe { out } => {
                std::fs::write(&out, guest_images::PROBE_ELF).with_context(|| format!("writing {}", out.display()))?;
                println!("{}: probe guest, {} bytes", out.display(), guest_images::PROBE_ELF.len());
            }
            ImageCommand::Vmlinux { from, out } => {
                let bzimage = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
                let vmlinux =
                    guest_images::kernel::extract_vmlinux(&bzimage).with_context(|| from.display().to_string())?;
                std::fs::write(&out, &vmlinux).with_context(|| format!("writing {}", out.display()))?;
                println!("{}: vmlinux, {} bytes", out.display(), vmlinux.len());
            }
        }
        Ok(0)
    }
}

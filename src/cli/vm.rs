//! `driverlab vm ...`

use clap::Subcommand;
use vmm::cli::RunArgs;

/// Micro-VM commands.
#[derive(Subcommand)]
pub enum VmCommand {
    /// Boot a kernel in a fresh micro-VM and run it until it powers off, resets, fails, times out
    /// or is stopped. Serial output goes to stdout (or --serial); one JSON line goes to stderr last:
    /// the exit line (`{"vmm":"exit",...}`) of a VM that ran, or the error line
    /// (`{"vmm":"error","kind":...,"message":...,"exit_code":N}`) of one that could not.
    ///
    /// The VM is described by a JSON spec (--config, see docs/vmm.md) or by flags, which build
    /// the same spec; a flag given with --config replaces that field of the file's spec.
    ///
    /// Exit codes: 0 poweroff, 1 VMM, host or device-peer failure, 2 bad input, 3 reset or triple
    /// fault, 4 KVM internal error, 5 guest panic, 6 timeout, 7 stopped through the control
    /// socket.
    Run(Box<RunArgs>),
    /// Test-only: enters the VMM's jail by the VMM's own code path, then tries what a guest
    /// that broke out would try and prints one JSON line saying how each attempt ended.
    #[command(hide = true)]
    JailBreak(crate::cli::jail_break::JailBreakArgs),
}

impl VmCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            VmCommand::Run(args) => Ok(vmm::cli::run(*args, guest_images::PROBE_ELF)),
            VmCommand::JailBreak(args) => Ok(crate::cli::jail_break::run(&args)),
        }
    }
}

//! `driverlab-vmm`: one micro-VM, the process the lab starts for each (the Firecracker model).
//! The same command line as `driverlab vm run` (docs/vmm.md), in a binary that links only what a
//! VM needs: no HTTP server, no database, no plotting (docs/architecture.md, "Binaries").

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

/// Boot a kernel in a fresh micro-VM and run it to its end; the exit or error line last on
/// stderr (docs/vmm.md).
#[derive(Parser)]
#[command(name = "driverlab-vmm", version, about)]
struct Cli {
    #[command(flatten)]
    run: vmm::cli::RunArgs,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => e.exit(),
        Err(e) => return ExitCode::from(vmm::cli::usage_error(&e)),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
    ExitCode::from(vmm::cli::run(cli.run, guest_images::PROBE_ELF))
}

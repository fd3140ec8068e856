//! `driverlab-model`: a device model served over vfio-user, the process the lab starts beside
//! each VM whose device is a model. The same command line as `driverlab model` (docs/model.md),
//! in a binary that links only what a model needs (docs/architecture.md, "Binaries").

use std::process::ExitCode;

use clap::Parser;

/// Device models served over vfio-user (docs/model.md).
#[derive(Parser)]
#[command(name = "driverlab-model", version, about)]
struct Cli {
    #[command(subcommand)]
    model: device_models::cli::ModelCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
    match cli.model.run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

//! `driverlab model ...`: device models served over vfio-user.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use devices::models::server::{self, Model};
use devices::models::testdev::TestDevice;

/// Device models.
#[derive(Subcommand)]
pub enum ModelCommand {
    /// The passthrough conformance device (d1ab:7e57): scratch registers, a DMA engine that may
    /// only reach what the client mapped, MSI-X, an mmap-able BAR. Serves one client at a time
    /// until killed (or only one with --once); prints what it counted after each client.
    Testdev {
        /// Unix socket to serve on (must not exist).
        #[arg(long, value_name = "PATH")]
        socket: PathBuf,
        /// Serve a single client, then exit.
        #[arg(long)]
        once: bool,
    },
}

impl ModelCommand {
    /// Runs the model.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            ModelCommand::Testdev { socket, once } => {
                let mut model = TestDevice::new().context("creating the test device")?;
                serve(&socket, &mut model, once)
            }
        }
    }
}

fn serve(socket: &std::path::Path, model: &mut dyn Model, once: bool) -> anyhow::Result<u8> {
    eprintln!("{} serving vfio-user on {}", model.name(), socket.display());
    let mut clients = 0u64;
    server::serve(socket, model, once, |model| {
        clients += 1;
        let counters = model.dma().counters();
        println!("{}", serde_json::json!({"model": model.name(), "client": clients, "counters": counters}));
    })?;
    Ok(0)
}

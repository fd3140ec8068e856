//! `driverlab peer ...`: what runs on a workload's peer.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Subcommand;

/// Peer commands.
#[derive(Subcommand)]
pub enum PeerCommand {
    /// The UDP source a guest asks for a load on a TCP connection (a line `send SECONDS PPS
    /// PAYLOAD PORT`, then `sent` for the count; the xdp workload): prints `listening ADDR`,
    /// then serves until killed.
    UdpSource {
        /// The address and port to listen on.
        #[arg(long, value_name = "ADDR:PORT")]
        listen: SocketAddr,
    },
}

impl PeerCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            PeerCommand::UdpSource { listen } => {
                let control = std::net::TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
                let source =
                    std::net::UdpSocket::bind((listen.ip(), 0)).with_context(|| format!("binding {}", listen.ip()))?;
                println!("listening {}", control.local_addr()?);
                engines::udp_source::serve(&control, &source).context("serving the UDP source")?;
                Ok(0)
            }
        }
    }
}

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
    /// The remote end of the kernel's NIC selftests (the kselftest workload): an SSH server on
    /// port 2222 of the listening address, with a host key made here, and the enrollment of the
    /// guest's key on ADDR:PORT (a line `ssh-ed25519 BASE64`, answered with the host key):
    /// prints `listening ADDR`, then serves until killed. Needs openssh-server.
    SshRemote {
        /// The address and port to take enrollments on.
        #[arg(long, value_name = "ADDR:PORT")]
        listen: SocketAddr,
        /// An empty folder for the host key and the commands' folder (default: a new one in
        /// the temporary folder).
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
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
            PeerCommand::SshRemote { listen, dir } => {
                let dir = match dir {
                    Some(dir) => dir,
                    None => {
                        let dir = std::env::temp_dir().join(format!("driverlab-ssh-remote-{}", std::process::id()));
                        std::fs::create_dir(&dir).with_context(|| format!("making {}", dir.display()))?;
                        dir
                    }
                };
                let remote = engines::ssh_remote::SshRemote::start(&dir, listen.ip()).context("starting sshd")?;
                let enroll = std::net::TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
                println!("listening {}", enroll.local_addr()?);
                remote.serve(&enroll).context("serving enrollments")?;
                Ok(0)
            }
        }
    }
}

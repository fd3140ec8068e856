//! The model's command line, shared by `driverlab model ...` and the small `driverlab-model`
//! binary the lab starts: device models served over vfio-user, and a NIC model's control socket.

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};
use vm_spec::model_control::{self, ModelRefusal, ModelReport, ModelRequest};

use crate::nic_model::MacAddress;
use crate::process::{self, ProcessError, Serving, Wire};

/// Why a model command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Serving the model failed.
    #[error(transparent)]
    Serve(#[from] ProcessError),
    /// The model's control socket did not answer.
    #[error("{socket}: is `driverlab model aqc100|lan743x --control` running there? {source}")]
    Control {
        /// The socket.
        socket: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The model answered something else than a report or a refusal.
    #[error("the model's answer is neither a report nor a refusal")]
    Answer,
}

/// How long `driverlab model control` waits for the model's answer.
const CONTROL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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
        /// Run without the jail (namespaces, empty root, own uid and cgroup, Landlock; see
        /// docs/model.md): for debugging.
        #[arg(long)]
        no_jail: bool,
    },
    /// A software Aquantia AQC100 10G NIC (1d6a:00b1) that the Linux atlantic driver drives:
    /// firmware interface, link at 10G, RX/TX rings with checksum offload and TSO, MSI-X. Its
    /// wire is a host TAP device (--tap), a frame generator (--generate), or nothing. Serves one
    /// client at a time until killed (or only one with --once); prints what it counted (DMA
    /// maps and unmaps from the client, frames moved) after each client.
    Aqc100 {
        /// Unix socket to serve on (must not exist).
        #[arg(long, value_name = "PATH")]
        socket: PathBuf,
        /// Host TAP interface to use as the wire (created if missing; needs CAP_NET_ADMIN).
        #[arg(long, value_name = "IF", conflicts_with = "generate")]
        tap: Option<String>,
        /// Generate received frames: `pps=N` (0 or absent: as fast as the guest takes them,
        /// never dropping), `size=B` (60-16384, default 1514), `count=N` (default unlimited).
        /// Transmitted frames are counted. Example: --generate size=1514,count=20000
        #[arg(long, value_name = "SPEC")]
        generate: Option<String>,
        /// Permanent MAC address the driver reads from the firmware.
        #[arg(long, value_name = "MAC", default_value = "02:1d:6a:00:00:01")]
        mac: MacAddress,
        /// Also listen on this Unix socket for control commands (see `driverlab model control`).
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
        /// Serve a single client, then exit.
        #[arg(long)]
        once: bool,
        /// Run without the jail (namespaces, empty root, own uid and cgroup, Landlock; see
        /// docs/model.md): for debugging.
        #[arg(long)]
        no_jail: bool,
    },
    /// A software Microchip LAN7430 1G NIC (1055:7430) that the Linux lan743x driver drives:
    /// chip ID, the MAC from its registers, the internal PHY on MDIO (link at 1000 Mb/s), the
    /// interrupt block with MSI-X, the DMA controller, RX and TX rings at the descriptor spacing
    /// the driver programs, checksum offload and TSO, statistics. Its wire and its counters are
    /// as for the AQC100.
    Lan743x {
        /// Unix socket to serve on (must not exist).
        #[arg(long, value_name = "PATH")]
        socket: PathBuf,
        /// Host TAP interface to use as the wire (created if missing; needs CAP_NET_ADMIN).
        #[arg(long, value_name = "IF", conflicts_with = "generate")]
        tap: Option<String>,
        /// Generate received frames, as for the AQC100 (`pps=N,size=B,count=N`).
        #[arg(long, value_name = "SPEC")]
        generate: Option<String>,
        /// Permanent MAC address (what the EEPROM would load).
        #[arg(long, value_name = "MAC", default_value = "02:10:55:74:30:01")]
        mac: MacAddress,
        /// Also listen on this Unix socket for control commands (see `driverlab model control`).
        #[arg(long, value_name = "PATH")]
        control: Option<PathBuf>,
        /// Serve a single client, then exit.
        #[arg(long)]
        once: bool,
        /// Run without the jail (namespaces, empty root, own uid and cgroup, Landlock; see
        /// docs/model.md): for debugging.
        #[arg(long)]
        no_jail: bool,
    },
    /// Talk to a running `driverlab model aqc100|lan743x --control PATH`: print its status and counters
    /// as JSON, or take its link down or up.
    Control {
        /// The model's control socket.
        #[arg(value_name = "PATH")]
        socket: PathBuf,
        /// What to do.
        #[arg(value_enum, default_value = "status")]
        command: ControlCommand,
    },
}

/// Control commands.
#[derive(Clone, Copy, ValueEnum)]
pub enum ControlCommand {
    /// Status and counters as one JSON object.
    Status,
    /// Take the link down (the driver sees it go down).
    LinkDown,
    /// Let the link come up again.
    LinkUp,
}

impl ControlCommand {
    fn request(self) -> ModelRequest {
        match self {
            ControlCommand::Status => ModelRequest::Status,
            ControlCommand::LinkDown => ModelRequest::Link { up: false },
            ControlCommand::LinkUp => ModelRequest::Link { up: true },
        }
    }
}

impl ModelCommand {
    /// Runs the model; its exit code.
    pub fn run(self) -> Result<u8, CommandError> {
        match self {
            ModelCommand::Testdev { socket, once, no_jail } => {
                process::serve_testdev(&socket, once, !no_jail)?;
                Ok(0)
            }
            ModelCommand::Aqc100 { socket, tap, generate, mac, control, once, no_jail } => {
                let wire = Wire { tap, generate, mac };
                let options = Serving { control, once, jail: !no_jail };
                process::serve_nic::<crate::aqc100::nic::Nic>(&socket, wire, options)?;
                Ok(0)
            }
            ModelCommand::Lan743x { socket, tap, generate, mac, control, once, no_jail } => {
                let wire = Wire { tap, generate, mac };
                let options = Serving { control, once, jail: !no_jail };
                process::serve_nic::<crate::lan743x::nic::Nic>(&socket, wire, options)?;
                Ok(0)
            }
            ModelCommand::Control { socket, command } => {
                let reply = model_control::ask(&socket, command.request(), CONTROL_TIMEOUT)
                    .map_err(|source| CommandError::Control { socket: socket.display().to_string(), source })?;
                print!("{reply}");
                if ModelReport::parse(&reply).is_some() {
                    Ok(0)
                } else if serde_json::from_str::<ModelRefusal>(&reply).is_ok() {
                    Ok(1)
                } else {
                    Err(CommandError::Answer)
                }
            }
        }
    }
}

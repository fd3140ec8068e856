//! `driverlab model ...`: device models served over vfio-user, and the AQC100's control socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use device_models::nic_model::{MacAddress, NicCore, NicHandle, NicModel};
use device_models::server::{self, Model};
use device_models::testdev::TestDevice;
use device_models::wire::backend::{Backend, unplugged};
use device_models::wire::generator::{GeneratorConfig, generator};
use device_models::wire::tap;

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
    fn wire(self) -> &'static str {
        match self {
            ControlCommand::Status => "status",
            ControlCommand::LinkDown => "link down",
            ControlCommand::LinkUp => "link up",
        }
    }
}

impl ModelCommand {
    /// Runs the model.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            ModelCommand::Testdev { socket, once } => {
                let mut model = TestDevice::new().context("creating the test device")?;
                let dma = model.dma();
                let files = vec![socket.clone()];
                exit_on_signal(files, move || serde_json::json!({"model": "testdev", "counters": dma.counters()}))?;
                serve(&socket, &mut model, once, None)
            }
            ModelCommand::Aqc100 { socket, tap, generate, mac, control, once } => {
                let wire = Wire { tap, generate, mac };
                serve_nic::<device_models::aqc100::nic::Nic>(&socket, wire, control, once, "the AQC100 model")
            }
            ModelCommand::Lan743x { socket, tap, generate, mac, control, once } => {
                let wire = Wire { tap, generate, mac };
                serve_nic::<device_models::lan743x::nic::Nic>(&socket, wire, control, once, "the LAN7430 model")
            }
            ModelCommand::Control { socket, command } => {
                let mut stream = UnixStream::connect(&socket).with_context(|| {
                    format!("{}: is `driverlab model aqc100|lan743x --control` running there?", socket.display())
                })?;
                writeln!(stream, "{}", command.wire())?;
                let mut reply = String::new();
                BufReader::new(stream).read_line(&mut reply)?;
                print!("{reply}");
                let value: serde_json::Value = serde_json::from_str(&reply).context("reply is not JSON")?;
                Ok(if value.get("error").is_some() { 1 } else { 0 })
            }
        }
    }
}

fn backend(tap_name: Option<&str>, generate: Option<&str>, mac: MacAddress) -> anyhow::Result<Backend> {
    Ok(match (tap_name, generate) {
        (Some(name), _) => tap::tap(name)?,
        (None, Some(spec)) => {
            let config: GeneratorConfig = spec.parse().map_err(|e| anyhow::anyhow!("--generate {spec}: {e}"))?;
            generator(config, mac.0).0
        }
        (None, None) => unplugged(),
    })
}

/// A NIC model's wire and address, from the command line.
struct Wire {
    tap: Option<String>,
    generate: Option<String>,
    mac: MacAddress,
}

/// Serves NIC model `N` on `socket` (and its control socket), printing its counters after each
/// client and on SIGINT/SIGTERM.
fn serve_nic<N: NicCore>(
    socket: &Path,
    wire: Wire,
    control: Option<PathBuf>,
    once: bool,
    what: &str,
) -> anyhow::Result<u8> {
    let backend = backend(wire.tap.as_deref(), wire.generate.as_deref(), wire.mac)?;
    let files: Vec<PathBuf> = [Some(socket.to_path_buf()), control.clone()].into_iter().flatten().collect();
    // Before the model starts its threads, so that they leave the signals to us.
    let handle_slot = std::sync::Arc::new(std::sync::OnceLock::<NicHandle<N>>::new());
    let slot = handle_slot.clone();
    exit_on_signal(files, move || slot.get().map(status_json).unwrap_or_default())?;
    let mut model = NicModel::<N>::new(wire.mac, backend).with_context(|| format!("starting {what}"))?;
    eprintln!("{} {} on {}", N::NAME, wire.mac, model.backend_description());
    let handle = model.handle();
    let _ = handle_slot.set(handle.clone());
    if let Some(path) = &control {
        listen(path, handle.clone())?;
    }
    let status = move || serde_json::to_value(handle.status()).unwrap_or_default();
    let result = serve(socket, &mut model, once, Some(&status));
    if let Some(path) = &control {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// `{"model": ..., "status": ..., "counters": ...}`.
fn status_json<N: NicCore>(handle: &NicHandle<N>) -> serde_json::Value {
    serde_json::json!({"model": N::NAME, "status": handle.status(), "counters": handle.counters()})
}

/// Answers control commands on `path`, one line in, one JSON line out, in a thread.
fn listen<N: NicCore>(path: &Path, handle: NicHandle<N>) -> anyhow::Result<()> {
    if path.exists() {
        bail!("{}: already exists; remove it or choose another --control path", path.display());
    }
    let listener = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::thread::Builder::new().name("aqc100-control".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let Ok(mut writer) = stream.try_clone() else { continue };
            if BufReader::new(stream).read_line(&mut line).is_err() {
                continue;
            }
            let reply = match line.trim() {
                "status" => status_json(&handle),
                "link down" | "link up" => {
                    handle.set_link(line.trim() == "link up");
                    status_json(&handle)
                }
                other => {
                    serde_json::json!({"error": format!("unknown command `{other}`; use status, link up, link down")})
                }
            };
            let _ = writeln!(writer, "{reply}");
        }
    })?;
    Ok(())
}

/// Blocks SIGINT and SIGTERM in this thread and every thread it starts afterwards, and waits for
/// them in a thread of their own: on either, prints `report()` (the final counters), removes
/// `files` (the sockets) and ends the process.
fn exit_on_signal(
    files: Vec<PathBuf>,
    report: impl FnOnce() -> serde_json::Value + Send + 'static,
) -> anyhow::Result<()> {
    // SAFETY: a zeroed sigset_t is a valid argument for sigemptyset, which initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; the calls only read and write it and
    // this thread's signal mask.
    let rc = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        bail!("blocking SIGINT and SIGTERM: {}", std::io::Error::from_raw_os_error(rc));
    }
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let mut signal = 0;
        // SAFETY: `set` is initialised and outlives the call; `signal` receives the number.
        unsafe { libc::sigwait(&set, &mut signal) };
        let mut line = report();
        if line.is_object() {
            line["exit"] = serde_json::json!(if signal == libc::SIGINT { "SIGINT" } else { "SIGTERM" });
            println!("{line}");
        }
        for file in &files {
            let _ = std::fs::remove_file(file);
        }
        std::process::exit(0);
    })?;
    Ok(())
}

fn serve(
    socket: &Path,
    model: &mut dyn Model,
    once: bool,
    nic: Option<&dyn Fn() -> serde_json::Value>,
) -> anyhow::Result<u8> {
    eprintln!("{} serving vfio-user on {}", model.name(), socket.display());
    let mut clients = 0u64;
    server::serve(socket, model, once, |model| {
        clients += 1;
        let mut line = serde_json::json!({"model": model.name(), "client": clients, "counters": model.counters()});
        if let Some(status) = nic {
            line["status"] = status();
        }
        println!("{line}");
    })?;
    Ok(0)
}

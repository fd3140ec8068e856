//! `driverlab model ...`: device models served over vfio-user, and the AQC100's control socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use device_models::nic_model::{MacAddress, NicCore, NicHandle, NicModel};
use device_models::server::{self, Model};
use device_models::testdev::TestDevice;
use device_models::wire::backend::{Backend, unplugged};
use device_models::wire::generator::{GeneratorConfig, generator};
use device_models::wire::tap;
use vm_spec::model_control::{self, ModelRefusal, ModelReport, ModelRequest, NicStatus};

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
    /// Runs the model.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            ModelCommand::Testdev { socket, once, no_jail } => {
                let files = vec![socket.clone()];
                let jailed = Jailed::enter("testdev", &files, !no_jail)?;
                let mut model = TestDevice::new().context("creating the test device")?;
                let bound = bind(&socket, &model)?;
                jailed.confine("testdev");
                let dma = model.dma();
                let own = if no_jail { files } else { Vec::new() };
                exit_on_signal(own, move || ModelReport {
                    model: "testdev".into(),
                    client: None,
                    status: None,
                    counters: dma.counters(),
                    confinement: None,
                    exit: None,
                })?;
                serve(&socket, bound, &mut model, once, None, !no_jail)
            }
            ModelCommand::Aqc100 { socket, tap, generate, mac, control, once, no_jail } => {
                let wire = Wire { tap, generate, mac };
                let options = Serving { control, once, jail: !no_jail };
                serve_nic::<device_models::aqc100::nic::Nic>(&socket, wire, options, "the AQC100 model")
            }
            ModelCommand::Lan743x { socket, tap, generate, mac, control, once, no_jail } => {
                let wire = Wire { tap, generate, mac };
                let options = Serving { control, once, jail: !no_jail };
                serve_nic::<device_models::lan743x::nic::Nic>(&socket, wire, options, "the LAN7430 model")
            }
            ModelCommand::Control { socket, command } => {
                let reply = model_control::ask(&socket, command.request(), CONTROL_TIMEOUT).with_context(|| {
                    format!("{}: is `driverlab model aqc100|lan743x --control` running there?", socket.display())
                })?;
                print!("{reply}");
                if ModelReport::parse(&reply).is_some() {
                    Ok(0)
                } else if serde_json::from_str::<ModelRefusal>(&reply).is_ok() {
                    Ok(1)
                } else {
                    bail!("the model's answer is neither a report nor a refusal")
                }
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

/// How a model serves, from the command line.
struct Serving {
    control: Option<PathBuf>,
    once: bool,
    jail: bool,
}

/// Memory a model's cgroup allows: its own buffers, and pages of the client's memory that its
/// DMA writes first (they are charged to the process that touches them first).
const MODEL_MEMORY: u64 = 1 << 30;
/// Threads a model runs: the vfio-user server, the data path, the control socket, signals.
const MODEL_THREADS: u64 = 4;
/// CPUs a model may keep busy: its data path and its vfio-user server.
const MODEL_CPUS: u32 = 2;

/// A model process's jail (docs/model.md): namespaces first, the rest once its sockets are
/// bound and before its threads start, as the VMM does.
struct Jailed {
    namespaces: Option<jail::Namespaces>,
    confinement: jail::Confinement,
    spec: jail::JailSpec,
}

impl Jailed {
    /// Enters the namespaces (the supervisor stays behind, passing SIGTERM and SIGINT on and
    /// removing `files` afterwards), or records that the jail is off. Blocks SIGINT and SIGTERM
    /// for every thread (they are waited for, see [`exit_on_signal`]).
    fn enter(name: &str, files: &[PathBuf], on: bool) -> anyhow::Result<Jailed> {
        let spec =
            jail::JailSpec::from_env(name, MODEL_MEMORY, MODEL_THREADS, MODEL_CPUS).map_err(anyhow::Error::msg)?;
        let mut confinement = jail::Confinement { jailed: on, ..jail::Confinement::default() };
        let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
        let namespaces = on.then(|| jail::enter_namespaces(&mut confinement, &paths, jail::Signals::Forward));
        block_termination_signals().with_context(|| format!("{name}: blocking SIGINT and SIGTERM"))?;
        Ok(Jailed { namespaces, confinement, spec })
    }

    /// The rest of the jail; says on stderr how the model is confined, and returns it.
    fn confine(mut self, name: &str) -> jail::Confinement {
        if let Some(namespaces) = &self.namespaces {
            jail::confine(&self.spec, namespaces, &mut self.confinement);
        }
        eprintln!("{name}: {}", self.confinement.summary());
        self.confinement
    }
}

/// Serves NIC model `N` on `socket` (and its control socket), printing its counters after each
/// client and on SIGINT/SIGTERM. The wire (a TAP) is opened before the jail's network
/// namespace; the sockets are bound before its empty root; the threads start after it.
fn serve_nic<N: NicCore>(socket: &Path, wire: Wire, options: Serving, what: &str) -> anyhow::Result<u8> {
    let Serving { control, once, jail } = options;
    let backend = backend(wire.tap.as_deref(), wire.generate.as_deref(), wire.mac)?;
    let files: Vec<PathBuf> = [Some(socket.to_path_buf()), control.clone()].into_iter().flatten().collect();
    let jailed = Jailed::enter(N::KIND.name(), &files, jail)?;
    let mut model = NicModel::<N>::unstarted(wire.mac, backend).with_context(|| format!("starting {what}"))?;
    eprintln!("{} {} on {}", N::KIND.name(), wire.mac, model.backend_description());
    let listener = control.as_deref().map(bind_control).transpose()?;
    let bound = bind(socket, &model)?;
    let confinement = std::sync::Arc::new(jailed.confine(N::KIND.name()));
    let handle = model.handle();
    let report = handle.clone();
    let confined = confinement.clone();
    // The sockets this process removes itself: none when jailed (its supervisor does).
    let own_files = if jail { Vec::new() } else { files };
    exit_on_signal(own_files, move || nic_report(&report, &confined))?;
    model.start().with_context(|| format!("starting {what}'s data path"))?;
    if let Some(listener) = listener {
        serve_control(listener, handle.clone(), confinement)?;
    }
    let status = move || handle.status();
    let result = serve(socket, bound, &mut model, once, Some(&status), jail);
    // A jailed model's supervisor removes its sockets; this one would not be allowed to.
    if let Some(path) = control.as_ref().filter(|_| !jail) {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// A NIC model's report: its status, counters and confinement (docs/model.md).
fn nic_report<N: NicCore>(handle: &NicHandle<N>, confinement: &jail::Confinement) -> ModelReport {
    ModelReport {
        model: N::KIND.name().into(),
        client: None,
        status: Some(handle.status()),
        counters: handle.counters(),
        confinement: Some(confinement.clone()),
        exit: None,
    }
}

/// Binds the control socket at `path`.
fn bind_control(path: &Path) -> anyhow::Result<UnixListener> {
    if path.exists() {
        bail!("{}: already exists; remove it or choose another --control path", path.display());
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

/// Answers control commands on `listener`, one line in, one JSON line out, in a thread (started
/// after the jail, so a client that connects early waits for the model's final confinement).
fn serve_control<N: NicCore>(
    listener: UnixListener,
    handle: NicHandle<N>,
    confinement: std::sync::Arc<jail::Confinement>,
) -> anyhow::Result<()> {
    std::thread::Builder::new().name(format!("{}-control", N::KIND.name())).spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let Ok(mut writer) = stream.try_clone() else { continue };
            if BufReader::new(stream).read_line(&mut line).is_err() {
                continue;
            }
            let reply = match line.parse::<ModelRequest>() {
                Ok(ModelRequest::Status) => serde_json::to_string(&nic_report(&handle, &confinement)),
                Ok(ModelRequest::Link { up }) => {
                    handle.set_link(up);
                    serde_json::to_string(&nic_report(&handle, &confinement))
                }
                Err(refusal) => serde_json::to_string(&refusal),
            };
            let _ = writeln!(writer, "{}", reply.unwrap_or_default());
        }
    })?;
    Ok(())
}

/// Blocks SIGINT and SIGTERM in this thread and every thread it starts afterwards.
fn block_termination_signals() -> anyhow::Result<()> {
    let set = jail::termination_signals();
    // SAFETY: `set` is a valid sigset_t; the call only changes this thread's signal mask.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        bail!("{}", std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for SIGINT or SIGTERM (blocked since [`Jailed::enter`]) in a thread of its own: on
/// either, prints `report()` (the final counters), removes `files` (the sockets of a model
/// without the jail; a jailed model's supervisor removes them) and ends the process.
fn exit_on_signal(files: Vec<PathBuf>, report: impl FnOnce() -> ModelReport + Send + 'static) -> anyhow::Result<()> {
    let set = jail::termination_signals();
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let mut signal = 0;
        // SAFETY: `set` is initialised and outlives the call; `signal` receives the number.
        unsafe { libc::sigwait(&set, &mut signal) };
        let report =
            ModelReport { exit: Some(if signal == libc::SIGINT { "SIGINT" } else { "SIGTERM" }.into()), ..report() };
        if let Ok(line) = serde_json::to_string(&report) {
            println!("{line}");
        }
        for file in &files {
            let _ = std::fs::remove_file(file);
        }
        std::process::exit(0);
    })?;
    Ok(())
}

/// Binds the vfio-user socket for `model`.
fn bind(socket: &Path, model: &dyn Model) -> anyhow::Result<server::Bound> {
    Ok(server::bind(socket, model)?)
}

/// Installs the seccomp filter on every thread (all started by now), then serves `model` on
/// `socket`, printing its counters (and `nic()`) after each client. `jailed`: the supervisor,
/// not this process, removes the sockets, so the filter allows no unlink.
fn serve(
    socket: &Path,
    bound: server::Bound,
    model: &mut dyn Model,
    once: bool,
    nic: Option<&dyn Fn() -> NicStatus>,
    jailed: bool,
) -> anyhow::Result<u8> {
    device_models::seccomp::install(!jailed).with_context(|| format!("{}: seccomp", model.name()))?;
    eprintln!("{} serving vfio-user on {} (seccomp filter on every thread)", model.name(), socket.display());
    let mut clients = 0u64;
    bound.run(model, once, |model| {
        clients += 1;
        let report = ModelReport {
            model: model.name().into(),
            client: Some(clients),
            status: nic.map(|status| status()),
            counters: model.counters(),
            confinement: None,
            exit: None,
        };
        if let Ok(line) = serde_json::to_string(&report) {
            println!("{line}");
        }
    });
    if jailed {
        // Its socket is outside the empty root and its filter allows no stat or unlink of it:
        // the supervisor removes it.
        std::mem::forget(bound);
    }
    Ok(0)
}

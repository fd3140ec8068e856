//! A device model's process (`driverlab model ...`): its jail, its vfio-user server, a NIC's
//! control socket, and its end on SIGINT or SIGTERM. The CLI parses the command line and calls
//! [`serve_nic`] or [`serve_testdev`]; everything the process does after that is here, next to
//! the models it serves.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use vm_spec::model_control::{ModelReport, ModelRequest, NicStatus};

use crate::nic_model::{MacAddress, NicCore, NicHandle, NicModel};
use crate::server::{self, Model};
use crate::testdev::TestDevice;
use crate::wire::backend::{Backend, unplugged};
use crate::wire::generator::{GeneratorConfig, generator};
use crate::wire::tap;

/// Why a model process could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A system call or file failed.
    #[error("{what}: {source}")]
    Io {
        /// What the process was doing.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A set-up step refused (the wire's options, the jail, the server, the seccomp filter).
    #[error("{0}")]
    Setup(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ProcessError {
    let what = what.into();
    move |source| ProcessError::Io { what, source }
}

/// A NIC model's wire and address, from the command line: a host TAP, a frame generator
/// (`pps=N,size=B,count=N`), or nothing.
#[derive(Debug, Clone)]
pub struct Wire {
    /// A host TAP interface (created if missing; needs CAP_NET_ADMIN).
    pub tap: Option<String>,
    /// The generator's options.
    pub generate: Option<String>,
    /// The permanent MAC address.
    pub mac: MacAddress,
}

/// How a model serves, from the command line.
#[derive(Debug, Clone)]
pub struct Serving {
    /// A control socket to listen on too (the NIC models).
    pub control: Option<PathBuf>,
    /// Serve a single client, then exit.
    pub once: bool,
    /// Whether to jail the process (docs/model.md); off for debugging.
    pub jail: bool,
}

fn backend(wire: &Wire) -> Result<Backend, ProcessError> {
    Ok(match (&wire.tap, &wire.generate) {
        (Some(name), _) => tap::tap(name).map_err(io(format!("TAP {name}")))?,
        (None, Some(spec)) => {
            let config: GeneratorConfig =
                spec.parse().map_err(|e| ProcessError::Setup(format!("--generate {spec}: {e}")))?;
            generator(config, wire.mac.0).0
        }
        (None, None) => unplugged(),
    })
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
    fn enter(name: &str, files: &[PathBuf], on: bool) -> Result<Jailed, ProcessError> {
        if on {
            jail::seccomp::one_malloc_arena();
        }
        let spec = jail::JailSpec::from_env(name, MODEL_MEMORY, MODEL_THREADS, MODEL_CPUS)
            .map_err(|e| ProcessError::Setup(e.to_string()))?;
        let mut confinement = jail::Confinement { jailed: on, ..jail::Confinement::default() };
        let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
        let namespaces = on.then(|| jail::enter_namespaces(&mut confinement, &paths, jail::Signals::Forward, &spec));
        block_termination_signals().map_err(io(format!("{name}: blocking SIGINT and SIGTERM")))?;
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

/// Serves the passthrough conformance device on `socket`, printing its counters after each
/// client and on SIGINT/SIGTERM.
pub fn serve_testdev(socket: &Path, once: bool, jail: bool) -> Result<(), ProcessError> {
    let files = vec![socket.to_path_buf()];
    let jailed = Jailed::enter("testdev", &files, jail)?;
    let mut model = TestDevice::new().map_err(io("creating the test device"))?;
    let bound = bind(socket, &model)?;
    jailed.confine("testdev");
    let dma = model.dma();
    let own = if jail { Vec::new() } else { files };
    exit_on_signal(own, move || ModelReport {
        model: "testdev".into(),
        client: None,
        status: None,
        counters: dma.counters(),
        confinement: None,
        exit: None,
    })?;
    serve(socket, bound, &mut model, once, None, jail)
}

/// Serves NIC model `N` on `socket` (and its control socket), printing its counters after each
/// client and on SIGINT/SIGTERM. The wire (a TAP) is opened before the jail's network
/// namespace; the sockets are bound before its empty root; the threads start after it.
pub fn serve_nic<N: NicCore>(socket: &Path, wire: Wire, options: Serving) -> Result<(), ProcessError> {
    let what = N::KIND.name();
    let Serving { control, once, jail } = options;
    let backend = backend(&wire)?;
    let files: Vec<PathBuf> = [Some(socket.to_path_buf()), control.clone()].into_iter().flatten().collect();
    let jailed = Jailed::enter(N::KIND.name(), &files, jail)?;
    let mut model = NicModel::<N>::unstarted(wire.mac, backend).map_err(io(format!("starting {what}")))?;
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
    model.start().map_err(io(format!("starting {what}'s data path")))?;
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
fn bind_control(path: &Path) -> Result<UnixListener, ProcessError> {
    if path.exists() {
        return Err(ProcessError::Setup(format!(
            "{}: already exists; remove it or choose another --control path",
            path.display()
        )));
    }
    UnixListener::bind(path).map_err(io(format!("binding {}", path.display())))
}

/// Answers control commands on `listener`, one line in, one JSON line out, in a thread (started
/// after the jail, so a client that connects early waits for the model's final confinement).
fn serve_control<N: NicCore>(
    listener: UnixListener,
    handle: NicHandle<N>,
    confinement: std::sync::Arc<jail::Confinement>,
) -> Result<(), ProcessError> {
    std::thread::Builder::new()
        .name(format!("{}-control", N::KIND.name()))
        .spawn(move || {
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
        })
        .map_err(io("starting the control thread"))?;
    Ok(())
}

/// Blocks SIGINT and SIGTERM in this thread and every thread it starts afterwards.
fn block_termination_signals() -> std::io::Result<()> {
    let set = jail::termination_signals();
    // SAFETY: `set` is a valid sigset_t; the call only changes this thread's signal mask.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for SIGINT or SIGTERM (blocked since [`Jailed::enter`]) in a thread of its own: on
/// either, prints `report()` (the final counters), removes `files` (the sockets of a model
/// without the jail; a jailed model's supervisor removes them) and ends the process.
fn exit_on_signal(
    files: Vec<PathBuf>,
    report: impl FnOnce() -> ModelReport + Send + 'static,
) -> Result<(), ProcessError> {
    let set = jail::termination_signals();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut signal = 0;
            // SAFETY: `set` is initialised and outlives the call; `signal` receives the number.
            unsafe { libc::sigwait(&set, &mut signal) };
            let report = ModelReport {
                exit: Some(if signal == libc::SIGINT { "SIGINT" } else { "SIGTERM" }.into()),
                ..report()
            };
            if let Ok(line) = serde_json::to_string(&report) {
                println!("{line}");
            }
            for file in &files {
                let _ = std::fs::remove_file(file);
            }
            std::process::exit(0);
        })
        .map_err(io("starting the signal thread"))?;
    Ok(())
}

/// Binds the vfio-user socket for `model`.
fn bind(socket: &Path, model: &dyn Model) -> Result<server::Bound, ProcessError> {
    server::bind(socket, model).map_err(|e| ProcessError::Setup(e.to_string()))
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
) -> Result<(), ProcessError> {
    crate::seccomp::install(!jailed).map_err(|e| ProcessError::Setup(format!("{}: seccomp: {e}", model.name())))?;
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
    Ok(())
}

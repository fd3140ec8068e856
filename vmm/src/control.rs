//! The control socket: HTTP/1.1 with JSON on a Unix socket, served by one thread of the VMM
//! process for as long as it lives (routes and messages in `vm_spec::control`).
//!
//! The thread parses at most [`MAX_REQUEST_BYTES`] per request with `httparse`, answers one
//! request per connection and gives a silent client [`CLIENT_TIMEOUT`] before it drops it, so no
//! client can hold it. It runs under its own seccomp filter ([`crate::seccomp::control_filter`]).
//! What it reads of the VM comes through [`VmObserver`], which the VMM installs once the platform
//! exists; until then the VM is `booting` and its counters are zero.

use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use jail::seccomp::BpfProgram;
use vm_spec::confinement::Confinement;
use vm_spec::control::{
    AfterSnapshot, BouncePool, ControlError as ErrorBody, DEFAULT_SHUTDOWN_GRACE_S, LiveCounters, MAX_REQUEST_BYTES,
    PlugRequest, ShutdownAccepted, ShutdownRequest, SlotInfo, SnapshotAccepted, SnapshotRequest, UnplugRequest,
    VM_BOUNCE_POOL, VM_COUNTERS, VM_INFO, VM_PLUG, VM_SHUTDOWN, VM_SNAPSHOT, VM_UNPLUG, VmInfo, VmState,
};
use vm_spec::{ExitCounts, VmSpec};

use crate::exit::{StopCause, VmStop};
use crate::pause::SnapshotPause;

/// How long a connected client may take to send its request.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest grace a shutdown request may ask for.
const MAX_GRACE_S: f64 = 3600.0;

/// Errors setting up the control socket.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Another process serves this path.
    #[error("control socket {}: another process serves it", .0.display())]
    InUse(PathBuf),
    /// The socket cannot be created.
    #[error("control socket {}: {source}", path.display())]
    Bind {
        /// The path.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The thread cannot be started.
    #[error("control socket thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl ControlError {
    /// True when the path given is at fault (the user's to fix), not the host.
    pub fn is_bad_input(&self) -> bool {
        match self {
            ControlError::InUse(_) => true,
            ControlError::Bind { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::AlreadyExists
            ),
            ControlError::Thread(_) => false,
        }
    }
}

/// What the control thread may ask of the running VM.
pub trait VmObserver: Send + Sync {
    /// The counters now.
    fn counters(&self) -> LiveCounters;
    /// Presses the ACPI power button.
    fn press_power_button(&self) -> std::io::Result<()>;
    /// Tells the virtio-iommu where the guest's bounce pool is; why not, when it cannot.
    fn set_bounce_pool(&self, pool: BouncePool) -> Result<(), String>;
    /// The hot-plug slots.
    fn slots(&self) -> Vec<SlotInfo>;
    /// Plugs a device into its slot; the HTTP status and why, when refused.
    fn plug(&self, request: PlugRequest) -> Result<SlotInfo, (u16, String)>;
    /// Pulls a device out of its slot; the HTTP status and why, when refused.
    fn unplug(&self, request: UnplugRequest) -> Result<SlotInfo, (u16, String)>;
    /// Why this VM cannot be snapshotted, if it cannot.
    fn snapshot_refusal(&self) -> Option<String>;
}

/// What the control thread knows of the VM, shared with the VMM's threads.
pub struct ControlState {
    spec: VmSpec,
    started: Instant,
    state: AtomicU8,
    entry: OnceLock<String>,
    observer: OnceLock<Arc<dyn VmObserver>>,
    stop: Arc<VmStop>,
    pid: u32,
    confinement: OnceLock<Confinement>,
    snapshot_dir: OnceLock<String>,
    /// A snapshot was taken (or tried) while the VM went on: its directory is used.
    snapshot_written: AtomicBool,
    /// Where a snapshot taken while the VM goes on is asked for.
    pub pause: Arc<SnapshotPause>,
}

/// How long `vm.snapshot` with `then: resume` waits for the snapshot to be written.
const RESUME_SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(120);

impl ControlState {
    /// The state of a VM being set up for `spec`, whose stop requests go to `stop`; `pid` is
    /// the process its starter started (the jail's supervisor, when it has one).
    pub fn new(spec: VmSpec, stop: Arc<VmStop>, pid: u32) -> Self {
        ControlState {
            spec,
            started: Instant::now(),
            state: AtomicU8::new(VmState::Booting as u8),
            entry: OnceLock::new(),
            observer: OnceLock::new(),
            stop,
            pid,
            confinement: OnceLock::new(),
            snapshot_dir: OnceLock::new(),
            snapshot_written: AtomicBool::new(false),
            pause: Arc::new(SnapshotPause::default()),
        }
    }

    /// Records where `vm.snapshot` writes (`--snapshot-to`).
    pub fn set_snapshot_dir(&self, dir: String) {
        let _ = self.snapshot_dir.set(dir);
    }

    /// The boot protocol, once chosen.
    pub fn entry(&self) -> Option<String> {
        self.entry.get().cloned()
    }

    /// Records how the process is confined.
    pub fn set_confinement(&self, confinement: Confinement) {
        let _ = self.confinement.set(confinement);
    }

    /// Records the boot protocol chosen.
    pub fn set_entry(&self, entry: &str) {
        let _ = self.entry.set(entry.to_string());
    }

    /// Installs what the counters and the power button come from.
    pub fn set_observer(&self, observer: Arc<dyn VmObserver>) {
        let _ = self.observer.set(observer);
    }

    /// Moves the VM to `state` (never back from `stopping`).
    pub fn set_state(&self, state: VmState) {
        let _ = self.state.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
            (now != VmState::Stopping as u8).then_some(state as u8)
        });
    }

    /// The state now.
    pub fn state(&self) -> VmState {
        if self.stop.is_stopping() {
            return VmState::Stopping;
        }
        match self.state.load(Ordering::SeqCst) {
            s if s == VmState::Running as u8 => VmState::Running,
            s if s == VmState::Stopping as u8 => VmState::Stopping,
            _ => VmState::Booting,
        }
    }

    fn info(&self) -> VmInfo {
        VmInfo {
            state: self.state(),
            pid: self.pid,
            uptime_ms: self.started.elapsed().as_secs_f64() * 1e3,
            entry: self.entry.get().cloned(),
            config: self.spec.clone(),
            confinement: self.confinement.get().cloned(),
            slots: self.observer.get().map(|o| o.slots()).unwrap_or_default(),
        }
    }

    fn counters(&self) -> LiveCounters {
        let mut counters = match self.observer.get() {
            Some(observer) => observer.counters(),
            None => LiveCounters {
                state: VmState::Booting,
                run_ms: 0.0,
                serial_bytes: 0,
                com2_bytes: None,
                exits: ExitCounts::default(),
                viommu: None,
                devices: Vec::new(),
            },
        };
        counters.state = self.state();
        counters
    }

    fn shutdown(&self, request: ShutdownRequest) -> Result<ShutdownAccepted, String> {
        let grace = request.grace_s.unwrap_or(DEFAULT_SHUTDOWN_GRACE_S);
        if !(grace.is_finite() && (0.0..=MAX_GRACE_S).contains(&grace)) {
            return Err(format!("grace_s {grace}: must be between 0 and {MAX_GRACE_S}"));
        }
        if grace > 0.0
            && let Some(observer) = self.observer.get()
            && let Err(e) = observer.press_power_button()
        {
            tracing::warn!("pressing the power button: {e}");
        }
        self.stop.request_shutdown(Duration::from_secs_f64(grace));
        let state = match self.state() {
            VmState::Booting => VmState::Booting,
            _ => VmState::Stopping,
        };
        Ok(ShutdownAccepted { state, grace_s: grace })
    }

    /// Takes a snapshot, when this VM has somewhere to write one and can be snapshotted: stops
    /// the vCPUs for it (202), or writes it while they hold and lets them go on (200); the HTTP
    /// status and why, when not.
    fn snapshot(&self, request: SnapshotRequest) -> Result<(u16, SnapshotAccepted), (u16, String)> {
        let Some(dir) = self.snapshot_dir.get() else {
            return Err((
                409,
                "this VM was started without --snapshot-to DIR: it has nowhere to write a snapshot".into(),
            ));
        };
        let Some(observer) = self.observer.get() else {
            return Err((409, "the VM is still booting".into()));
        };
        if self.state() == VmState::Stopping {
            return Err((409, "the VM is stopping already".into()));
        }
        if let Some(why) = observer.snapshot_refusal() {
            return Err((409, format!("this VM cannot be snapshotted: {why}")));
        }
        if self.snapshot_written.swap(true, Ordering::SeqCst) {
            return Err((409, format!("this VM wrote its snapshot to {dir} already: one snapshot per --snapshot-to")));
        }
        match request.then {
            AfterSnapshot::Stop => {
                self.stop.request(StopCause::Snapshot);
                Ok((202, SnapshotAccepted { state: VmState::Stopping, dir: dir.clone(), written: None }))
            }
            AfterSnapshot::Resume => {
                let written = self.pause.ask(&self.stop, RESUME_SNAPSHOT_TIMEOUT).map_err(|why| (500, why))?;
                Ok((200, SnapshotAccepted { state: self.state(), dir: dir.clone(), written: Some(written) }))
            }
        }
    }
}

/// A bound control socket, not yet served.
pub struct ControlSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlSocket {
    /// Binds `path`, readable and writable by its owner only. A stale socket left by a VMM that
    /// is gone is replaced; one that answers is not.
    pub fn bind(path: &Path) -> Result<ControlSocket, ControlError> {
        let bind_error = |source| ControlError::Bind { path: path.to_path_buf(), source };
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(bind_error(std::io::Error::from(std::io::ErrorKind::AlreadyExists)));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(ControlError::InUse(path.to_path_buf()));
            }
            std::fs::remove_file(path).map_err(bind_error)?;
        }
        // SAFETY: umask has no preconditions; the previous mask is restored right after bind.
        let old = unsafe { libc::umask(0o177) };
        let listener = UnixListener::bind(path);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        Ok(ControlSocket { listener: listener.map_err(bind_error)?, path: path.to_path_buf() })
    }

    /// Serves requests on a thread of its own until the process ends; the thread installs
    /// `seccomp` first, if given.
    pub fn serve(self, state: Arc<ControlState>, seccomp: Option<BpfProgram>) -> Result<ControlServer, ControlError> {
        let ControlSocket { listener, path } = self;
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                if let Some(filter) = seccomp
                    && let Err(e) = crate::seccomp::apply(&filter)
                {
                    tracing::error!("control socket: {e}; not serving");
                    return;
                }
                for stream in listener.incoming() {
                    match stream {
                        Ok(stream) => handle(stream, &state),
                        Err(e) => tracing::debug!("control socket: accept: {e}"),
                    }
                }
            })
            .map_err(ControlError::Thread)?;
        Ok(ControlServer { path, _thread: thread })
    }
}

/// The running control socket; its file is removed when this is dropped.
pub struct ControlServer {
    path: PathBuf,
    _thread: JoinHandle<()>,
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An answer: status, reason and JSON body.
struct Answer(u16, &'static str, String);

fn json<T: serde::Serialize>(status: u16, reason: &'static str, body: &T) -> Answer {
    Answer(status, reason, serde_json::to_string(body).unwrap_or_else(|_| "{}".into()))
}

fn error(status: u16, reason: &'static str, message: impl Into<String>) -> Answer {
    json(status, reason, &ErrorBody { error: message.into() })
}

fn handle(mut stream: UnixStream, state: &ControlState) {
    let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
    let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
    let answer = match read_request(&mut stream) {
        Ok((method, path, body)) => route(state, &method, &path, &body),
        Err(answer) => answer,
    };
    let Answer(status, reason, body) = answer;
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes());
}

/// Reads one request: method, path and body.
fn read_request(stream: &mut UnixStream) -> Result<(String, String, Vec<u8>), Answer> {
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            return Err(error(413, "Payload Too Large", format!("requests are limited to {MAX_REQUEST_BYTES} bytes")));
        }
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(error(400, "Bad Request", "the request ended early")),
            Ok(n) => filled += n,
            Err(e) => return Err(error(400, "Bad Request", format!("reading the request: {e}"))),
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        let header_len = match request.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => continue,
            Err(e) => return Err(error(400, "Bad Request", format!("not an HTTP request: {e}"))),
        };
        let length = match request.headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length")) {
            None => 0,
            Some(h) => std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| error(400, "Bad Request", "Content-Length is not a number"))?,
        };
        if header_len + length > buf.len() {
            return Err(error(413, "Payload Too Large", format!("requests are limited to {MAX_REQUEST_BYTES} bytes")));
        }
        let method = request.method.unwrap_or_default().to_string();
        let path = request.path.unwrap_or_default().to_string();
        while filled < header_len + length {
            match stream.read(&mut buf[filled..header_len + length]) {
                Ok(0) => return Err(error(400, "Bad Request", "the body ended early")),
                Ok(n) => filled += n,
                Err(e) => return Err(error(400, "Bad Request", format!("reading the body: {e}"))),
            }
        }
        return Ok((method, path, buf[header_len..header_len + length].to_vec()));
    }
}

fn route(state: &ControlState, method: &str, path: &str, body: &[u8]) -> Answer {
    let allowed = match path {
        VM_INFO | VM_COUNTERS => "GET",
        VM_SHUTDOWN | VM_BOUNCE_POOL | VM_PLUG | VM_UNPLUG | VM_SNAPSHOT => "PUT",
        _ => {
            let routes = [VM_INFO, VM_COUNTERS, VM_SHUTDOWN, VM_BOUNCE_POOL, VM_PLUG, VM_UNPLUG, VM_SNAPSHOT];
            return error(404, "Not Found", format!("no such route; there are {}", routes.join(", ")));
        }
    };
    if method != allowed {
        return error(405, "Method Not Allowed", format!("{path} takes {allowed}"));
    }
    match path {
        VM_INFO => json(200, "OK", &state.info()),
        VM_COUNTERS => json(200, "OK", &state.counters()),
        VM_SNAPSHOT => {
            match optional_body::<SnapshotRequest>(body).map_err(|e| (400, e)).and_then(|r| state.snapshot(r)) {
                Ok((status, accepted)) => json(status, reason_phrase(status), &accepted),
                Err((status, why)) => error(status, reason_phrase(status), why),
            }
        }
        VM_PLUG => slot_request(state, body, |o, r: PlugRequest| o.plug(r), 200),
        VM_UNPLUG => {
            let surprise = serde_json::from_slice::<UnplugRequest>(body).is_ok_and(|r| r.surprise);
            slot_request(state, body, |o, r: UnplugRequest| o.unplug(r), if surprise { 200 } else { 202 })
        }
        VM_BOUNCE_POOL => match serde_json::from_slice::<BouncePool>(body) {
            Err(e) => error(400, "Bad Request", format!("invalid body: {e}")),
            Ok(pool) if pool.end < pool.start => error(400, "Bad Request", "the pool ends before it starts"),
            Ok(pool) => match state.observer.get().map(|o| o.set_bounce_pool(pool)) {
                Some(Ok(())) => json(200, "OK", &pool),
                Some(Err(why)) => error(409, "Conflict", why),
                None => error(409, "Conflict", "the VM is still booting"),
            },
        },
        _ => {
            let request = match optional_body::<ShutdownRequest>(body) {
                Ok(request) => request,
                Err(why) => return error(400, "Bad Request", why),
            };
            match state.shutdown(request) {
                Ok(accepted) => json(202, "Accepted", &accepted),
                Err(message) => error(400, "Bad Request", message),
            }
        }
    }
}

/// A `vm.plug` or `vm.unplug`: the body parsed into `R`, handed to the running VM, its slot as
/// the answer with status `ok`.
fn slot_request<R: serde::de::DeserializeOwned>(
    state: &ControlState,
    body: &[u8],
    act: impl FnOnce(&dyn VmObserver, R) -> Result<SlotInfo, (u16, String)>,
    ok: u16,
) -> Answer {
    let request = match serde_json::from_slice::<R>(body) {
        Ok(request) => request,
        Err(e) => return error(400, "Bad Request", format!("invalid body: {e}")),
    };
    let Some(observer) = state.observer.get() else {
        return error(409, "Conflict", "the VM is still booting");
    };
    match act(observer.as_ref(), request) {
        Ok(slot) => json(ok, if ok == 200 { "OK" } else { "Accepted" }, &slot),
        Err((status, why)) => error(status, reason_phrase(status), why),
    }
}

/// A request's JSON body, or its default when the body is empty.
fn optional_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| format!("invalid body: {e}"))
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        404 => "Not Found",
        409 => "Conflict",
        _ => "Internal Server Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use vm_spec::Kernel;

    struct Fake {
        presses: AtomicU64,
        pool: std::sync::Mutex<Option<BouncePool>>,
    }

    impl VmObserver for Fake {
        fn counters(&self) -> LiveCounters {
            LiveCounters {
                state: VmState::Running,
                run_ms: 5.0,
                serial_bytes: 42,
                com2_bytes: Some(7),
                exits: ExitCounts { io: 3, mmio: 4, unclaimed: 0, ..ExitCounts::default() },
                viommu: None,
                devices: Vec::new(),
            }
        }
        fn press_power_button(&self) -> std::io::Result<()> {
            self.presses.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn set_bounce_pool(&self, pool: BouncePool) -> Result<(), String> {
            *self.pool.lock().unwrap() = Some(pool);
            Ok(())
        }
        fn slots(&self) -> Vec<SlotInfo> {
            Vec::new()
        }
        fn plug(&self, request: PlugRequest) -> Result<SlotInfo, (u16, String)> {
            Err((404, format!("no device {:?}", request.device)))
        }
        fn unplug(&self, request: UnplugRequest) -> Result<SlotInfo, (u16, String)> {
            use vm_spec::control::SlotState;
            let state = if request.surprise { SlotState::Empty } else { SlotState::Releasing };
            Ok(SlotInfo { device: request.device, port: "00:02.0".into(), bdf: "01:00.0".into(), state })
        }
        fn snapshot_refusal(&self) -> Option<String> {
            None
        }
    }

    fn ask(path: &Path, request: &[u8]) -> (u16, serde_json::Value) {
        let mut stream = UnixStream::connect(path).unwrap();
        stream.write_all(request).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response[9..12].parse().unwrap();
        let body = response.split_once("\r\n\r\n").unwrap().1;
        (status, serde_json::from_str(body).unwrap())
    }

    #[test]
    fn answers_state_counters_and_shutdown_and_refuses_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.sock");
        let stop = Arc::new(VmStop::new());
        let state = Arc::new(ControlState::new(VmSpec::new(Kernel::Probe), stop.clone(), 1));
        let server = ControlSocket::bind(&path).unwrap().serve(state.clone(), None).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600, "private by default");

        let (status, info) = ask(&path, b"GET /api/v1/vm.info HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!((status, info["state"].as_str()), (200, Some("booting")));
        assert_eq!(info["config"]["kernel"], "probe");
        let (_, counters) = ask(&path, b"GET /api/v1/vm.counters HTTP/1.1\r\n\r\n");
        assert_eq!(counters["serial_bytes"], 0, "no observer yet");

        let pool =
            |body: &str| format!("PUT /api/v1/vm.bounce-pool HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        assert_eq!(ask(&path, pool(r#"{"start":1,"end":2}"#).as_bytes()).0, 409, "still booting");
        let fake = Arc::new(Fake { presses: AtomicU64::new(0), pool: Default::default() });
        state.set_observer(fake.clone());
        state.set_state(VmState::Running);
        let (_, counters) = ask(&path, b"GET /api/v1/vm.counters HTTP/1.1\r\n\r\n");
        assert_eq!((counters["state"].as_str(), counters["serial_bytes"].as_u64()), (Some("running"), Some(42)));
        assert_eq!(counters["exits"]["mmio"], 4);
        let (status, answer) = ask(&path, pool(r#"{"start":4096,"end":8191}"#).as_bytes());
        assert_eq!((status, answer["end"].as_u64()), (200, Some(8191)));
        assert_eq!(*fake.pool.lock().unwrap(), Some(BouncePool { start: 4096, end: 8191 }));
        assert_eq!(ask(&path, pool(r#"{"start":2,"end":1}"#).as_bytes()).0, 400, "ends before it starts");
        assert_eq!(ask(&path, pool(r#"{"start":2}"#).as_bytes()).0, 400);
        assert_eq!(ask(&path, b"GET /api/v1/vm.bounce-pool HTTP/1.1\r\n\r\n").0, 405);
        let put_to = |route: &str, body: &str| {
            format!("PUT /api/v1/{route} HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        };
        let (status, why) = ask(&path, put_to("vm.plug", r#"{"device":"vfio-user=/x"}"#).as_bytes());
        assert_eq!((status, why["error"].as_str()), (404, Some("no device \"vfio-user=/x\"")));
        assert_eq!(ask(&path, put_to("vm.plug", r#"{"dev":"x"}"#).as_bytes()).0, 400);
        let (status, slot) = ask(&path, put_to("vm.unplug", r#"{"device":"vfio-user=/x"}"#).as_bytes());
        assert_eq!((status, slot["state"].as_str()), (202, Some("releasing")), "orderly: accepted");
        let (status, slot) = ask(&path, put_to("vm.unplug", r#"{"device":"vfio-user=/x","surprise":true}"#).as_bytes());
        assert_eq!((status, slot["state"].as_str()), (200, Some("empty")), "surprise: done");
        let (status, why) = ask(&path, put_to("vm.snapshot", r#"{"then":"later"}"#).as_bytes());
        assert_eq!(status, 400, "{why}");
        let (status, why) = ask(&path, put_to("vm.snapshot", r#"{"then":"resume"}"#).as_bytes());
        assert_eq!(status, 409, "started without --snapshot-to: {why}");

        assert_eq!(ask(&path, b"POST /api/v1/vm.info HTTP/1.1\r\n\r\n").0, 405);
        assert_eq!(ask(&path, b"GET /api/v1/vm.reboot HTTP/1.1\r\n\r\n").0, 404);
        assert_eq!(ask(&path, b"garbage\r\n\r\n").0, 400);
        let big = format!("PUT /api/v1/vm.shutdown HTTP/1.1\r\nContent-Length: {}\r\n\r\n", MAX_REQUEST_BYTES * 2);
        assert_eq!(ask(&path, big.as_bytes()).0, 413);
        let put =
            |body: &str| format!("PUT /api/v1/vm.shutdown HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        assert_eq!(ask(&path, put(r#"{"grace_s":-1}"#).as_bytes()).0, 400);
        assert_eq!(ask(&path, put(r#"{"grace":1}"#).as_bytes()).0, 400);
        assert!(!stop.is_stopping());

        let (status, accepted) = ask(&path, put(r#"{"grace_s":0.01}"#).as_bytes());
        assert_eq!((status, accepted["grace_s"].as_f64()), (202, Some(0.01)), "{accepted}");
        assert_eq!(fake.presses.load(Ordering::SeqCst), 1, "the power button was pressed");
        assert_eq!(stop.wait(None), crate::exit::StopCause::Shutdown);
        let (_, info) = ask(&path, b"GET /api/v1/vm.info HTTP/1.1\r\n\r\n");
        assert_eq!(info["state"], "stopping");

        // A silent client is dropped after the timeout and the socket keeps answering.
        let _silent = UnixStream::connect(&path).unwrap();
        assert_eq!(ask(&path, b"GET /api/v1/vm.info HTTP/1.1\r\n\r\n").0, 200);
        assert!(matches!(ControlSocket::bind(&path), Err(ControlError::InUse(_))));
        drop(server);
        assert!(!path.exists(), "the socket is removed at the end");
    }
}

//! The box's supervisor: one process (`driverlab nested-box supervise --dir DIR`) that owns the
//! box's folder lock and every process of the box on the host (the models in their wire
//! namespaces, the peers' sshd, QEMU), writes `state.json` as the box starts, comes up and ends,
//! and takes it all down on SIGTERM or when QEMU ends. Its children die with it
//! (`PR_SET_PDEATHSIG`), so a supervisor killed with -9 leaves no box running; its namespaces are
//! removed by the next `up`.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{BoxDir, BoxError, BoxPlan, BoxState, Lock, box_args, io, read_token, signal};
use engines::model_process::ModelProcess;
use engines::peer::{Addresses, TAP, WireNamespace};

/// Starts the supervisor for `dir` in a session of its own, its stderr into the folder's
/// `supervisor.log`; returns its PID.
pub fn spawn(driverlab: &Path, dir: &BoxDir) -> Result<u32, BoxError> {
    let log = std::fs::File::create(dir.supervisor_log()).map_err(io(&dir.supervisor_log()))?;
    let mut command = Command::new(driverlab);
    command.args(["nested-box", "supervise", "--dir"]).arg(dir.root());
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
    // SAFETY: setsid in the forked child before exec touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            rustix::process::setsid()?;
            Ok(())
        });
    }
    let child = command.spawn().map_err(|e| BoxError::Tool {
        what: format!("starting {} nested-box supervise", driverlab.display()),
        detail: e.to_string(),
    })?;
    Ok(child.id())
}

/// Blocks SIGTERM and SIGINT in this thread (and the threads it starts later) and returns a flag
/// that a thread waiting for them sets.
fn stop_on_signal() -> Result<Arc<AtomicBool>, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    // SAFETY: a zeroed sigset_t is what sigemptyset initialises; the calls get valid pointers.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let flag = stop.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut signal = 0;
            // SAFETY: `set` is initialised and outlives the call; `signal` receives the number.
            unsafe { libc::sigwait(&set, &mut signal) };
            flag.store(true, Ordering::SeqCst);
        })
        .map_err(|e| BoxError::Tool { what: "starting the signal thread".into(), detail: e.to_string() })?;
    Ok(stop)
}

/// Runs the box of `dir` to its end; returns why it ended.
pub fn supervise(dir: &BoxDir) -> Result<String, BoxError> {
    let Some(_lock) = Lock::try_take(&dir.lock())? else {
        let url = dir.read_state().map(|s| s.url).unwrap_or_default();
        return Err(BoxError::AlreadyUp { url, dir: dir.root().to_path_buf() });
    };
    let stop = stop_on_signal()?;
    let plan: BoxPlan = serde_json::from_slice(&std::fs::read(dir.plan()).map_err(io(&dir.plan()))?)
        .map_err(|e| BoxError::Boot(format!("{}: {e}", dir.plan().display())))?;
    let mut state = BoxState {
        phase: "starting".into(),
        url: format!("http://127.0.0.1:{}", plan.port),
        token_file: dir.token(),
        supervisor: std::process::id(),
        qemu: None,
        cards: plan.cards.clone(),
        console: dir.console(),
        started_at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        ended: None,
    };
    dir.write_state(&state)?;
    let ended = match run(dir, plan, &mut state, &stop) {
        Ok(why) => why,
        Err(e) => e.to_string(),
    };
    eprintln!("nested box ended: {ended}");
    state.phase = "ended".into();
    state.qemu = None;
    state.ended = Some(ended.clone());
    dir.write_state(&state)?;
    Ok(ended)
}

/// A child killed and reaped when dropped.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(dir: &BoxDir, mut plan: BoxPlan, state: &mut BoxState, stop: &AtomicBool) -> Result<String, BoxError> {
    // Dropped in reverse: QEMU first, then the sshd, the models and their namespaces.
    let mut namespaces = Vec::new();
    let mut models = Vec::new();
    for card in &mut plan.cards {
        let namespace = WireNamespace::create(&card.netns, &Addresses::default())
            .map_err(|e| BoxError::Boot(format!("card {}: {e}", card.name)))?;
        let control = card.control.display().to_string();
        let log_path = dir.root().join(format!("model-{}.log", card.name));
        let model = ModelProcess::start_logged(
            &engines::Programs::beside(&plan.driverlab).model,
            card.kind.name(),
            &["--tap", TAP, "--control", &control],
            Some(namespace.name()),
            Some(&log_path),
        )
        .map_err(|e| BoxError::Boot(format!("card {}: {e}", card.name)))?;
        card.socket = model.socket().to_path_buf();
        namespaces.push(namespace);
        models.push(model);
    }
    state.cards = plan.cards.clone();
    dir.write_state(state)?;
    let _sshd = Owned(start_sshd(dir, plan.ssh_port)?);

    let qemu = engines::qemu::Qemu::find(&plan.qemu_root).map_err(|e| BoxError::Qemu(e.to_string()))?;
    let qemu_log = std::fs::File::create(dir.qemu_log()).map_err(io(&dir.qemu_log()))?;
    let mut command = qemu.command(&box_args(&plan, dir));
    engines::vm_process::die_with_parent(&mut command);
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(qemu_log)
        .spawn()
        .map_err(|e| BoxError::Qemu(format!("starting QEMU: {e}")))?;
    state.qemu = Some(child.id());
    dir.write_state(state)?;
    let mut qemu_child = Owned(child);
    let token = read_token(&dir.token())?;
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = qemu_child.0.try_wait() {
            let console = std::fs::read_to_string(dir.console()).unwrap_or_default();
            let last = console.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("nothing").to_string();
            let said = std::fs::read_to_string(dir.qemu_log()).unwrap_or_default();
            let complaint = said.lines().rev().find(|l| !l.trim().is_empty()).map(|l| format!("; QEMU: {l}"));
            return Ok(format!(
                "the box's QEMU ended ({status}) after {:.0} s; its console's last line: {last}{}",
                started.elapsed().as_secs_f64(),
                complaint.unwrap_or_default()
            ));
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(stop_box(dir, &mut qemu_child));
        }
        if state.phase == "starting" && ready(dir, plan.port, &token) {
            state.phase = "up".into();
            dir.write_state(state)?;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How long a box has to stop cleanly once asked: its daemon ended (its running run left
/// `interrupted`, its database closed), its disk written out and unmounted, its poweroff.
pub const CLEAN_STOP: Duration = Duration::from_secs(30);

/// Stops the box: asks it to (the stop file in its share, which its init watches) and waits
/// [`CLEAN_STOP`] for its poweroff to end QEMU; ends QEMU if it has not (SIGTERM: to the box, a
/// power cut). What happened, for the state's `ended`.
fn stop_box(dir: &BoxDir, qemu: &mut Owned) -> String {
    let exited = |qemu: &mut Owned, within: Duration| {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if !matches!(qemu.0.try_wait(), Ok(None)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    };
    let asked = std::fs::write(dir.stop_request(), b"").is_ok();
    if asked && exited(qemu, CLEAN_STOP) {
        return "stopped by `driverlab nested-box down` (the box powered off)".into();
    }
    // Our own child's PID, which it stays until we wait for it.
    signal(qemu.0.id(), rustix::process::Signal::TERM);
    exited(qemu, Duration::from_secs(10));
    format!(
        "stopped by `driverlab nested-box down` (the box did not power off within {} s: its QEMU was ended)",
        CLEAN_STOP.as_secs()
    )
}

/// Starts the peers' sshd on the host's loopback and waits until it listens.
fn start_sshd(dir: &BoxDir, port: u16) -> Result<Child, BoxError> {
    // sshd refuses to start without its privilege separation folder.
    let _ = std::fs::create_dir_all("/run/sshd");
    let log_path = dir.sshd().join("sshd.log");
    let log = std::fs::File::create(&log_path).map_err(io(&log_path))?;
    let mut command = Command::new("/usr/sbin/sshd");
    command.args(["-D", "-e", "-f"]).arg(dir.sshd().join("sshd_config"));
    engines::vm_process::die_with_parent(&mut command);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| BoxError::Tool { what: "starting /usr/sbin/sshd".into(), detail: e.to_string() })?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(BoxError::Tool {
                what: format!("the peers' sshd ({status})"),
                detail: said.lines().last().unwrap_or("it said nothing").to_string(),
            });
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(BoxError::Tool {
                what: "the peers' sshd".into(),
                detail: format!("not listening on port {port}"),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}

/// Whether the box said it is ready and its daemon answers on the forwarded port with the token.
fn ready(dir: &BoxDir, port: u16, token: &str) -> bool {
    let console = std::fs::read_to_string(dir.console()).unwrap_or_default();
    if !console.lines().any(|l| l.starts_with("dlbox: ready")) {
        return false;
    }
    http_status(port, "/v1/version", token) == Some(200)
}

/// The status of a GET on the box's daemon, over the forwarded port.
pub fn http_status(port: u16, path: &str, token: &str) -> Option<u16> {
    let mut stream =
        std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: driverlab\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).ok()?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace().nth(1)?.parse().ok()
}

//! A device model served by its own `driverlab model KIND` process, for VMs that pass it through
//! with `--device vfio-user=SOCKET`: started on a socket in a private folder, killed and cleaned up
//! when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vm_spec::model_control::{self, ModelReport, ModelRequest};

use crate::program::Program;

/// How long a model may take to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors starting a model process.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The folder or the process could not be created.
    #[error("starting `driverlab model {kind}`: {source}")]
    Start {
        /// Which model.
        kind: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// The model never created its socket (it exited, or refused its arguments).
    #[error("`driverlab model {kind}` did not start serving on {socket} within {START_TIMEOUT:?}{said}", socket = socket.display())]
    NotServing {
        /// Which model.
        kind: String,
        /// Where it should have been serving.
        socket: PathBuf,
        /// What it said last, `: ...`, if anything.
        said: String,
    },
}

/// A running model process serving one client (`--once`).
pub struct ModelProcess {
    kind: String,
    child: Child,
    socket: PathBuf,
    /// A NIC model's control socket (`--control`), for its live counters.
    control: Option<PathBuf>,
    dir: PathBuf,
    /// The caller's log file, which also gets the model's report lines (its stdout) at its end,
    /// so that the log alone says what the model counted (`driverlab agent verdict`).
    log: Option<PathBuf>,
}

impl ModelProcess {
    /// Starts `PROGRAM KIND --once --socket DIR/KIND.sock ARGS...` (`program`: `driverlab-model` or
    /// `driverlab model`) and waits until it
    /// serves. Its stdout (the counters it prints) is kept for [`ModelProcess::terminate`].
    pub fn start(program: &Program, kind: &str, args: &[&str]) -> Result<ModelProcess, ModelError> {
        ModelProcess::start_in(program, kind, args, None)
    }

    /// The same, inside network namespace `netns` (where its TAP is), when one is given.
    pub fn start_in(
        program: &Program,
        kind: &str,
        args: &[&str],
        netns: Option<&str>,
    ) -> Result<ModelProcess, ModelError> {
        ModelProcess::start_logged(program, kind, args, netns, None)
    }

    /// The same, its stderr (the model's log) into the file `log` (created or truncated)
    /// instead of one in its own folder.
    pub fn start_logged(
        program: &Program,
        kind: &str,
        args: &[&str],
        netns: Option<&str>,
        log: Option<&Path>,
    ) -> Result<ModelProcess, ModelError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let start_error = |source| ModelError::Start { kind: kind.to_string(), source };
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("driverlab-model-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(start_error)?;
        let socket = dir.join(format!("{kind}.sock"));
        let mut command = program.command([kind, "--once", "--socket"]);
        command.arg(&socket).args(args);
        if let Some(netns) = netns {
            // Into the namespace's network only (as `ip netns exec` would, but without its
            // fresh /sys, which has no cgroup tree for the model's jail).
            let path = Path::new("/run/netns").join(netns);
            let namespace = std::fs::File::open(&path).map_err(|e| {
                let _ = std::fs::remove_dir_all(&dir);
                start_error(std::io::Error::new(e.kind(), format!("network namespace {}: {e}", path.display())))
            })?;
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the forked child before exec and makes one system call
            // on a descriptor it owns (the namespace's file, open until the command is dropped).
            unsafe {
                command.pre_exec(move || {
                    let network = Some(rustix::thread::LinkNameSpaceType::Network);
                    rustix::thread::move_into_link_name_space(std::os::fd::AsFd::as_fd(&namespace), network)?;
                    Ok(())
                });
            }
        }
        // A NIC model's control socket, for its live counters: the caller's, or one of ours.
        let given = args.iter().position(|a| *a == "--control").and_then(|i| args.get(i + 1)).map(PathBuf::from);
        let control = match given {
            Some(path) => Some(path),
            None if kind.parse::<vm_spec::NicKind>().is_ok() => {
                let path = dir.join("control.sock");
                command.arg("--control").arg(&path);
                Some(path)
            }
            None => None,
        };
        crate::vm_process::die_with_parent(&mut command);
        // Its log: the caller's file, else one in its folder, read back if it does not start.
        let own_log = log.map_or_else(|| dir.join("model.log"), Path::to_path_buf);
        let stderr = std::fs::File::create(&own_log).map_or_else(|_| Stdio::null(), Stdio::from);
        let child = match command.stdout(Stdio::piped()).stderr(stderr).spawn() {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(start_error(e));
            }
        };
        let model =
            ModelProcess { kind: kind.to_string(), child, socket, control, dir, log: log.map(Path::to_path_buf) };
        let deadline = Instant::now() + START_TIMEOUT;
        let mut model = model;
        while !model.socket.exists() {
            let ended = matches!(model.child.try_wait(), Ok(Some(_)));
            if ended || Instant::now() > deadline {
                let text = std::fs::read_to_string(&own_log).unwrap_or_default();
                let said = text
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .map(|l| format!(": it said {:?}", l.trim().chars().take(300).collect::<String>()))
                    .unwrap_or_default();
                return Err(ModelError::NotServing { kind: kind.to_string(), socket: model.socket.clone(), said });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(model)
    }

    /// The process ID of the process started (a jailed model's supervisor).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The vfio-user socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `vfio-user=SOCKET`, for `driverlab vm run --device`.
    pub fn device_arg(&self) -> String {
        self.device_spec().to_string()
    }

    /// The device as a VM spec names it.
    pub fn device_spec(&self) -> vm_spec::DeviceSpec {
        vm_spec::DeviceSpec::vfio_user(self.socket.clone())
    }

    /// The model's status line over its control socket (the NIC models; `None` for models
    /// without one, or when it does not answer within a second).
    fn status(&self) -> Option<ModelReport> {
        let line = model_control::ask(self.control.as_ref()?, ModelRequest::Status, Duration::from_secs(1)).ok()?;
        ModelReport::parse(&line)
    }

    /// What the model has counted so far, over its control socket (the NIC models; `None` for
    /// models without one, or when it does not answer within a second).
    pub fn counters(&self) -> Option<vm_spec::counters::ModelCounters> {
        Some(self.status()?.counters)
    }

    /// How the model process is confined (its jail's steps), over its control socket: final
    /// once it answers, since it answers only after its jail.
    pub fn confinement(&self) -> Option<vm_spec::confinement::Confinement> {
        self.status()?.confinement
    }

    /// If the model has ended other than by finishing its one client's session (a signal, an
    /// exit code other than 0), how: `the aqc100 model ended (signal 9)`. A model that dies
    /// mid-repetition is the lab's error, not the driver's failure.
    pub fn ended_badly(&mut self) -> Option<String> {
        use std::os::unix::process::ExitStatusExt;
        let status = self.child.try_wait().ok()??;
        if status.success() {
            return None;
        }
        let how = match (status.signal(), status.code()) {
            (Some(signal), _) => format!("signal {signal}"),
            (None, Some(code)) => format!("exit code {code}"),
            (None, None) => status.to_string(),
        };
        Some(format!("the {} model ended ({how}) during the repetition", self.kind))
    }

    /// Kills the model now (a peer that goes away mid-run).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Sends SIGTERM, waits for the model to exit, and returns its exit code and stdout.
    pub fn terminate(mut self) -> std::io::Result<(Option<i32>, String)> {
        self.signal(rustix::process::Signal::TERM);
        let status = self.child.wait()?;
        let out = self.take_stdout()?;
        Ok((status.code(), out))
    }

    /// Sends `signal` to the model: our own child, whose PID it stays until we wait for it.
    fn signal(&self, signal: rustix::process::Signal) {
        if let Some(pid) = i32::try_from(self.child.id()).ok().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }

    /// What the model printed on its stdout (its report lines), once it has ended; appended to
    /// the caller's log too.
    fn take_stdout(&mut self) -> std::io::Result<String> {
        let mut out = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            std::io::Read::read_to_string(&mut stdout, &mut out)?;
        }
        if let Some(log) = &self.log
            && !out.is_empty()
        {
            use std::io::Write;
            std::fs::OpenOptions::new().append(true).open(log)?.write_all(out.as_bytes())?;
        }
        Ok(out)
    }
}

impl Drop for ModelProcess {
    fn drop(&mut self) {
        // SIGTERM first, so that a model still serving prints its final report line.
        self.signal(rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(2);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.take_stdout();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

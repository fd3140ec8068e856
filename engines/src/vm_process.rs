//! One VMM process: started with a [`VmSpec`] (`driverlab vm run --config -`, the spec on its
//! stdin), bounded in time, its output collected: the guest's serial output, and the exit line or
//! the error line on stderr.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vm_spec::{ErrorLine, ExitSummary, VmSpec};

use crate::program::Program;

/// Errors running a VMM process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The process could not be started.
    #[error("cannot start {binary}: {source}", binary = binary.display())]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// Waiting for it failed.
    #[error("waiting for the VMM process: {0}")]
    Wait(#[source] std::io::Error),
}

/// How to start one VMM process (`driverlab-vmm`, or `driverlab vm run`).
#[derive(Debug, Clone)]
pub struct VmProcess {
    /// The VMM program.
    pub program: Program,
    /// What to run.
    pub launch: Launch,
    /// A control socket for the VMM to serve (`--control`).
    pub control: Option<PathBuf>,
    /// More flags after the spec's or the launch's (`--snapshot-to DIR`).
    pub more_flags: Vec<OsString>,
    /// Kill the process if it runs longer than this (a backstop to the spec's own timeout).
    pub deadline: Duration,
}

/// What a [`VmProcess`] runs.
#[derive(Debug, Clone)]
pub enum Launch {
    /// A spec, handed over on stdin (`--config -`): how the lab and the API start VMs.
    Spec(VmSpec),
    /// Command-line flags after `vm run`, for tests of the command line itself.
    Args(Vec<OsString>),
}

/// What a finished VMM process left behind.
#[derive(Debug)]
pub struct VmOutcome {
    /// Its exit status.
    pub status: ExitStatus,
    /// The exit line, if it printed one.
    pub exit: Option<ExitSummary>,
    /// The error line, if the VMM could not run the VM.
    pub error: Option<ErrorLine>,
    /// Everything the guest wrote to its serial port (the process's stdout).
    pub serial: String,
    /// The process's stderr.
    pub stderr: String,
    /// Wall time from start to exit.
    pub wall: Duration,
    /// True if the lab killed it at the deadline.
    pub killed: bool,
}

impl VmOutcome {
    /// The exit code, or `None` if a signal ended the process.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// The signal that ended the process, if one did.
    pub fn signal(&self) -> Option<i32> {
        std::os::unix::process::ExitStatusExt::signal(&self.status)
    }
}

impl VmProcess {
    /// A VMM process running `spec`, killed after its own timeout plus `grace` (or `grace` alone when the
    /// spec has none).
    pub fn new(program: &Program, spec: VmSpec, grace: Duration) -> Self {
        let deadline = spec.timeout_s.map_or(Duration::ZERO, Duration::from_secs_f64) + grace;
        VmProcess {
            program: program.clone(),
            launch: Launch::Spec(spec),
            control: None,
            more_flags: Vec::new(),
            deadline,
        }
    }

    /// A VMM process with the command-line flags `args`, killed after `deadline`.
    pub fn with_args(
        program: &Program,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        deadline: Duration,
    ) -> Self {
        let args = args.into_iter().map(Into::into).collect();
        VmProcess {
            program: program.clone(),
            launch: Launch::Args(args),
            control: None,
            more_flags: Vec::new(),
            deadline,
        }
    }

    /// The same, serving a control socket at `path`.
    pub fn with_control(mut self, path: impl AsRef<Path>) -> Self {
        self.control = Some(path.as_ref().to_path_buf());
        self
    }

    /// The same, with more flags.
    pub fn with_flags(mut self, flags: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.more_flags.extend(flags.into_iter().map(Into::into));
        self
    }

    /// Runs the process to its end.
    pub fn run(&self) -> Result<VmOutcome, ProcessError> {
        self.start()?.wait()
    }

    /// Starts the process; [`RunningVm::wait`] collects it.
    pub fn start(&self) -> Result<RunningVm, ProcessError> {
        let started = Instant::now();
        let mut command = match &self.launch {
            Launch::Spec(_) => self.program.command(["--config", "-"]),
            Launch::Args(args) => self.program.command(args),
        };
        if let Some(control) = &self.control {
            command.arg("--control").arg(control);
        }
        command.args(&self.more_flags);
        let stdin = if matches!(self.launch, Launch::Spec(_)) { Stdio::piped() } else { Stdio::null() };
        die_with_parent(&mut command);
        let mut child = command
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ProcessError::Spawn { binary: self.program.path().to_path_buf(), source })?;
        if let (Launch::Spec(spec), Some(mut stdin)) = (&self.launch, child.stdin.take()) {
            // A VMM that dies before reading its spec shows in its exit status, not here.
            let _ = stdin.write_all(spec.to_json().as_bytes());
        }
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        Ok(RunningVm { child, stdout, stderr, started, deadline: self.deadline })
    }
}

/// A started VMM process.
pub struct RunningVm {
    child: std::process::Child,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
    started: Instant,
    deadline: Duration,
}

impl RunningVm {
    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to end (killing it at its deadline) and collects its output.
    pub fn wait(self) -> Result<VmOutcome, ProcessError> {
        let RunningVm { mut child, stdout, stderr, started: start, deadline } = self;
        let mut killed = false;
        let status = loop {
            if let Some(status) = child.try_wait().map_err(ProcessError::Wait)? {
                break status;
            }
            if start.elapsed() > deadline && !killed {
                tracing::warn!("VMM process passed its deadline of {deadline:?}; killing it");
                let _ = child.kill();
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let wall = start.elapsed();
        let serial = stdout.join().unwrap_or_default();
        let stderr = stderr.join().unwrap_or_default();
        Ok(VmOutcome {
            status,
            exit: ExitSummary::find_in(&stderr),
            error: ErrorLine::find_in(&stderr),
            serial,
            stderr,
            wall,
            killed,
        })
    }
}

/// Makes the child receive SIGKILL when the thread that started it goes away, so a lab killed
/// with -9 leaves no VMM or model behind holding a device.
pub fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls prctl, which is
    // async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            Ok(())
        });
    }
}

/// Reads a pipe to its end on a thread (so neither pipe can fill and block the child).
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_output_and_kills_at_the_deadline() {
        // A stand-in for driverlab: called as `fake vm run MODE`.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake-driverlab");
        std::fs::write(
            &fake,
            "#!/bin/sh\ncase \"$3\" in\n quick) echo serial; echo '{\"vmm\":\"x\"}' >&2; exit 3;;\n slow) exec sleep 5;;\nesac\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

        let fake = Program::driverlab_vm(fake);
        let out = VmProcess::with_args(&fake, ["quick"], Duration::from_secs(5)).run().unwrap();
        assert_eq!((out.code(), out.serial.as_str(), out.killed), (Some(3), "serial\n", false));
        assert!(out.exit.is_none(), "not an exit line");
        let out = VmProcess::with_args(&fake, ["slow"], Duration::from_millis(50)).run().unwrap();
        assert!(out.killed && out.signal() == Some(rustix::process::Signal::KILL.as_raw()));
        assert!(out.wall < Duration::from_secs(4));
        let nowhere = Program::driverlab_vm("/nonexistent/driverlab");
        let missing = VmProcess::with_args(&nowhere, Vec::<String>::new(), Duration::from_secs(1));
        assert!(matches!(missing.run(), Err(ProcessError::Spawn { .. })));
    }

    #[test]
    fn a_spec_goes_in_on_stdin_and_the_error_line_comes_back() {
        // A stand-in that checks its arguments, echoes its stdin as serial output and fails the
        // way a VMM does.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake-driverlab");
        std::fs::write(
            &fake,
            "#!/bin/sh\n[ \"$3 $4 $5\" = \"--config - --control\" ] || exit 9\ncat\n\
             echo '{\"vmm\":\"error\",\"kind\":\"peer\",\"message\":\"m\",\"exit_code\":1}' >&2; exit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let spec = VmSpec::new(vm_spec::Kernel::Probe);
        let fake = Program::driverlab_vm(fake);
        let out =
            VmProcess::new(&fake, spec.clone(), Duration::from_secs(5)).with_control("/tmp/c.sock").run().unwrap();
        assert_eq!(out.code(), Some(1));
        assert_eq!(VmSpec::from_json(&out.serial).unwrap(), spec);
        let error = out.error.unwrap();
        assert_eq!((error.kind, error.exit_code), (vm_spec::ErrorKind::Peer, 1));
    }
}

//! One VMM process: started, bounded in time, its output collected.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vmm::ExitSummary;

/// Errors running a VMM process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The process could not be started.
    #[error("cannot start {binary}: {source}", binary = binary.display())]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Waiting for it failed.
    #[error("waiting for the VMM process: {0}")]
    Wait(#[source] std::io::Error),
}

/// How to start one `driverlab vm run`.
#[derive(Debug, Clone)]
pub struct VmProcess {
    /// The driverlab binary.
    pub binary: PathBuf,
    /// Arguments after `vm run`.
    pub args: Vec<OsString>,
    /// Kill the process if it runs longer than this (a backstop to the VMM's own `--timeout`).
    pub deadline: Duration,
}

/// What a finished VMM process left behind.
#[derive(Debug)]
pub struct VmOutcome {
    /// Its exit status.
    pub status: ExitStatus,
    /// The exit line, if it printed one.
    pub exit: Option<ExitSummary>,
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
    /// A `vm run` with `args`, killed after `deadline`.
    pub fn new(
        binary: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        deadline: Duration,
    ) -> Self {
        VmProcess { binary: binary.into(), args: args.into_iter().map(Into::into).collect(), deadline }
    }

    /// Runs the process to its end.
    pub fn run(&self) -> Result<VmOutcome, ProcessError> {
        let start = Instant::now();
        let mut child = Command::new(&self.binary)
            .args(["vm", "run"])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ProcessError::Spawn { binary: self.binary.clone(), source })?;
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        let mut killed = false;
        let status = loop {
            if let Some(status) = child.try_wait().map_err(ProcessError::Wait)? {
                break status;
            }
            if start.elapsed() > self.deadline && !killed {
                tracing::warn!("VMM process passed its deadline of {:?}; killing it", self.deadline);
                let _ = child.kill();
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let wall = start.elapsed();
        let serial = stdout.join().unwrap_or_default();
        let stderr = stderr.join().unwrap_or_default();
        Ok(VmOutcome { status, exit: ExitSummary::find_in(&stderr), serial, stderr, wall, killed })
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

        let out = VmProcess::new(&fake, ["quick"], Duration::from_secs(5)).run().unwrap();
        assert_eq!((out.code(), out.serial.as_str(), out.killed), (Some(3), "serial\n", false));
        assert!(out.exit.is_none(), "not an exit line");
        let out = VmProcess::new(&fake, ["slow"], Duration::from_millis(50)).run().unwrap();
        assert!(out.killed && out.signal() == Some(libc::SIGKILL));
        assert!(out.wall < Duration::from_secs(4));
        let missing = VmProcess::new("/nonexistent/driverlab", Vec::<String>::new(), Duration::from_secs(1));
        assert!(matches!(missing.run(), Err(ProcessError::Spawn { .. })));
    }
}

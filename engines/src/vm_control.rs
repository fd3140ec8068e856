//! A client for a VMM's control socket (`driverlab vm run --control PATH`): `vm.info`,
//! `vm.counters` and `vm.shutdown` as typed calls, one connection per request.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vm_spec::control::{
    AfterSnapshot, BouncePool, ControlError as ErrorBody, LiveCounters, PlugRequest, ShutdownAccepted, ShutdownRequest,
    SlotInfo, SnapshotAccepted, SnapshotRequest, UnplugRequest, VM_BOUNCE_POOL, VM_COUNTERS, VM_INFO, VM_PLUG,
    VM_SHUTDOWN, VM_SNAPSHOT, VM_UNPLUG, VmInfo,
};

/// Most bytes of an answer read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Errors talking to a control socket.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket could not be reached or the connection failed.
    #[error("control socket {}: {source}", path.display())]
    Io {
        /// The socket.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The answer is not HTTP, too large, or not the JSON expected.
    #[error("control socket {}: bad answer: {reason}", path.display())]
    BadAnswer {
        /// The socket.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The VMM refused the request.
    #[error("control socket {}: {status}: {message}", path.display())]
    Refused {
        /// The socket.
        path: PathBuf,
        /// The HTTP status.
        status: u16,
        /// The VMM's message.
        message: String,
    },
}

/// A VMM's control socket.
#[derive(Debug, Clone)]
pub struct ControlClient {
    path: PathBuf,
    timeout: Duration,
}

impl ControlClient {
    /// A client for the socket at `path`, giving each answer `timeout`.
    pub fn new(path: impl AsRef<Path>, timeout: Duration) -> Self {
        ControlClient { path: path.as_ref().to_path_buf(), timeout }
    }

    /// `GET /api/v1/vm.info`.
    pub fn info(&self) -> Result<VmInfo, ControlError> {
        self.call("GET", VM_INFO, None)
    }

    /// `GET /api/v1/vm.counters`.
    pub fn counters(&self) -> Result<LiveCounters, ControlError> {
        self.call("GET", VM_COUNTERS, None)
    }

    /// `PUT /api/v1/vm.shutdown`.
    pub fn shutdown(&self, request: ShutdownRequest) -> Result<ShutdownAccepted, ControlError> {
        let body = serde_json::to_vec(&request).expect("a ShutdownRequest always serializes");
        self.call("PUT", VM_SHUTDOWN, Some(&body))
    }

    /// `PUT /api/v1/vm.bounce-pool`.
    pub fn set_bounce_pool(&self, pool: BouncePool) -> Result<BouncePool, ControlError> {
        let body = serde_json::to_vec(&pool).expect("a BouncePool always serializes");
        self.call("PUT", VM_BOUNCE_POOL, Some(&body))
    }

    /// `PUT /api/v1/vm.plug`: `device` (as the spec names it, without options) into its slot.
    pub fn plug(&self, device: &str) -> Result<SlotInfo, ControlError> {
        let body = serde_json::to_vec(&PlugRequest { device: device.into() }).expect("a PlugRequest always serializes");
        self.call("PUT", VM_PLUG, Some(&body))
    }

    /// `PUT /api/v1/vm.unplug`: `device` out of its slot, by `surprise` or in order.
    pub fn unplug(&self, device: &str, surprise: bool) -> Result<SlotInfo, ControlError> {
        let request = UnplugRequest { device: device.into(), surprise };
        let body = serde_json::to_vec(&request).expect("an UnplugRequest always serializes");
        self.call("PUT", VM_UNPLUG, Some(&body))
    }

    /// `PUT /api/v1/vm.snapshot`: stop the VM and write its snapshot into its `--snapshot-to`
    /// directory (the process's exit line says when it is written).
    pub fn snapshot(&self) -> Result<SnapshotAccepted, ControlError> {
        self.call("PUT", VM_SNAPSHOT, None)
    }

    /// `PUT /api/v1/vm.snapshot` with `then`: with [`AfterSnapshot::Resume`] the answer comes
    /// once the snapshot is written (its `written`), the VM running on.
    pub fn snapshot_then(&self, then: AfterSnapshot) -> Result<SnapshotAccepted, ControlError> {
        let body = serde_json::to_vec(&SnapshotRequest { then }).expect("a SnapshotRequest always serializes");
        self.call("PUT", VM_SNAPSHOT, Some(&body))
    }

    /// One request; the answer's JSON body as `T`.
    pub fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        route: &str,
        body: Option<&[u8]>,
    ) -> Result<T, ControlError> {
        let io = |source| ControlError::Io { path: self.path.clone(), source };
        let bad = |reason: String| ControlError::BadAnswer { path: self.path.clone(), reason };
        let mut stream = UnixStream::connect(&self.path).map_err(io)?;
        stream.set_read_timeout(Some(self.timeout)).map_err(io)?;
        stream.set_write_timeout(Some(self.timeout)).map_err(io)?;
        let body = body.unwrap_or_default();
        let head = format!(
            "{method} {route} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).map_err(io)?;
        let mut answer = Vec::new();
        stream.take(MAX_ANSWER_BYTES as u64 + 1).read_to_end(&mut answer).map_err(io)?;
        if answer.len() > MAX_ANSWER_BYTES {
            return Err(bad(format!("more than {MAX_ANSWER_BYTES} bytes")));
        }
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut response = httparse::Response::new(&mut headers);
        let header_len = match response.parse(&answer) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Err(bad("the answer ended early".into())),
            Err(e) => return Err(bad(e.to_string())),
        };
        let status = response.code.unwrap_or(0);
        let body = &answer[header_len..];
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<ErrorBody>(body)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(body).chars().take(200).collect());
            return Err(ControlError::Refused { path: self.path.clone(), status, message });
        }
        serde_json::from_slice(body).map_err(|e| bad(e.to_string()))
    }

    /// Waits up to `timeout` for the socket to answer `vm.info` (a VMM just started).
    pub fn wait_until_serving(&self, timeout: Duration) -> Result<VmInfo, ControlError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.info() {
                Ok(info) => return Ok(info),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }
}

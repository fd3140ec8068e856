//! The daemon the API tests talk to, and what they share: a `driverlab serve` on its own socket
//! and database, the client, curl, the run's events, the probe matrix, the file limits.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api::client::{Answer, Client};
use serde_json::Value;

use crate::common::{self, driverlab};

/// A daemon on its own socket and database, killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub tcp: Option<String>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    pub fn start(dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_under(&[], dir, extra)
    }

    /// The daemon run by `prefix` (e.g. `prlimit --as=...`), when it is not empty.
    pub fn start_under(prefix: &[&str], dir: &Path, extra: &[&str]) -> Daemon {
        let socket = dir.join("api.sock");
        let mut command = match prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(driverlab());
                c
            }
            None => Command::new(driverlab()),
        };
        let mut child = command
            .args(["serve", "--socket"])
            .arg(&socket)
            .arg("--db")
            .arg(dir.join("lab.db"))
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("driverlab serve starts");
        // Its first lines say where it listens.
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("driverlab API on tcp://") {
                    let _ = tx.send(addr.split_whitespace().next().unwrap_or_default().to_string());
                }
            }
        });
        let tcp = extra.contains(&"--listen").then(|| rx.recv_timeout(Duration::from_secs(10)).expect("a TCP address"));
        // Answering, not just there: a daemon killed before leaves its socket behind.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the daemon answers on its socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { child, socket, tcp }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    /// `curl --unix-socket` with `args`; (HTTP status, body).
    pub fn curl(&self, args: &[&str]) -> (u16, String) {
        let out = Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "--unix-socket"])
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

pub fn call(client: &Client, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Answer {
    runtime().block_on(client.call(method, path, headers, body.map(<[u8]>::to_vec))).unwrap()
}

pub fn json_of(answer: &Answer) -> Value {
    serde_json::from_slice(&answer.body)
        .unwrap_or_else(|e| panic!("{e}: {} {}", answer.status, String::from_utf8_lossy(&answer.body)))
}

pub fn have_curl(test: &str) -> bool {
    if Command::new("curl").arg("--version").output().is_err() {
        common::skip(test, common::Lacks::Setup, "no curl (apt-get install curl)");
        return false;
    }
    true
}

/// The events of a run's stream, as JSON, until it ends (or `recorded` repetitions came).
pub fn events(daemon: &Daemon, run: &str, recorded: Option<usize>) -> Vec<Value> {
    let mut seen: Vec<Value> = Vec::new();
    runtime()
        .block_on(daemon.client().events(&format!("/v1/runs/{run}/events"), |data| {
            seen.push(serde_json::from_str(data).unwrap());
            recorded.is_none_or(|n| seen.iter().filter(|e| e["event"] == "recorded").count() < n)
        }))
        .unwrap();
    seen
}

pub fn probe_matrix() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/probe-matrix.toml").display().to_string()
}

/// What a report says per cell that does not change from run to run.
pub fn cell_facts(report: &Value) -> Vec<(String, String, u64, Value, f64)> {
    report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["cell"].as_str().unwrap().into(),
                c["variant"].as_str().unwrap().into(),
                c["n"].as_u64().unwrap(),
                c["status"].clone(),
                c["metrics"]["maps_per_packet"]["mean"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// A test daemon on TCP with a token; its token.
pub fn tcp_daemon(dir: &Path, prefix: &[&str]) -> (Daemon, String) {
    let token = "bounds-token-0123456789abcdef".to_string();
    std::fs::write(dir.join("token"), &token).unwrap();
    let token_file = dir.join("token").display().to_string();
    (Daemon::start_under(prefix, dir, &["--listen", "127.0.0.1:0", "--token-file", &token_file]), token)
}

/// Raises this process's open-file limit to its hard limit (the flood needs thousands).
pub fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit with a pointer to a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    limit.rlim_cur
}

pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

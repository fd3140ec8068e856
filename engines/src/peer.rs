//! The traffic peer a workload runs against, with the server its workload talks to
//! ([`PeerServer`]: `iperf3 -s`, or `sockperf server` for the latency workload).
//!
//! For a software model, a network namespace of its own with a TAP device, the peer's addresses
//! on it and the server in it; the model runs in the namespace and moves frames between the TAP
//! and the guest. For a host NIC, a remote machine on the NIC's wire, reached over SSH, where the
//! server serves the repetition. The lab removes it all when the repetition ends.
//!
//! ```text
//! guest 10.77.0.2/24, fd77::2/64 --driver--> model --TAP dltap0--> netns: 10.77.0.1/24, fd77::1/64, iperf3 -s
//! guest --driver--> host NIC --wire--> peer machine (ssh user@peer): iperf3 -s -1
//! ```

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;
use vm_spec::model_control::ModelReport;

/// The TAP device's name inside the namespace.
pub const TAP: &str = "dltap0";

/// The guest's and the peer's addresses on the wire between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses {
    /// The guest's IPv4 address and prefix.
    pub guest_v4: String,
    /// The peer's IPv4 address.
    pub peer_v4: String,
    /// The guest's IPv6 address and prefix.
    pub guest_v6: String,
    /// The peer's IPv6 address.
    pub peer_v6: String,
}

impl Default for Addresses {
    /// The namespace peer's: 10.77.0.0/24 and fd77::/64, the guest `.2`, the peer `.1`.
    fn default() -> Addresses {
        Addresses {
            guest_v4: "10.77.0.2/24".into(),
            peer_v4: "10.77.0.1".into(),
            guest_v6: "fd77::2/64".into(),
            peer_v6: "fd77::1".into(),
        }
    }
}

impl Addresses {
    /// The kernel command line words that point the guest agent at the peer.
    pub fn cmdline(&self) -> String {
        format!(
            "driverlab.ip={} driverlab.peer={} driverlab.ip6={} driverlab.peer6={}",
            self.guest_v4, self.peer_v4, self.guest_v6, self.peer_v6
        )
    }
}

/// Errors setting the peer up.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A command failed.
    #[error("setting up the peer: {what}: {detail}")]
    Command {
        /// The command.
        what: String,
        /// Its output.
        detail: String,
    },
}

/// The server a peer runs for its workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerServer {
    /// `iperf3 -s` (the iperf3 and packet-rate workloads).
    Iperf3,
    /// `sockperf server` on UDP port [`SOCKPERF_UDP_PORT`] or TCP port [`SOCKPERF_TCP_PORT`]
    /// (the latency workload).
    Sockperf {
        /// TCP, else UDP.
        tcp: bool,
    },
    /// `driverlab peer udp-source` on port [`crate::udp_source::PORT`]: a load the guest asks
    /// for with one datagram (the xdp workload, whose program leaves no control connection).
    UdpSource,
    /// `driverlab peer ssh-remote`: an SSH server the kernel's NIC selftests reach as their
    /// remote, the guest's key enrolled on port [`crate::ssh_remote::ENROLL_PORT`] (the
    /// kselftest workload; [`crate::ssh_remote`]).
    SshRemote,
}

/// The port of the peer's UDP `sockperf server` (the agent's `driverlab.sockperf`).
pub const SOCKPERF_UDP_PORT: u16 = 11111;
/// The port of the peer's TCP `sockperf server`.
pub const SOCKPERF_TCP_PORT: u16 = 11112;

impl PeerServer {
    /// Its command line, listening on `address` (the peer's IPv4 address); `once` for a remote
    /// peer (iperf3 serves one test and exits; driverlab is the one on its `PATH`).
    fn command(self, address: &str, once: bool) -> Vec<String> {
        let words: Vec<String> = match self {
            PeerServer::Iperf3 if once => ["iperf3", "-s", "-1", "--forceflush"].map(String::from).into(),
            PeerServer::Iperf3 => ["iperf3", "-s"].map(String::from).into(),
            PeerServer::UdpSource => {
                let listen = format!("{address}:{}", crate::udp_source::PORT);
                vec![driverlab(once), "peer".into(), "udp-source".into(), "--listen".into(), listen]
            }
            PeerServer::SshRemote => {
                let listen = format!("{address}:{}", crate::ssh_remote::ENROLL_PORT);
                vec![driverlab(once), "peer".into(), "ssh-remote".into(), "--listen".into(), listen]
            }
            PeerServer::Sockperf { tcp } => {
                let port = if tcp { SOCKPERF_TCP_PORT } else { SOCKPERF_UDP_PORT };
                let mut words: Vec<String> =
                    ["sockperf", "server", "-i", address, "-p", &port.to_string()].map(String::from).into();
                if tcp {
                    words.push("--tcp".into());
                }
                words
            }
        };
        words
    }

    /// What it prints once it listens.
    fn ready_line(self) -> &'static str {
        match self {
            PeerServer::Iperf3 => "Server listening",
            PeerServer::Sockperf { .. } => "to block on socket",
            PeerServer::UdpSource | PeerServer::SshRemote => "listening",
        }
    }

    /// Its program's name.
    fn program(self) -> &'static str {
        match self {
            PeerServer::Iperf3 => "iperf3",
            PeerServer::Sockperf { .. } => "sockperf",
            PeerServer::UdpSource | PeerServer::SshRemote => "driverlab",
        }
    }
}

/// The command a remote peer runs for `server` listening on `address` (after `timeout N`): what
/// a gate in front of a peer must let through.
pub fn remote_command(server: PeerServer, address: &str) -> Vec<String> {
    server.command(address, true)
}

/// This binary, for a server in the namespace; `driverlab` on a remote peer's `PATH`.
fn driverlab(remote: bool) -> String {
    match remote {
        false => std::env::current_exe().map_or("driverlab".into(), |p| p.display().to_string()),
        true => "driverlab".into(),
    }
}

/// A running peer; dropping it stops its server and removes what was made for it.
pub struct Peer {
    place: Place,
    iperf: Option<Child>,
    addresses: Addresses,
    /// A folder of the server's (the SSH remote's keys), removed with the peer.
    scratch: Option<std::path::PathBuf>,
}

enum Place {
    Namespace(String),
    Remote,
}

fn ip(args: &[&str]) -> Result<(), PeerError> {
    let out = Command::new("ip").args(args).output().map_err(|e| PeerError::Command {
        what: format!("ip {}", args.join(" ")),
        detail: format!("{e} (apt-get install iproute2)"),
    })?;
    if !out.status.success() {
        return Err(PeerError::Command {
            what: format!("ip {}", args.join(" ")),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// The SSH client: `$DRIVERLAB_SSH` (a program taking ssh's arguments), else `ssh`.
pub fn ssh_program() -> String {
    std::env::var("DRIVERLAB_SSH").unwrap_or_else(|_| "ssh".into())
}

/// How long a remote peer may take to answer and start iperf3.
const REMOTE_START: Duration = Duration::from_secs(20);

impl Peer {
    /// Creates a namespace `driverlab-PID-N` with the TAP and the peer's addresses, and starts
    /// `server` in it. Needs root.
    pub fn namespace(server: PeerServer) -> Result<Peer, PeerError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let netns = format!("driverlab-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let addresses = Addresses::default();
        ip(&["netns", "add", &netns])?;
        let mut peer = Peer { place: Place::Namespace(netns.clone()), iperf: None, addresses, scratch: None };
        let ns = netns.as_str();
        wire(ns, &peer.addresses)?;
        let mut words = server.command(&peer.addresses.peer_v4, false);
        if server == PeerServer::SshRemote {
            let dir = std::env::temp_dir().join(format!("{netns}-ssh"));
            std::fs::create_dir(&dir)
                .map_err(|e| PeerError::Command { what: format!("making {}", dir.display()), detail: e.to_string() })?;
            words.extend(["--dir".into(), dir.display().to_string()]);
            peer.scratch = Some(dir);
        }
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", ns])
            .args(&words)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        crate::vm_process::die_with_parent(&mut command);
        let child = command.spawn().map_err(|e| PeerError::Command {
            what: words.join(" "),
            detail: format!("{e} (apt-get install {})", server.program()),
        })?;
        peer.iperf = Some(child);
        // The servers listen within milliseconds; a client that comes too early retries anyway
        // (iperf3 for --connect-timeout, sockperf in its warm-up).
        std::thread::sleep(Duration::from_millis(50));
        Ok(peer)
    }

    /// Starts `server` on `destination` over SSH (iperf3 with `-1`: one test, then it exits),
    /// limited to `limit` there too, and waits until it listens. `destination` is
    /// `[user@]host`, which the matrix checked; SSH runs in batch mode, so it needs a key, not a
    /// password.
    pub fn remote(
        destination: &str,
        addresses: Addresses,
        limit: Duration,
        server: PeerServer,
    ) -> Result<Peer, PeerError> {
        Peer::remote_with(&ssh_program(), destination, addresses, limit, server)
    }

    /// [`Peer::remote`] with the SSH client `ssh`.
    pub fn remote_with(
        ssh: &str,
        destination: &str,
        addresses: Addresses,
        limit: Duration,
        server: PeerServer,
    ) -> Result<Peer, PeerError> {
        let words = server.command(&addresses.peer_v4, true);
        let what = format!("{ssh} {destination} {}", words.join(" "));
        let (program, ready) = (server.program(), server.ready_line());
        let mut command = Command::new(ssh);
        command
            .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5", "--"])
            .arg(destination)
            .args(["timeout", &format!("{}", limit.as_secs().max(1))])
            .args(&words)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        crate::vm_process::die_with_parent(&mut command);
        let mut child = command.spawn().map_err(|e| PeerError::Command {
            what: what.clone(),
            detail: format!("{e} (apt-get install openssh-client, or set DRIVERLAB_SSH)"),
        })?;
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        // The server says when it listens; wait for that line, or for SSH to give up.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let listening = lines.by_ref().map_while(Result::ok).any(|l| l.contains(ready));
            let _ = tx.send(listening);
            // Keep reading so that the server's reports never block on a full pipe.
            lines.for_each(drop);
        });
        let fail = |child: &mut Child, stderr: &mut dyn Read, why: String| {
            let _ = child.kill();
            let _ = child.wait();
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            let said = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim().to_string();
            PeerError::Command {
                what: what.clone(),
                detail: if said.is_empty() { why } else { format!("{why}: {said}") },
            }
        };
        match rx.recv_timeout(REMOTE_START) {
            Ok(true) => {}
            Ok(false) => {
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                return Err(fail(&mut child, &mut stderr, format!("it ended ({status}) before {program} listened")));
            }
            Err(_) => {
                return Err(fail(
                    &mut child,
                    &mut stderr,
                    format!("{program} did not listen within {} s", REMOTE_START.as_secs()),
                ));
            }
        }
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
        });
        Ok(Peer { place: Place::Remote, iperf: Some(child), addresses, scratch: None })
    }

    /// The namespace's name, for a namespace peer.
    pub fn netns(&self) -> Option<&str> {
        match &self.place {
            Place::Namespace(netns) => Some(netns),
            Place::Remote => None,
        }
    }

    /// Whether `iperf3 -s` (or the SSH session that runs it) still runs.
    pub fn serving(&mut self) -> bool {
        self.iperf.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The kernel command line words that point the guest agent at this peer.
    pub fn cmdline(&self) -> String {
        self.addresses.cmdline()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // A remote iperf3 ends by itself after its one test, or at its time limit.
        if let Some(mut child) = self.iperf.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Place::Namespace(netns) = &self.place {
            let _ = ip(&["-n", netns, "link", "del", TAP]);
            if let Err(e) = ip(&["netns", "del", netns]) {
                tracing::warn!("{e}");
            }
        }
        if let Some(dir) = self.scratch.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A device model's counters from a host NIC's peer: the nested lab box's cards are models on
/// the host, whose gate answers `driverlab model counters` with a status line for each line it
/// reads (the nested lab box's gate, `nested_box::gate`). One SSH session for the whole repetition, so that each
/// look costs a round trip, not a handshake.
pub struct RemoteCounters {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
    confinement: Option<vm_spec::confinement::Confinement>,
}

/// How long one look at a remote model's counters may take.
const REMOTE_LOOK: Duration = Duration::from_secs(10);

impl RemoteCounters {
    /// Opens the session to `destination` and takes a first look (so that a peer that cannot
    /// answer is an error now, not a missing figure later).
    pub fn open(destination: &str) -> Result<RemoteCounters, PeerError> {
        let ssh = ssh_program();
        let what = format!("{ssh} {destination} driverlab model counters");
        let mut command = Command::new(&ssh);
        command
            .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5", "--"])
            .arg(destination)
            .args(["driverlab", "model", "counters"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        crate::vm_process::die_with_parent(&mut command);
        let mut child =
            command.spawn().map_err(|e| PeerError::Command { what: what.clone(), detail: e.to_string() })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut remote = RemoteCounters { child, stdin, lines, confinement: None };
        let first = remote.look();
        let report = first.as_deref().and_then(ModelReport::parse);
        remote.confinement = report.as_ref().and_then(|r| r.confinement.clone());
        if report.is_none() {
            let _ = remote.child.kill();
            let _ = remote.child.wait();
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            let said = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim().to_string();
            let got = first.unwrap_or_else(|| "no answer".into());
            return Err(PeerError::Command {
                what,
                detail: if said.is_empty() { got } else { format!("{got}: {said}") },
            });
        }
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
        });
        Ok(remote)
    }

    /// The model's answer line, or `None` when the peer does not answer in time.
    fn look(&mut self) -> Option<String> {
        use std::io::Write;
        self.stdin.write_all(b"\n").ok()?;
        self.stdin.flush().ok()?;
        self.lines.recv_timeout(REMOTE_LOOK).ok()
    }

    /// What the model has counted so far, or `None` when the peer does not answer in time.
    pub fn counters(&mut self) -> Option<vm_spec::counters::ModelCounters> {
        ModelReport::parse(&self.look()?).map(|report| report.counters)
    }

    /// How the model behind the peer is confined, from its first answer.
    pub fn confinement(&self) -> Option<vm_spec::confinement::Confinement> {
        self.confinement.clone()
    }
}

impl Drop for RemoteCounters {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sets up the peer's end of the wire in the network namespace `netns`, which exists: loopback
/// up, the TAP device [`TAP`] with the peer's addresses, up.
fn wire(ns: &str, addresses: &Addresses) -> Result<(), PeerError> {
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    ip(&["-n", ns, "tuntap", "add", "dev", TAP, "mode", "tap"])?;
    ip(&["-n", ns, "addr", "add", &format!("{}/24", addresses.peer_v4), "dev", TAP])?;
    ip(&["-n", ns, "-6", "addr", "add", &format!("{}/64", addresses.peer_v6), "dev", TAP, "nodad"])?;
    ip(&["-n", ns, "link", "set", TAP, "up"])
}

/// A network namespace with the peer's end of a model's wire ([`TAP`] with the peer's
/// addresses) and no server in it: the nested lab box's cards, whose iperf3 servers their SSH
/// peer starts per test. Dropping it deletes the namespace.
pub struct WireNamespace {
    netns: String,
}

impl WireNamespace {
    /// Creates `netns` (deleting a stale one of the same name first) with the wire in it. Needs
    /// root.
    pub fn create(netns: &str, addresses: &Addresses) -> Result<WireNamespace, PeerError> {
        let _ = ip(&["netns", "del", netns]);
        ip(&["netns", "add", netns])?;
        let namespace = WireNamespace { netns: netns.to_string() };
        wire(netns, addresses)?;
        Ok(namespace)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.netns
    }
}

impl Drop for WireNamespace {
    fn drop(&mut self) {
        let _ = ip(&["-n", &self.netns, "link", "del", TAP]);
        if let Err(e) = ip(&["netns", "del", &self.netns]) {
            tracing::warn!("{e}");
        }
    }
}

/// Whether this process may create network namespaces (it runs as root).
pub fn can_create() -> bool {
    rustix::process::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have_iperf3(test: &str) -> bool {
        if Command::new("iperf3").arg("--version").output().is_err() {
            testkit::skip(test, testkit::Lacks::Setup, "no iperf3 (apt-get install iperf3)");
            return false;
        }
        true
    }

    #[test]
    fn a_peer_has_its_namespace_addresses_and_server_and_leaves_nothing() {
        let test = "a_peer_has_its_namespace_addresses_and_server_and_leaves_nothing";
        if !can_create() {
            testkit::skip(test, testkit::Lacks::Setup, "needs root (network namespaces)");
            return;
        }
        if !have_iperf3(test) {
            return;
        }
        let mut peer = Peer::namespace(PeerServer::Iperf3).unwrap();
        let netns = peer.netns().unwrap().to_string();
        let addrs = Command::new("ip").args(["-n", &netns, "addr", "show", TAP]).output().unwrap();
        let addrs = String::from_utf8_lossy(&addrs.stdout);
        assert!(addrs.contains("10.77.0.1/24") && addrs.contains("fd77::1/64"), "{addrs}");
        // Waits for the listening socket itself.
        let listens = || {
            let out = Command::new("ip").args(["netns", "exec", &netns, "ss", "-ltn"]).output().unwrap();
            String::from_utf8_lossy(&out.stdout).contains(":5201")
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !listens() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(peer.serving(), "iperf3 -s runs");
        assert!(listens(), "iperf3 listens in the namespace");
        assert!(peer.cmdline().contains("driverlab.peer=10.77.0.1"));
        drop(peer);
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        assert!(!String::from_utf8_lossy(&list.stdout).contains(&netns), "the namespace is gone");
    }

    /// An `ssh` that runs the command here: it takes ssh's options and destination, logs them,
    /// and runs the rest. Real SSH to another machine needs one; the lab's side is all here.
    fn fake_ssh(dir: &std::path::Path, body: &str) -> String {
        let path = dir.join("ssh");
        std::fs::write(&path, format!("#!/bin/sh\necho \"$*\" > {}/args\n{body}\n", dir.display())).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    #[test]
    fn a_remote_peer_serves_one_test_over_ssh_and_ssh_failures_say_why() {
        if !have_iperf3("a_remote_peer_serves_one_test_over_ssh_and_ssh_failures_say_why") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Options up to `--`, then the destination, then the remote command.
        let ssh = fake_ssh(dir.path(), "while [ \"$1\" != -- ]; do shift; done; shift 2; exec \"$@\"");
        let addresses = Addresses { peer_v4: "127.0.0.1".into(), ..Addresses::default() };
        let mut peer =
            Peer::remote_with(&ssh, "lab@peer-box", addresses, Duration::from_secs(30), PeerServer::Iperf3).unwrap();
        let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
        assert!(args.contains("BatchMode=yes") && args.contains("-- lab@peer-box timeout 30 iperf3 -s -1"), "{args}");
        assert!(peer.serving());
        assert!(peer.netns().is_none());
        assert!(peer.cmdline().contains("driverlab.peer=127.0.0.1"));
        // It really listens: one client test, and then the one-off server is done.
        let client = Command::new("iperf3").args(["-c", "127.0.0.1", "-t", "1", "--json"]).output().unwrap();
        assert!(client.status.success(), "{}", String::from_utf8_lossy(&client.stdout));
        // Waits for the one-off server to end (or 10 s).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while peer.serving() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!peer.serving(), "iperf3 -s -1 ended after its test");
        drop(peer);

        let refused = fake_ssh(dir.path(), "echo 'lab@peer-box: Permission denied (publickey).' >&2; exit 255");
        let err = Peer::remote_with(
            &refused,
            "lab@peer-box",
            Addresses::default(),
            Duration::from_secs(30),
            PeerServer::Iperf3,
        )
        .err()
        .unwrap();
        let text = err.to_string();
        assert!(text.contains("before iperf3 listened") && text.contains("Permission denied (publickey)"), "{text}");
    }
}

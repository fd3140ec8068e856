//! The traffic peer of a software model: a network namespace of its own with a TAP device, the
//! peer's addresses on it and `iperf3 -s` bound in it. The model runs in the namespace and moves
//! frames between the TAP and the guest; the lab removes it all when the repetition ends.
//!
//! ```text
//! guest 10.77.0.2/24, fd77::2/64 --driver--> model --TAP dltap0--> netns: 10.77.0.1/24, fd77::1/64, iperf3 -s
//! ```

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The TAP device's name inside the namespace.
pub const TAP: &str = "dltap0";
/// The peer's addresses.
pub const PEER_V4: &str = "10.77.0.1";
/// The guest's IPv4 address and prefix.
pub const GUEST_V4: &str = "10.77.0.2/24";
/// The peer's IPv6 address.
pub const PEER_V6: &str = "fd77::1";
/// The guest's IPv6 address and prefix.
pub const GUEST_V6: &str = "fd77::2/64";

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

/// A running peer; dropping it stops iperf3 and removes the namespace with its TAP.
pub struct Peer {
    netns: String,
    iperf: Option<Child>,
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

impl Peer {
    /// Creates a namespace `driverlab-PID-N` with the TAP and the peer's addresses, and starts
    /// `iperf3 -s` in it. Needs root.
    pub fn start() -> Result<Peer, PeerError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let netns = format!("driverlab-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        ip(&["netns", "add", &netns])?;
        let mut peer = Peer { netns, iperf: None };
        let ns = peer.netns.clone();
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&["-n", &ns, "tuntap", "add", "dev", TAP, "mode", "tap"])?;
        ip(&["-n", &ns, "addr", "add", &format!("{PEER_V4}/24"), "dev", TAP])?;
        ip(&["-n", &ns, "-6", "addr", "add", &format!("{PEER_V6}/64"), "dev", TAP, "nodad"])?;
        ip(&["-n", &ns, "link", "set", TAP, "up"])?;
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &ns, "iperf3", "-s"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        crate::vm_process::die_with_parent(&mut command);
        let child =
            command.spawn().map_err(|e| PeerError::Command { what: "iperf3 -s".into(), detail: e.to_string() })?;
        peer.iperf = Some(child);
        // iperf3 listens within milliseconds; a client that comes too early retries anyway.
        std::thread::sleep(Duration::from_millis(50));
        Ok(peer)
    }

    /// The namespace's name.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// Whether `iperf3 -s` still runs.
    pub fn serving(&mut self) -> bool {
        self.iperf.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The kernel command line words that point the guest agent at this peer.
    pub fn cmdline(&self) -> String {
        format!("driverlab.ip={GUEST_V4} driverlab.peer={PEER_V4} driverlab.ip6={GUEST_V6} driverlab.peer6={PEER_V6}")
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(mut child) = self.iperf.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = ip(&["-n", &self.netns, "link", "del", TAP]);
        if let Err(e) = ip(&["netns", "del", &self.netns]) {
            tracing::warn!("{e}");
        }
    }
}

/// Whether this process may create network namespaces (it runs as root).
pub fn can_create() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_has_its_namespace_addresses_and_server_and_leaves_nothing() {
        if !can_create() {
            eprintln!(
                "SKIP a_peer_has_its_namespace_addresses_and_server_and_leaves_nothing: needs root (network namespaces)"
            );
            return;
        }
        if Command::new("iperf3").arg("--version").output().is_err() {
            eprintln!(
                "SKIP a_peer_has_its_namespace_addresses_and_server_and_leaves_nothing: no iperf3 (apt-get install iperf3)"
            );
            return;
        }
        let mut peer = Peer::start().unwrap();
        let netns = peer.netns().to_string();
        let addrs = Command::new("ip").args(["-n", &netns, "addr", "show", TAP]).output().unwrap();
        let addrs = String::from_utf8_lossy(&addrs.stdout);
        assert!(addrs.contains("10.77.0.1/24") && addrs.contains("fd77::1/64"), "{addrs}");
        std::thread::sleep(Duration::from_millis(200));
        assert!(peer.serving(), "iperf3 -s runs");
        let listening = Command::new("ip").args(["netns", "exec", &netns, "ss", "-ltn"]).output().unwrap();
        assert!(String::from_utf8_lossy(&listening.stdout).contains(":5201"), "iperf3 listens in the namespace");
        assert!(peer.cmdline().contains("driverlab.peer=10.77.0.1"));
        drop(peer);
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        assert!(!String::from_utf8_lossy(&list.stdout).contains(&netns), "the namespace is gone");
    }
}

//! A card's gate: the only command the box's SSH key for that card may run on the host
//! (`command="driverlab nested-box gate --netns NS --control SOCK"` in the sshd's authorized
//! keys). It reads what the box asked for from `SSH_ORIGINAL_COMMAND` and allows exactly two
//! things:
//!
//! - `timeout N iperf3 -s -1 --forceflush`, what the lab runs on a real NIC's peer
//!   ([`engines::peer::Peer::remote`]): run in the card's wire namespace;
//! - `driverlab model counters`: for each line on stdin, one line of the card's model status
//!   (its control socket's answer to `status`), so that the box's lab can set the model's count
//!   beside its own virtio-iommu's ([`engines::peer::RemoteCounters`]).
//!
//! Anything else is refused with a line on stderr and exit code 1.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::Command;

/// What the box may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateCommand {
    /// `timeout N iperf3 -s -1 --forceflush`.
    Iperf3Server {
        /// The limit in seconds.
        limit_s: u64,
    },
    /// `driverlab model counters`.
    ModelCounters,
}

/// The command the box asked for, if it is one the gate allows.
pub fn parse(original: &str) -> Result<GateCommand, String> {
    let words: Vec<&str> = original.split_whitespace().collect();
    match words.as_slice() {
        ["timeout", limit, "iperf3", "-s", "-1", "--forceflush"] => match limit.parse::<u64>() {
            Ok(limit_s) if (1..=86_400).contains(&limit_s) => Ok(GateCommand::Iperf3Server { limit_s }),
            _ => Err(format!("the limit {limit:?} is not 1 to 86400 seconds")),
        },
        ["driverlab", "model", "counters"] => Ok(GateCommand::ModelCounters),
        _ => Err(format!(
            "{:?} is not allowed here: only `timeout N iperf3 -s -1 --forceflush` and `driverlab model counters`",
            original.chars().take(200).collect::<String>()
        )),
    }
}

/// Runs the gate for the card whose wire is `netns` and whose model's control socket is
/// `control`; returns the exit code.
pub fn run(netns: &str, control: &Path) -> i32 {
    let original = std::env::var("SSH_ORIGINAL_COMMAND").unwrap_or_default();
    match parse(&original) {
        Ok(GateCommand::Iperf3Server { limit_s }) => {
            iperf3_server(netns, limit_s, &control.with_extension("iperf3.pid"))
        }
        Ok(GateCommand::ModelCounters) => {
            let stdin = std::io::stdin();
            let mut stdout = std::io::stdout();
            for line in stdin.lock().lines() {
                if line.is_err() {
                    break;
                }
                let answer = status(control).unwrap_or_else(|error| {
                    serde_json::to_string(&vm_spec::model_control::ModelRefusal { error }).unwrap_or_default()
                });
                if writeln!(stdout, "{}", answer.trim_end()).and_then(|()| stdout.flush()).is_err() {
                    break;
                }
            }
            0
        }
        Err(why) => {
            eprintln!("gate: {why}");
            1
        }
    }
}

/// Runs `timeout LIMIT iperf3 -s -1` in `netns` until it ends. A server the card's last
/// repetition left (its SSH session gone, iperf3 still waiting for a client that never came)
/// would hold the port: the one `pidfile` names is stopped first. A card's peer serves one lab,
/// which holds the card's lease, so such a server is always stale.
fn iperf3_server(netns: &str, limit_s: u64, pidfile: &Path) -> i32 {
    use std::os::unix::process::CommandExt;
    if let Some(pid) = std::fs::read_to_string(pidfile).ok().and_then(|t| t.trim().parse::<i32>().ok()) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains("iperf3") {
            // The process group the last server ran in (its own, below).
            if let Some(group) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::TERM);
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::path::Path::new(&format!("/proc/{pid}")).exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    let child = Command::new("ip")
        .args(["netns", "exec", netns, "timeout", &limit_s.to_string(), "iperf3", "-s", "-1", "--forceflush"])
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            eprintln!("gate: ip netns exec {netns} iperf3: {e}");
            return 1;
        }
    };
    let _ = std::fs::write(pidfile, child.id().to_string());
    let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(1);
    if std::fs::read_to_string(pidfile).is_ok_and(|t| t.trim() == child.id().to_string()) {
        let _ = std::fs::remove_file(pidfile);
    }
    code
}

/// The model's status line from its control socket.
fn status(control: &Path) -> Result<String, String> {
    let request = vm_spec::model_control::ModelRequest::Status;
    vm_spec::model_control::ask(control, request, std::time::Duration::from_secs(2))
        .map_err(|e| format!("{}: {e}", control.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_peer_s_two_commands_pass() {
        assert_eq!(parse("timeout 120 iperf3 -s -1 --forceflush"), Ok(GateCommand::Iperf3Server { limit_s: 120 }));
        assert_eq!(parse("driverlab model counters"), Ok(GateCommand::ModelCounters));
        for refused in [
            "",
            "sh",
            "timeout 0 iperf3 -s -1 --forceflush",
            "timeout 99999999 iperf3 -s -1 --forceflush",
            "timeout 10 iperf3 -s -1 --forceflush; rm -rf /",
            "timeout 10 iperf3 -s --forceflush",
            "driverlab model control /tmp/x link-down",
            "timeout 10 sh -c iperf3",
        ] {
            assert!(parse(refused).is_err(), "{refused:?} refused");
        }
        assert!(parse("cat /etc/shadow").unwrap_err().contains("not allowed here"));
    }
}

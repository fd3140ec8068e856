//! A card's gate: the only command the box's SSH key for that card may run on the host
//! (`command="driverlab nested-box gate --netns NS --control SOCK"` in the sshd's authorized
//! keys). It reads what the box asked for from `SSH_ORIGINAL_COMMAND` and allows exactly these:
//!
//! - the servers the lab runs on a real NIC's peer ([`engines::peer::Peer::remote`]), each run
//!   in the card's wire namespace: `timeout N iperf3 -s -1 --forceflush` (iperf3 and
//!   packet-rate workloads), `timeout N sockperf server -i ADDR -p 11111|11112 [--tcp]`
//!   (latency), `timeout N driverlab peer udp-source --listen ADDR:9000` (xdp; this host's
//!   driverlab);
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
    /// `timeout N sockperf server -i ADDR -p PORT [--tcp]`.
    SockperfServer {
        /// The limit in seconds.
        limit_s: u64,
        /// The address to listen on.
        address: std::net::Ipv4Addr,
        /// TCP (port 11112), else UDP (port 11111).
        tcp: bool,
    },
    /// `timeout N driverlab peer udp-source --listen ADDR:9000`.
    UdpSource {
        /// The limit in seconds.
        limit_s: u64,
        /// The address to listen on.
        address: std::net::Ipv4Addr,
    },
    /// `driverlab model counters`.
    ModelCounters,
}

impl GateCommand {
    /// The command it runs in the card's namespace, for a server.
    fn server(&self, driverlab: &str) -> Option<Vec<String>> {
        let (limit_s, words): (u64, Vec<String>) = match *self {
            GateCommand::Iperf3Server { limit_s } => {
                (limit_s, ["iperf3", "-s", "-1", "--forceflush"].map(String::from).into())
            }
            GateCommand::SockperfServer { limit_s, address, tcp } => {
                let port = if tcp { engines::peer::SOCKPERF_TCP_PORT } else { engines::peer::SOCKPERF_UDP_PORT };
                let mut words: Vec<String> =
                    ["sockperf", "server", "-i", &address.to_string(), "-p", &port.to_string()]
                        .map(String::from)
                        .into();
                if tcp {
                    words.push("--tcp".into());
                }
                (limit_s, words)
            }
            GateCommand::UdpSource { limit_s, address } => {
                let listen = format!("{address}:{}", engines::udp_source::PORT);
                (limit_s, [driverlab, "peer", "udp-source", "--listen", &listen].map(String::from).into())
            }
            GateCommand::ModelCounters => return None,
        };
        let mut command = vec!["timeout".to_string(), limit_s.to_string()];
        command.extend(words);
        Some(command)
    }
}

/// A limit the gate accepts: 1 s to a day.
fn limit(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(limit_s) if (1..=86_400).contains(&limit_s) => Ok(limit_s),
        _ => Err(format!("the limit {text:?} is not 1 to 86400 seconds")),
    }
}

/// An IPv4 address a server may listen on.
fn address(text: &str) -> Result<std::net::Ipv4Addr, String> {
    text.parse().map_err(|_| format!("{text:?} is not an IPv4 address"))
}

/// The command the box asked for, if it is one the gate allows.
pub fn parse(original: &str) -> Result<GateCommand, String> {
    let words: Vec<&str> = original.split_whitespace().collect();
    let (udp, tcp) = (engines::peer::SOCKPERF_UDP_PORT.to_string(), engines::peer::SOCKPERF_TCP_PORT.to_string());
    match words.as_slice() {
        ["timeout", n, "iperf3", "-s", "-1", "--forceflush"] => Ok(GateCommand::Iperf3Server { limit_s: limit(n)? }),
        ["timeout", n, "sockperf", "server", "-i", ip, "-p", port] if *port == udp => {
            Ok(GateCommand::SockperfServer { limit_s: limit(n)?, address: address(ip)?, tcp: false })
        }
        ["timeout", n, "sockperf", "server", "-i", ip, "-p", port, "--tcp"] if *port == tcp => {
            Ok(GateCommand::SockperfServer { limit_s: limit(n)?, address: address(ip)?, tcp: true })
        }
        ["timeout", n, "driverlab", "peer", "udp-source", "--listen", listen] => {
            let at = listen.parse::<std::net::SocketAddrV4>().map_err(|_| format!("{listen:?} is not ADDR:PORT"))?;
            if at.port() != engines::udp_source::PORT {
                return Err(format!("the UDP source listens on port {} only", engines::udp_source::PORT));
            }
            Ok(GateCommand::UdpSource { limit_s: limit(n)?, address: *at.ip() })
        }
        ["driverlab", "model", "counters"] => Ok(GateCommand::ModelCounters),
        _ => Err(format!(
            "{:?} is not allowed here: only the peer's servers (`timeout N iperf3 -s -1 --forceflush`, \
             `timeout N sockperf server -i ADDR -p 11111|11112 [--tcp]`, `timeout N driverlab peer udp-source --listen \
             ADDR:9000`) and `driverlab model counters`",
            original.chars().take(200).collect::<String>()
        )),
    }
}

/// Runs the gate for the card whose wire is `netns` and whose model's control socket is
/// `control`; returns the exit code.
pub fn run(netns: &str, control: &Path) -> i32 {
    let original = std::env::var("SSH_ORIGINAL_COMMAND").unwrap_or_default();
    let driverlab = std::env::current_exe().map_or("driverlab".into(), |p| p.display().to_string());
    match parse(&original) {
        Ok(
            command @ (GateCommand::Iperf3Server { .. }
            | GateCommand::SockperfServer { .. }
            | GateCommand::UdpSource { .. }),
        ) => {
            let Some(words) = command.server(&driverlab) else { return 1 };
            server(netns, &words, &control.with_extension("server.pid"))
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

/// The words in a server's command line by which the gate knows one it started.
const SERVERS: [&str; 3] = ["iperf3", "sockperf", "udp-source"];

/// Runs a server's `words` in `netns` until it ends. A server the card's last repetition left
/// (its SSH session gone, the server still waiting for a client that never came) would hold its
/// port: the one `pidfile` names, if it is still a server, is stopped first. A card's peer serves
/// one lab, which holds the card's lease, so such a server is always stale.
fn server(netns: &str, words: &[String], pidfile: &Path) -> i32 {
    use std::os::unix::process::CommandExt;
    if let Some(pid) = std::fs::read_to_string(pidfile).ok().and_then(|t| t.trim().parse::<i32>().ok()) {
        let cmdline =
            String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()).into_owned();
        if SERVERS.iter().any(|s| cmdline.contains(s)) {
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
    let child = Command::new("ip").args(["netns", "exec", netns]).args(words).process_group(0).spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            eprintln!("gate: ip netns exec {netns} {}: {e}", words.join(" "));
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
    fn only_the_peer_s_servers_and_the_counters_pass() {
        assert_eq!(parse("timeout 120 iperf3 -s -1 --forceflush"), Ok(GateCommand::Iperf3Server { limit_s: 120 }));
        assert_eq!(parse("driverlab model counters"), Ok(GateCommand::ModelCounters));
        let peer = std::net::Ipv4Addr::new(10, 77, 0, 1);
        let sockperf = parse("timeout 60 sockperf server -i 10.77.0.1 -p 11112 --tcp").unwrap();
        assert_eq!(sockperf, GateCommand::SockperfServer { limit_s: 60, address: peer, tcp: true });
        let words = sockperf.server("driverlab").unwrap();
        assert_eq!(words.join(" "), "timeout 60 sockperf server -i 10.77.0.1 -p 11112 --tcp");
        let source = parse("timeout 60 driverlab peer udp-source --listen 10.77.0.1:9000").unwrap();
        assert_eq!(source, GateCommand::UdpSource { limit_s: 60, address: peer });
        let words = source.server("/usr/bin/driverlab").unwrap();
        assert_eq!(words.join(" "), "timeout 60 /usr/bin/driverlab peer udp-source --listen 10.77.0.1:9000");
        // What the lab's remote peer asks for is what the gate takes.
        for server in [
            engines::peer::PeerServer::Iperf3,
            engines::peer::PeerServer::Sockperf { tcp: false },
            engines::peer::PeerServer::Sockperf { tcp: true },
            engines::peer::PeerServer::UdpSource,
        ] {
            let asked = format!("timeout 30 {}", engines::peer::remote_command(server, "10.77.0.1").join(" "));
            assert!(parse(&asked).is_ok(), "{asked}");
        }
        for refused in [
            "",
            "sh",
            "timeout 0 iperf3 -s -1 --forceflush",
            "timeout 99999999 iperf3 -s -1 --forceflush",
            "timeout 10 iperf3 -s -1 --forceflush; rm -rf /",
            "timeout 10 iperf3 -s --forceflush",
            "driverlab model control /tmp/x link-down",
            "timeout 10 sh -c iperf3",
            "timeout 10 sockperf server -i 10.77.0.1 -p 22",
            "timeout 10 sockperf server -i 10.77.0.1 -p 11111 --tcp",
            "timeout 10 sockperf server -i ;reboot -p 11111",
            "timeout 10 sockperf server -i 10.77.0.1 -p 11111 --load-vma=x",
            "timeout 10 driverlab peer udp-source --listen 10.77.0.1:22",
            "timeout 10 driverlab peer ssh-remote --listen 10.77.0.1:9001",
            "timeout 10 driverlab vm run --kernel x",
        ] {
            assert!(parse(refused).is_err(), "{refused:?} refused");
        }
        assert!(parse("cat /etc/shadow").unwrap_err().contains("not allowed here"));
    }
}

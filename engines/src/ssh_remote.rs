//! The peer as the remote end of the kernel's NIC selftests (the kselftest workload): an OpenSSH
//! server the suite reaches with `REMOTE_TYPE=ssh` (tools/testing/selftests/drivers/net/lib/py/
//! remote_ssh.py), on port [`SSH_PORT`] of the peer's address, with a host key made for the
//! repetition. The guest makes its own key at boot and enrolls it on a TCP connection (busybox's
//! `nc`), one line each way:
//!
//! ```text
//! guest -> peer:9001  "ssh-ed25519 BASE64 [comment]"   its public key
//! peer  -> guest      "ssh-ed25519 BASE64"             the server's host key, for known_hosts
//! ```
//!
//! A key enrolled replaces the one before (one guest per peer). What the suite runs there runs
//! through the key's forced command: in a folder of the repetition's, and, when the peer is
//! root, as a uid of its own without capabilities and with no_new_privs (`setpriv`), so that a
//! hostile guest gets an unprivileged shell in the peer's network namespace and nothing of the
//! host's root. The namespace lets that uid ping (`net.ipv4.ping_group_range`, which is the
//! namespace's own).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The port the guest enrolls its key on.
pub const ENROLL_PORT: u16 = 9001;
/// The port the SSH server listens on (beside a real peer's own sshd).
pub const SSH_PORT: u16 = 2222;
/// The longest line an enrollment reads.
const MAX_LINE: u64 = 1024;

/// Errors serving as the remote.
#[derive(Debug, thiserror::Error)]
pub enum SshRemoteError {
    /// A file of the server could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A program failed or is missing.
    #[error("{what}: {detail}")]
    Program {
        /// The program and what it was doing.
        what: String,
        /// Its output, or what to install.
        detail: String,
    },
}

/// An enrolled key: `ssh-ed25519` and its base64 blob, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestKey(String);

impl std::str::FromStr for GuestKey {
    type Err = String;

    /// `ssh-ed25519 BLOB [comment]`: an Ed25519 key's blob is 51 bytes, 68 base64 characters.
    fn from_str(line: &str) -> Result<GuestKey, String> {
        let mut words = line.split_whitespace();
        let (Some("ssh-ed25519"), Some(blob)) = (words.next(), words.next()) else {
            return Err("expected `ssh-ed25519 BASE64 [comment]`".into());
        };
        let base64 = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=');
        if blob.len() != 68 || !blob.chars().all(base64) || !blob.starts_with("AAAAC3NzaC1lZDI1NTE5") {
            return Err("not an Ed25519 public key".into());
        }
        Ok(GuestKey(format!("ssh-ed25519 {blob}")))
    }
}

/// The SSH server and what it was made with; dropping it stops the server.
pub struct SshRemote {
    dir: PathBuf,
    sshd: Child,
    command: String,
}

impl SshRemote {
    /// Makes a host key in `dir` (the repetition's, empty), the commands' folder and the
    /// server's configuration, and starts `sshd` on `address`:[`SSH_PORT`], waiting until it
    /// listens.
    pub fn start(dir: &Path, address: IpAddr) -> Result<SshRemote, SshRemoteError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SshRemoteError::Io { path, source }
        };
        let work = dir.join("work");
        std::fs::create_dir_all(&work).map_err(io(&work))?;
        let host_key = dir.join("host_key");
        program(
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "driverlab-peer", "-f"])
                .arg(&host_key),
            "ssh-keygen (openssh-client)",
        )?;
        let command = forced_command(&work)?;
        let config = dir.join("sshd_config");
        std::fs::write(&config, sshd_config(dir, address)).map_err(io(&config))?;
        if rustix::process::geteuid().is_root() {
            // sshd's privilege separation folder, as its service makes it.
            std::fs::create_dir_all("/run/sshd").map_err(io(Path::new("/run/sshd")))?;
        }
        let mut sshd = Command::new("/usr/sbin/sshd");
        sshd.args(["-D", "-e", "-f"]).arg(&config).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        crate::vm_process::die_with_parent(&mut sshd);
        let sshd = sshd.spawn().map_err(|e| SshRemoteError::Program {
            what: "/usr/sbin/sshd".into(),
            detail: format!("{e} (apt-get install openssh-server)"),
        })?;
        let mut remote = SshRemote { dir: dir.to_path_buf(), sshd, command };
        remote.wait_listening(SocketAddr::new(address, SSH_PORT))?;
        Ok(remote)
    }

    fn wait_listening(&mut self, at: SocketAddr) -> Result<(), SshRemoteError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&at, Duration::from_millis(200)).is_err() {
            if Instant::now() > deadline || !matches!(self.sshd.try_wait(), Ok(None)) {
                return Err(SshRemoteError::Program {
                    what: format!("sshd on {at}"),
                    detail: "it did not listen within 10 s (run `sshd -t -f sshd_config` to see why)".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The server's host key line (`ssh-ed25519 BASE64`).
    pub fn host_key(&self) -> Result<String, SshRemoteError> {
        let path = self.dir.join("host_key.pub");
        let text = std::fs::read_to_string(&path).map_err(|source| SshRemoteError::Io { path, source })?;
        Ok(text.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
    }

    /// Lets `key` in (instead of any key before), restricted to the forced command.
    pub fn enroll(&self, key: &GuestKey) -> Result<(), SshRemoteError> {
        let path = self.dir.join("authorized_keys");
        let line = format!("restrict,command=\"{}\" {} guest\n", self.command, key.0);
        std::fs::write(&path, line).map_err(|source| SshRemoteError::Io { path, source })
    }

    /// Answers enrollments on `listener` until the process ends: each connection sends a key
    /// line and gets the host key, or `error ...` for anything else.
    pub fn serve(&self, listener: &TcpListener) -> Result<(), SshRemoteError> {
        let host_key = self.host_key()?;
        for stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut line = String::new();
            let Ok(reader) = stream.try_clone() else { continue };
            let _ = BufReader::new(reader.take(MAX_LINE)).read_line(&mut line);
            let answer = match line.trim().parse::<GuestKey>() {
                Ok(key) => self.enroll(&key).map(|()| host_key.clone()).unwrap_or_else(|e| format!("error {e}")),
                Err(e) => format!("error {e}"),
            };
            let _ = (&stream).write_all(format!("{answer}\n").as_bytes());
        }
        Ok(())
    }
}

impl Drop for SshRemote {
    fn drop(&mut self) {
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
    }
}

fn program(command: &mut Command, what: &str) -> Result<(), SshRemoteError> {
    let out = command.output().map_err(|e| SshRemoteError::Program { what: what.into(), detail: e.to_string() })?;
    if !out.status.success() {
        let detail = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(SshRemoteError::Program { what: what.into(), detail });
    }
    Ok(())
}

/// The server's configuration: keys only (the enrolled one), no forwarding, no TTY, nothing
/// read from the host's own sshd configuration.
fn sshd_config(dir: &Path, address: IpAddr) -> String {
    let listen = SocketAddr::new(address, SSH_PORT);
    format!(
        "ListenAddress {listen}\nHostKey {host_key}\nAuthorizedKeysFile {keys}\nPidFile none\nUsePAM no\n\
         PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin forced-commands-only\n\
         StrictModes no\nAllowTcpForwarding no\nAllowAgentForwarding no\nX11Forwarding no\nPermitTTY no\n\
         PermitUserEnvironment no\nMaxSessions 16\nMaxStartups 16\nLogLevel ERROR\n",
        host_key = dir.join("host_key").display(),
        keys = dir.join("authorized_keys").display(),
    )
}

/// The command every session runs: the suite's command from the commands' folder; as root, the
/// folder goes to a uid of this process's own ([`jail::UID_BASE`] plus its PID, as the jail
/// numbers its processes) and the command runs as that uid without capabilities, and pings are
/// let through in this namespace. (The bounding set stays: with `no_new_privs` no program gains
/// a capability anyway, and dropping it would make the kernel refuse to run `ping`, whose file
/// capability it could then not honour.)
fn forced_command(work: &Path) -> Result<String, SshRemoteError> {
    let folder = work.display();
    if !rustix::process::geteuid().is_root() {
        return Ok(format!("cd {folder} && exec /bin/sh -c \\\"$SSH_ORIGINAL_COMMAND\\\""));
    }
    let uid = jail::UID_BASE + std::process::id();
    let owner = rustix::fs::Uid::from_raw(uid);
    let group = rustix::fs::Gid::from_raw(uid);
    rustix::fs::chown(work, Some(owner), Some(group))
        .map_err(|e| SshRemoteError::Io { path: work.to_path_buf(), source: e.into() })?;
    let range = "/proc/sys/net/ipv4/ping_group_range";
    std::fs::write(range, format!("0 {}", u32::MAX >> 1))
        .map_err(|source| SshRemoteError::Io { path: range.into(), source })?;
    Ok(format!(
        "cd {folder} && exec setpriv --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all \
         --no-new-privs -- /bin/sh -c \\\"$SSH_ORIGINAL_COMMAND\\\""
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_ed25519_key_line_is_enrolled() {
        let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOUJyPHDvvX+wOfxXNP87p4mwg6YGC0KZE5Ic7zVgEbd root@guest";
        assert_eq!(
            key.parse::<GuestKey>().unwrap().0,
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOUJyPHDvvX+wOfxXNP87p4mwg6YGC0KZE5Ic7zVgEbd"
        );
        for bad in [
            "",
            "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ",
            "ssh-ed25519",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOUJyPHDvvX+wOfxXNP87p4mwg6YGC0KZE5Ic7zVgEb\"",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOUJyPHDvvX+wOfxXNP87p4mwg6YGC0KZE5Ic7zVgEbd,command=x",
            "command=\"sh\" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOUJyPHDvvX+wOfxXNP87p4mwg6YGC0KZE5Ic7zVgEbd",
        ] {
            assert!(bad.parse::<GuestKey>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_configuration_takes_nothing_from_the_host_s_sshd() {
        let text = sshd_config(Path::new("/run/x"), "10.77.0.1".parse().unwrap());
        assert!(text.contains("ListenAddress 10.77.0.1:2222\n"), "{text}");
        assert!(text.contains("AuthorizedKeysFile /run/x/authorized_keys\n"), "{text}");
        assert!(
            text.contains("PasswordAuthentication no\n") && text.contains("PermitRootLogin forced-commands-only\n")
        );
    }
}

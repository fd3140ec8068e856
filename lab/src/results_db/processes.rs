//! Whether the process that took a run or a lease is still alive: on this host, a process with
//! its PID that started no later than it took it.

use std::time::Duration;

/// This host's name, for leases.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Whether the process that took something at `since` (RFC 3339) as `pid` on `host` may still
/// hold it: always for another host (the lab cannot tell), else `pid` must exist and have started
/// no later than `since` (a process that started after it only reused the PID, as a box's
/// daemon does after a reboot).
pub fn holder_alive(host: &str, pid: u32, since: &str) -> bool {
    if host != host_name() {
        return true;
    }
    if !process_alive(pid) {
        return false;
    }
    let (Some(started), Ok(since)) = (process_started(pid), humantime::parse_rfc3339_weak(since)) else {
        return true;
    };
    // The boot time is in whole seconds: allow for it.
    started <= since + Duration::from_secs(2)
}

/// When process `pid` started: the boot time (`/proc/stat` `btime`) plus its start in clock
/// ticks (`/proc/PID/stat` field 22).
fn process_started(pid: u32) -> Option<std::time::SystemTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: the fields after it follow the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let hz = Some(rustix::param::clock_ticks_per_second()).filter(|&h| h > 0)?;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(boot) + Duration::from_millis(ticks * 1000 / hz))
}

/// Whether process `pid` exists on this host (one we may not signal exists too).
pub fn process_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { return false };
    match rustix::process::test_kill_process(pid) {
        Ok(()) => true,
        Err(e) => e == rustix::io::Errno::PERM,
    }
}

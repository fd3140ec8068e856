//! Crash detection in a serial log, with a fingerprint of the first stack frames (NIPA's way): a
//! Linux panic, oops, BUG, WARNING or KASAN report, or the probe guest's `panic` and `fault`
//! sections. The same crash gives the same fingerprint, whatever the addresses and timestamps.

use serde::{Deserialize, Serialize};

use crate::probe_report::ProbeReport;

/// What a crash in a guest's log is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::Display, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum CrashKind {
    /// `Kernel panic - not syncing`, or the probe's panic section.
    Panic,
    /// A KASAN report.
    Kasan,
    /// `BUG:`.
    Bug,
    /// An oops or a general protection fault.
    Oops,
    /// `WARNING:`.
    Warning,
    /// A CPU exception in the probe guest.
    Fault,
    /// The guest stopped talking (the lab stopped it).
    Hang,
}

/// A crash the serial log shows, and its fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Crash {
    /// What kind.
    pub kind: CrashKind,
    /// The line that gave it away.
    pub line: String,
    /// The first stack frames (function names), when the log has a trace.
    pub frames: Vec<String>,
    /// A short hash of the kind and frames: the same crash has the same fingerprint.
    pub fingerprint: String,
}

/// Stack frames kept for the fingerprint.
pub const FRAMES: usize = 5;

/// Lines that open a Linux crash report, and the kind each one is.
const MARKERS: &[(&str, CrashKind)] = &[
    ("Kernel panic - not syncing", CrashKind::Panic),
    ("BUG: KASAN", CrashKind::Kasan),
    ("BUG:", CrashKind::Bug),
    ("Oops:", CrashKind::Oops),
    ("general protection fault", CrashKind::Oops),
    ("WARNING:", CrashKind::Warning),
];

/// The first crash the log shows, if any (the probe's report, read from it, or a kernel's).
pub fn detect(serial: &str) -> Option<Crash> {
    in_probe_report(&ProbeReport::parse(serial)).or_else(|| in_kernel_log(serial))
}

/// The probe guest's panic or CPU exception, if its report has one.
pub fn in_probe_report(report: &ProbeReport) -> Option<Crash> {
    if let Some(panic) = report.section("panic") {
        let at = format!("{}:{}", panic["file"].as_str().unwrap_or("?"), panic["line"]);
        let message = panic["message"].as_str().unwrap_or("").to_string();
        return Some(crash(CrashKind::Panic, format!("probe panic at {at}: {message}"), vec![at]));
    }
    let fault = report.section("fault")?;
    let frame = format!("vector {} rip {:#x}", fault["vector"], fault["rip"].as_u64().unwrap_or(0));
    Some(crash(CrashKind::Fault, format!("probe CPU exception: {frame}"), vec![frame]))
}

/// The first crash a kernel's log shows, with its first stack frames.
pub fn in_kernel_log(serial: &str) -> Option<Crash> {
    let lines: Vec<&str> = serial.lines().map(strip_timestamp).collect();
    let (at, kind) = lines
        .iter()
        .enumerate()
        .find_map(|(i, line)| MARKERS.iter().find(|(marker, _)| line.contains(marker)).map(|&(_, kind)| (i, kind)))?;
    let frames = lines[at..]
        .iter()
        .skip_while(|l| !l.contains("Call Trace:"))
        .skip(1)
        .take_while(|l| !l.contains("---[ end trace") && !l.contains("</TASK>"))
        .filter_map(|l| frame(l))
        .take(FRAMES)
        .collect();
    Some(crash(kind, lines[at].trim().to_string(), frames))
}

/// A crash of `kind` at `line`, fingerprinted by its kind's name and its frames (or, without
/// frames, the line without its numbers).
pub fn crash(kind: CrashKind, line: String, frames: Vec<String>) -> Crash {
    let mut text = kind.to_string();
    for f in &frames {
        text.push('|');
        text.push_str(f);
    }
    if frames.is_empty() {
        // No trace: the report line without its numbers.
        text.push('|');
        text.extend(line.chars().filter(|c| !c.is_ascii_digit()));
    }
    Crash { kind, line, frames, fingerprint: format!("{:016x}", fnv1a(text.as_bytes())) }
}

/// `[   12.345678] text` -> `text`.
fn strip_timestamp(line: &str) -> &str {
    match line.trim_start().strip_prefix('[').and_then(|rest| rest.split_once(']')) {
        Some((stamp, rest)) if stamp.trim().chars().all(|c| c.is_ascii_digit() || c == '.') => rest,
        _ => line,
    }
}

/// ` ? do_thing+0x12/0x40 [mod]` -> `do_thing`; unreliable (`?`) frames and register dumps are
/// not frames.
fn frame(line: &str) -> Option<String> {
    let word = line.split_whitespace().next()?;
    if word == "?" || word.starts_with('<') {
        return None;
    }
    let (name, offset) = word.split_once('+')?;
    offset.starts_with("0x").then(|| name.to_string())
}

/// FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| (hash ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OOPS: &str = "\
[    5.100000] atlantic 0000:00:02.0: link up
[    6.123456] BUG: kernel NULL pointer dereference, address: 0000000000000008
[    6.123500] Oops: 0000 [#1] PREEMPT SMP NOPTI
[    6.123600] RIP: 0010:aq_ring_rx_clean+0x1a2/0x4e0 [atlantic]
[    6.123700] Call Trace:
[    6.123701]  <IRQ>
[    6.123702]  ? __die+0x23/0x70
[    6.123703]  aq_ring_rx_clean+0x1a2/0x4e0 [atlantic]
[    6.123704]  aq_vec_poll+0x10b/0x1e0 [atlantic]
[    6.123705]  __napi_poll+0x2b/0x1b0
[    6.123706]  net_rx_action+0x2f1/0x3a0
[    6.123707]  handle_softirqs+0xd8/0x2b0
[    6.123708]  irq_exit_rcu+0x78/0xa0
[    6.123709]  </IRQ>
";

    #[test]
    fn a_linux_oops_gives_its_first_frames_and_a_stable_fingerprint() {
        let crash = detect(OOPS).unwrap();
        assert_eq!(crash.kind, CrashKind::Bug);
        assert!(crash.line.starts_with("BUG: kernel NULL pointer dereference"));
        assert_eq!(
            crash.frames,
            ["aq_ring_rx_clean", "aq_vec_poll", "__napi_poll", "net_rx_action", "handle_softirqs"]
        );
        // Other timestamps and addresses, the same crash.
        let again = OOPS.replace("6.1237", "9.9").replace("0x1a2/0x4e0", "0x1b0/0x4f0");
        assert_eq!(detect(&again).unwrap().fingerprint, crash.fingerprint);
        let other = OOPS.replace("aq_vec_poll", "aq_vec_isr");
        assert_ne!(detect(&other).unwrap().fingerprint, crash.fingerprint);
    }

    #[test]
    fn the_probe_s_panics_and_faults_and_clean_logs() {
        let panic = r#"{"probe":"panic","file":"src/nic.rs","line":42,"message":"ring full"}"#;
        let crash = detect(panic).unwrap();
        assert_eq!((crash.kind, crash.frames.as_slice()), (CrashKind::Panic, ["src/nic.rs:42".to_string()].as_slice()));
        let fault = r#"{"probe":"fault","vector":14,"error":2,"rip":1050000,"cr2":0}"#;
        assert_eq!(detect(fault).unwrap().kind, CrashKind::Fault);
        assert!(detect("{\"probe\":\"done\",\"ok\":true,\"failures\":[]}\nLinux version 6.12\n").is_none());
        let panic_line = "[   1.0] Kernel panic - not syncing: VFS: Unable to mount root fs\n";
        let crash = detect(panic_line).unwrap();
        assert_eq!((crash.kind, crash.frames.len()), (CrashKind::Panic, 0));
        // The fingerprints of older records stay what they were: the kind's name is hashed.
        assert_eq!(crash.fingerprint, "7d18395455f8b7cc");
        assert_eq!(crash.fingerprint, detect(&panic_line.replace("1.0", "7.5")).unwrap().fingerprint);
    }
}

//! The guest agent's results: frames on COM2 (`guest-images/agent/init`), parsed back into
//! JSON, and the verdict the Linux check draws from them.
//!
//! ```text
//! @@DL 7 step json 58
//! {"step":"probe","status":"ok","reason":"","secs":1.20,"if":"eth0"}
//! @@END 7
//! ```
//!
//! A frame is trusted only whole: its header, exactly the bytes it announced, and its end line.
//! Anything else on the port (a torn frame, noise) is skipped and counted, never guessed at.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use vm_spec::model_control::ModelReport;

/// Traffic direction, seen from the guest.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, strum::Display, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Direction {
    /// The guest receives.
    #[default]
    Rx,
    /// The guest sends.
    Tx,
    /// Both at once.
    Bidir,
}

/// The header line's marker.
pub const BEGIN: &str = "@@DL ";
/// The end line's marker.
pub const END: &str = "@@END ";
/// The largest payload a frame may announce.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// What a frame is. The agent may send kinds this lab does not know (a newer agent): they are
/// kept as [`FrameKind::Other`] and read by nobody.
#[derive(Debug, Clone, PartialEq, Eq, Hash, strum::Display, strum::EnumString)]
#[strum(serialize_all = "kebab-case")]
pub enum FrameKind {
    /// The agent started: its version and command line.
    Hello,
    /// The guest is up with its NIC's slot still empty (`driverlab.snapshot=1`): the lab
    /// snapshots it here; a restored copy reads its cell's words on the result port, its NIC
    /// plugged, and goes on.
    Ready,
    /// A step's result.
    Step,
    /// The workload starts: the lab reads the counters now.
    WorkloadBegin,
    /// The workload ended: the lab reads the counters now.
    WorkloadEnd,
    /// iperf3's JSON.
    Iperf3,
    /// sockperf's report (text).
    Sockperf,
    /// xdp-bench's output (text).
    XdpBench,
    /// The xdp workload's load, as the peer's UDP source counted it.
    XdpLoad,
    /// The kselftest workload's KTAP (text).
    Kselftest,
    /// The whole kernel log, at the end.
    Dmesg,
    /// The kernel log the workload added.
    DmesgDelta,
    /// The agent is done, with the driver unloaded: the lab reads what the teardown left.
    Done,
    /// The interface's counters before the workload.
    NetdevBefore,
    /// The interface's counters after the workload.
    NetdevAfter,
    /// `ethtool -S` before the workload.
    #[strum(serialize = "ethtool-S-before")]
    EthtoolSBefore,
    /// `ethtool -S` after the workload.
    #[strum(serialize = "ethtool-S-after")]
    EthtoolSAfter,
    /// `/proc/interrupts` before the workload.
    InterruptsBefore,
    /// `/proc/interrupts` after the workload.
    InterruptsAfter,
    /// `/proc/softirqs` before the workload.
    SoftirqsBefore,
    /// `/proc/softirqs` after the workload.
    SoftirqsAfter,
    /// `/proc/net/snmp` and `/proc/net/snmp6` before the workload.
    SnmpBefore,
    /// `/proc/net/snmp` and `/proc/net/snmp6` after the workload.
    SnmpAfter,
    /// `/proc/stat` as the workload began.
    StatBefore,
    /// `/proc/stat` as the workload ended.
    StatAfter,
    /// A kind this lab does not know.
    #[strum(default, to_string = "{0}")]
    Other(String),
}

impl Serialize for FrameKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A frame's header line, without its marker: `SEQ KIND FORMAT LENGTH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Its sequence number.
    pub seq: u64,
    /// What the frame is.
    pub kind: FrameKind,
    /// Whether the payload is text (else JSON).
    pub text: bool,
    /// The payload's length in bytes.
    pub len: usize,
}

impl Header {
    /// Parses a header line (with or without its marker and line end); `None` for anything that
    /// is not a whole, well-formed header.
    pub fn parse(line: &[u8]) -> Option<Header> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_prefix(BEGIN.as_bytes()).unwrap_or(line);
        let line = std::str::from_utf8(line).ok()?;
        let [seq, kind, format, len] = line.split(' ').collect::<Vec<_>>()[..] else { return None };
        let text = match format {
            "json" => false,
            "text" => true,
            _ => return None,
        };
        let len = len.parse::<usize>().ok().filter(|&len| len <= MAX_PAYLOAD)?;
        if kind.is_empty() {
            return None;
        }
        let kind = kind.parse().unwrap_or_else(|_| FrameKind::Other(kind.to_string()));
        Some(Header { seq: seq.parse().ok()?, kind, text, len })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Frame {
    /// Its sequence number.
    pub seq: u64,
    /// What it is.
    pub kind: FrameKind,
    /// The payload: JSON as sent, or a text frame as a JSON string.
    pub payload: Value,
}

/// The frames of a result port's output, and how many broken ones were skipped.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Frames {
    /// The whole frames, in order.
    pub frames: Vec<Frame>,
    /// Frames that were torn, malformed or not valid JSON.
    pub broken: usize,
}

/// Encodes one frame (what the agent writes; for tests and for other agents).
pub fn encode(seq: u64, kind: &str, text: bool, payload: &[u8]) -> Vec<u8> {
    let mut out =
        format!("{BEGIN}{seq} {kind} {} {}\n", if text { "text" } else { "json" }, payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out.extend_from_slice(format!("\n{END}{seq}\n").as_bytes());
    out
}

/// The bounce pool the agent reported in the log at `log` so far (its `iommu-group` step), read
/// when an engine needs it: at the workload's begin, before the window's counters are taken.
pub(crate) fn bounce_pool_in(log: Option<&std::path::Path>) -> Option<vm_spec::control::BouncePool> {
    parse(&std::fs::read(log?).ok()?).bounce_pool()
}

/// Parses a result port's output.
pub fn parse(data: &[u8]) -> Frames {
    let mut out = Frames::default();
    let mut at = 0;
    while let Some(offset) = find(&data[at..], BEGIN.as_bytes()) {
        let start = at + offset;
        // A header starts a line.
        if start > 0 && data[start - 1] != b'\n' {
            at = start + BEGIN.len();
            continue;
        }
        let Some(line_end) = find(&data[start..], b"\n").map(|n| start + n) else {
            out.broken += 1;
            break;
        };
        let Some(Header { seq, kind, text, len }) = Header::parse(&data[start..line_end]) else {
            out.broken += 1;
            at = line_end + 1;
            continue;
        };
        let body = line_end + 1;
        let end_line = format!("\n{END}{seq}\n");
        let whole = data.get(body..body + len).is_some() && data[body + len..].starts_with(end_line.as_bytes());
        if !whole {
            out.broken += 1;
            at = line_end + 1;
            continue;
        }
        let bytes = &data[body..body + len];
        let payload = if text {
            Some(Value::String(String::from_utf8_lossy(bytes).into_owned()))
        } else {
            serde_json::from_slice(bytes).ok()
        };
        match payload {
            Some(payload) => out.frames.push(Frame { seq, kind, payload }),
            None => out.broken += 1,
        }
        at = body + len + end_line.len();
    }
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Frames {
    /// The first frame of `kind`.
    pub fn first(&self, kind: FrameKind) -> Option<&Value> {
        self.frames.iter().find(|f| f.kind == kind).map(|f| &f.payload)
    }

    /// The frames of `kind`, in order.
    pub fn all(&self, kind: FrameKind) -> impl Iterator<Item = &Value> {
        self.frames.iter().filter(move |f| f.kind == kind).map(|f| &f.payload)
    }

    /// The `step` frames, in order (a step frame that is not one is skipped).
    pub fn steps(&self) -> impl Iterator<Item = Step> + '_ {
        self.all(FrameKind::Step).filter_map(|s| Step::deserialize(s).ok())
    }

    /// The last result of step `name`.
    pub fn step(&self, name: &str) -> Option<Step> {
        self.steps().filter(|s| s.step == name).last()
    }

    /// The guest's swiotlb bounce pool as its `iommu-group` step reported it (`swiotlb`:
    /// `{"start":"0x...","end":"0x..."}`, inclusive), if it has one.
    pub fn bounce_pool(&self) -> Option<vm_spec::control::BouncePool> {
        let pool = self.step("iommu-group")?.facts.get("swiotlb")?.clone();
        let hex = |key: &str| u64::from_str_radix(pool.get(key)?.as_str()?.strip_prefix("0x")?, 16).ok();
        let (start, end) = (hex("start")?, hex("end")?);
        (start <= end).then_some(vm_spec::control::BouncePool { start, end })
    }

    /// When step `name` ended, ms of the guest's uptime, if it passed.
    pub fn passed_at_ms(&self, name: &str) -> Option<f64> {
        self.step(name).filter(|s| s.status == StepStatus::Ok).and_then(|s| s.at).map(|at| at * 1e3)
    }

    /// The workload's direction, as its begin frame gives it.
    pub fn direction(&self) -> Option<Direction> {
        self.first(FrameKind::WorkloadBegin)?.get("direction").and_then(|d| Direction::deserialize(d).ok())
    }
}

/// How a step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum StepStatus {
    /// It passed.
    Ok,
    /// It failed, for its reason.
    Fail,
    /// It did not run: an earlier step failed.
    Skip,
}

/// A step's frame: `{"step":"probe","status":"ok","reason":"","secs":1.20,"at":2.3,...facts}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Its name.
    pub step: String,
    /// How it went.
    pub status: StepStatus,
    /// Why it failed or was skipped.
    #[serde(default)]
    pub reason: String,
    /// Seconds it took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secs: Option<f64>,
    /// When it ended, seconds of the guest's uptime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<f64>,
    /// What else it found (`if`, `fw`, `rx_ring`, ...).
    #[serde(flatten)]
    pub facts: serde_json::Map<String, Value>,
}

/// Kernel messages that fail a run: warnings, BUGs, oopses, lockups, stalls, transmit
/// timeouts, IOMMU faults and DMA-API complaints.
pub const FAULTS: &[&str] = &[
    "WARNING:",
    "BUG:",
    "Oops",
    "general protection fault",
    "Unable to handle",
    "Call Trace",
    "NETDEV WATCHDOG",
    "soft lockup",
    "hard LOCKUP",
    "blocked for more than",
    "page allocation failure",
    "fault from EP",
    "swiotlb buffer is full",
    "DMA-API",
    // page_pool_release_retry(): pages still out of a destroyed pool after a minute.
    "stalled pool shutdown",
];

/// The lines of `log` that report a kernel fault (see [`FAULTS`]; also RCU stalls and IOMMU,
/// DMAR and AMD-Vi faults).
pub fn fault_lines(log: &str) -> Vec<String> {
    let mut lines: Vec<String> = log
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.starts_with(BEGIN) && !l.starts_with(END))
        .filter(|l| {
            let lower = l.to_ascii_lowercase();
            FAULTS.iter().any(|f| l.contains(f))
                || (lower.contains("rcu") && lower.contains("stall"))
                || ((lower.contains("iommu") || l.contains("DMAR:") || l.contains("AMD-Vi:"))
                    && lower.contains(" fault"))
        })
        .map(String::from)
        .collect();
    lines.sort();
    lines.dedup();
    lines
}

/// What a Linux run's frames and console say.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Every step passed, the agent finished, and no kernel fault showed.
    pub ok: bool,
    /// Each step: name, status, and its frame.
    pub steps: Vec<Step>,
    /// What is wrong, one line each.
    pub problems: Vec<String>,
    /// The kernel faults seen (on the console or in the agent's dmesg frames).
    pub faults: Vec<String>,
}

/// Judges a run from the agent's frames and the console log.
pub fn verdict(frames: &Frames, console: &str) -> Verdict {
    let mut problems = Vec::new();
    let steps: Vec<Step> = frames.steps().collect();
    for step in steps.iter().filter(|s| s.status == StepStatus::Fail) {
        problems.push(format!("step {} failed: {}", step.step, step.reason));
    }
    match frames.first(FrameKind::Done) {
        None => {
            let last = steps.last().map_or("none".to_string(), |s| s.step.clone());
            problems.push(format!("the agent did not finish; its last step: {last}"));
        }
        Some(done) if done["ok"] != true && problems.is_empty() => problems.push(format!("the agent says: {done}")),
        Some(_) => {}
    }
    if frames.broken > 0 {
        problems.push(format!("{} broken frame(s) on the result port", frames.broken));
    }
    let mut log = console.to_string();
    for frame in frames.frames.iter().filter(|f| matches!(f.kind, FrameKind::Dmesg | FrameKind::DmesgDelta)) {
        log.push('\n');
        log.push_str(frame.payload.as_str().unwrap_or_default());
    }
    let faults = fault_lines(&log);
    if !faults.is_empty() {
        problems.push(format!("kernel faults: {} distinct line(s), first: {}", faults.len(), faults[0]));
    }
    Verdict { ok: problems.is_empty(), steps, problems, faults }
}

/// What iperf3's JSON says the guest received and sent, in Gbit/s, and the retransmits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IperfFigures {
    /// Goodput the receiver saw (`end.sum_received`), Gbit/s.
    pub received_gbit_s: f64,
    /// What the sender sent (`end.sum_sent`), Gbit/s.
    pub sent_gbit_s: f64,
    /// TCP retransmits (`end.sum_sent.retransmits`).
    pub retransmits: Option<u64>,
    /// Seconds measured.
    pub seconds: f64,
}

/// Reads iperf3's `--json` output (TCP or UDP).
pub fn iperf_figures(json: &Value) -> Option<IperfFigures> {
    let end = json.get("end")?;
    // UDP: `sum` is the receiver's summary (with loss and jitter); iperf3's `sum_received` for
    // UDP counts only part of what arrived.
    let udp = end.get("sum").is_some_and(|s| s.get("lost_packets").is_some());
    let received = if udp { end.get("sum") } else { end.get("sum_received").or_else(|| end.get("sum")) }?;
    let sent = end.get("sum_sent").or_else(|| end.get("sum"))?;
    // `--bidir`: the reverse stream's receiver summary too (UDP's `sum_bidir_reverse`, TCP's
    // `sum_received_bidir_reverse`); what the two ends received together is the goodput.
    let reverse = if udp { end.get("sum_bidir_reverse") } else { end.get("sum_received_bidir_reverse") };
    let reverse_bps = reverse.and_then(|r| r.get("bits_per_second")).and_then(Value::as_f64).unwrap_or(0.0);
    Some(IperfFigures {
        received_gbit_s: (received.get("bits_per_second")?.as_f64()? + reverse_bps) / 1e9,
        sent_gbit_s: sent.get("bits_per_second")?.as_f64()? / 1e9,
        retransmits: sent.get("retransmits").and_then(Value::as_u64),
        seconds: received.get("seconds").and_then(Value::as_f64).unwrap_or(0.0),
    })
}

/// The Linux check's report over a folder of logs: `agent.log` (the result port), `console.log`,
/// and where there are, `model.log` (the model's counters lines), `qemu.log` (QEMU's stderr) and
/// `qemu-trace.log` (its virtio-iommu and vfio-user trace).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinuxCheck {
    /// The agent's verdict, with the checks on the other logs added to its problems.
    pub verdict: Verdict,
    /// iperf3 per direction (`tx`, `rx`, `bidir`).
    pub iperf: Vec<(String, IperfFigures)>,
    /// The model's last counters line.
    pub model_counters: Option<ModelReport>,
    /// QEMU's trace events counted by name (`virtio_iommu_map`, `vfio_user_dma_map`, ...).
    pub trace: std::collections::BTreeMap<String, u64>,
}

/// Judges the Linux check's logs in `dir`.
pub fn linux_check(dir: &std::path::Path) -> std::io::Result<LinuxCheck> {
    let read = |name: &str| std::fs::read(dir.join(name));
    let frames = parse(&read("agent.log")?);
    // The console: console.log, or serial.log as the lab names it in a repetition's folder.
    let console = read("console.log").or_else(|_| read("serial.log")).unwrap_or_default();
    let console = String::from_utf8_lossy(&console).into_owned();
    let mut verdict = verdict(&frames, &console);
    let mut iperf = Vec::new();
    let directions: Vec<String> =
        frames.all(FrameKind::WorkloadBegin).map(|f| f["direction"].as_str().unwrap_or("?").to_string()).collect();
    for (direction, payload) in directions.iter().zip(frames.all(FrameKind::Iperf3)) {
        if let Some(figures) = iperf_figures(payload) {
            iperf.push((direction.clone(), figures));
        }
    }
    let model_counters = read("model.log").ok().and_then(|log| {
        String::from_utf8_lossy(&log).lines().rev().find_map(|l| ModelReport::parse(l.get(l.find("{\"model\"")?..)?))
    });
    if let Ok(log) = read("model.log") {
        match &model_counters {
            None if !log.is_empty() => verdict.problems.push("the model printed no counters line (model.log)".into()),
            Some(report) if report.counters.dma_faults > 0 => verdict.problems.push(format!(
                "the model refused {} DMA accesses outside the guest's mappings (IOMMU faults; model.log)",
                report.counters.dma_faults
            )),
            _ => {}
        }
    }
    if let Ok(log) = read("qemu.log") {
        let log = String::from_utf8_lossy(&log);
        let errors: std::collections::BTreeSet<&str> =
            log.lines().filter(|l| l.to_ascii_lowercase().contains("error") && !l.contains("warning:")).collect();
        if !errors.is_empty() {
            verdict.problems.push(format!("QEMU reported errors: {} distinct line(s) in qemu.log", errors.len()));
        }
    }
    let mut trace = std::collections::BTreeMap::new();
    if let Ok(log) = read("qemu-trace.log") {
        for line in String::from_utf8_lossy(&log).lines() {
            // "2026-11-30T23:22:59.155058Z virtio_iommu_map domain=1 ...", or without the time.
            let mut words = line.split_whitespace();
            let first = words.next().unwrap_or_default();
            let event =
                if first.contains('T') && first.ends_with('Z') { words.next().unwrap_or_default() } else { first };
            if event.starts_with("virtio_iommu_") || event.starts_with("vfio_user_") {
                *trace.entry(event.to_string()).or_insert(0) += 1;
            }
        }
        if trace.contains_key("virtio_iommu_report_fault") {
            verdict.problems.push("QEMU's virtio-iommu reported translation faults (qemu-trace.log)".into());
        }
    }
    verdict.ok = verdict.problems.is_empty();
    Ok(LinuxCheck { verdict, iperf, model_counters, trace })
}

impl LinuxCheck {
    /// The summary a person reads: the steps with their facts, throughput, IOMMU activity, and
    /// `result: PASS` or `result: FAIL` with the problems.
    pub fn summary(&self) -> String {
        let mut out = String::from("steps:\n");
        for step in &self.verdict.steps {
            let fact =
                |k: &str, v: &Value| format!("{k}={}", v.as_str().map_or(v.to_string(), |s| s.replace(' ', "_")));
            let mut facts: Vec<String> = Vec::new();
            if !step.reason.is_empty() {
                facts.push(fact("reason", &Value::from(step.reason.as_str())));
            }
            facts.extend(step.secs.map(|v| fact("secs", &Value::from(v))));
            facts.extend(step.at.map(|v| fact("at", &Value::from(v))));
            facts.extend(step.facts.iter().map(|(k, v)| fact(k, v)));
            out.push_str(&format!("  {:<18} {:<5} {}\n", step.step, step.status.to_string(), facts.join(" ")));
        }
        for (direction, f) in &self.iperf {
            let retransmits = f.retransmits.map_or(String::new(), |r| format!(", {r} retransmits"));
            out.push_str(&format!(
                "iperf3 {direction}: {:.1} Mbit/s received, {:.1} Mbit/s sent{retransmits}\n",
                f.received_gbit_s * 1e3,
                f.sent_gbit_s * 1e3
            ));
        }
        if !self.trace.is_empty() {
            let counts: Vec<String> = self.trace.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("QEMU trace: {}\n", counts.join(" ")));
        }
        if let Some(report) = &self.model_counters {
            out.push_str(&format!("model counters: {}\n", serde_json::to_string(report).unwrap_or_default()));
        }
        if self.verdict.faults.is_empty() {
            out.push_str("kernel faults: none\n");
        } else {
            out.push_str("kernel faults:\n");
            for line in self.verdict.faults.iter().take(20) {
                out.push_str(&format!("  {line}\n"));
            }
        }
        if self.verdict.ok {
            out.push_str("result: PASS\n");
        } else {
            out.push_str("result: FAIL\n");
            for p in &self.verdict.problems {
                out.push_str(&format!("  - {p}\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_parse_and_noise_is_skipped() {
        let mut port = b"agent: booting\n".to_vec();
        port.extend(encode(1, "hello", false, br#"{"agent":"driverlab"}"#));
        port.extend(b"@@DL 2 step json 999\n{\"torn\":"); // the guest died mid-frame
        port.extend(b"\nnoise @@DL 3 x json 2\n");
        port.extend(encode(4, "dmesg", true, b"[ 1.0] WARNING: at aq_ring.c\nline two"));
        port.extend(encode(5, "step", false, br#"{"step":"probe","status":"ok"}"#));
        port.extend(encode(6, "step", false, b"not json"));
        let frames = parse(&port);
        let kinds: Vec<String> = frames.frames.iter().map(|f| f.kind.to_string()).collect();
        assert_eq!(kinds, ["hello", "dmesg", "step"]);
        assert_eq!(frames.broken, 2, "the torn frame and the invalid JSON");
        assert_eq!(frames.first(FrameKind::Dmesg).unwrap().as_str().unwrap().lines().count(), 2);
        assert_eq!(frames.step("probe").unwrap().status, StepStatus::Ok);
    }

    #[test]
    fn the_verdict_needs_every_step_the_end_and_a_clean_log() {
        let mut port = Vec::new();
        for (i, step) in ["boot", "probe", "iperf"].iter().enumerate() {
            port.extend(encode(i as u64, "step", false, format!(r#"{{"step":"{step}","status":"ok"}}"#).as_bytes()));
        }
        let unfinished = verdict(&parse(&port), "");
        assert!(!unfinished.ok && unfinished.problems[0].contains("did not finish; its last step: iperf"));
        port.extend(encode(9, "done", false, br#"{"ok":true,"failed":[]}"#));
        assert!(verdict(&parse(&port), "Linux version 6.12\n").ok);
        let faulty = verdict(&parse(&port), "[ 3.2] NETDEV WATCHDOG: eth0 (atlantic): transmit queue 0 timed out\n");
        assert!(!faulty.ok && faulty.faults.len() == 1, "{faulty:?}");
        assert_eq!(fault_lines("AMD-Vi: Event logged [IO_PAGE_FAULT]\nvirtio_iommu: page fault from EP 16\n").len(), 1);
        assert_eq!(fault_lines("rcu: INFO: rcu_preempt self-detected stall on CPU\n").len(), 1);
        let leak = "page_pool_release_retry() stalled pool shutdown: id 9, 1 inflight 60 sec\n";
        assert_eq!(fault_lines(leak).len(), 1, "a page_pool that cannot drain");
        port.extend(encode(10, "step", false, br#"{"step":"unload","status":"fail","reason":"rmmod: busy"}"#));
        let failed = verdict(&parse(&port), "");
        assert!(failed.problems.iter().any(|p| p == "step unload failed: rmmod: busy"), "{failed:?}");
    }

    #[test]
    fn the_bounce_pool_is_read_from_the_iommu_group_step() {
        let step = |json: &str| parse(&encode(0, "step", false, json.as_bytes()));
        let pool = step(r#"{"step":"iommu-group","status":"ok","swiotlb":{"start":"0x1b000000","end":"0x1effffff"}}"#);
        assert_eq!(pool.bounce_pool(), Some(vm_spec::control::BouncePool { start: 0x1b00_0000, end: 0x1eff_ffff }));
        for none in [
            r#"{"step":"iommu-group","status":"ok","swiotlb":null}"#,
            r#"{"step":"iommu-group","status":"ok"}"#,
            r#"{"step":"iommu-group","status":"ok","swiotlb":{"start":"12","end":"0x1"}}"#,
            r#"{"step":"iommu-group","status":"ok","swiotlb":{"start":"0x2","end":"0x1"}}"#,
            r#"{"step":"probe","status":"ok","swiotlb":{"start":"0x1","end":"0x2"}}"#,
        ] {
            assert_eq!(step(none).bounce_pool(), None, "{none}");
        }
    }

    #[test]
    fn iperf3_json_gives_goodput_and_retransmits() {
        let tcp: Value = serde_json::json!({"end": {"sum_sent": {"bits_per_second": 9.2e9, "retransmits": 12},
            "sum_received": {"bits_per_second": 9.14e9, "seconds": 10.0}}});
        let f = iperf_figures(&tcp).unwrap();
        assert_eq!((f.received_gbit_s, f.retransmits, f.seconds), (9.14, Some(12), 10.0));
        let udp: Value =
            serde_json::json!({"end": {"sum": {"bits_per_second": 1.0e9, "seconds": 5.0, "lost_percent": 0.1}}});
        assert_eq!(iperf_figures(&udp).unwrap().sent_gbit_s, 1.0);
        assert!(iperf_figures(&serde_json::json!({"error": "unable to connect"})).is_none());
        // iperf3 3.18's UDP -R: `sum_received` counts a fraction; `sum` is the receiver's.
        let udp_reverse: Value = serde_json::json!({"end": {
            "sum": {"bits_per_second": 4.9999e7, "seconds": 5.07, "lost_packets": 0, "sender": false},
            "sum_sent": {"bits_per_second": 5.0e7, "seconds": 5.07},
            "sum_received": {"bits_per_second": 125650.3, "seconds": 5.07, "lost_packets": 0}}});
        assert_eq!(iperf_figures(&udp_reverse).unwrap().received_gbit_s, 4.9999e-2);
        // UDP --bidir (iperf3 3.18, the guest the client): `sum` is the forward stream's
        // receiver, `sum_bidir_reverse` the reverse one's; the goodput is both.
        let udp_bidir: Value = serde_json::json!({"end": {
            "sum": {"bits_per_second": 2.0e5, "seconds": 5.19, "lost_packets": 0},
            "sum_sent": {"bits_per_second": 2.03e5, "seconds": 5.07},
            "sum_bidir_reverse": {"bits_per_second": 5.1e7, "seconds": 5.19, "lost_packets": 0},
            "sum_received_bidir_reverse": {"bits_per_second": 1.98e5, "seconds": 5.19}}});
        assert_eq!(iperf_figures(&udp_bidir).unwrap().received_gbit_s, (2.0e5 + 5.1e7) / 1e9);
    }

    /// This host's busybox and a folder holding the agent as `init`, for `test` to source it in
    /// busybox sh; `None` (the test skipped, saying why) without busybox.
    fn agent_in_busybox(test: &str) -> Option<(&'static str, tempfile::TempDir)> {
        let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().find(|p| std::path::Path::new(p).exists());
        let Some(busybox) = busybox else {
            testkit::skip(test, testkit::Lacks::Setup, "no busybox (apt-get install busybox-static)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("init"), guest_images::AGENT).unwrap();
        Some((busybox, dir))
    }

    /// Runs the agent's own frame functions in busybox sh and parses what they wrote.
    #[test]
    fn the_agent_s_frames_round_trip_through_the_parser() {
        let Some((busybox, dir)) = agent_in_busybox("the_agent_s_frames_round_trip_through_the_parser") else {
            return;
        };
        let script = r#"DRIVERLAB_AGENT_LIB=1 . ./init
            OUT=port; T0=$(cut -d' ' -f1 /proc/uptime)
            frame_json hello '{"agent":"driverlab","version":1}'
            STEP=probe; ok ',"if":"eth0","fw":"3.1.38"'
            STEP=ping; fail "ping 10.77.0.1: no "reply"" ',"received":0'
            frame_cmd interrupts-before printf 'CPU0
 24: 7 PCI-MSI atlantic
'
            printf 'plain text	with a tab
' >/tmp/t; frame dmesg-delta text /tmp/t
            frame_json done '{"ok":false,"failed":["ping"]}'"#;
        let out =
            std::process::Command::new(busybox).args(["sh", "-c", script]).current_dir(dir.path()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let frames = parse(&std::fs::read(dir.path().join("port")).unwrap());
        assert_eq!(frames.broken, 0);
        let kinds: Vec<String> = frames.frames.iter().map(|f| f.kind.to_string()).collect();
        assert_eq!(kinds, ["hello", "step", "step", "interrupts-before", "dmesg-delta", "done"]);
        assert_eq!(frames.step("probe").unwrap().facts["fw"], "3.1.38");
        let ping = frames.step("ping").unwrap();
        assert_eq!((ping.status, ping.facts["received"].as_u64()), (StepStatus::Fail, Some(0)));
        assert_eq!(ping.reason, "ping 10.77.0.1: no reply", "quotes are dropped, not breaking the JSON");
        assert!(frames.first(FrameKind::InterruptsBefore).unwrap().as_str().unwrap().contains("PCI-MSI atlantic"));
        assert_eq!(frames.first(FrameKind::DmesgDelta).unwrap(), "plain text\twith a tab\n");
        let verdict = verdict(&frames, "");
        assert!(!verdict.ok && verdict.problems[0].starts_with("step ping failed"));
    }

    /// The ready path's shell-only pieces: a step's seconds from two uptimes (hundredths, no awk),
    /// a JSON frame's byte count in a UTF-8 locale, every setting read in one pass (defaults,
    /// the last word winning), a wait that ticks on its FIFO and a module looked up in a file.
    #[test]
    fn the_agent_s_ready_path_does_its_arithmetic_and_parsing_in_the_shell() {
        let Some((busybox, dir)) =
            agent_in_busybox("the_agent_s_ready_path_does_its_arithmetic_and_parsing_in_the_shell")
        else {
            return;
        };
        let script = r#"DRIVERLAB_AGENT_LIB=1 . ./init
            OUT=port; TICK=./tick; mkfifo "$TICK"
            read_uptime() { NOW=$FAKE_NOW; }
            FAKE_NOW=6.16; T0=5.53; STEP=load; ok
            FAKE_NOW=10.00; T0=9.99; STEP=probe; ok
            FAKE_NOW=3.05; T0=0; STEP=boot; ok
            FAKE_NOW=1.00; T0=2.00; STEP=clock; ok
            frame_json hello '{"agent":"naïve – ünïcode"}'
            CMDLINE="console=ttyS0 driverlab.ip6=fd00::2/64 driverlab.nic=lan743x driverlab.mtu=9000 driverlab.nic=atlantic driverlab.iperf=rx,10,6,1,tcp x=driverlab.check=1"
            read_params
            echo "$NIC|$IP|$IP6|$MTU|$IPERF|$CHECK|$UNPLUG|$RXRING"
            wait_for 1 true && echo waited-true
            tries=0; bump() { tries=$((tries + 1)); [ "$tries" -ge 3 ]; }
            wait_for 1 bump && echo "waited-$tries"
            wait_for 0 false || echo gave-up
            printf 'virtio_iommu 32768 0 - Live 0x0\natlantic 253952 0 - Live 0x0\n' >modules
            sed -i 's#</proc/modules#<modules#' ./init
            . ./init
            module_loaded atlantic && ! module_loaded atlanti && ! module_loaded macsec && echo modules-ok"#;
        let out = std::process::Command::new(busybox)
            .args(["sh", "-c", script])
            .env("LANG", "C.UTF-8")
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let said = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = said.lines().filter(|l| !l.starts_with("agent: ")).collect();
        assert_eq!(
            lines,
            [
                "atlantic|10.77.0.2/24|fd00::2/64|9000|rx,10,6,1,tcp|0|none|0",
                "waited-true",
                "waited-3",
                "gave-up",
                "modules-ok"
            ]
        );
        let frames = parse(&std::fs::read(dir.path().join("port")).unwrap());
        assert_eq!(frames.broken, 0, "a frame's byte count is its bytes, not its characters");
        let secs: Vec<(f64, f64)> = ["load", "probe", "boot", "clock"]
            .iter()
            .map(|s| {
                let step = frames.step(s).unwrap();
                (step.secs.unwrap(), step.at.unwrap())
            })
            .collect();
        assert_eq!(secs, [(0.63, 6.16), (0.01, 10.0), (3.05, 3.05), (0.0, 1.0)]);
        assert_eq!(frames.first(FrameKind::Hello).unwrap()["agent"], "naïve – ünïcode");
    }

    /// The agent at its snapshot point: sends `ready`, takes the cell's line from its result port
    /// (here a file that holds it), and reads its settings and the driver's parameters from it.
    #[test]
    fn the_agent_takes_its_cell_s_line_after_a_restore() {
        let Some((busybox, dir)) = agent_in_busybox("the_agent_takes_its_cell_s_line_after_a_restore") else {
            return;
        };
        let line = "driverlab.nic=lan743x driverlab.iperf=rx,10,6,1,tcp lan743x.rxq=3 lan743x.x=1\n";
        std::fs::write(dir.path().join("port"), line).unwrap();
        let script = r#"DRIVERLAB_AGENT_LIB=1 . ./init
            OUT=port; T0=$(cut -d' ' -f1 /proc/uptime)
            CMDLINE="console=ttyS0 driverlab.nic=atlantic driverlab.snapshot=1"; read_params
            wait_in_snapshot >/dev/null
            echo "$NIC|$IPERF|$(modparams "$NIC")""#;
        let out =
            std::process::Command::new(busybox).args(["sh", "-c", script]).current_dir(dir.path()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "lan743x|rx,10,6,1,tcp| rxq=3 x=1");
        let port = std::fs::read(dir.path().join("port")).unwrap();
        let frames = parse(&port);
        assert!(frames.first(FrameKind::Ready).is_some_and(|r| r["slot"] == "empty"), "{frames:?}");
    }

    /// The agent takes a restored copy's payload from the payload window (here a file standing
    /// for /dev/mem, with /proc/iomem's lines around the window), checks it and unpacks it; a
    /// payload that is not the one sent fails its `load` step.
    #[test]
    fn the_agent_unpacks_the_payload_window_and_refuses_a_wrong_one() {
        let Some((busybox, dir)) = agent_in_busybox("the_agent_unpacks_the_payload_window_and_refuses_a_wrong_one")
        else {
            return;
        };
        let mut tree = guest_images::initramfs::Tree::new();
        tree.file("lib/modules/atlantic.ko", 0o644, b"patched module".to_vec());
        tree.file("etc/driverlab/modules.atlantic", 0o644, b"atlantic\n".to_vec());
        let payload = tree.cpio();
        let window = 0x1e80_0000u64;
        let iomem = "00000000-00000fff : Reserved\n00001000-0009fbff : System RAM\n0009fc00-000fffff : Reserved\n\
                     00100000-1e7fffff : System RAM\n  01000000-01ffffff : Kernel code\n1e800000-1f7fffff : Reserved\n\
                     1f800000-1fffffff : System RAM\ne0000000-e1ffffff : PCI ECAM 0000 [bus 00-1f]\n\
                     e0000000-e1ffffff : Reserved\n";
        std::fs::write(dir.path().join("iomem"), iomem).unwrap();
        let mem = std::fs::File::create(dir.path().join("mem")).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&mem, &payload, window).unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let sum = guest_images::store::sha256(&payload);
        let take = |sum: &str| {
            let script = format!(
                r#"DRIVERLAB_AGENT_LIB=1 . ./init
                OUT=port; T0=$(cut -d' ' -f1 /proc/uptime); IOMEM=iomem MEM=mem UNPACK_TO=root
                PAYLOAD={}:{sum}; STEP=load; take_payload && echo "taken $PAYLOAD_TAKEN"; exit 0"#,
                payload.len()
            );
            let out = std::process::Command::new(busybox)
                .args(["sh", "-c", &script])
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert!(take(&sum).contains(&format!("taken ,\"payload_bytes\":{}", payload.len())));
        assert_eq!(std::fs::read(dir.path().join("root/lib/modules/atlantic.ko")).unwrap(), b"patched module");
        let wrong = take(&"0".repeat(64));
        assert!(!wrong.contains("taken"), "{wrong}");
        let frames = parse(&std::fs::read(dir.path().join("port")).unwrap());
        let load = frames.step("load").unwrap();
        assert_eq!(load.status, StepStatus::Fail);
        assert!(load.reason.contains("the window at 0x1e800000 holds is not what was sent"), "{}", load.reason);
    }

    #[test]
    fn the_agent_passes_shellcheck() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("init");
        std::fs::write(&file, guest_images::AGENT).unwrap();
        match std::process::Command::new("shellcheck").args(["-s", "sh"]).arg(&file).output() {
            Err(e) => testkit::skip(
                "the_agent_passes_shellcheck",
                testkit::Lacks::Setup,
                format!("no shellcheck ({e}; apt-get install shellcheck)"),
            ),
            Ok(out) => assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout)),
        }
    }

    fn kind() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,12}"
    }

    proptest! {
        #[test]
        fn frames_round_trip_between_any_noise(
            texts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..6),
            kinds in proptest::collection::vec(kind(), 6),
            noise in proptest::collection::vec("[^@]{0,40}\n", 7),
        ) {
            let mut port = Vec::new();
            for (i, text) in texts.iter().enumerate() {
                port.extend(noise[i].as_bytes());
                port.extend(encode(i as u64, &kinds[i], true, text));
            }
            port.extend(noise[6].as_bytes());
            let frames = parse(&port);
            prop_assert_eq!(frames.broken, 0);
            prop_assert_eq!(frames.frames.len(), texts.len());
            for (frame, text) in frames.frames.iter().zip(&texts) {
                prop_assert_eq!(frame.payload.as_str().unwrap(), String::from_utf8_lossy(text));
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse(&data);
            let mut framed = b"@@DL 1 a json 3\n".to_vec();
            framed.extend(&data);
            let _ = parse(&framed);
        }

        #[test]
        fn a_truncated_frame_is_never_taken(cut in 0usize..60) {
            let whole = encode(1, "step", false, br#"{"step":"probe","status":"ok","secs":1.5}"#);
            let cut = cut.min(whole.len() - 1);
            let frames = parse(&whole[..cut]);
            prop_assert!(frames.frames.is_empty());
        }
    }
}

//! What an `xdp` workload measured: the frames per second `xdp-bench` counted its program
//! handling (its per-interval `Summary` lines), the load the peer's UDP source sent, and the
//! driver's XDP counters (`ethtool -S` lines naming XDP) over the window.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::matrix::XdpAction;
use engines::agent::{FrameKind, Frames};

/// What the program and the load did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct XdpFigures {
    /// What the program did with each frame.
    #[schema(value_type = String)]
    pub action: XdpAction,
    /// The load's frames on the wire, FCS included.
    pub frame_bytes: u32,
    /// Frames per second the program handled under the load: the mean of xdp-bench's one-second
    /// intervals that saw frames, less the first and the last of them (parts of a second at
    /// the load's edges) when there are three or more.
    pub handled_per_s: f64,
    /// The intervals that mean is over.
    pub intervals: u32,
    /// Frames per second the program failed on (xdp-bench's `err/s`), over the same intervals.
    pub errors_per_s: f64,
    /// Datagrams the peer's UDP source sent (over the load, which runs 2 s past the window).
    pub sent: Option<u64>,
    /// `sent` per second of the load.
    pub sent_per_s: Option<f64>,
    /// The driver's counters that name XDP (`ethtool -S`), over the window, summed over queues:
    /// name (its queue prefix dropped) and count.
    pub driver_counters: std::collections::BTreeMap<String, u64>,
}

impl XdpFigures {
    /// The figures of an xdp workload of `action` under `frame_bytes` frames, from its agent's
    /// frames; `None` without xdp-bench's intervals.
    pub fn of(frames: &Frames, action: XdpAction, frame_bytes: u32) -> Option<XdpFigures> {
        let bench = frames.first(FrameKind::XdpBench)?.as_str()?;
        let all: Vec<(f64, f64)> = bench.lines().filter_map(summary_line).collect();
        let busy: Vec<(f64, f64)> = all.iter().copied().filter(|(rx, _)| *rx > 0.0).collect();
        let intervals = match busy.len() {
            0 if all.is_empty() => return None,
            0 => all,
            1 | 2 => busy,
            n => busy[1..n - 1].to_vec(),
        };
        let n = intervals.len() as f64;
        let load = frames.first(FrameKind::XdpLoad);
        let sent = load.and_then(|l| l.get("sent")?.as_u64());
        let seconds = load.and_then(|l| l.get("seconds")?.as_f64()).filter(|s| *s > 0.0);
        Some(XdpFigures {
            action,
            frame_bytes,
            handled_per_s: intervals.iter().map(|i| i.0).sum::<f64>() / n,
            intervals: intervals.len() as u32,
            errors_per_s: intervals.iter().map(|i| i.1).sum::<f64>() / n,
            sent,
            sent_per_s: sent.zip(seconds).map(|(s, t)| s as f64 / t),
            driver_counters: xdp_counters(frames),
        })
    }
}

/// An interval's `Summary  1,234,567 rx/s  0 err/s` (or `err,drop/s`): its rates.
fn summary_line(line: &str) -> Option<(f64, f64)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "Summary")?;
    let number = |w: &str| w.replace(',', "").parse::<f64>().ok();
    match words.get(at + 1..at + 5)? {
        [rx, "rx/s", err, unit] if unit.starts_with("err") => Some((number(rx)?, number(err)?)),
        _ => None,
    }
}

/// The `ethtool -S` counters naming XDP, after less before, summed over queues.
fn xdp_counters(frames: &Frames) -> std::collections::BTreeMap<String, u64> {
    let read = |kind: FrameKind| {
        let mut sums = std::collections::BTreeMap::<String, u64>::new();
        let text = frames.first(kind).and_then(Value::as_str).unwrap_or_default();
        for line in text.lines() {
            let Some((name, value)) = line.split_once(':') else { continue };
            let Ok(value) = value.trim().parse::<u64>() else { continue };
            let name = name.trim();
            if name.to_ascii_lowercase().contains("xdp") {
                // atlantic's `Queue[3] XdpDrop` and the like: one sum per counter over the queues.
                let counter = name.rsplit(' ').next().unwrap_or(name).to_string();
                *sums.entry(counter).or_default() += value;
            }
        }
        sums
    };
    let (before, after) = (read(FrameKind::EthtoolSBefore), read(FrameKind::EthtoolSAfter));
    after
        .into_iter()
        .map(|(name, a)| (name.clone(), a.saturating_sub(before.get(&name).copied().unwrap_or(0))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use engines::agent::encode;

    fn frames(bench: &str) -> Frames {
        let ethtool = |drops: u64| {
            format!(
                "NIC statistics:\n     InPackets: 9\n     Queue[0] InPackets: 9\n     Queue[0] XdpDrop: {drops}\n     Queue[1] XdpDrop: 1\n     Queue[0] XdpPass: 0\n"
            )
        };
        let mut port = encode(1, "ethtool-S-before", true, ethtool(100).as_bytes());
        port.extend(encode(2, "ethtool-S-after", true, ethtool(5100).as_bytes()));
        port.extend(encode(3, "xdp-bench", true, bench.as_bytes()));
        port.extend(encode(4, "xdp-load", false, br#"{"sent":70000,"seconds":7,"payload":18,"pps":0}"#));
        engines::agent::parse(&port)
    }

    const BENCH: &str = "Dropping packets on eth0 (ifindex 2; driver atlantic)\n\
        Summary                          0 rx/s                  0 err/s\n\
        Summary                        300 rx/s                  0 err/s\n\
        Summary                      1,000 rx/s                  0 err/s\n\
        Summary                      1,200 rx/s                  3 err/s\n\
        Summary                        800 rx/s                  0 err,drop/s\n\
        Summary                         10 rx/s                  0 err/s\n\
        Summary                          0 rx/s                  0 err/s\n\
        \n  Packets received    : 3,000\n  Average packets/s   : 1,000\n";

    #[test]
    fn xdp_bench_s_intervals_the_load_and_the_driver_s_counters_are_read() {
        let x = XdpFigures::of(&frames(BENCH), XdpAction::Drop, 64).unwrap();
        // The three full seconds under the load: not the idle ones, nor its partial first and last.
        assert_eq!((x.handled_per_s, x.intervals, x.errors_per_s), (1000.0, 3, 1.0));
        assert_eq!((x.sent, x.sent_per_s), (Some(70_000), Some(10_000.0)));
        assert_eq!(x.driver_counters.get("XdpDrop"), Some(&5000), "atlantic's per-queue counters summed");
        assert_eq!(x.driver_counters.get("XdpPass"), Some(&0));
    }

    #[test]
    fn an_idle_program_handled_nothing_and_a_short_load_is_not_trimmed() {
        let idle = "Summary 0 rx/s 0 err/s\nSummary 0 rx/s 0 err/s\n";
        assert_eq!(XdpFigures::of(&frames(idle), XdpAction::Pass, 64).unwrap().handled_per_s, 0.0);
        let short = "Summary 0 rx/s 0 err/s\nSummary 40 rx/s 0 err/s\nSummary 60 rx/s 0 err/s\n";
        let x = XdpFigures::of(&frames(short), XdpAction::Tx, 64).unwrap();
        assert_eq!((x.handled_per_s, x.intervals), (50.0, 2));
    }

    #[test]
    fn output_without_intervals_is_no_figure() {
        assert_eq!(
            XdpFigures::of(&frames("Failed to attach XDP program: Operation not supported\n"), XdpAction::Drop, 64),
            None
        );
        assert_eq!(summary_line("Summary 1,0x0 rx/s 0 err/s"), None);
        assert_eq!(summary_line("Summary 10 rx/s"), None);
    }
}

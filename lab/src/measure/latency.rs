//! What a `latency` workload measured: `sockperf ping-pong --full-rtt`'s round trips, read from
//! its report (the agent's `sockperf` frame).
//!
//! ```text
//! sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=114082; ReceivedMessages=114082
//! sockperf: ====> avg-rtt=13.560 (std-dev=65.062)
//! sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0
//! sockperf: ---> <MAX> observation = 5263.890
//! sockperf: ---> percentile 99.999 = 5152.175
//! ...
//! sockperf: ---> percentile 50.000 =   11.627
//! sockperf: ---> <MIN> observation =   11.116
//! ```

use serde::{Deserialize, Serialize};

use crate::matrix::Protocol;

/// Round trips of one latency workload, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Latency {
    /// `udp` or `tcp`.
    #[schema(value_type = String)]
    pub protocol: Protocol,
    /// The message's size in bytes.
    pub message_bytes: u32,
    /// Seconds the run took, its warm-up included.
    pub seconds: f64,
    /// Round trips measured (sockperf's valid duration, after its warm-up).
    pub messages: u64,
    /// Messages sockperf found dropped.
    pub dropped: u64,
    /// The mean round trip.
    pub mean_us: f64,
    /// Its standard deviation.
    pub stddev_us: f64,
    /// The shortest.
    pub min_us: f64,
    /// The median.
    pub p50_us: f64,
    /// The 90th percentile.
    pub p90_us: f64,
    /// The 99th percentile.
    pub p99_us: f64,
    /// The 99.9th percentile.
    pub p99_9_us: f64,
    /// The longest.
    pub max_us: f64,
}

impl Latency {
    /// Reads sockperf's report `text` of a run with `protocol` and `message_bytes`; `None`
    /// without its statistics (a run that failed).
    pub fn parse(text: &str, protocol: Protocol, message_bytes: u32) -> Option<Latency> {
        let mut latency = Latency {
            protocol,
            message_bytes,
            seconds: f64::NAN,
            messages: 0,
            dropped: 0,
            mean_us: f64::NAN,
            stddev_us: f64::NAN,
            min_us: f64::NAN,
            p50_us: f64::NAN,
            p90_us: f64::NAN,
            p99_us: f64::NAN,
            p99_9_us: f64::NAN,
            max_us: f64::NAN,
        };
        for line in text.lines().map(without_escapes) {
            let line = line.trim_start_matches("sockperf:").trim();
            if let Some(rest) = line.strip_prefix("[Total Run]") {
                latency.seconds = field(rest, "RunTime=").unwrap_or(f64::NAN);
            } else if let Some(rest) = line.strip_prefix("[Valid Duration]") {
                latency.messages = field(rest, "ReceivedMessages=").unwrap_or(0.0) as u64;
            } else if let Some(rest) = line.strip_prefix("====> avg-rtt=") {
                let (mean, stddev) = rest.split_once(" (std-dev=")?;
                latency.mean_us = mean.trim().parse().ok()?;
                latency.stddev_us = stddev.trim_end_matches(')').trim().parse().ok()?;
            } else if line.starts_with("# dropped messages") {
                latency.dropped = field(line, "dropped messages = ").unwrap_or(0.0) as u64;
            } else if let Some((what, value)) = line.strip_prefix("---> ").and_then(|l| l.split_once(" = ")) {
                let value: f64 = value.trim().parse().ok()?;
                match what.trim() {
                    "<MAX> observation" => latency.max_us = value,
                    "<MIN> observation" => latency.min_us = value,
                    "percentile 99.900" => latency.p99_9_us = value,
                    "percentile 99.000" => latency.p99_us = value,
                    "percentile 90.000" => latency.p90_us = value,
                    "percentile 50.000" => latency.p50_us = value,
                    _ => {}
                }
            }
        }
        let figures = [latency.mean_us, latency.min_us, latency.p50_us, latency.p90_us, latency.p99_us];
        (latency.messages > 0 && figures.iter().all(|f| f.is_finite())).then_some(latency)
    }
}

/// The number after `key` in `text`, up to the next `;` or space.
fn field(text: &str, key: &str) -> Option<f64> {
    let rest = &text[text.find(key)? + key.len()..];
    rest.split([';', ' ']).next()?.trim().parse().ok()
}

/// `line` without its terminal escape sequences (sockperf colours its summary lines).
fn without_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sockperf 3.7's report of a UDP ping-pong (`--full-rtt`), as Debian's prints it.
    const REPORT: &str = "sockperf: == version #3.7-no.git == \n\
sockperf[CLIENT] send on:sockperf: using recvfrom() to block on socket(s)\n\
\n\
[ 0] IP = 10.77.0.1       PORT = 11111 # UDP\n\
sockperf: Warmup stage (sending a few dummy messages)...\n\
sockperf: Starting test...\n\
sockperf: Test end (interrupted by timer)\n\
sockperf: Test ended\n\
sockperf: [Total Run] RunTime=2.003 sec; Warm up time=400 msec; SentMessages=126724; ReceivedMessages=126723\n\
sockperf: ========= Printing statistics for Server No: 0\n\
sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=114082; ReceivedMessages=114082\n\
sockperf: \u{1b}[2;35m====> avg-rtt=13.560 (std-dev=65.062)\u{1b}[0m\n\
sockperf: # dropped messages = 2; # duplicated messages = 0; # out-of-order messages = 0\n\
sockperf: Summary: Round trip is 13.560 usec\n\
sockperf: \u{1b}[2;35mTotal 114082 observations\u{1b}[0m; each percentile contains 1140.82 observations\n\
sockperf: ---> <MAX> observation = 5263.890\n\
sockperf: ---> percentile 99.999 = 5152.175\n\
sockperf: ---> percentile 99.990 = 3755.037\n\
sockperf: ---> percentile 99.900 =   59.277\n\
sockperf: ---> percentile 99.000 =   38.386\n\
sockperf: ---> percentile 90.000 =   12.678\n\
sockperf: ---> percentile 75.000 =   12.147\n\
sockperf: ---> percentile 50.000 =   11.627\n\
sockperf: ---> percentile 25.000 =   11.436\n\
sockperf: ---> <MIN> observation =   11.116\n";

    #[test]
    fn sockperf_s_report_is_read_into_ordered_percentiles() {
        let l = Latency::parse(REPORT, Protocol::Udp, 64).unwrap();
        assert_eq!((l.messages, l.dropped, l.message_bytes, l.seconds), (114_082, 2, 64, 2.003));
        assert_eq!((l.mean_us, l.stddev_us), (13.56, 65.062));
        assert_eq!(
            (l.min_us, l.p50_us, l.p90_us, l.p99_us, l.p99_9_us, l.max_us),
            (11.116, 11.627, 12.678, 38.386, 59.277, 5263.89)
        );
        let ordered = [l.min_us, l.p50_us, l.p90_us, l.p99_us, l.p99_9_us, l.max_us];
        assert!(ordered.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_report_without_statistics_is_no_figure() {
        assert_eq!(Latency::parse("sockperf: ERROR: Failed to connect\n", Protocol::Tcp, 64), None);
        let cut = REPORT.split("percentile 90.000").next().unwrap();
        assert_eq!(Latency::parse(cut, Protocol::Udp, 64), None, "no median: cut short");
        let garbled = REPORT.replace("avg-rtt=13.560", "avg-rtt=fast");
        assert_eq!(Latency::parse(&garbled, Protocol::Udp, 64), None);
        assert_eq!(without_escapes("a\u{1b}[2;35mb\u{1b}[0mc"), "abc");
    }
}

//! What a `packet-rate` workload measured: UDP frames of one size sent, delivered to the
//! receiving socket, and dropped where each drop happened (the NIC, the IP and UDP stack, the
//! socket's buffer), from iperf3's JSON and the guest's counters before and after.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::matrix::Direction;
use engines::agent::{FrameKind, Frames};

/// Who sent the frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Sender {
    /// iperf3 on the peer (`rx`): the peer's CPU may be the limit.
    PeerIperf3,
    /// iperf3 in the guest (`tx`).
    GuestIperf3,
    /// Both, one stream each way (`bidir`).
    BothIperf3,
}

/// Frames dropped on the receiving side, where they were counted; `None` where the guest is not
/// the receiver or the counter could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Drops {
    /// The guest's NIC: its interface's `rx_dropped`, `rx_missed_errors`, `rx_fifo_errors` and
    /// `rx_over_errors` (the driver's own accounting: no buffer, ring overrun).
    pub nic: Option<u64>,
    /// The guest's stack: IP's `InDiscards` and UDP's `InErrors` less its `RcvbufErrors`, and
    /// `NoPorts` (`/proc/net/snmp`, or `snmp6`'s `Ip6InDiscards` and `Udp6*` over IPv6).
    pub stack: Option<u64>,
    /// The receiving socket: UDP's `RcvbufErrors` (its buffer was full: the reader fell behind).
    pub socket: Option<u64>,
}

/// What a packet-rate workload measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PacketRate {
    /// The frame's length on the wire, FCS included.
    pub frame_bytes: u32,
    /// Who sent.
    pub sender: Sender,
    /// Datagrams the sending iperf3 sent.
    pub sent: u64,
    /// Packets the guest's IP layer received (`Ip:InReceives`, and `Ip6InReceives`), where the
    /// guest receives: what reached its stack, before the stack's and the socket's drops.
    pub received: Option<u64>,
    /// Datagrams the receiving iperf3 read from its socket (the bytes it received over the
    /// datagram's length).
    pub delivered: u64,
    /// `delivered` per second of the test.
    pub delivered_per_s: f64,
    /// Where the receiver dropped frames (the guest's side, for `rx`).
    pub drops: Drops,
}

impl PacketRate {
    /// The figures of a packet-rate workload of `frame_bytes` frames carrying `payload` bytes
    /// of UDP in `direction`, from its agent's frames; `None` without iperf3's UDP summary.
    pub fn of(frames: &Frames, frame_bytes: u32, payload: u32, direction: Direction) -> Option<PacketRate> {
        let end = frames.first(FrameKind::Iperf3)?.get("end")?;
        let summary = end.get("sum")?;
        let seconds = summary.get("seconds").and_then(Value::as_f64).filter(|s| *s > 0.0)?;
        let sent = end.get("sum_sent").or(Some(summary)).and_then(|s| s.get("packets")?.as_u64())?;
        // What the receivers read: iperf3's own loss count is of sequence gaps, which reordering
        // and its counters' width upset; the bytes it read are exact, every datagram `payload`
        // long.
        let bytes = |key: &str| end.get(key).and_then(|s| s.get("bytes")?.as_u64());
        let read = bytes("sum_received")? + bytes("sum_received_bidir_reverse").unwrap_or(0);
        let delivered = read / u64::from(payload.max(1));
        let (sender, guest_receives) = match direction {
            Direction::Rx => (Sender::PeerIperf3, true),
            Direction::Tx => (Sender::GuestIperf3, false),
            Direction::Bidir => (Sender::BothIperf3, true),
        };
        let (received, drops) = if guest_receives { receive_counts(frames) } else { (None, Drops::default()) };
        Some(PacketRate {
            frame_bytes,
            sender,
            sent,
            received,
            delivered,
            delivered_per_s: delivered as f64 / seconds,
            drops,
        })
    }
}

/// The packets the guest's IP layer received over the workload, and its drops by where they
/// happened.
fn receive_counts(frames: &Frames) -> (Option<u64>, Drops) {
    let netdev = |kind: FrameKind, key: &str| frames.first(kind)?.get(key)?.as_u64();
    let nic: Option<u64> = ["rx_dropped", "rx_missed_errors", "rx_fifo_errors", "rx_over_errors"]
        .iter()
        .map(|k| Some(netdev(FrameKind::NetdevAfter, k)?.saturating_sub(netdev(FrameKind::NetdevBefore, k)?)))
        .sum();
    let snmp = |kind: FrameKind| frames.first(kind).and_then(Value::as_str).map(Snmp::parse);
    let (Some(before), Some(after)) = (snmp(FrameKind::SnmpBefore), snmp(FrameKind::SnmpAfter)) else {
        return (None, Drops { nic, ..Drops::default() });
    };
    let delta = |names: &[&str]| -> Option<u64> {
        names.iter().map(|n| Some(after.get(n)?.saturating_sub(before.get(n)?))).sum()
    };
    // IPv4's and IPv6's counters added: the traffic is one or the other.
    let sum = |v4: &[&str], v6: &[&str]| match (delta(v4), delta(v6)) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    let socket = sum(&["Udp:RcvbufErrors"], &["Udp6RcvbufErrors"]);
    let in_errors = sum(&["Udp:InErrors"], &["Udp6InErrors"]);
    let other = sum(&["Ip:InDiscards", "Udp:NoPorts"], &["Ip6InDiscards", "Udp6NoPorts"]);
    let stack = match (in_errors, other) {
        (Some(errors), Some(other)) => Some(errors.saturating_sub(socket.unwrap_or(0)) + other),
        _ => None,
    };
    (sum(&["Ip:InReceives"], &["Ip6InReceives"]), Drops { nic, stack, socket })
}

/// `/proc/net/snmp` (a line of names, then one of values, per protocol: `Udp:` `InErrors`
/// becomes `Udp:InErrors`) and `/proc/net/snmp6` (a name and a value per line).
struct Snmp(std::collections::BTreeMap<String, u64>);

impl Snmp {
    fn parse(text: &str) -> Snmp {
        let mut map = std::collections::BTreeMap::new();
        let mut header: Option<(&str, Vec<&str>)> = None;
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let Some(first) = words.next() else { continue };
            if let Some(proto) = first.strip_suffix(':') {
                let rest: Vec<&str> = words.collect();
                match header.take() {
                    Some((names_of, names)) if names_of == proto && rest.iter().all(|w| w.parse::<i64>().is_ok()) => {
                        for (name, value) in names.iter().zip(&rest) {
                            if let Ok(v) = value.parse::<u64>() {
                                map.insert(format!("{proto}:{name}"), v);
                            }
                        }
                    }
                    _ => header = Some((proto, rest)),
                }
            } else if let (Some(value), None) = (words.next().and_then(|v| v.parse::<u64>().ok()), words.next()) {
                map.insert(first.to_string(), value);
            }
        }
        Snmp(map)
    }

    fn get(&self, name: &str) -> Option<u64> {
        self.0.get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engines::agent::encode;

    const SNMP_BEFORE: &str = "Ip: Forwarding DefaultTTL InReceives InHdrErrors InDiscards\nIp: 2 64 100 0 1\n\
        Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\nUdp: 10 0 0 5 0\n\
        Ip6InReceives                   \t7\nIp6InDiscards 0\nUdp6InErrors 0\nUdp6RcvbufErrors 0\nUdp6NoPorts 0\n";
    const SNMP_AFTER: &str = "Ip: Forwarding DefaultTTL InReceives InHdrErrors InDiscards\nIp: 2 64 90100 0 4\n\
        Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\nUdp: 80010 2 9000 9 8500\n\
        Ip6InReceives 7\nIp6InDiscards 0\nUdp6InErrors 0\nUdp6RcvbufErrors 0\nUdp6NoPorts 0\n";

    fn frames(direction: &str) -> Frames {
        let iperf = r#"{"end":{"sum":{"seconds":10.0,"packets":100000,"lost_packets":20000},
            "sum_sent":{"packets":100004},"sum_received":{"bytes":1260000}}}"#;
        let mut port = encode(
            1,
            "netdev-before",
            false,
            br#"{"rx_dropped":5,"rx_missed_errors":0,"rx_fifo_errors":0,"rx_over_errors":0}"#,
        );
        port.extend(encode(2, "snmp-before", true, SNMP_BEFORE.as_bytes()));
        port.extend(encode(3, "workload-begin", false, format!(r#"{{"direction":"{direction}"}}"#).as_bytes()));
        port.extend(encode(
            4,
            "netdev-after",
            false,
            br#"{"rx_dropped":105,"rx_missed_errors":900,"rx_fifo_errors":0,"rx_over_errors":0}"#,
        ));
        port.extend(encode(5, "snmp-after", true, SNMP_AFTER.as_bytes()));
        port.extend(encode(6, "iperf3", false, iperf.as_bytes()));
        engines::agent::parse(&port)
    }

    #[test]
    fn snmp_tables_and_lines_are_read_by_name() {
        let snmp = Snmp::parse(SNMP_AFTER);
        assert_eq!(snmp.get("Udp:RcvbufErrors"), Some(8500));
        assert_eq!(snmp.get("Ip:InDiscards"), Some(4));
        assert_eq!(snmp.get("Ip6InReceives"), Some(7));
        assert_eq!(snmp.get("Udp:Nope"), None);
        let broken = Snmp::parse("Udp: InErrors\nUdp: x\nIcmp: A B\nIcmp: 1\n");
        assert_eq!((broken.get("Udp:InErrors"), broken.get("Icmp:A"), broken.get("Icmp:B")), (None, Some(1), None));
    }

    #[test]
    fn a_received_stream_counts_its_drops_where_they_happened() {
        let rate = PacketRate::of(&frames("rx"), 64, 18, Direction::Rx).unwrap();
        // iperf3 read 1 260 000 bytes: 70 000 datagrams of 18 bytes (its gap count says 80 000).
        assert_eq!((rate.sent, rate.delivered, rate.sender), (100_004, 70_000, Sender::PeerIperf3));
        assert_eq!(rate.delivered_per_s, 7000.0);
        assert_eq!(rate.received, Some(90_000), "IP's InReceives over the workload");
        // NIC: 100 dropped + 900 missed; stack: 3 IP discards + (9000 - 8500) UDP errors + 2 no
        // port; socket: 8500 receive-buffer errors.
        assert_eq!(rate.drops, Drops { nic: Some(1000), stack: Some(505), socket: Some(8500) });
    }

    #[test]
    fn a_sent_stream_has_no_receive_drops_in_the_guest() {
        let rate = PacketRate::of(&frames("tx"), 1518, 1472, Direction::Tx).unwrap();
        assert_eq!((rate.sender, rate.frame_bytes, rate.received), (Sender::GuestIperf3, 1518, None));
        assert_eq!(rate.delivered, 855, "1 260 000 bytes in 1472-byte datagrams");
        assert_eq!(rate.drops, Drops::default());
        assert_eq!(PacketRate::of(&Frames::default(), 64, 18, Direction::Rx), None);
    }
}

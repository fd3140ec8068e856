//! What a NIC model puts on its PCIe link, counted as a PCIe analyser on the card's link would
//! count it ([`LinkCounts`], `"bus"` in a model's counters), and the cost model that turns those
//! counts into link time per packet ([`LinkProfile::cost`]).
//!
//! The models count what the chip would issue, not what the model's code happens to do: a
//! descriptor fetch covers as many packed descriptors as the chip's burst allows (and one
//! descriptor when the driver spaces them apart), a write is split at cache-line boundaries and
//! its pieces that cover less than a whole line are counted apart (the root complex has to merge
//! them into the line), a read is one request per `max_read_request` bytes and its data comes back
//! in one completion per cache line (the read completion boundary), an MSI-X interrupt is a
//! 4-byte write. docs/lab.md has the fields, docs/experiments.md what they show.

use serde::{Deserialize, Serialize};

/// Transactions (TLPs) of one kind and the payload bytes they carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transactions {
    /// Transaction layer packets: requests for reads, write TLPs for writes.
    pub tlps: u64,
    /// Payload bytes (for reads, the bytes asked for).
    pub bytes: u64,
}

impl Transactions {
    /// The transactions since `earlier`.
    pub fn minus(self, earlier: Transactions) -> Transactions {
        Transactions { tlps: self.tlps.saturating_sub(earlier.tlps), bytes: self.bytes.saturating_sub(earlier.bytes) }
    }

    /// Both together.
    pub fn plus(self, other: Transactions) -> Transactions {
        Transactions { tlps: self.tlps + other.tlps, bytes: self.bytes + other.bytes }
    }
}

/// One side of the data path's traffic on the link (receive or transmit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkTraffic {
    /// Descriptor fetches (reads).
    pub descriptor_reads: Transactions,
    /// Descriptor write-backs.
    pub descriptor_writes: Transactions,
    /// Packet buffer reads (TX data).
    pub buffer_reads: Transactions,
    /// Packet buffer writes (RX data).
    pub buffer_writes: Transactions,
    /// Head pointer write-backs.
    pub head_writes: Transactions,
    /// MSI-X messages (a 4-byte write each).
    pub interrupts: Transactions,
    /// Completions that carried the reads' data back (one per cache line a read touches).
    pub read_completions: u64,
    /// Write TLPs that cover less than a whole cache line (interrupts not included).
    pub partial_writes: u64,
}

/// The number of u64 fields of a [`LinkTraffic`] in the counters region.
pub(crate) const TRAFFIC_WORDS: usize = 14;

impl LinkTraffic {
    /// All reads: descriptor fetches and buffer reads.
    pub fn reads(&self) -> Transactions {
        self.descriptor_reads.plus(self.buffer_reads)
    }

    /// All writes: descriptor, buffer and head write-backs, and interrupts.
    pub fn writes(&self) -> Transactions {
        self.descriptor_writes.plus(self.buffer_writes).plus(self.head_writes).plus(self.interrupts)
    }

    /// Every TLP the device sent (reads are requests; completions come the other way).
    pub fn tlps(&self) -> u64 {
        self.reads().tlps + self.writes().tlps
    }

    /// The traffic since `earlier` (counters only grow; a reset model counts from 0 again).
    pub fn minus(&self, earlier: &LinkTraffic) -> LinkTraffic {
        LinkTraffic {
            descriptor_reads: self.descriptor_reads.minus(earlier.descriptor_reads),
            descriptor_writes: self.descriptor_writes.minus(earlier.descriptor_writes),
            buffer_reads: self.buffer_reads.minus(earlier.buffer_reads),
            buffer_writes: self.buffer_writes.minus(earlier.buffer_writes),
            head_writes: self.head_writes.minus(earlier.head_writes),
            interrupts: self.interrupts.minus(earlier.interrupts),
            read_completions: self.read_completions.saturating_sub(earlier.read_completions),
            partial_writes: self.partial_writes.saturating_sub(earlier.partial_writes),
        }
    }

    /// Both sides together.
    pub fn plus(&self, other: &LinkTraffic) -> LinkTraffic {
        LinkTraffic {
            descriptor_reads: self.descriptor_reads.plus(other.descriptor_reads),
            descriptor_writes: self.descriptor_writes.plus(other.descriptor_writes),
            buffer_reads: self.buffer_reads.plus(other.buffer_reads),
            buffer_writes: self.buffer_writes.plus(other.buffer_writes),
            head_writes: self.head_writes.plus(other.head_writes),
            interrupts: self.interrupts.plus(other.interrupts),
            read_completions: self.read_completions + other.read_completions,
            partial_writes: self.partial_writes + other.partial_writes,
        }
    }

    pub(crate) fn words(&self) -> [u64; TRAFFIC_WORDS] {
        let t = |x: Transactions| [x.tlps, x.bytes];
        let [a, b] = t(self.descriptor_reads);
        let [c, d] = t(self.descriptor_writes);
        let [e, f] = t(self.buffer_reads);
        let [g, h] = t(self.buffer_writes);
        let [i, j] = t(self.head_writes);
        let [k, l] = t(self.interrupts);
        [a, b, c, d, e, f, g, h, i, j, k, l, self.read_completions, self.partial_writes]
    }

    pub(crate) fn from_words(w: [u64; TRAFFIC_WORDS]) -> LinkTraffic {
        let t = |i: usize| Transactions { tlps: w[i], bytes: w[i + 1] };
        LinkTraffic {
            descriptor_reads: t(0),
            descriptor_writes: t(2),
            buffer_reads: t(4),
            buffer_writes: t(6),
            head_writes: t(8),
            interrupts: t(10),
            read_completions: w[12],
            partial_writes: w[13],
        }
    }
}

/// What a model put on the link, receive and transmit apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCounts {
    /// The receive path: RX descriptors, frames written, RX head write-backs and interrupts.
    pub rx: LinkTraffic,
    /// The transmit path: TX descriptors, frames read, TX head write-backs and interrupts.
    pub tx: LinkTraffic,
}

/// The link and the chip's DMA engine, as the cost model and the models' accounting see them.
/// Every figure is a parameter; [`LinkProfile::lan743x`] and [`LinkProfile::aqc100`] are the
/// defaults (docs/lab.md says where each value comes from).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkProfile {
    /// The link, e.g. "PCIe Gen2 x1".
    pub link: String,
    /// Transfer rate per lane, GT/s.
    pub gt_per_s: f64,
    /// The link's width in lanes.
    pub lanes: u32,
    /// Payload bits per transferred bit (8b/10b: 0.8; 128b/130b: 128/130).
    pub encoding: f64,
    /// Bytes every TLP costs beyond its payload: framing, sequence number, a 4-DW header
    /// (64-bit addresses), LCRC.
    pub tlp_overhead: u32,
    /// The chip's largest read request, bytes.
    pub max_read_request: u32,
    /// Cache line and read completion boundary, bytes.
    pub cache_line: u32,
    /// The largest descriptor fetch, bytes: packed descriptors are fetched up to this many
    /// bytes at once.
    pub descriptor_burst: u32,
    /// Round trip of a read, from request to its last completion, ns.
    pub read_latency_ns: f64,
    /// Reads the chip keeps in flight at once.
    pub outstanding_reads: u32,
}

impl LinkProfile {
    /// The LAN7430: a PCIe Gen2 x1 link (as issue 20 gives it), descriptor fetches of one
    /// cache line, 512-byte read requests, 4 reads in flight, 1 us read round trip.
    pub fn lan743x() -> LinkProfile {
        LinkProfile {
            link: "PCIe Gen2 x1".into(),
            gt_per_s: 5.0,
            lanes: 1,
            encoding: 0.8,
            tlp_overhead: 24,
            max_read_request: 512,
            cache_line: 64,
            descriptor_burst: 64,
            read_latency_ns: 1000.0,
            outstanding_reads: 4,
        }
    }

    /// The AQC100: a PCIe Gen3 x2 link, descriptor fetches of up to 128 bytes (8 descriptors),
    /// 512-byte read requests, 8 reads in flight, 1 us read round trip.
    pub fn aqc100() -> LinkProfile {
        LinkProfile {
            link: "PCIe Gen3 x2".into(),
            gt_per_s: 8.0,
            lanes: 2,
            encoding: 128.0 / 130.0,
            tlp_overhead: 24,
            max_read_request: 512,
            cache_line: 64,
            descriptor_burst: 128,
            read_latency_ns: 1000.0,
            outstanding_reads: 8,
        }
    }

    /// Payload bytes per ns in each direction of the link.
    pub fn bytes_per_ns(&self) -> f64 {
        self.gt_per_s * f64::from(self.lanes) * self.encoding / 8.0
    }

    /// The link time of `traffic` spread over `packets` packets: each direction of the link
    /// carries its own TLPs (the device's writes and read requests upstream, the completions
    /// downstream), and the reads' round trips overlap up to `outstanding_reads` at a time.
    /// The slowest of the three bounds the packet rate.
    pub fn cost(&self, traffic: &LinkTraffic, packets: u64) -> Option<LinkCost> {
        if packets == 0 {
            return None;
        }
        let n = packets as f64;
        let overhead = f64::from(self.tlp_overhead);
        let (reads, writes) = (traffic.reads(), traffic.writes());
        let upstream = (writes.bytes as f64 + writes.tlps as f64 * overhead + reads.tlps as f64 * overhead) / n;
        let downstream = (reads.bytes as f64 + traffic.read_completions as f64 * overhead) / n;
        let rate = self.bytes_per_ns();
        let upstream_ns = upstream / rate;
        let downstream_ns = downstream / rate;
        let latency_ns = reads.tlps as f64 / n * self.read_latency_ns / f64::from(self.outstanding_reads.max(1));
        let ns_per_packet = upstream_ns.max(downstream_ns).max(latency_ns);
        let limit = if ns_per_packet == latency_ns {
            LinkLimit::ReadLatency
        } else if ns_per_packet == upstream_ns {
            LinkLimit::Upstream
        } else {
            LinkLimit::Downstream
        };
        Some(LinkCost {
            upstream_ns,
            downstream_ns,
            latency_ns,
            ns_per_packet,
            packets_per_s: if ns_per_packet > 0.0 { 1e9 / ns_per_packet } else { f64::INFINITY },
            limit,
        })
    }
}

/// What bounds the modelled packet rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkLimit {
    /// The device-to-host direction (writes and read requests).
    Upstream,
    /// The host-to-device direction (read completions).
    Downstream,
    /// Read round trips beyond what the outstanding reads hide.
    ReadLatency,
}

/// The cost model's figures for one packet (see [`LinkProfile::cost`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkCost {
    /// Upstream link time per packet, ns.
    pub upstream_ns: f64,
    /// Downstream link time per packet, ns.
    pub downstream_ns: f64,
    /// Read round trips per packet divided by the reads in flight, ns.
    pub latency_ns: f64,
    /// The largest of the three: the bus time per packet.
    pub ns_per_packet: f64,
    /// The packet rate the link would allow.
    pub packets_per_s: f64,
    /// Which of the three it is.
    pub limit: LinkLimit,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_round_trips_through_its_words_and_subtracts() {
        let t = LinkTraffic {
            descriptor_reads: Transactions { tlps: 1, bytes: 2 },
            interrupts: Transactions { tlps: 11, bytes: 12 },
            read_completions: 13,
            partial_writes: 14,
            ..Default::default()
        };
        assert_eq!(LinkTraffic::from_words(t.words()), t);
        assert_eq!(t.minus(&t), LinkTraffic::default());
        assert_eq!(t.plus(&t).minus(&t), t);
        assert_eq!(t.tlps(), 12);
    }

    #[test]
    fn the_cost_is_the_slowest_of_the_link_directions_and_the_read_round_trips() {
        let p = LinkProfile::lan743x();
        assert_eq!(p.bytes_per_ns(), 0.5, "Gen2 x1: 5 GT/s, 8b/10b");
        // 10 packets: 10 buffer writes of 1,000 bytes in 160 TLPs, 10 descriptor reads of 16
        // bytes with 10 completions.
        let t = LinkTraffic {
            buffer_writes: Transactions { tlps: 160, bytes: 10_000 },
            descriptor_reads: Transactions { tlps: 10, bytes: 160 },
            read_completions: 10,
            ..Default::default()
        };
        let c = p.cost(&t, 10).unwrap();
        let up = (10_000.0 + 160.0 * 24.0 + 10.0 * 24.0) / 10.0 / 0.5;
        let down = (160.0 + 10.0 * 24.0) / 10.0 / 0.5;
        let latency = 1.0 * 1000.0 / 4.0;
        assert_eq!((c.upstream_ns, c.downstream_ns, c.latency_ns), (up, down, latency));
        assert_eq!((c.ns_per_packet, c.limit), (up, LinkLimit::Upstream));
        assert_eq!(c.packets_per_s, 1e9 / up);
        // Only reads, one round trip each with nothing in flight beside it: latency bound.
        let p1 = LinkProfile { outstanding_reads: 1, ..p };
        let r = LinkTraffic {
            descriptor_reads: Transactions { tlps: 4, bytes: 64 },
            read_completions: 4,
            ..Default::default()
        };
        let c = p1.cost(&r, 1).unwrap();
        assert_eq!((c.ns_per_packet, c.limit), (4000.0, LinkLimit::ReadLatency));
        assert!(p1.cost(&r, 0).is_none());
    }
}

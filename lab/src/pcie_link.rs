//! A record's bus figures: what the device model counted on its PCIe link over the workload
//! (`vm_spec::pcie_link`), per packet and by side, and the link time the cost model gives for it.

use serde::{Deserialize, Serialize};
use vm_spec::NicKind;
use vm_spec::counters::ModelCounters;
use vm_spec::pcie_link::{LinkCost, LinkProfile, LinkTraffic};

/// One side's traffic per packet of that side (frames the model received into the host for RX,
/// frames it read and sent for TX).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkPerPacket {
    /// TLPs the device sent (read requests and writes).
    pub tlps: f64,
    /// Payload bytes both ways.
    pub bytes: f64,
    /// Descriptor fetches.
    pub descriptor_reads: f64,
    /// Descriptor write-backs.
    pub descriptor_writes: f64,
    /// Buffer reads and writes.
    pub buffer_tlps: f64,
    /// Head write-backs.
    pub head_writes: f64,
    /// MSI-X writes.
    pub interrupts: f64,
    /// Writes of less than a cache line.
    pub partial_writes: f64,
    /// Completions of the reads.
    pub read_completions: f64,
    /// This side's traffic through the cost model, per packet of this side.
    #[serde(default)]
    pub modelled: Option<LinkCost>,
}

impl LinkPerPacket {
    fn of(t: &LinkTraffic, packets: u64, profile: &LinkProfile) -> Option<LinkPerPacket> {
        if packets == 0 {
            return None;
        }
        let per = |v: u64| v as f64 / packets as f64;
        Some(LinkPerPacket {
            tlps: per(t.tlps()),
            bytes: per(t.reads().bytes + t.writes().bytes),
            descriptor_reads: per(t.descriptor_reads.tlps),
            descriptor_writes: per(t.descriptor_writes.tlps),
            buffer_tlps: per(t.buffer_reads.tlps + t.buffer_writes.tlps),
            head_writes: per(t.head_writes.tlps),
            interrupts: per(t.interrupts.tlps),
            partial_writes: per(t.partial_writes),
            read_completions: per(t.read_completions),
            modelled: profile.cost(t, packets),
        })
    }
}

/// What a record says about the bus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkFigures {
    /// The link the cost model assumed (e.g. `PCIe Gen2 x1`): its figures are modelled.
    pub link: String,
    /// Every parameter the counting and the cost model used.
    #[serde(default)]
    pub profile: Option<LinkProfile>,
    /// Receive traffic per frame received.
    pub rx: Option<LinkPerPacket>,
    /// Transmit traffic per frame sent.
    pub tx: Option<LinkPerPacket>,
    /// Both sides' traffic over all frames moved, through the cost model.
    pub modelled: Option<LinkCost>,
}

/// The bus figures of `nic`'s model between two snapshots of its counters; `None` when the model
/// counted no bus traffic (an older model, or one without a ledger) or moved no frame.
pub fn figures(nic: NicKind, before: &ModelCounters, after: &ModelCounters) -> Option<LinkFigures> {
    let rx = after.link.rx.minus(&before.link.rx);
    let tx = after.link.tx.minus(&before.link.tx);
    let rx_frames = after.rx_frames.saturating_sub(before.rx_frames);
    let tx_frames = after.tx_frames.saturating_sub(before.tx_frames);
    if rx.tlps() + tx.tlps() == 0 || rx_frames + tx_frames == 0 {
        return None;
    }
    let profile = nic.link_profile();
    Some(LinkFigures {
        modelled: profile.cost(&rx.plus(&tx), rx_frames + tx_frames),
        rx: LinkPerPacket::of(&rx, rx_frames, &profile),
        tx: LinkPerPacket::of(&tx, tx_frames, &profile),
        link: profile.link.clone(),
        profile: Some(profile),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_spec::pcie_link::Transactions;

    #[test]
    fn figures_are_the_window_per_frame_of_each_side_and_modelled_over_both() {
        let before = ModelCounters { rx_frames: 10, tx_frames: 5, ..Default::default() };
        let mut after = ModelCounters { rx_frames: 110, tx_frames: 55, ..Default::default() };
        after.link.rx.descriptor_reads = Transactions { tlps: 25, bytes: 1600 };
        after.link.rx.buffer_writes = Transactions { tlps: 2400, bytes: 151_400 };
        after.link.rx.partial_writes = 100;
        after.link.tx.descriptor_reads = Transactions { tlps: 50, bytes: 800 };
        after.link.tx.read_completions = 50;
        let f = figures(NicKind::Lan743x, &before, &after).unwrap();
        assert_eq!(f.link, "PCIe Gen2 x1");
        let rx = f.rx.unwrap();
        assert_eq!((rx.descriptor_reads, rx.buffer_tlps, rx.tlps, rx.partial_writes), (0.25, 24.0, 24.25, 1.0));
        assert_eq!(f.tx.unwrap().descriptor_reads, 1.0);
        let profile = NicKind::Lan743x.link_profile();
        assert_eq!(rx.modelled, profile.cost(&after.link.rx, 100), "each side over its own frames");
        let both = after.link.rx.plus(&after.link.tx);
        assert_eq!(f.modelled, NicKind::Lan743x.link_profile().cost(&both, 150));
        assert!(figures(NicKind::Lan743x, &before, &before).is_none(), "nothing counted");
    }
}

//! The transmit path: on a tail write, take each complete packet (an optional context
//! descriptor, then data descriptors up to EOP) from the ring, read its buffers from guest
//! memory, apply the offloads the descriptors ask for (checksums, TSO/USO, VLAN insertion),
//! send the result, advance the head register (the driver's only completion signal) and raise
//! the ring's interrupt.

use super::interrupts::RingEvent;
use super::nic::{Effects, Nic};
use super::regs;
use super::stats::Destination;
use crate::dma::DmaSpace;
use crate::pcie_link::Side;
use crate::wire::offload::{self, Segmentation};

/// The largest packet a descriptor chain may describe (TSO's 256 KiB limit).
const MAX_PACKET: usize = 256 * 1024;

struct DataDescriptor {
    address: u64,
    control: u32,
    control2: u32,
}

/// How a chain of descriptors ended.
enum Chain {
    /// A packet: its data descriptors and the number of descriptors it used.
    Packet(Vec<DataDescriptor>, u32),
    /// Descriptors that cannot be sent (unreadable or malformed), to be skipped.
    Bad(u32),
    /// The packet's EOP is not in the ring yet.
    Incomplete,
}

fn decode(raw: &[u8; 16]) -> (u64, u32, u32) {
    (
        u64::from_le_bytes(raw[0..8].try_into().expect("8 bytes")),
        u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes")),
        u32::from_le_bytes(raw[12..16].try_into().expect("4 bytes")),
    )
}

impl Nic {
    /// Reads the next chain from TX ring `index`, updating the ring's context. Counts the
    /// descriptor fetches in the bus ledger once the chain is complete (an incomplete one is
    /// read again when its end comes).
    fn next_chain(&mut self, index: usize, dma: &DmaSpace) -> Chain {
        let ring = self.tx[index];
        let chain = self.read_chain(index, dma);
        if !matches!(chain, Chain::Incomplete) {
            let used = match &chain {
                Chain::Packet(_, used) | Chain::Bad(used) => *used,
                Chain::Incomplete => 0,
            };
            dma.link(|link| {
                for i in 0..used {
                    link.fetch_descriptor(Side::Tx, index as u32, ring.descriptor(i), 16, 16, ring.fetchable(i));
                }
            });
        }
        chain
    }

    fn read_chain(&mut self, index: usize, dma: &DmaSpace) -> Chain {
        let ring = self.tx[index];
        let owned = ring.owned();
        let mut data = Vec::new();
        for used in 0..owned {
            let mut raw = [0u8; 16];
            if dma.read(ring.descriptor(used), &mut raw).is_err() {
                return Chain::Bad(used + 1);
            }
            let (address, control, control2) = decode(&raw);
            match control & 7 {
                regs::TXD_TYPE_CONTEXT => self.tx[index].context = Some((control, control2)),
                regs::TXD_TYPE_DATA => {
                    data.push(DataDescriptor { address, control, control2 });
                    if control & regs::TXD_EOP != 0 {
                        return Chain::Packet(data, used + 1);
                    }
                }
                _ => return Chain::Bad(used + 1),
            }
        }
        if owned + 1 >= ring.size() {
            // The driver handed over the whole ring without an end of packet: it cannot mean it.
            return Chain::Bad(owned);
        }
        Chain::Incomplete
    }

    /// Sends every complete packet of TX ring `index`.
    pub(super) fn transmit(&mut self, index: usize, dma: &DmaSpace) -> Effects {
        let mut effects = Effects::default();
        if self.stored(regs::TX_BUFFER_ENABLE) & 1 == 0 {
            return effects;
        }
        let mut completed = false;
        while self.tx[index].owned() > 0 {
            match self.next_chain(index, dma) {
                Chain::Incomplete => break,
                Chain::Bad(used) => {
                    self.stats.tx_errors += 1;
                    self.tx[index].advance(used);
                }
                Chain::Packet(descriptors, used) => {
                    if !self.link_up() {
                        // Nothing on the wire to send to: the packet completes and is lost.
                    } else if self.assemble(&descriptors, dma) {
                        self.send(index, &descriptors);
                    } else {
                        self.stats.tx_errors += 1;
                    }
                    self.tx[index].advance(used);
                }
            }
            completed = true;
        }
        if completed {
            effects.vectors = self.raise_ring(RingEvent::Tx(index));
        }
        effects
    }

    /// Reads the packet's buffers into the TX buffer; false if that fails.
    fn assemble(&mut self, descriptors: &[DataDescriptor], dma: &DmaSpace) -> bool {
        self.tx_buffer.clear();
        for d in descriptors {
            let len = ((d.control & regs::TXD_LENGTH_MASK) >> 4) as usize;
            let start = self.tx_buffer.len();
            if start + len > MAX_PACKET {
                return false;
            }
            self.tx_buffer.resize(start + len, 0);
            dma.link(|link| link.read_buffer(Side::Tx, d.address, len));
            if dma.read(d.address, &mut self.tx_buffer[start..]).is_err() {
                return false;
            }
        }
        !self.tx_buffer.is_empty()
    }

    /// Applies the offloads and sends the assembled packet.
    fn send(&mut self, index: usize, descriptors: &[DataDescriptor]) {
        let flags = descriptors.iter().fold(0, |acc, d| acc | d.control);
        let context =
            descriptors.first().filter(|d| d.control2 & regs::TXD_CONTEXT_ENABLE != 0).and(self.tx[index].context);
        let offloads = self.stored(regs::TX_CHECKSUM_CONTROL);
        let ip = flags & regs::TXD_IP_CHECKSUM != 0 && offloads & 2 != 0;
        let l4 = flags & regs::TXD_L4_CHECKSUM != 0 && offloads & 1 != 0;
        let vlan = context
            .filter(|_| flags & regs::TXD_VLAN != 0)
            .map(|(control, _)| ((control & regs::TXC_VLAN_MASK) >> 4) as u16);
        let masks = [
            (self.stored(regs::LSO_FLAGS_FIRST_MID) & 0xfff) as u16,
            ((self.stored(regs::LSO_FLAGS_FIRST_MID) >> 16) & 0xfff) as u16,
            (self.stored(regs::LSO_FLAGS_LAST) & 0xfff) as u16,
        ];
        let Nic { sink, stats, tx_buffer, .. } = self;
        let mut emit = |frame: &[u8]| {
            let tagged;
            let frame = match vlan {
                Some(tag) => {
                    tagged = offload::insert_vlan(frame, tag);
                    &tagged[..]
                }
                None => frame,
            };
            match sink.transmit(frame) {
                Ok(()) => stats.tx.count(Destination::of(frame), frame.len()),
                Err(e) => {
                    stats.tx_errors += 1;
                    tracing::debug!("transmit failed: {e}");
                }
            }
        };
        match context.filter(|_| flags & regs::TXD_LSO != 0) {
            Some((control, control2)) => {
                let seg = Segmentation {
                    l2: ((control & regs::TXC_L2_LENGTH_MASK) >> 24) as usize,
                    l3: (((control2 & regs::TXC_L3_LENGTH_MASK) << 1) | control >> 31) as usize,
                    l4: ((control2 & regs::TXC_L4_LENGTH_MASK) >> 8) as usize,
                    mss: (control2 >> 16) as usize,
                    tcp: control & regs::TXC_TCP != 0,
                    flag_masks: masks,
                };
                if let Err(reason) = offload::segment(tx_buffer, &seg, &mut emit) {
                    stats.tx_errors += 1;
                    tracing::warn!("TX ring {index}: {reason}; packet dropped");
                }
            }
            None => {
                offload::insert_checksums(tx_buffer, ip, l4);
                emit(tx_buffer);
            }
        }
    }
}

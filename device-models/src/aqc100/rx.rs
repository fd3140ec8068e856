//! The receive path: filter a frame, write it into the buffers of RX ring 0's next descriptors
//! (2 KiB each by default; a longer frame spans several), write the descriptors back with DD,
//! EOP, length, packet type and checksum status, and raise the ring's interrupt.
//!
//! Data is written before its descriptor, and each descriptor's status word (which holds DD)
//! is written last, so a driver polling DD never sees a half-written frame.

use super::interrupts::RingEvent;
use super::nic::{Effects, Nic};
use super::regs;
use super::stats::Destination;
use crate::dma::DmaSpace;
use crate::nic_model::NicReceive;
use crate::pcie_link::{Side, WriteKind};
use crate::wire::offload;

/// The ring every received frame goes to.
const RX_RING: usize = 0;
/// Write-back type word: a DMA error on this frame.
const TYPE_DMA_ERROR: u32 = 0x1000;

/// An RX check in the AQC100's write-back bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WriteBackBits {
    /// Packet type (bits 11:4 of the first word, unshifted): bits 1:0 the L3 type (0 IPv4,
    /// 1 IPv6, 2 other), bits 4:2 the L4 type (0 TCP, 1 UDP, 3 other), bit 5 a VLAN tag.
    packet_type: u32,
    /// Checksum-checked bits (0: IPv4 header, 1: L4), unshifted.
    checked: u32,
    /// rx_stat bits for the status word (already shifted into place).
    status: u16,
}

impl WriteBackBits {
    fn of(check: &offload::RxCheck) -> WriteBackBits {
        use offload::{Checksum, L3, L4};
        let l3 = match check.l3 {
            L3::Ipv4 => 0,
            L3::Ipv6 => 1,
            L3::Other => 2,
        };
        let l4 = match check.l4 {
            L4::Tcp => 0,
            L4::Udp => 1,
            L4::Other => 3,
        };
        let vlan = if check.vlan { regs::RXD_PACKET_TYPE_VLAN } else { 0 };
        let checked = |c: Checksum| u32::from(c != Checksum::Unchecked);
        let mut status = 0;
        if check.ip_checksum == Checksum::Bad {
            status |= regs::RXD_STAT_IP_ERROR;
        }
        status |= match check.l4_checksum {
            Checksum::Unchecked => 0,
            Checksum::Good => regs::RXD_STAT_L4_VALID,
            Checksum::Bad => regs::RXD_STAT_L4_ERROR,
        };
        WriteBackBits {
            packet_type: l3 | l4 << 2 | vlan,
            checked: checked(check.ip_checksum) | checked(check.l4_checksum) << 1,
            status,
        }
    }
}

impl Nic {
    /// Whether reception is on at all (link up, RX enabled, ring 0 enabled).
    fn receiving(&self) -> bool {
        self.link_up() && self.stored(regs::RX_BUFFER_ENABLE) & 1 != 0 && self.rx[RX_RING].enabled()
    }

    /// Whether a unicast filter, promiscuous mode, or the group bit lets `frame` in.
    fn accepts(&self, frame: &[u8]) -> bool {
        if frame.len() < 14 {
            return false;
        }
        if self.stored(regs::L2_FILTER_CONTROL) & regs::PROMISCUOUS != 0 || frame[0] & 1 == 1 {
            return true;
        }
        let dst_hi = u16::from_be_bytes([frame[0], frame[1]]) as u32;
        let dst_lo = u32::from_be_bytes([frame[2], frame[3], frame[4], frame[5]]);
        (0..regs::UNICAST_FILTERS).any(|f| {
            let hi = self.stored(regs::UNICAST_FILTER_HI + 8 * f);
            hi & regs::UNICAST_FILTER_ENABLE != 0
                && hi & 0xffff == dst_hi
                && self.stored(regs::UNICAST_FILTER_LO + 8 * f) == dst_lo
        })
    }
}

impl NicReceive for Nic {
    /// Whether a frame of `len` bytes would find descriptors now.
    fn rx_room(&self, len: usize) -> bool {
        let ring = &self.rx[RX_RING];
        self.receiving() && ring.owned() as usize >= len.div_ceil(ring.buffer_bytes()).max(1)
    }

    /// Receives one frame from the wire.
    fn receive(&mut self, frame: &[u8], dma: &DmaSpace) -> Effects {
        let mut effects = Effects::default();
        if !self.link_up() {
            self.stats.rx_dropped += 1;
            return effects;
        }
        if !self.accepts(frame) {
            self.stats.rx_filtered += 1;
            return effects;
        }
        if !self.rx_room(frame.len()) {
            self.stats.rx_dropped += 1;
            return effects;
        }
        let ring = self.rx[RX_RING];
        let stripped;
        let (frame, vlan) = match offload::parse(frame) {
            layers if layers.vlan && ring.strips_vlan() => {
                let tag = u16::from_be_bytes([frame[14], frame[15]]);
                let mut untagged = Vec::with_capacity(frame.len() - 4);
                untagged.extend_from_slice(&frame[..12]);
                untagged.extend_from_slice(&frame[16..]);
                stripped = untagged;
                (&stripped[..], Some(tag))
            }
            _ => (frame, None),
        };
        let checks = self.stored(regs::RX_CHECKSUM_CONTROL);
        let mut check =
            offload::check_rx(frame, checks & regs::RX_CHECKSUM_IPV4 != 0, checks & regs::RX_CHECKSUM_L4 != 0);
        check.vlan |= vlan.is_some();
        let bits = WriteBackBits::of(&check);
        let buffer = ring.buffer_bytes();
        let pieces = frame.len().div_ceil(buffer).max(1);
        let mut failed = false;
        let mut memory = dma.lock();
        for (i, chunk) in frame.chunks(buffer).enumerate() {
            let at = ring.descriptor(i as u32);
            let ahead = ring.fetchable(i as u32);
            memory.link(|link| link.fetch_descriptor(Side::Rx, RX_RING as u32, at, 16, 16, ahead));
            let mut address = [0u8; 8];
            let ok = memory.read(at, &mut address).is_ok() && {
                let address = u64::from_le_bytes(address);
                memory.link(|link| link.write(Side::Rx, WriteKind::Buffer, address, chunk.len()));
                memory.write(address, chunk).is_ok()
            };
            failed |= !ok;
        }
        let mut type_word =
            bits.packet_type << regs::RXD_PACKET_TYPE_SHIFT | bits.checked << regs::RXD_CHECKSUM_CHECKED_SHIFT;
        if failed {
            type_word |= TYPE_DMA_ERROR;
        }
        for i in 0..pieces {
            let last = i + 1 == pieces;
            let mut status = regs::RXD_DD;
            if last {
                status |= regs::RXD_EOP | bits.status;
            }
            let mut tail = [0u8; 8];
            tail[0..2].copy_from_slice(&status.to_le_bytes());
            tail[2..4].copy_from_slice(&(frame.len() as u16).to_le_bytes());
            tail[6..8].copy_from_slice(&vlan.unwrap_or(0).to_le_bytes());
            let at = ring.descriptor(i as u32);
            let mut head = [0u8; 8];
            head[0..4].copy_from_slice(&type_word.to_le_bytes());
            // The chip writes the descriptor back whole; the model writes its halves in order.
            memory.link(|link| link.write(Side::Rx, WriteKind::Descriptor, at, 16));
            // The first half (type, RSS hash) before the second (status with DD, length).
            if memory.write(at, &head).is_err() || memory.write(at + 8, &tail).is_err() {
                failed = true;
            }
        }
        drop(memory);
        self.rx[RX_RING].advance(pieces as u32);
        if failed {
            self.stats.rx_errors += 1;
        } else {
            self.stats.rx.count(Destination::of(frame), frame.len());
        }
        effects.vectors = self.raise_ring(RingEvent::Rx(RX_RING));
        effects
    }
}

#[cfg(test)]
mod write_back_tests {
    use super::*;
    use offload::{Checksum, L3, L4, RxCheck};

    #[test]
    fn a_check_becomes_the_aqc100s_bits() {
        let udp4 = RxCheck {
            l3: L3::Ipv4,
            l4: L4::Udp,
            vlan: false,
            ip_checksum: Checksum::Good,
            l4_checksum: Checksum::Good,
        };
        assert_eq!(
            WriteBackBits::of(&udp4),
            WriteBackBits { packet_type: 1 << 2, checked: 3, status: regs::RXD_STAT_L4_VALID }
        );
        let bad = RxCheck { ip_checksum: Checksum::Bad, l4_checksum: Checksum::Bad, vlan: true, ..udp4 };
        assert_eq!(
            WriteBackBits::of(&bad),
            WriteBackBits {
                packet_type: 1 << 2 | regs::RXD_PACKET_TYPE_VLAN,
                checked: 3,
                status: regs::RXD_STAT_IP_ERROR | regs::RXD_STAT_L4_ERROR
            }
        );
        let other = RxCheck::default();
        assert_eq!(WriteBackBits::of(&other), WriteBackBits { packet_type: 2 | 3 << 2, checked: 0, status: 0 });
        let tcp6 = RxCheck { l3: L3::Ipv6, l4: L4::Tcp, l4_checksum: Checksum::Good, ..RxCheck::default() };
        assert_eq!(
            WriteBackBits::of(&tcp6),
            WriteBackBits { packet_type: 1, checked: 2, status: regs::RXD_STAT_L4_VALID }
        );
    }
}

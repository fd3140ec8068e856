//! The LAN7430's descriptor rings: their registers, and the data path through them. Descriptor
//! `i` of a ring lies at `base + i * spacing`, the spacing being what the driver programmed in
//! `DMAC_CFG` (16 bytes in Linux 6.12, 64 with seed 004's revert); only its first 16 bytes
//! are read and written. The device owns RX descriptors from the head up to (not including) the
//! tail, and TX descriptors from the head to the tail; after each batch it writes the new head
//! to the head write-back address, then raises the channel's DMA interrupt.

use super::channel::Channel;
use super::nic::{Effects, Nic};
use super::regs::*;
use crate::dma::DmaSpace;
use crate::nic_model::NicReceive;
use crate::pcie_link::{Side, WriteKind};
use crate::wire::offload::{self, Segmentation};

/// The FCS the MAC appends to a received frame in guest memory (its value is not checked).
const FCS_LEN: usize = 4;
/// The largest frame a TX chain may assemble (a TSO super-frame and its headers).
const MAX_TX_FRAME: usize = 256 << 10;
/// TCP flags kept on the first, middle and last TSO segments: FIN and PSH only on the last,
/// CWR only on the first.
const TSO_FLAG_MASKS: [u16; 3] = [0xff6, 0xf76, 0xf7f];

fn words(bytes: &[u8; 16]) -> [u32; 4] {
    std::array::from_fn(|i| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes")))
}

impl Nic {
    /// The write-back's checksum status word (data1) for `frame`: an error bit per bad
    /// checksum, else "checksum not computed" unless the L4 checksum was checked good.
    fn checksum_status(&self, frame: &[u8]) -> u32 {
        let (ip, l4) = self.rx_checksums();
        if !ip && !l4 {
            return RX_DESC_DATA1_STATUS_ICSM;
        }
        let check = offload::check_rx(frame, ip, l4);
        let mut status = 0;
        if check.ip_checksum == offload::Checksum::Bad {
            status |= RX_DESC_DATA1_STATUS_ICE;
        }
        if check.l4_checksum == offload::Checksum::Bad {
            status |= RX_DESC_DATA1_STATUS_TCE;
        }
        if check.l4_checksum != offload::Checksum::Good && status == 0 {
            status |= RX_DESC_DATA1_STATUS_ICSM;
        }
        status
    }

    /// Sends what TX channel `ch` holds from its head to its tail, frame by frame.
    pub fn transmit(&mut self, ch: usize, dma: &DmaSpace) -> Effects {
        let mut effects = Effects::default();
        if ch != 0 || !self.tx_enabled() {
            return effects;
        }
        let spacing = self.descriptor_spacing();
        let len = self.tx[0].len();
        let mut completed = false;
        while len != 0 && self.tx[0].head < len && self.tx[0].tail < len && self.tx[0].head != self.tx[0].tail {
            let channel = self.tx[0];
            let available = (channel.tail + len - channel.head) % len;
            let mut reads = Vec::new();
            let assembled = self.assemble(&channel, spacing, available, dma, &mut reads);
            if !matches!(assembled, Assembled::Incomplete) {
                // What the chip read for this chain; a chain not all there yet is read again
                // when its tail comes, and counted then.
                dma.link(|link| {
                    for read in reads {
                        match read {
                            ChainRead::Descriptor { at, ahead } => {
                                link.fetch_descriptor(Side::Tx, 0, at, 16, spacing, ahead)
                            }
                            ChainRead::Buffer { at, len } => link.read_buffer(Side::Tx, at, len),
                        }
                    }
                });
            }
            match assembled {
                Assembled::Incomplete => break,
                Assembled::Frame { consumed, frame, first, lso, interrupt } => {
                    self.send(&frame, first, lso);
                    completed |= interrupt;
                    self.tx[0].head = (channel.head + consumed) % len;
                }
                Assembled::Bad { consumed, why } => {
                    tracing::debug!("TX descriptor chain dropped: {why}");
                    self.totals.tx_errors += 1;
                    self.tx[0].head = (channel.head + consumed) % len;
                }
            }
        }
        if !self.tx[0].write_back(Side::Tx, dma) {
            self.totals.tx_errors += 1;
        }
        if completed {
            self.dmac_int_sts |= dmac_int_bit_tx_ioc(0);
        }
        effects.vectors |= self.evaluate();
        effects
    }

    /// Reads one frame's descriptor chain from `channel`'s head.
    /// `reads`: what the chip reads for it, in order, for the bus ledger.
    fn assemble(
        &self,
        channel: &Channel,
        spacing: u64,
        available: u32,
        dma: &DmaSpace,
        reads: &mut Vec<ChainRead>,
    ) -> Assembled {
        let len = channel.len();
        let mut frame = Vec::new();
        let (mut first, mut lso, mut interrupt) = (0u32, false, false);
        let mut k = 0;
        loop {
            if k == available {
                return Assembled::Incomplete;
            }
            let mut raw = [0u8; 16];
            let index = (channel.head + k) % len;
            let at = channel.descriptor(index, spacing);
            reads.push(ChainRead::Descriptor { at, ahead: channel.ahead(index, available - k) });
            k += 1;
            if dma.read(at, &mut raw).is_err() {
                return Assembled::Bad { consumed: k, why: "a descriptor outside the client's maps" };
            }
            let d = words(&raw);
            if d[0] & TX_DESC_DATA0_DTYPE_MASK == TX_DESC_DATA0_DTYPE_EXT {
                return Assembled::Bad { consumed: k, why: "an extension descriptor where data was due" };
            }
            if k == 1 {
                if d[0] & TX_DESC_DATA0_FS == 0 {
                    return Assembled::Bad { consumed: k, why: "a chain without its first descriptor" };
                }
                first = (d[0] & !0xffff) | ((d[3] & TX_DESC_DATA3_FRAME_LENGTH_MSS_MASK) >> 16);
            }
            interrupt |= d[0] & TX_DESC_DATA0_IOC != 0;
            let size = (d[0] & TX_DESC_DATA0_BUF_LENGTH_MASK) as usize;
            if frame.len() + size > MAX_TX_FRAME {
                return Assembled::Bad { consumed: k, why: "a chain longer than any frame" };
            }
            let start = frame.len();
            frame.resize(start + size, 0);
            let buffer = u64::from(d[1]) | u64::from(d[2]) << 32;
            reads.push(ChainRead::Buffer { at: buffer, len: size });
            if dma.read(buffer, &mut frame[start..]).is_err() {
                return Assembled::Bad { consumed: k, why: "a buffer outside the client's maps" };
            }
            if d[0] & TX_DESC_DATA0_EXT != 0 {
                if k == available {
                    return Assembled::Incomplete;
                }
                let mut ext = [0u8; 16];
                let index = (channel.head + k) % len;
                let at = channel.descriptor(index, spacing);
                reads.push(ChainRead::Descriptor { at, ahead: channel.ahead(index, available - k) });
                k += 1;
                if dma.read(at, &mut ext).is_err() {
                    return Assembled::Bad { consumed: k, why: "a descriptor outside the client's maps" };
                }
                lso |= words(&ext)[0] & TX_DESC_DATA0_EXT_LSO != 0;
            }
            if d[0] & TX_DESC_DATA0_LS != 0 {
                return Assembled::Frame { consumed: k, frame, first, lso, interrupt };
            }
        }
    }

    /// Offloads and sends one assembled frame. `first`: the first descriptor's data0 flags with
    /// its data3 length/MSS in the low 16 bits.
    fn send(&mut self, frame: &[u8], first: u32, lso: bool) {
        if !self.link_up() {
            return;
        }
        let mut out: Vec<Vec<u8>> = Vec::new();
        if lso {
            let layers = offload::parse(frame);
            let Some(l4) = layers.l4.filter(|&l4| frame.len() >= l4 + 20) else {
                self.totals.tx_errors += 1;
                return;
            };
            let seg = Segmentation {
                l2: layers.l3,
                l3: l4 - layers.l3,
                l4: ((frame[l4 + 12] >> 4) as usize) * 4,
                mss: (first & 0xffff).max(8) as usize,
                tcp: true,
                flag_masks: TSO_FLAG_MASKS,
            };
            if offload::segment(frame, &seg, |s| out.push(s.to_vec())).is_err() {
                self.totals.tx_errors += 1;
                return;
            }
        } else {
            let mut frame = frame.to_vec();
            if first & TX_DESC_DATA0_ICE != 0 {
                offload::insert_checksums(&mut frame, first & TX_DESC_DATA0_IPE != 0, first & TX_DESC_DATA0_TPE != 0);
            }
            out.push(frame);
        }
        for f in &out {
            match self.sink.transmit(f) {
                Ok(()) => {
                    self.totals.tx_frames += 1;
                    self.totals.tx_bytes += f.len() as u64;
                    self.count(false, f, f.len() + FCS_LEN);
                }
                Err(_) => self.totals.tx_errors += 1,
            }
        }
    }
}

/// A read the chip makes for a TX chain.
enum ChainRead {
    /// A descriptor fetch; `ahead`: descriptors from it on that the device owns before the end.
    Descriptor { at: u64, ahead: u32 },
    /// A buffer read.
    Buffer { at: u64, len: usize },
}

/// One frame's descriptor chain.
enum Assembled {
    /// Not all of it is there yet (the tail stops inside it).
    Incomplete,
    /// A frame, the descriptors it took, its first descriptor's flags, TSO, and whether a
    /// descriptor asked for an interrupt.
    Frame { consumed: u32, frame: Vec<u8>, first: u32, lso: bool, interrupt: bool },
    /// A chain the device cannot use; skipped.
    Bad { consumed: u32, why: &'static str },
}

impl NicReceive for Nic {
    /// Whether RX channel 0 could take a frame of `len` bytes now.
    fn rx_room(&self, len: usize) -> bool {
        let buffers = self.rx[0].owned();
        self.link_up() && self.rx_enabled() && buffers > 0 && (len + FCS_LEN) <= buffers as usize * 0x3fff
    }

    /// A frame from the wire: filtered, then written into RX channel 0's buffers.
    /// Returns whether it reached guest memory.
    fn receive(&mut self, frame: &[u8], dma: &DmaSpace) -> Effects {
        let mut effects = Effects::default();
        if !self.link_up() || !self.rx_enabled() {
            self.totals.rx_dropped += 1;
            return effects;
        }
        if !self.accepts(frame) {
            self.totals.rx_filtered += 1;
            return effects;
        }
        let spacing = self.descriptor_spacing();
        let channel = self.rx[0];
        let pad = if channel.cfg_b & RX_CFG_B_RX_PAD_MASK == 0x0200_0000 { 2 } else { 0 };
        let mut data = vec![0u8; pad];
        data.extend_from_slice(frame);
        data.resize(pad + frame.len() + FCS_LEN, 0);
        // The descriptors the frame needs, each still owned by the device.
        let mut chain = Vec::new();
        let mut room = 0usize;
        let owned = channel.owned();
        let len = channel.len();
        while room < data.len() {
            if chain.len() as u32 == owned {
                self.totals.rx_dropped += 1;
                self.bump(STAT_RX_DROPPED_FRAMES, 1);
                return effects;
            }
            let index = (channel.head + chain.len() as u32) % len;
            let at = channel.descriptor(index, spacing);
            let ahead = channel.ahead(index, owned - chain.len() as u32);
            dma.link(|link| link.fetch_descriptor(Side::Rx, 0, at, 16, spacing, ahead));
            let mut raw = [0u8; 16];
            if dma.read(at, &mut raw).is_err() {
                self.totals.rx_errors += 1;
                return effects;
            }
            let d = words(&raw);
            let size = (d[0] & RX_DESC_DATA0_BUF_LENGTH_MASK) as usize;
            if d[0] & RX_DESC_DATA0_OWN == 0 || size == 0 {
                self.totals.rx_dropped += 1;
                self.bump(STAT_RX_DROPPED_FRAMES, 1);
                return effects;
            }
            chain.push((at, u64::from(d[1]) | u64::from(d[2]) << 32, size));
            room += size;
        }
        let status = self.checksum_status(frame);
        let mut offset = 0;
        for (i, &(at, buffer, size)) in chain.iter().enumerate() {
            let piece = &data[offset..(offset + size).min(data.len())];
            offset += piece.len();
            let last = i + 1 == chain.len();
            let mut data0 = if i == 0 { RX_DESC_DATA0_FS } else { 0 };
            if last {
                data0 |= RX_DESC_DATA0_LS | ((frame.len() + FCS_LEN) as u32) << 16 & RX_DESC_DATA0_FRAME_LENGTH_MASK;
            }
            // The chip writes the data, then the whole descriptor back (the model writes its
            // status before its ownership word, so that the driver never sees one without the
            // other).
            dma.link(|link| {
                link.write(Side::Rx, WriteKind::Buffer, buffer, piece.len());
                link.write(Side::Rx, WriteKind::Descriptor, at, 16);
            });
            let wrote = dma.write(buffer, piece).is_ok()
                && dma.write(at + 4, &status.to_le_bytes()).is_ok()
                && dma.write(at, &data0.to_le_bytes()).is_ok();
            if !wrote {
                self.totals.rx_errors += 1;
                return effects;
            }
        }
        let rx = &mut self.rx[0];
        rx.head = (rx.head + chain.len() as u32) % len;
        if !rx.write_back(Side::Rx, dma) {
            self.totals.rx_errors += 1;
        }
        self.dmac_int_sts |= dmac_int_bit_rxfrm(0);
        self.totals.rx_frames += 1;
        self.totals.rx_bytes += frame.len() as u64;
        self.count(true, frame, frame.len() + FCS_LEN);
        effects.vectors |= self.evaluate();
        effects
    }
}

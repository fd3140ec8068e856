//! The bus ledger: what a model's chip would put on its PCIe link for the DMA the model does,
//! counted into [`vm_spec::pcie_link::LinkCounts`] by the rules of its [`LinkProfile`].
//!
//! The models call it beside their DMA, describing the access the chip makes rather than the
//! model's own copies (a model may write a descriptor's words one at a time; the chip writes the
//! descriptor back at once):
//!
//! - a descriptor fetch reads, when the driver packs descriptors (spacing = descriptor size), every
//!   descriptor the device owns from this one up to the end of the burst (`descriptor_burst`
//!   bytes, aligned), and later fetches inside those bytes cost nothing; when the driver spaces
//!   them apart, each descriptor is its own read;
//! - a read is one request per `max_read_request` bytes (and per 4 KiB page), its data one
//!   completion per cache line it touches (the read completion boundary);
//! - a write is one TLP per cache line it touches; a piece that covers less than the whole line
//!   is a partial write;
//! - an interrupt (MSI-X) is one 4-byte write.

use vm_spec::pcie_link::{LinkCounts, LinkProfile, LinkTraffic, Transactions};

/// Which side of the data path an access belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Receive: RX descriptors, frames written to the host, their head write-backs.
    Rx,
    /// Transmit: TX descriptors, frames read from the host, their head write-backs.
    Tx,
}

/// What a write carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// A descriptor write-back.
    Descriptor,
    /// Packet data.
    Buffer,
    /// A head pointer write-back.
    Head,
}

/// The largest span of a read request: PCIe requests do not cross a 4 KiB boundary.
const PAGE: u64 = 4096;
/// An MSI-X message's payload.
const MSI_BYTES: u64 = 4;

/// The counts and the state the rules need (what each ring's last fetch brought in).
#[derive(Debug, Clone)]
pub struct LinkLedger {
    profile: LinkProfile,
    counts: LinkCounts,
    /// Per (side, ring): the descriptor bytes the last fetch read, `[start, end)`.
    fetched: Vec<((Side, u32), (u64, u64))>,
}

impl LinkLedger {
    /// An empty ledger under `profile`'s rules.
    pub fn new(profile: LinkProfile) -> Self {
        LinkLedger { profile, counts: LinkCounts::default(), fetched: Vec::new() }
    }

    /// The rules.
    pub fn profile(&self) -> &LinkProfile {
        &self.profile
    }

    /// What was counted so far.
    pub fn counts(&self) -> LinkCounts {
        self.counts
    }

    fn traffic(&mut self, side: Side) -> &mut LinkTraffic {
        match side {
            Side::Rx => &mut self.counts.rx,
            Side::Tx => &mut self.counts.tx,
        }
    }

    /// The chip needs the `size`-byte descriptor at `at` of `side`'s ring `ring`, whose
    /// descriptors lie `spacing` bytes apart; `ahead` descriptors from this one on (counting
    /// it) are the device's and lie before the ring's end, so a fetch may take them too.
    pub fn fetch_descriptor(&mut self, side: Side, ring: u32, at: u64, size: u32, spacing: u64, ahead: u32) {
        let size = u64::from(size);
        let slot = self.fetched.iter().position(|(key, _)| *key == (side, ring));
        if let Some(i) = slot {
            let (start, end) = self.fetched[i].1;
            if at >= start && at.saturating_add(size) <= end {
                return;
            }
        }
        let burst = u64::from(self.profile.descriptor_burst).max(size);
        let count = if spacing == size {
            let to_burst_end = (burst - at % burst) / size;
            u64::from(ahead).min(to_burst_end).max(1)
        } else {
            1
        };
        let bytes = count * size;
        let read = self.read_transactions(at, bytes);
        let t = self.traffic(side);
        t.descriptor_reads = t.descriptor_reads.plus(read.0);
        t.read_completions += read.1;
        let window = (at, at + bytes);
        match slot {
            Some(i) => self.fetched[i].1 = window,
            None => self.fetched.push(((side, ring), window)),
        }
    }

    /// The chip reads `len` bytes of packet data at `at`.
    pub fn read_buffer(&mut self, side: Side, at: u64, len: usize) {
        let read = self.read_transactions(at, len as u64);
        let t = self.traffic(side);
        t.buffer_reads = t.buffer_reads.plus(read.0);
        t.read_completions += read.1;
    }

    /// The chip writes `len` bytes at `at`.
    pub fn write(&mut self, side: Side, kind: WriteKind, at: u64, len: usize) {
        let line = u64::from(self.profile.cache_line.max(1));
        let (mut tlps, mut partial) = (0, 0);
        let (mut from, end) = (at, at.saturating_add(len as u64));
        while from < end {
            let to = (from - from % line).saturating_add(line).min(end);
            tlps += 1;
            if to - from < line {
                partial += 1;
            }
            from = to;
        }
        let written = Transactions { tlps, bytes: len as u64 };
        let t = self.traffic(side);
        match kind {
            WriteKind::Descriptor => t.descriptor_writes = t.descriptor_writes.plus(written),
            WriteKind::Buffer => t.buffer_writes = t.buffer_writes.plus(written),
            WriteKind::Head => t.head_writes = t.head_writes.plus(written),
        }
        t.partial_writes += partial;
    }

    /// The chip signals an MSI-X vector for `side`.
    pub fn interrupt(&mut self, side: Side) {
        let t = self.traffic(side);
        t.interrupts = t.interrupts.plus(Transactions { tlps: 1, bytes: MSI_BYTES });
    }

    /// The chip's descriptor caches are dropped (a ring reset, a new client).
    pub fn forget_fetched(&mut self) {
        self.fetched.clear();
    }

    /// The requests and completions of a read of `len` bytes at `at`.
    fn read_transactions(&self, at: u64, len: u64) -> (Transactions, u64) {
        let line = u64::from(self.profile.cache_line.max(1));
        let request = u64::from(self.profile.max_read_request.max(1));
        let (mut requests, mut completions) = (0, 0);
        let (mut from, end) = (at, at.saturating_add(len));
        while from < end {
            let to = from.saturating_add(request).min(end).min((from - from % PAGE).saturating_add(PAGE));
            requests += 1;
            completions += (to - 1) / line - from / line + 1;
            from = to;
        }
        (Transactions { tlps: requests, bytes: len }, completions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> LinkLedger {
        LinkLedger::new(LinkProfile::lan743x())
    }

    #[test]
    fn packed_descriptors_are_fetched_a_burst_at_a_time_and_spaced_ones_one_by_one() {
        // 64 descriptors of 16 bytes, all owned by the device, read in order.
        for (spacing, fetches) in [(16u64, 16u64), (64, 64)] {
            let mut l = ledger();
            let base = 0x10_0000;
            for i in 0..64u32 {
                l.fetch_descriptor(Side::Rx, 0, base + u64::from(i) * spacing, 16, spacing, 64 - i);
            }
            let rx = l.counts().rx;
            assert_eq!(rx.descriptor_reads, Transactions { tlps: fetches, bytes: 64 * 16 }, "spacing {spacing}");
            assert_eq!(rx.read_completions, fetches, "one cache line per fetch");
        }
    }

    #[test]
    fn a_fetch_takes_only_what_the_device_owns_and_stops_at_the_burst_boundary() {
        let mut l = ledger();
        // Only 2 owned: one read of 32 bytes; the third descriptor is a new read.
        l.fetch_descriptor(Side::Tx, 0, 0x1000, 16, 16, 2);
        l.fetch_descriptor(Side::Tx, 0, 0x1010, 16, 16, 1);
        l.fetch_descriptor(Side::Tx, 0, 0x1020, 16, 16, 8);
        // From 0x1020 the burst (64 bytes, aligned) ends at 0x1040: 2 descriptors.
        l.fetch_descriptor(Side::Tx, 0, 0x1030, 16, 16, 7);
        l.fetch_descriptor(Side::Tx, 0, 0x1040, 16, 16, 6);
        assert_eq!(l.counts().tx.descriptor_reads, Transactions { tlps: 3, bytes: 32 + 32 + 64 });
        // Another ring's fetches do not use this ring's window; a reset forgets it.
        l.fetch_descriptor(Side::Tx, 1, 0x1040, 16, 16, 1);
        l.forget_fetched();
        l.fetch_descriptor(Side::Tx, 0, 0x1050, 16, 16, 1);
        assert_eq!(l.counts().tx.descriptor_reads.tlps, 5);
        assert_eq!(l.counts().rx, LinkTraffic::default());
    }

    #[test]
    fn writes_split_at_cache_lines_and_partial_lines_are_counted_apart() {
        let mut l = ledger();
        // A 1,518-byte frame at a line-aligned buffer: 24 lines, the last one partial.
        l.write(Side::Rx, WriteKind::Buffer, 0x2000, 1518);
        // The same 2 bytes off alignment: still 24 lines, the first and last partial.
        l.write(Side::Rx, WriteKind::Buffer, 0x4002, 1518);
        l.write(Side::Rx, WriteKind::Descriptor, 0x1010, 16);
        l.write(Side::Rx, WriteKind::Head, 0x3000, 4);
        l.interrupt(Side::Rx);
        let rx = l.counts().rx;
        assert_eq!(rx.buffer_writes, Transactions { tlps: 48, bytes: 3036 });
        assert_eq!(rx.descriptor_writes, Transactions { tlps: 1, bytes: 16 });
        assert_eq!(rx.head_writes, Transactions { tlps: 1, bytes: 4 });
        assert_eq!(rx.interrupts, Transactions { tlps: 1, bytes: 4 });
        assert_eq!(rx.partial_writes, 1 + 2 + 1 + 1);
        assert_eq!(rx.writes().tlps, 51);
    }

    #[test]
    fn reads_are_requests_of_at_most_the_read_request_size_within_a_page() {
        let mut l = ledger();
        // 1,514 bytes from 0x5000: requests of 512, 512, 490; 24 lines.
        l.read_buffer(Side::Tx, 0x5000, 1514);
        // 600 bytes from 4 KiB - 100: split at the page, then 500 more.
        l.read_buffer(Side::Tx, 0x6f9c, 600);
        let tx = l.counts().tx;
        assert_eq!(tx.buffer_reads, Transactions { tlps: 3 + 2, bytes: 2114 });
        // 0x6f9c..0x7000 touches 2 lines, 0x7000..0x71f4 touches 8.
        assert_eq!(tx.read_completions, 24 + 2 + 8);
    }
}

//! The MAC's statistics: real counters of what the model moved, in the forms the driver reads
//! them (the firmware mailbox's statistics block and the DMA counter registers).

/// Where a frame was addressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// One station.
    Unicast,
    /// A group.
    Multicast,
    /// Everyone.
    Broadcast,
}

impl Destination {
    /// The destination class of an Ethernet frame.
    pub fn of(frame: &[u8]) -> Destination {
        match frame.get(..6) {
            Some([0xff, 0xff, 0xff, 0xff, 0xff, 0xff]) => Destination::Broadcast,
            Some(dst) if dst[0] & 1 == 1 => Destination::Multicast,
            _ => Destination::Unicast,
        }
    }
}

/// Packet and byte counts per destination class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassCounts {
    /// Unicast frames.
    pub unicast: u64,
    /// Multicast frames.
    pub multicast: u64,
    /// Broadcast frames.
    pub broadcast: u64,
    /// Unicast bytes.
    pub unicast_bytes: u64,
    /// Multicast bytes.
    pub multicast_bytes: u64,
    /// Broadcast bytes.
    pub broadcast_bytes: u64,
}

impl ClassCounts {
    /// Counts one frame of `len` bytes.
    pub fn count(&mut self, destination: Destination, len: usize) {
        let len = len as u64;
        match destination {
            Destination::Unicast => (self.unicast += 1, self.unicast_bytes += len),
            Destination::Multicast => (self.multicast += 1, self.multicast_bytes += len),
            Destination::Broadcast => (self.broadcast += 1, self.broadcast_bytes += len),
        };
    }

    /// All frames.
    pub fn frames(&self) -> u64 {
        self.unicast + self.multicast + self.broadcast
    }

    /// All bytes.
    pub fn bytes(&self) -> u64 {
        self.unicast_bytes + self.multicast_bytes + self.broadcast_bytes
    }
}

/// What the MAC counted since the last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MacStats {
    /// Frames written into guest memory.
    pub rx: ClassCounts,
    /// Frames taken from guest memory and sent.
    pub tx: ClassCounts,
    /// Received frames dropped for want of descriptors (or with RX off).
    pub rx_dropped: u64,
    /// Received frames no filter accepted.
    pub rx_filtered: u64,
    /// Received frames lost to refused DMA.
    pub rx_errors: u64,
    /// Frames to send that could not be read (refused DMA, malformed descriptors).
    pub tx_errors: u64,
}

impl MacStats {
    /// Dword `index` of the firmware mailbox's statistics block (`struct hw_atl_stats_s`:
    /// uprc mprc bprc erpt uptc mptc bptc erpr mbtc bbtc mbrc bbrc ubrc ubtc dpc; erpt counts
    /// transmit errors and erpr receive errors, as atlantic reads them). The hardware counters
    /// are 32 bits wide and wrap.
    pub fn mailbox_word(&self, index: usize) -> u32 {
        let value = match index {
            0 => self.rx.unicast,
            1 => self.rx.multicast,
            2 => self.rx.broadcast,
            3 => self.tx_errors,
            4 => self.tx.unicast,
            5 => self.tx.multicast,
            6 => self.tx.broadcast,
            7 => self.rx_errors,
            8 => self.tx.multicast_bytes,
            9 => self.tx.broadcast_bytes,
            10 => self.rx.multicast_bytes,
            11 => self.rx.broadcast_bytes,
            12 => self.rx.unicast_bytes,
            13 => self.tx.unicast_bytes,
            14 => self.rx_dropped,
            _ => 0,
        };
        value as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_mailbox_order() {
        let mut stats = MacStats::default();
        stats.rx.count(Destination::of(&[0xff; 14]), 60);
        stats.rx.count(Destination::of(&[0x01, 0x00, 0x5e, 0, 0, 1]), 100);
        stats.rx.count(Destination::of(&[0x02, 0, 0, 0, 0, 1]), 1514);
        stats.tx.count(Destination::Unicast, 1000);
        stats.rx_dropped = 7;
        stats.tx_errors = 2;
        stats.rx_errors = 3;
        let words: Vec<u32> = (0..15).map(|i| stats.mailbox_word(i)).collect();
        assert_eq!(words, vec![1, 1, 1, 2, 1, 0, 0, 3, 0, 0, 100, 60, 1514, 1000, 7]);
        assert_eq!((stats.rx.frames(), stats.rx.bytes()), (3, 1674));
    }
}

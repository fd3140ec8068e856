//! A descriptor ring's registers: base address, control (enable, length), head, tail and (RX)
//! the data buffer size. The device owns the descriptors from head up to, not including, tail.

use super::regs;

/// One ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ring {
    addr_lo: u32,
    addr_hi: u32,
    control: u32,
    /// The next descriptor the device uses.
    pub head: u32,
    tail: u32,
    buffer_size: u32,
    /// The last TX context descriptor seen (its two control words).
    pub context: Option<(u32, u32)>,
    /// Whether the head was written since the ring was last enabled (else enabling it starts
    /// over at descriptor 0).
    head_written: bool,
}

impl Ring {
    /// Guest address of the descriptors.
    pub fn base(&self) -> u64 {
        self.addr_lo as u64 | (self.addr_hi as u64) << 32
    }

    /// Number of descriptors (a multiple of 8).
    pub fn size(&self) -> u32 {
        ((self.control & regs::RING_LENGTH_MASK) >> 3) * 8
    }

    /// Whether the ring is enabled.
    pub fn enabled(&self) -> bool {
        self.control & regs::RING_ENABLE != 0
    }

    /// Whether the RX ring strips VLAN tags.
    pub fn strips_vlan(&self) -> bool {
        self.control & regs::RX_RING_VLAN_STRIP != 0
    }

    /// RX data buffer size in bytes (the register counts KiB; 0 reads as the 2 KiB default).
    pub fn buffer_bytes(&self) -> usize {
        match self.buffer_size & regs::BUFFER_SIZE_MASK {
            0 => 2048,
            kib => kib as usize * 1024,
        }
    }

    /// Descriptors the device owns now: 0 if the ring is off or its pointers are out of range.
    pub fn owned(&self) -> u32 {
        let size = self.size();
        if !self.enabled() || size == 0 || self.head >= size || self.tail >= size {
            return 0;
        }
        (self.tail + size - self.head) % size
    }

    /// Guest address of descriptor `ahead` places after the head.
    pub fn descriptor(&self, ahead: u32) -> u64 {
        let index = (self.head + ahead) % self.size().max(1);
        self.base().wrapping_add(index as u64 * regs::DESCRIPTOR_SIZE)
    }

    /// Of the descriptors the device owns, those from `ahead` places after the head up to the
    /// ring's end: what one descriptor fetch there may take.
    pub fn fetchable(&self, ahead: u32) -> u32 {
        let index = (self.head + ahead) % self.size().max(1);
        self.owned().saturating_sub(ahead).min(self.size().saturating_sub(index))
    }

    /// Hands `count` descriptors back to the driver.
    pub fn advance(&mut self, count: u32) {
        self.head = (self.head + count) % self.size().max(1);
    }

    /// A read of register `offset` of the ring's block.
    pub fn read(&self, offset: u32) -> u32 {
        match offset {
            regs::RING_ADDR_LO => self.addr_lo,
            regs::RING_ADDR_HI => self.addr_hi,
            regs::RING_CONTROL => self.control,
            regs::RING_HEAD => self.head,
            regs::RING_TAIL => self.tail,
            regs::RX_RING_BUFFER_SIZE => self.buffer_size,
            _ => 0,
        }
    }

    /// A write of register `offset`; true if the device may now own more descriptors.
    pub fn write(&mut self, offset: u32, value: u32) -> bool {
        match offset {
            regs::RING_ADDR_LO => self.addr_lo = value & !0x7f, // 128-byte aligned
            regs::RING_ADDR_HI => self.addr_hi = value,
            regs::RING_CONTROL => {
                let was_enabled = self.enabled();
                self.control = value;
                // A ring keeps its head while it is stopped (the driver may still read it: atlantic
                // stops its rings before napi_disable() in aq_vec_stop(), so a last poll reads it)
                // and starts over at descriptor 0 when it is started again, which is what the
                // driver's re-init assumes (aq_ring_init() sets its own heads to 0 and never
                // writes the register), unless the head was written while it was stopped.
                if !was_enabled && self.enabled() {
                    if !self.head_written {
                        self.head = 0;
                    }
                    self.head_written = false;
                    self.context = None;
                }
                return self.enabled();
            }
            regs::RING_HEAD if !self.enabled() => {
                self.head = value & regs::RING_POINTER_MASK;
                self.head_written = true;
            }
            regs::RING_TAIL => {
                self.tail = value & regs::RING_POINTER_MASK;
                return true;
            }
            regs::RX_RING_BUFFER_SIZE => self.buffer_size = value,
            _ => {}
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_wraps_and_needs_an_enabled_ring() {
        let mut ring = Ring::default();
        ring.write(regs::RING_ADDR_LO, 0x1000_0080);
        ring.write(regs::RING_ADDR_HI, 1);
        ring.write(regs::RING_CONTROL, (64 / 8) << 3);
        ring.write(regs::RING_TAIL, 10);
        assert_eq!(ring.owned(), 0, "disabled");
        assert!(ring.write(regs::RING_CONTROL, regs::RING_ENABLE | (64 / 8) << 3));
        assert_eq!((ring.size(), ring.owned()), (64, 10));
        assert_eq!(ring.descriptor(3), 0x1_1000_0080 + 48);
        ring.advance(10);
        assert_eq!(ring.owned(), 0);
        ring.write(regs::RING_TAIL, 2);
        assert_eq!(ring.owned(), 56, "wrapped");
        assert_eq!(ring.descriptor(55), 0x1_1000_0080 + 16);
        assert_eq!(
            (ring.fetchable(0), ring.fetchable(53), ring.fetchable(54)),
            (54, 1, 2),
            "up to the end, then from 0"
        );
        ring.write(regs::RING_TAIL, 64);
        assert_eq!(ring.owned(), 0, "a tail beyond the ring owns nothing");
        ring.write(regs::RING_HEAD, 5);
        assert_eq!(ring.head, 10, "head is read-only while enabled");
        let control = ring.control;
        ring.write(regs::RING_CONTROL, 0);
        assert_eq!(ring.head, 10, "a stopped ring keeps its head: a last poll may read it");
        ring.write(regs::RING_CONTROL, control);
        assert_eq!(ring.head, 0, "starting again starts over at descriptor 0");
        ring.write(regs::RING_CONTROL, 0);
        ring.write(regs::RING_HEAD, 7);
        ring.write(regs::RING_CONTROL, control);
        assert_eq!(ring.head, 7, "unless the head was set while it was stopped");
        assert_eq!(ring.buffer_bytes(), 2048);
        ring.write(regs::RX_RING_BUFFER_SIZE, 4);
        assert_eq!(ring.buffer_bytes(), 4096);
    }
}

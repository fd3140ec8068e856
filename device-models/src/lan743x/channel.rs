//! A LAN7430 DMA channel's registers and position in its descriptor ring, and its run state.

use super::regs::*;
use crate::dma::DmaSpace;
use crate::pcie_link::{Side, WriteKind};

/// A DMA channel's run state as `DMAC_CMD` reads it back: (started, stop requested).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunState {
    /// START was the last command.
    pub started: bool,
    /// STOP was the last command.
    pub stopped: bool,
}

/// One channel's registers and position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Channel {
    /// CFG_A.
    pub cfg_a: u32,
    /// CFG_B (ring length in bits 15:0).
    pub cfg_b: u32,
    /// CFG_C.
    pub cfg_c: u32,
    /// Ring base IOVA.
    pub base: u64,
    /// Head write-back IOVA.
    pub writeback: u64,
    /// Next descriptor the device uses.
    pub head: u32,
    /// The driver's tail.
    pub tail: u32,
    /// START/STOP state.
    pub run: RunState,
}

impl Channel {
    /// A channel register write (offset within the channel's block).
    pub fn set(&mut self, offset: u32, value: u32) {
        let high = |v: u64| (v & 0xffff_ffff) | u64::from(value) << 32;
        let low = |v: u64| (v & !0xffff_ffff) | u64::from(value);
        match offset {
            CH_CFG_A => self.cfg_a = value,
            CH_CFG_B => self.cfg_b = value,
            CH_CFG_C => self.cfg_c = value,
            CH_BASE_ADDRH => self.base = high(self.base),
            CH_BASE_ADDRL => self.base = low(self.base),
            CH_HEAD_WRITEBACK_ADDRH => self.writeback = high(self.writeback),
            CH_HEAD_WRITEBACK_ADDRL => self.writeback = low(self.writeback),
            _ => {}
        }
    }

    /// The channel's software reset (`DMAC_CMD`'s RX_SWR/TX_SWR): stopped, head 0.
    pub fn reset(&mut self) {
        self.head = 0;
        self.run = RunState::default();
    }

    pub(super) fn len(&self) -> u32 {
        self.cfg_b & CFG_B_RING_LEN_MASK
    }

    /// Descriptors the device owns: RX from head to tail (exclusive).
    pub(super) fn owned(&self) -> u32 {
        let len = self.len();
        if len == 0 || self.head >= len || self.tail >= len {
            return 0;
        }
        (self.tail + len - self.head) % len
    }

    pub(super) fn descriptor(&self, index: u32, spacing: u64) -> u64 {
        self.base.wrapping_add(u64::from(index) * spacing)
    }

    /// Writes the head to the write-back address, when enabled.
    pub(super) fn write_back(&self, side: Side, dma: &DmaSpace) -> bool {
        if self.cfg_a & CFG_A_HP_WB_EN == 0 {
            return true;
        }
        dma.link(|link| link.write(side, WriteKind::Head, self.writeback, 4));
        dma.write(self.writeback, &self.head.to_le_bytes()).is_ok()
    }

    /// The descriptors from `index` on that are the device's (`owned_from_index` of them) and
    /// lie before the ring's end: what one descriptor fetch may take.
    pub(super) fn ahead(&self, index: u32, owned_from_index: u32) -> u32 {
        owned_from_index.min(self.len().saturating_sub(index))
    }
}

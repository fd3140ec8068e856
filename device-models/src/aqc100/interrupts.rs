//! The interrupt block: causes, their enable mask, auto-masking, and the maps that route ring
//! and link events to causes. In MSI-X mode cause n is MSI-X vector n.
//!
//! A cause that is enabled fires at once: its vector is signalled, its status bit clears, and if
//! it auto-masks its enable bit clears until the driver sets it again (the atlantic driver's
//! NAPI poll does that when it is done). A cause that is not enabled is latched in the status
//! register and fires the moment it is enabled.

use super::regs;

/// Interrupt mode bits of the global interrupt control register (0x2300): MSI-X.
const MODE_MSIX: u32 = 2;
const MODE_MASK: u32 = 3;
/// Global interrupt control register.
pub const GLOBAL_CONTROL: u32 = 0x2300;
/// Global interrupt control: reset of the interrupt block (self-clearing).
const GLOBAL_RESET: u32 = 1 << 31;

/// The interrupt block's registers.
#[derive(Debug, Default, Clone)]
pub struct InterruptController {
    status: u32,
    enabled: u32,
    auto_mask: u32,
    global_control: u32,
    ring_maps: [u32; regs::RINGS / 2],
    general_maps: [u32; 4],
}

/// Which ring event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingEvent {
    /// Frames were written back on RX ring n.
    Rx(usize),
    /// Descriptors completed on TX ring n.
    Tx(usize),
}

impl InterruptController {
    /// A register read, or `None` if the register is not the interrupt block's.
    pub fn read(&self, reg: u32) -> Option<u32> {
        Some(match reg {
            regs::ISR => self.status,
            regs::IMSR | regs::IMCR => self.enabled,
            regs::IAMR => self.auto_mask,
            regs::ISCR => 0,
            GLOBAL_CONTROL => self.global_control,
            r if (regs::RING_IRQ_MAP_BASE..regs::RING_IRQ_MAP_BASE + 4 * (regs::RINGS as u32 / 2)).contains(&r) => {
                self.ring_maps[((r - regs::RING_IRQ_MAP_BASE) / 4) as usize]
            }
            r if (regs::GENERAL_IRQ_MAP_BASE..regs::GENERAL_IRQ_MAP_BASE + 16).contains(&r) => {
                self.general_maps[((r - regs::GENERAL_IRQ_MAP_BASE) / 4) as usize]
            }
            _ => return None,
        })
    }

    /// A register write; returns `None` if the register is not the interrupt block's, else the
    /// vectors to signal now (a bit mask).
    pub fn write(&mut self, reg: u32, value: u32) -> Option<u32> {
        match reg {
            regs::ISR => self.status = value,
            regs::ISCR => self.status &= !value,
            regs::IMSR => {
                self.enabled |= value;
                return Some(self.deliver());
            }
            regs::IMCR => self.enabled &= !value,
            regs::IAMR => self.auto_mask = value,
            GLOBAL_CONTROL => {
                if value & GLOBAL_RESET != 0 {
                    *self = InterruptController::default();
                }
                self.global_control = value & !GLOBAL_RESET;
            }
            r if (regs::RING_IRQ_MAP_BASE..regs::RING_IRQ_MAP_BASE + 4 * (regs::RINGS as u32 / 2)).contains(&r) => {
                self.ring_maps[((r - regs::RING_IRQ_MAP_BASE) / 4) as usize] = value;
            }
            r if (regs::GENERAL_IRQ_MAP_BASE..regs::GENERAL_IRQ_MAP_BASE + 16).contains(&r) => {
                self.general_maps[((r - regs::GENERAL_IRQ_MAP_BASE) / 4) as usize] = value;
            }
            _ => return None,
        }
        Some(0)
    }

    /// The cause a ring event is mapped to, if its map entry is enabled. Even rings use the
    /// upper byte of each half of their register, odd rings the lower: RX in bits 15:8 / 7:0,
    /// TX in bits 31:24 / 23:16; in each byte bit 7 enables and bits 4:0 name the cause.
    pub fn ring_cause(&self, event: RingEvent) -> Option<u32> {
        let (ring, tx) = match event {
            RingEvent::Rx(r) => (r, false),
            RingEvent::Tx(r) => (r, true),
        };
        let map = *self.ring_maps.get(ring / 2)?;
        let shift = if tx { 16 } else { 0 } + if ring % 2 == 0 { 8 } else { 0 };
        let entry = (map >> shift) & 0xff;
        (entry & regs::MAP_ENABLE != 0).then_some(entry & 0x1f)
    }

    /// The cause of link events, if mapped.
    pub fn link_cause(&self) -> Option<u32> {
        let entry = self.general_maps[regs::LINK_IRQ_MAP_INDEX as usize] & 0xff;
        (entry & regs::MAP_ENABLE != 0).then_some(entry & 0x1f)
    }

    /// Raises `cause`; returns the vectors to signal now.
    pub fn raise(&mut self, cause: u32) -> u32 {
        self.status |= 1 << (cause & 31);
        self.deliver()
    }

    /// Fires every latched cause that is enabled (MSI-X mode only: other modes are not offered
    /// by the model, their causes stay latched in the status register).
    fn deliver(&mut self) -> u32 {
        if self.global_control & MODE_MASK != MODE_MSIX {
            return 0;
        }
        let fire = self.status & self.enabled;
        self.status &= !fire;
        self.enabled &= !(fire & self.auto_mask);
        fire
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msix() -> InterruptController {
        let mut irq = InterruptController::default();
        irq.write(GLOBAL_CONTROL, 0x2000_0022);
        irq.write(regs::IAMR, !0);
        irq
    }

    #[test]
    fn fire_and_auto_mask_then_latch_until_reenabled() {
        let mut irq = msix();
        irq.write(regs::IMSR, 0b10);
        assert_eq!(irq.raise(1), 0b10, "enabled: fires");
        assert_eq!(irq.read(regs::IMSR), Some(0), "auto-masked");
        assert_eq!(irq.raise(1), 0, "masked: latched");
        assert_eq!(irq.read(regs::ISR), Some(0b10));
        assert_eq!(irq.write(regs::IMSR, 0b10), Some(0b10), "fires on re-enable");
        assert_eq!(irq.read(regs::ISR), Some(0));
        irq.write(regs::IMCR, !0);
        irq.raise(3);
        irq.write(regs::ISCR, 1 << 3);
        assert_eq!(irq.write(regs::IMSR, !0), Some(0), "cleared before it was enabled");
    }

    #[test]
    fn ring_and_link_maps() {
        let mut irq = msix();
        // Ring 0 RX -> cause 0, ring 0 TX -> cause 0, ring 1 RX -> cause 1 (atlantic's layout).
        irq.write(regs::RING_IRQ_MAP_BASE, 0x8000_8000 | 0x0080_0081);
        assert_eq!(irq.ring_cause(RingEvent::Rx(0)), Some(0));
        assert_eq!(irq.ring_cause(RingEvent::Tx(0)), Some(0));
        assert_eq!(irq.ring_cause(RingEvent::Rx(1)), Some(1));
        assert_eq!(irq.ring_cause(RingEvent::Tx(1)), Some(0));
        assert_eq!(irq.ring_cause(RingEvent::Rx(2)), None, "not mapped");
        assert_eq!(irq.ring_cause(RingEvent::Rx(99)), None);
        assert_eq!(irq.link_cause(), None);
        irq.write(regs::GENERAL_IRQ_MAP_BASE + 12, 0x80 | 3);
        assert_eq!(irq.link_cause(), Some(3));
    }

    #[test]
    fn nothing_fires_outside_msix_mode() {
        let mut irq = InterruptController::default();
        irq.write(regs::IMSR, !0);
        assert_eq!(irq.raise(0), 0);
        assert_eq!(irq.read(regs::ISR), Some(1));
    }
}

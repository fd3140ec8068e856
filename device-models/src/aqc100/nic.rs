//! The NIC's register file: what each register read and write does, the link state, and the
//! global soft reset. The receive and transmit paths are in `rx` and `tx`.

use super::firmware::Firmware;
use super::interrupts::InterruptController;
use super::regs;
use super::rings::Ring;
use super::stats::MacStats;
use crate::dma::DmaSpace;
use crate::nic_model::NicRegisters;
use crate::wire::backend::FrameSink;

/// Words of register storage: all of the 64 KiB BAR.
const STORAGE_WORDS: usize = 0x1_0000 / 4;
/// The global and firmware registers below 0x1000 survive a soft reset.
const GLOBAL_WORDS: usize = 0x1000 / 4;

pub use crate::nic_model::Effects;

/// The NIC's state.
pub struct Nic {
    /// Plain registers, one word per 4-byte register of BAR 0.
    storage: Box<[u32]>,
    pub(super) fw: Firmware,
    pub(super) irq: InterruptController,
    pub(super) rx: [Ring; regs::RINGS],
    pub(super) tx: [Ring; regs::RINGS],
    pub(super) stats: MacStats,
    pub(super) sink: Box<dyn FrameSink>,
    /// Scratch space for assembling transmitted packets.
    pub(super) tx_buffer: Vec<u8>,
    global_control: u32,
    admin_up: bool,
    carrier: bool,
    link_was_up: bool,
}

impl Nic {
    /// The global soft reset: the data path and the interrupt block start over; the firmware
    /// reboots, so the link drops until the driver asks for it again.
    fn soft_reset(&mut self) -> Effects {
        let fw_mac = self.fw.mac();
        self.storage[GLOBAL_WORDS..].fill(0);
        self.fw = Firmware::new(fw_mac);
        self.irq = InterruptController::default();
        self.rx = [Ring::default(); regs::RINGS];
        self.tx = [Ring::default(); regs::RINGS];
        self.link_was_up = false;
        Effects { vectors: 0, rx_changed: true }
    }

    /// Whether the link is up: the driver asked for a rate, nobody set it down, and the backend
    /// has a carrier.
    pub fn link_up(&self) -> bool {
        self.fw.link_requested() && self.admin_up && self.carrier
    }

    /// Link speed in Mbit/s (0 while down).
    pub fn link_mbps(&self) -> u32 {
        if self.link_up() { self.fw.link_mbps() } else { 0 }
    }

    /// The statistics.
    pub fn stats(&self) -> MacStats {
        self.stats
    }

    /// Raises the link interrupt if the link state changed.
    fn link_changed(&mut self) -> Effects {
        let up = self.link_up();
        if up == self.link_was_up {
            return Effects::default();
        }
        self.link_was_up = up;
        tracing::info!("link {}", if up { "up" } else { "down" });
        let vectors = self.irq.link_cause().map_or(0, |cause| self.irq.raise(cause));
        Effects { vectors, rx_changed: true }
    }

    fn ring_register(reg: u32, base: u32, stride: u32) -> Option<(usize, u32)> {
        let offset = reg.checked_sub(base)?;
        let ring = (offset / stride) as usize;
        (ring < regs::RINGS).then_some((ring, offset % stride))
    }

    fn counter(&self, reg: u32) -> Option<u32> {
        let (value, high) = match reg {
            r if r == regs::RX_GOOD_FRAMES || r == regs::RX_GOOD_FRAMES + 4 => {
                (self.stats.rx.frames(), r != regs::RX_GOOD_FRAMES)
            }
            r if r == regs::RX_GOOD_OCTETS || r == regs::RX_GOOD_OCTETS + 4 => {
                (self.stats.rx.bytes(), r != regs::RX_GOOD_OCTETS)
            }
            r if r == regs::TX_GOOD_FRAMES || r == regs::TX_GOOD_FRAMES + 4 => {
                (self.stats.tx.frames(), r != regs::TX_GOOD_FRAMES)
            }
            r if r == regs::TX_GOOD_OCTETS || r == regs::TX_GOOD_OCTETS + 4 => {
                (self.stats.tx.bytes(), r != regs::TX_GOOD_OCTETS)
            }
            regs::RX_DROPPED_FRAMES => (self.stats.rx_dropped, false),
            _ => return None,
        };
        Some(if high { (value >> 32) as u32 } else { value as u32 })
    }

    /// A plain register's value.
    pub(super) fn stored(&self, reg: u32) -> u32 {
        self.storage.get((reg / 4) as usize).copied().unwrap_or(0)
    }

    fn store(&mut self, reg: u32, value: u32) {
        if let Some(word) = self.storage.get_mut((reg / 4) as usize) {
            *word = value;
        }
    }

    /// Raises the interrupt a ring event is mapped to.
    pub(super) fn raise_ring(&mut self, event: super::interrupts::RingEvent) -> u32 {
        self.irq.ring_cause(event).map_or(0, |cause| self.irq.raise(cause))
    }
}

impl NicRegisters for Nic {
    /// A NIC with permanent address `mac` sending through `sink`, in its power-on state.
    fn new(mac: [u8; 6], sink: Box<dyn FrameSink>) -> Self {
        Nic {
            storage: vec![0; STORAGE_WORDS].into_boxed_slice(),
            fw: Firmware::new(mac),
            irq: InterruptController::default(),
            rx: [Ring::default(); regs::RINGS],
            tx: [Ring::default(); regs::RINGS],
            stats: MacStats::default(),
            sink,
            tx_buffer: Vec::new(),
            global_control: 0,
            admin_up: true,
            carrier: true,
            link_was_up: false,
        }
    }

    /// Back to the power-on state (a PCI reset); the statistics and the link settings made
    /// from outside (carrier, administrative state) stay.
    fn power_on_reset(&mut self) {
        self.storage.fill(0);
        self.fw = Firmware::new(self.fw.mac());
        self.irq = InterruptController::default();
        self.rx = [Ring::default(); regs::RINGS];
        self.tx = [Ring::default(); regs::RINGS];
        self.global_control = 0;
        self.link_was_up = false;
    }

    /// Sets the link down or lets it come up (an operator's command).
    fn set_admin_up(&mut self, up: bool) -> Effects {
        self.admin_up = up;
        self.link_changed()
    }

    /// Tells the NIC whether the backend has a carrier.
    fn set_carrier(&mut self, carrier: bool) -> Effects {
        if carrier == self.carrier {
            return Effects::default();
        }
        self.carrier = carrier;
        self.link_changed()
    }

    /// A 32-bit register read.
    fn read(&mut self, reg: u32) -> u32 {
        if let Some(value) = self.fw.read(reg, self.link_up()) {
            return value;
        }
        if let Some(value) = self.irq.read(reg) {
            return value;
        }
        if let Some(value) = self.counter(reg) {
            return value;
        }
        if let Some((ring, offset)) = Self::ring_register(reg, regs::RX_RING_BASE, regs::RX_RING_STRIDE) {
            return self.rx[ring].read(offset);
        }
        if let Some((ring, offset)) = Self::ring_register(reg, regs::TX_RING_BASE, regs::TX_RING_STRIDE) {
            return self.tx[ring].read(offset);
        }
        match reg {
            regs::GLOBAL_CONTROL => self.global_control,
            regs::RX_DESC_CACHE_INIT_DONE => 1,
            _ => self.stored(reg),
        }
    }

    /// A 32-bit register write, with whatever it sets off (DMA for transmits, interrupts).
    fn write(&mut self, reg: u32, value: u32, dma: &DmaSpace) -> Effects {
        let link_before = self.link_up();
        let mut effects = Effects::default();
        if self.fw.write(reg, value, &self.stats) {
            if reg == regs::FW_CONTROL && self.link_up() != link_before {
                effects.merge(self.link_changed());
            }
            return effects;
        }
        if let Some(vectors) = self.irq.write(reg, value) {
            effects.vectors = vectors;
            return effects;
        }
        if let Some((ring, offset)) = Self::ring_register(reg, regs::RX_RING_BASE, regs::RX_RING_STRIDE) {
            effects.rx_changed = self.rx[ring].write(offset, value);
            return effects;
        }
        if let Some((ring, offset)) = Self::ring_register(reg, regs::TX_RING_BASE, regs::TX_RING_STRIDE) {
            if self.tx[ring].write(offset, value) {
                effects.merge(self.transmit(ring, dma));
            }
            return effects;
        }
        match reg {
            regs::GLOBAL_CONTROL => {
                self.global_control = value & !regs::SOFT_RESET;
                if value & regs::SOFT_RESET != 0 {
                    effects.merge(self.soft_reset());
                }
            }
            regs::RSS_KEY_WRITE => {
                self.store(reg, value & !regs::RSS_KEY_WRITE_ENABLE);
            }
            regs::RSS_REDIRECTION_WRITE => {
                self.store(reg, value & !regs::RSS_REDIRECTION_WRITE_ENABLE);
            }
            regs::RX_BUFFER_ENABLE => {
                self.store(reg, value);
                effects.rx_changed = true;
            }
            regs::TX_BUFFER_ENABLE => {
                self.store(reg, value);
                for ring in 0..regs::RINGS {
                    if self.tx[ring].owned() > 0 {
                        effects.merge(self.transmit(ring, dma));
                    }
                }
            }
            regs::RX_DESC_CACHE_INIT_DONE => {}
            _ => {
                self.store(reg, value);
            }
        }
        effects
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::backend::unplugged;

    #[test]
    fn plain_registers_read_back_and_special_ones_behave() {
        let dma = DmaSpace::new();
        let mut nic = Nic::new([2, 0, 0, 0, 0, 1], unplugged().sink);
        nic.write(0x5280, 0xdead_beef, &dma);
        assert_eq!(nic.read(0x5280), 0xdead_beef, "filters and the like are storage");
        nic.write(regs::RSS_KEY_WRITE, 0x25, &dma);
        assert_eq!(nic.read(regs::RSS_KEY_WRITE), 0x05, "write enable self-clears");
        assert_eq!(nic.read(regs::RX_DESC_CACHE_INIT_DONE) & 1, 1);
        nic.write(regs::GLOBAL_CONTROL, regs::SOFT_RESET | 0x4000, &dma);
        assert_eq!(nic.read(regs::GLOBAL_CONTROL), 0x4000, "reset bit self-clears");
        assert_eq!(nic.read(0x5280), 0, "soft reset clears the data path registers");
        assert_eq!(nic.read(regs::FW_VERSION), super::super::firmware::VERSION);
    }

    #[test]
    fn link_follows_request_admin_state_and_carrier_with_an_interrupt() {
        let dma = DmaSpace::new();
        let mut nic = Nic::new([2, 0, 0, 0, 0, 1], unplugged().sink);
        nic.write(super::super::interrupts::GLOBAL_CONTROL, 0x2000_0022, &dma);
        nic.write(regs::GENERAL_IRQ_MAP_BASE + 12, 0x80 | 2, &dma);
        nic.write(regs::IAMR, !0, &dma);
        nic.write(regs::IMSR, !0, &dma);
        assert!(!nic.link_up());
        let e = nic.write(regs::FW_CONTROL, regs::RATE_10G, &dma);
        assert_eq!(e.vectors, 1 << 2, "link interrupt on vector 2");
        assert_eq!((nic.read(regs::FW_STATE), nic.link_mbps()), (regs::RATE_10G, 10_000));
        nic.write(regs::IMSR, !0, &dma);
        assert_eq!(nic.set_admin_up(false).vectors, 1 << 2);
        assert_eq!(nic.read(regs::FW_STATE), 0);
        nic.set_admin_up(true);
        assert_eq!(nic.set_carrier(false).vectors, 0, "auto-masked until the driver re-enables it");
        assert_eq!(nic.write(regs::IMSR, 1 << 2, &dma).vectors, 1 << 2, "latched event fires");
        assert!(!nic.link_up());
    }
}

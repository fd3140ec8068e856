//! A minimal driver for the virtio 1.x modern PCI transport: capability discovery, feature
//! negotiation, split virtqueues with one request in flight (or a set of device-writable
//! buffers the device fills when it has something to say), MSI-X when the function has it
//! (QEMU's virtio-iommu-pci does not: its completions are then polled).

use crate::mmio;
use crate::pci::{Ecam, Function};
use crate::time;

/// VIRTIO_F_VERSION_1.
pub const F_VERSION_1: u64 = 1 << 32;
const STATUS_ACKNOWLEDGE: u8 = 1;
const STATUS_DRIVER: u8 = 2;
const STATUS_DRIVER_OK: u8 = 4;
const STATUS_FEATURES_OK: u8 = 8;
/// The MSI-X vector number that means none (the queue interrupts nobody).
pub const NO_VECTOR: u16 = 0xffff;
/// How long a device may take to finish a reset (status reads 0 again).
const RESET_TIMEOUT_US: u64 = 100_000;
const CAP_VENDOR: u8 = 0x09;
const CAP_MSIX: u8 = 0x11;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
/// Descriptors in the probe's queue.
pub const QUEUE_SIZE: u16 = 64;

/// The memory of one split virtqueue: descriptors, available ring, used ring, a page each.
#[repr(C, align(4096))]
pub struct QueueMemory([u8; 3 * 4096]);

impl QueueMemory {
    /// Zeroed queue memory.
    pub const fn new() -> Self {
        QueueMemory([0; 3 * 4096])
    }
}

/// A virtio-pci function the probe drives.
pub struct VirtioPci {
    ecam: Ecam,
    device: u8,
    common: u64,
    notify: u64,
    notify_multiplier: u32,
    device_cfg: u64,
    /// The MSI-X table's address and the capability's offset, when the function has MSI-X.
    msix: Option<(u64, u16)>,
}

/// One split virtqueue, one request in flight.
pub struct Virtqueue {
    index: u16,
    base: u64,
    avail_idx: u16,
    used_idx: u16,
}

fn bar_base(f: &Function, bar: u8) -> Option<u64> {
    f.bars.get(bar as usize).filter(|b| b.1 != 0).map(|b| b.0)
}

impl VirtioPci {
    /// Finds the transport structures of `f` and turns on memory decoding and bus mastering.
    pub fn new(ecam: Ecam, f: &Function) -> Result<VirtioPci, &'static str> {
        let (d, func) = (f.device, f.function);
        let mut found = [None::<u64>; 5];
        let mut notify_multiplier = 0;
        let mut msix = None;
        for (id, cap) in ecam.capabilities(d, func) {
            if id == CAP_MSIX {
                msix = Some(cap);
            }
            if id != CAP_VENDOR {
                continue;
            }
            let cfg_type = (ecam.read32(d, func, cap) >> 24) as u8;
            let bar = ecam.read32(d, func, cap + 4) as u8;
            let offset = ecam.read32(d, func, cap + 8) as u64;
            if !(1..=4).contains(&cfg_type) {
                continue;
            }
            let base = bar_base(f, bar).ok_or("a virtio capability names a missing BAR")?;
            found[cfg_type as usize] = Some(base + offset);
            if cfg_type == 2 {
                notify_multiplier = ecam.read32(d, func, cap + 16);
            }
        }
        let msix = match msix {
            Some(cap) => {
                let table = ecam.read32(d, func, cap + 4);
                let base = bar_base(f, (table & 7) as u8).ok_or("the MSI-X table names a missing BAR")?;
                Some((base + (table & !7) as u64, cap))
            }
            None => None,
        };
        let command = ecam.read16(d, func, 4);
        ecam.write16(d, func, 4, command | 0x6);
        Ok(VirtioPci {
            ecam,
            device: d,
            common: found[1].ok_or("no common configuration capability")?,
            notify: found[2].ok_or("no notification capability")?,
            notify_multiplier,
            device_cfg: found[4].ok_or("no device configuration capability")?,
            msix,
        })
    }

    fn set_status(&self, status: u8) {
        mmio::write(self.common + 0x14, status);
    }

    fn status(&self) -> u8 {
        mmio::read(self.common + 0x14)
    }

    /// Resets the device, negotiates `wanted` (of what it offers, which must include
    /// VERSION_1 and `required`); returns the accepted features.
    pub fn negotiate(&self, wanted: u64, required: u64) -> Result<u64, &'static str> {
        self.set_status(0);
        // The reset is done when the status reads 0 again (virtio 1.2, 4.1.4.3.2).
        if !time::wait_until(time::deadline_after_micros(RESET_TIMEOUT_US), || self.status() == 0) {
            return Err("the device did not finish its reset");
        }
        self.set_status(STATUS_ACKNOWLEDGE);
        self.set_status(STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        let mut offered = 0u64;
        for select in 0..2u32 {
            mmio::write(self.common, select);
            offered |= (mmio::read::<u32>(self.common + 0x04) as u64) << (32 * select);
        }
        if offered & (F_VERSION_1 | required) != F_VERSION_1 | required {
            return Err("the device lacks a required feature");
        }
        let accepted = offered & (wanted | F_VERSION_1 | required);
        for select in 0..2u32 {
            mmio::write(self.common + 0x08, select);
            mmio::write(self.common + 0x0c, (accepted >> (32 * select)) as u32);
        }
        self.set_status(STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK);
        if self.status() & STATUS_FEATURES_OK == 0 {
            return Err("the device refused the features");
        }
        mmio::write(self.common + 0x10, NO_VECTOR);
        Ok(accepted)
    }

    /// Whether the function has MSI-X (otherwise completions are polled).
    pub fn has_msix(&self) -> bool {
        self.msix.is_some()
    }

    /// Sets up queue `index` in `memory`, completing on MSI-X table entry `vector` (on no vector
    /// when the function has no MSI-X).
    pub fn setup_queue(&self, index: u16, memory: &mut QueueMemory, vector: u16) -> Result<Virtqueue, &'static str> {
        let vector = if self.has_msix() { vector } else { NO_VECTOR };
        let base = memory.0.as_mut_ptr() as u64;
        memory.0.fill(0);
        mmio::write(self.common + 0x16, index);
        let max: u16 = mmio::read(self.common + 0x18);
        if max < QUEUE_SIZE {
            return Err("the queue is too small");
        }
        mmio::write(self.common + 0x18, QUEUE_SIZE);
        mmio::write(self.common + 0x1a, vector);
        if mmio::read::<u16>(self.common + 0x1a) != vector {
            return Err("the device refused the MSI-X vector");
        }
        for (offset, addr) in [(0x20u64, base), (0x28, base + 0x1000), (0x30, base + 0x2000)] {
            mmio::write(self.common + offset, addr as u32);
            mmio::write(self.common + offset + 4, (addr >> 32) as u32);
        }
        mmio::write(self.common + 0x1c, 1u16);
        Ok(Virtqueue { index, base, avail_idx: 0, used_idx: 0 })
    }

    /// Sets DRIVER_OK.
    pub fn driver_ok(&self) {
        self.set_status(STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
    }

    /// Points MSI-X table entry `entry` at `vector` of the CPU with `apic_id`, unmasked, and
    /// enables MSI-X (nothing without MSI-X).
    pub fn msix_route(&self, entry: u16, apic_id: u32, vector: u8) {
        let Some((table, cap)) = self.msix else { return };
        let at = table + entry as u64 * 16;
        mmio::write(at, 0xfee0_0000u32 | (apic_id << 12));
        mmio::write(at + 4, 0u32);
        mmio::write(at + 8, vector as u32);
        mmio::write(at + 12, 0u32);
        let control = self.ecam.read16(self.device, 0, cap + 2);
        self.ecam.write16(self.device, 0, cap + 2, (control | 0x8000) & !0x4000);
    }

    /// Reads the device configuration.
    pub fn config<T: Copy>(&self, offset: u64) -> T {
        mmio::read(self.device_cfg + offset)
    }

    /// Tells the device queue `queue` has work.
    pub fn notify(&self, queue: &Virtqueue) {
        mmio::write(self.notify + queue.index as u64 * self.notify_multiplier as u64, queue.index);
    }
}

impl Virtqueue {
    /// Makes a request available: `out` device-readable bytes, then `inp` device-writable bytes
    /// (both in identity-mapped memory).
    pub fn submit(&mut self, out: &[u8], inp: &mut [u8]) {
        let desc = self.base;
        mmio::write(desc, out.as_ptr() as u64);
        mmio::write(desc + 8, out.len() as u32);
        mmio::write(desc + 12, DESC_F_NEXT);
        mmio::write(desc + 14, 1u16);
        mmio::write(desc + 16, inp.as_mut_ptr() as u64);
        mmio::write(desc + 24, inp.len() as u32);
        mmio::write(desc + 28, DESC_F_WRITE);
        mmio::write(desc + 30, 0u16);
        let avail = self.base + 0x1000;
        mmio::write(avail + 4 + (self.avail_idx % QUEUE_SIZE) as u64 * 2, 0u16);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        mmio::write(avail + 2, self.avail_idx);
    }

    /// Whether the device has returned a request not yet taken with [`Virtqueue::poll`].
    pub fn ready(&self) -> bool {
        mmio::read::<u16>(self.base + 0x2000 + 2) != self.used_idx
    }

    /// Makes each of `buffers` available to the device as one device-writable descriptor (a
    /// queue the device fills on its own, such as the virtio-iommu's event queue).
    pub fn offer(&mut self, buffers: &mut [[u8; 64]]) {
        let avail = self.base + 0x1000;
        for (i, buffer) in buffers.iter_mut().enumerate().take(QUEUE_SIZE as usize) {
            let desc = self.base + i as u64 * 16;
            mmio::write(desc, buffer.as_mut_ptr() as u64);
            mmio::write(desc + 8, buffer.len() as u32);
            mmio::write(desc + 12, DESC_F_WRITE);
            mmio::write(desc + 14, 0u16);
            mmio::write(avail + 4 + (self.avail_idx % QUEUE_SIZE) as u64 * 2, i as u16);
            self.avail_idx = self.avail_idx.wrapping_add(1);
        }
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        mmio::write(avail + 2, self.avail_idx);
    }

    /// How many buffers the device has returned in all (for a queue it fills on its own).
    pub fn used(&self) -> u16 {
        mmio::read(self.base + 0x2000 + 2)
    }

    /// If the device returned the request, its used length.
    pub fn poll(&mut self) -> Option<u32> {
        let used = self.base + 0x2000;
        let idx: u16 = mmio::read(used + 2);
        if idx == self.used_idx {
            return None;
        }
        let len = mmio::read(used + 4 + (self.used_idx % QUEUE_SIZE) as u64 * 8 + 4);
        self.used_idx = self.used_idx.wrapping_add(1);
        Some(len)
    }
}

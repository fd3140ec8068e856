//! Address-range dispatch of guest accesses to devices, one bus per address space (PIO, MMIO).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

/// A device that answers guest reads and writes on a bus.
///
/// `offset` is relative to the base address the device was registered at; `data` is the access
/// (1, 2, 4 or 8 bytes, little-endian).
pub trait BusDevice: Send {
    /// Fills `data` for a guest read.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Handles a guest write.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors from building a bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The range is empty or wraps around the address space.
    #[error("invalid bus range {base:#x}+{len:#x}")]
    InvalidRange {
        /// First address.
        base: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// The range overlaps one already registered.
    #[error("bus range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap {
        /// First address.
        base: u64,
        /// Its length in bytes.
        len: u64,
    },
}

#[derive(Clone)]
struct Slot {
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// What a bus access hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A device handled it.
    Handled,
    /// No device is registered there: reads return all ones, writes are dropped.
    Unclaimed,
}

/// A set of non-overlapping address ranges, each served by one device. Ranges can be added and
/// removed while vCPUs use the bus (PCI BARs move when the guest programs them).
#[derive(Default)]
pub struct Bus {
    slots: RwLock<BTreeMap<u64, Slot>>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `device` for `[base, base + len)`.
    pub fn insert(&self, base: u64, len: u64, device: Arc<Mutex<dyn BusDevice>>) -> Result<(), BusError> {
        if len == 0 || base.checked_add(len - 1).is_none() {
            return Err(BusError::InvalidRange { base, len });
        }
        let end = base + (len - 1);
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        if let Some((&prev_base, prev)) = slots.range(..=end).next_back()
            && prev_base + (prev.len - 1) >= base
        {
            return Err(BusError::Overlap { base, len });
        }
        slots.insert(base, Slot { len, device });
        Ok(())
    }

    /// Removes the range registered at `base`; returns whether there was one.
    pub fn remove(&self, base: u64) -> bool {
        self.slots.write().unwrap_or_else(|p| p.into_inner()).remove(&base).is_some()
    }

    fn find(&self, addr: u64) -> Option<(u64, Slot)> {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        let (&base, slot) = slots.range(..=addr).next_back()?;
        (addr - base < slot.len).then(|| (base, slot.clone()))
    }

    /// Dispatches a guest read; unclaimed reads return all ones, as on real hardware.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> Access {
        match self.find(addr) {
            Some((base, slot)) => {
                lock(&slot.device).read(addr - base, data);
                Access::Handled
            }
            None => {
                data.fill(0xff);
                Access::Unclaimed
            }
        }
    }

    /// Dispatches a guest write; unclaimed writes are dropped.
    pub fn write(&self, addr: u64, data: &[u8]) -> Access {
        match self.find(addr) {
            Some((base, slot)) => {
                lock(&slot.device).write(addr - base, data);
                Access::Handled
            }
            None => Access::Unclaimed,
        }
    }
}

/// Locks a device, surviving a panic in another vCPU thread that held it.
fn lock(device: &Mutex<dyn BusDevice>) -> std::sync::MutexGuard<'_, dyn BusDevice + 'static> {
    device.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Recorder {
        last_write: Option<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.last_write = Some((offset, data.to_vec()));
        }
    }

    fn recorder() -> Arc<Mutex<Recorder>> {
        Arc::new(Mutex::new(Recorder { last_write: None }))
    }

    #[test]
    fn dispatches_by_offset_and_reports_unclaimed() {
        let bus = Bus::new();
        let dev = recorder();
        bus.insert(0x3f8, 8, dev.clone()).unwrap();
        let mut data = [0u8; 1];
        assert_eq!(bus.read(0x3fa, &mut data), Access::Handled);
        assert_eq!(data, [2]);
        assert_eq!(bus.write(0x3ff, &[7]), Access::Handled);
        assert_eq!(dev.lock().unwrap().last_write, Some((7, vec![7])));
        assert_eq!(bus.read(0x400, &mut data), Access::Unclaimed);
        assert_eq!(data, [0xff]);
        assert_eq!(bus.read(0x3f7, &mut data), Access::Unclaimed);
    }

    #[test]
    fn rejects_overlaps_and_bad_ranges() {
        let bus = Bus::new();
        bus.insert(0x100, 0x10, recorder()).unwrap();
        assert!(matches!(bus.insert(0x10f, 1, recorder()), Err(BusError::Overlap { .. })));
        assert!(matches!(bus.insert(0xf8, 0x9, recorder()), Err(BusError::Overlap { .. })));
        assert!(matches!(bus.insert(0x0, 0, recorder()), Err(BusError::InvalidRange { .. })));
        assert!(matches!(bus.insert(u64::MAX, 2, recorder()), Err(BusError::InvalidRange { .. })));
        bus.insert(0x110, 1, recorder()).unwrap();
        bus.insert(u64::MAX, 1, recorder()).unwrap();
        bus.insert(0xf8, 8, recorder()).unwrap();
        assert!(bus.remove(0x100));
        assert!(!bus.remove(0x100));
        bus.insert(0x100, 0x10, recorder()).unwrap();
    }
}

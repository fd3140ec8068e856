//! The root complex: bus 0 with a host bridge, configuration access through 0xCF8/0xCFC and an
//! ECAM window, and BARs mapped onto the MMIO bus wherever the guest programs them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::config::{PciConfiguration, PciIds};
use super::device::{BarMapping, PciDevice, decoded_bars};
use super::{BarKind, PciError};
use vm_device::bus::{Bus, BusDevice};

/// Device numbers on bus 0.
pub const DEVICES_PER_BUS: u8 = 32;
/// Bytes of configuration space per function in the ECAM window.
pub const ECAM_FUNCTION_SIZE: u64 = 4096;
/// ECAM window for bus 0: 32 devices x 8 functions x 4 KiB.
pub const ECAM_BUS_SIZE: u64 = 256 * ECAM_FUNCTION_SIZE;

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The host bridge at 00:00.0.
pub struct HostBridge {
    config: PciConfiguration,
}

impl HostBridge {
    /// A host bridge (class 06/00).
    pub fn new() -> Self {
        let ids = PciIds {
            vendor: 0x8086,
            device: 0x0d57,
            subsystem_vendor: 0,
            subsystem: 0,
            class: [0x06, 0x00, 0x00],
            revision: 0,
        };
        HostBridge { config: PciConfiguration::new(ids) }
    }
}

impl Default for HostBridge {
    fn default() -> Self {
        Self::new()
    }
}

impl PciDevice for HostBridge {
    fn name(&self) -> &str {
        "host bridge"
    }
    fn config_read(&mut self, reg: usize) -> u32 {
        self.config.read_reg(reg)
    }
    fn config_write(&mut self, offset: usize, data: &[u8]) {
        self.config.write(offset, data);
    }
    fn bar_read(&mut self, _bar: usize, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn bar_write(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
    fn bar_mappings(&self) -> Vec<BarMapping> {
        decoded_bars(&self.config)
    }
}

/// One BAR of one device, as a region on the MMIO (or port) bus.
struct BarRegion {
    device: Arc<Mutex<dyn PciDevice>>,
    bar: usize,
}

impl BusDevice for BarRegion {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        lock(&self.device).bar_read(self.bar, offset, data);
    }
    fn write(&mut self, offset: u64, data: &[u8]) {
        lock(&self.device).bar_write(self.bar, offset, data);
    }
}

struct Slot {
    device: Arc<Mutex<dyn PciDevice>>,
    mapped: Vec<BarMapping>,
}

/// Bus 0 and what is plugged into it.
pub struct PciRoot {
    slots: BTreeMap<u8, Slot>,
    mmio: Arc<Bus>,
    io: Arc<Bus>,
}

impl PciRoot {
    /// A root complex with its host bridge at 00:00.0, mapping BARs onto `mmio` and `io`.
    pub fn new(mmio: Arc<Bus>, io: Arc<Bus>) -> Self {
        let mut root = PciRoot { slots: BTreeMap::new(), mmio, io };
        root.slots.insert(0, Slot { device: Arc::new(Mutex::new(HostBridge::new())), mapped: Vec::new() });
        root
    }

    /// Plugs `device` in as function 0 of device number `device_number`, with its BARs mapped
    /// where it has them already.
    pub fn add_device(&mut self, device_number: u8, device: Arc<Mutex<dyn PciDevice>>) -> Result<(), PciError> {
        if device_number >= DEVICES_PER_BUS || self.slots.contains_key(&(device_number << 3)) {
            return Err(PciError::Slot(device_number));
        }
        let devfn = device_number << 3;
        self.slots.insert(devfn, Slot { device, mapped: Vec::new() });
        self.refresh_bars(devfn);
        Ok(())
    }

    /// The devices on the bus, by device/function number.
    pub fn functions(&self) -> Vec<u8> {
        self.slots.keys().copied().collect()
    }

    /// Reads dword `reg` of the function at `bus`/`devfn`; absent functions read all ones.
    pub fn config_read(&self, bus: u8, devfn: u8, reg: usize) -> u32 {
        match (bus, self.slots.get(&devfn)) {
            (0, Some(slot)) => lock(&slot.device).config_read(reg),
            _ => 0xffff_ffff,
        }
    }

    /// Writes configuration space of the function at `bus`/`devfn`, then moves its BARs if the
    /// write changed where they decode.
    pub fn config_write(&mut self, bus: u8, devfn: u8, offset: usize, data: &[u8]) {
        if bus != 0 {
            return;
        }
        let Some(slot) = self.slots.get(&devfn) else { return };
        lock(&slot.device).config_write(offset, data);
        self.refresh_bars(devfn);
    }

    fn refresh_bars(&mut self, devfn: u8) {
        let Some(slot) = self.slots.get_mut(&devfn) else { return };
        let wanted = lock(&slot.device).bar_mappings();
        if wanted == slot.mapped {
            return;
        }
        for old in slot.mapped.drain(..) {
            let bus = if old.kind == BarKind::Io { &self.io } else { &self.mmio };
            bus.remove(old.addr);
        }
        for mapping in wanted {
            let bus = if mapping.kind == BarKind::Io { &self.io } else { &self.mmio };
            let region = Arc::new(Mutex::new(BarRegion { device: slot.device.clone(), bar: mapping.bar }));
            match bus.insert(mapping.addr, mapping.size, region) {
                Ok(()) => slot.mapped.push(mapping),
                Err(e) => tracing::warn!(
                    "{:02x}.{}: BAR {} at {:#x} not mapped: {e}",
                    devfn >> 3,
                    devfn & 7,
                    mapping.bar,
                    mapping.addr
                ),
            }
        }
    }
}

/// Configuration mechanism #1: the address register at 0xCF8 and the data window at 0xCFC.
pub struct PciConfigIo {
    root: Arc<Mutex<PciRoot>>,
    address: u32,
}

/// First port of the configuration mechanism.
pub const CONFIG_IO_BASE: u64 = 0xcf8;
/// Ports it uses.
pub const CONFIG_IO_LEN: u64 = 8;
const CONFIG_ENABLE: u32 = 1 << 31;

impl PciConfigIo {
    /// Configuration access to `root`.
    pub fn new(root: Arc<Mutex<PciRoot>>) -> Self {
        PciConfigIo { root, address: 0 }
    }

    fn target(&self) -> Option<(u8, u8, usize)> {
        (self.address & CONFIG_ENABLE != 0).then_some((
            (self.address >> 16) as u8,
            (self.address >> 8) as u8,
            (self.address & 0xfc) as usize,
        ))
    }
}

impl BusDevice for PciConfigIo {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = match offset {
            0..=3 => self.address,
            _ => match self.target() {
                Some((bus, devfn, reg)) => lock(&self.root).config_read(bus, devfn, reg / 4),
                None => 0xffff_ffff,
            },
        };
        let shift = (offset % 4) * 8;
        for (i, b) in data.iter_mut().enumerate() {
            *b = (value >> (shift + i as u64 * 8)) as u8;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        match offset {
            0 if data.len() == 4 => self.address = u32::from_le_bytes(data.try_into().expect("4 bytes")),
            4..=7 => {
                if let Some((bus, devfn, reg)) = self.target() {
                    lock(&self.root).config_write(bus, devfn, reg + (offset - 4) as usize, data);
                }
            }
            _ => {}
        }
    }
}

/// The ECAM window: configuration space memory-mapped, 4 KiB per function (bus 0 only).
pub struct PciConfigMmio {
    root: Arc<Mutex<PciRoot>>,
}

impl PciConfigMmio {
    /// Memory-mapped configuration access to `root`.
    pub fn new(root: Arc<Mutex<PciRoot>>) -> Self {
        PciConfigMmio { root }
    }
}

impl BusDevice for PciConfigMmio {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let bus = (offset >> 20) as u8;
        let devfn = (offset >> 12) as u8;
        let reg = (offset & 0xfff) as usize;
        let value = lock(&self.root).config_read(bus, devfn, reg / 4);
        let shift = (reg % 4) * 8;
        for (i, b) in data.iter_mut().enumerate() {
            *b = value.checked_shr((shift + i * 8) as u32).unwrap_or(0) as u8;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let bus = (offset >> 20) as u8;
        let devfn = (offset >> 12) as u8;
        lock(&self.root).config_write(bus, devfn, (offset & 0xfff) as usize, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device with one 4 KiB memory BAR that echoes the offset.
    struct Echo {
        config: PciConfiguration,
    }

    impl PciDevice for Echo {
        fn name(&self) -> &str {
            "echo"
        }
        fn config_read(&mut self, reg: usize) -> u32 {
            self.config.read_reg(reg)
        }
        fn config_write(&mut self, offset: usize, data: &[u8]) {
            self.config.write(offset, data);
        }
        fn bar_read(&mut self, _bar: usize, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn bar_write(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
        fn bar_mappings(&self) -> Vec<BarMapping> {
            decoded_bars(&self.config)
        }
    }

    fn echo() -> Arc<Mutex<Echo>> {
        let ids = PciIds {
            vendor: 0x1234,
            device: 0x5678,
            subsystem_vendor: 0,
            subsystem: 0,
            class: [0xff, 0, 0],
            revision: 0,
        };
        let mut config = PciConfiguration::new(ids);
        config.add_bar(0, 0x1000, BarKind::Memory32).unwrap();
        config.set_bar_address(0, 0xc000_0000);
        Arc::new(Mutex::new(Echo { config }))
    }

    fn io_read32(port: &mut PciConfigIo, address: u32) -> u32 {
        port.write(0, &address.to_le_bytes());
        let mut data = [0u8; 4];
        port.read(4, &mut data);
        u32::from_le_bytes(data)
    }

    #[test]
    fn both_configuration_mechanisms_reach_the_same_space() {
        let mmio = Arc::new(Bus::new());
        let root = Arc::new(Mutex::new(PciRoot::new(mmio.clone(), Arc::new(Bus::new()))));
        lock(&root).add_device(2, echo()).unwrap();
        let mut io = PciConfigIo::new(root.clone());
        let mut ecam = PciConfigMmio::new(root.clone());
        assert_eq!(io_read32(&mut io, CONFIG_ENABLE | 2 << 11), 0x5678_1234);
        assert_eq!(io_read32(&mut io, CONFIG_ENABLE), 0x0d57_8086, "host bridge at 00:00.0");
        assert_eq!(io_read32(&mut io, CONFIG_ENABLE | 3 << 11), 0xffff_ffff, "empty slot");
        assert_eq!(io_read32(&mut io, 2 << 11), 0xffff_ffff, "enable bit clear");
        let mut id = [0u8; 2];
        ecam.read((2 << 15) + 2, &mut id);
        assert_eq!(u16::from_le_bytes(id), 0x5678);
        ecam.read((1 << 20) | (2 << 15), &mut id);
        assert_eq!(u16::from_le_bytes(id), 0xffff, "bus 1 does not exist");
        let mut high = [0u8; 4];
        ecam.read((2 << 15) + 0x100, &mut high);
        assert_eq!(high, [0; 4], "extended space of a conventional function reads 0");
    }

    #[test]
    fn bars_map_when_decoding_is_on_and_follow_the_guest() {
        let mmio = Arc::new(Bus::new());
        let root = Arc::new(Mutex::new(PciRoot::new(mmio.clone(), Arc::new(Bus::new()))));
        lock(&root).add_device(1, echo()).unwrap();
        let mut ecam = PciConfigMmio::new(root.clone());
        let mut data = [0u8; 1];
        assert_eq!(mmio.read(0xc000_0010, &mut data), vm_device::bus::Access::Unclaimed, "memory decoding off");
        ecam.write((1 << 15) + 4, &2u16.to_le_bytes()); // command: memory
        assert_eq!(mmio.read(0xc000_0010, &mut data), vm_device::bus::Access::Handled);
        assert_eq!(data, [0x10]);
        // The guest probes the BAR size (all ones: not decoded meanwhile), then moves it.
        ecam.write((1 << 15) + 0x10, &[0xff; 4]);
        assert_eq!(mmio.read(0xc000_0010, &mut data), vm_device::bus::Access::Unclaimed);
        ecam.write((1 << 15) + 0x10, &0xd000_0000u32.to_le_bytes());
        assert_eq!(mmio.read(0xd000_0fff, &mut data), vm_device::bus::Access::Handled);
        assert_eq!(mmio.read(0xc000_0010, &mut data), vm_device::bus::Access::Unclaimed);
        assert!(matches!(lock(&root).add_device(1, echo()), Err(PciError::Slot(1))));
        assert!(matches!(lock(&root).add_device(32, echo()), Err(PciError::Slot(32))));
    }
}

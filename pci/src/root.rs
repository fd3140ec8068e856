//! The root complex: bus 0 with a host bridge, root ports whose secondary buses hold one adapter
//! each, configuration access through 0xCF8/0xCFC and an ECAM window, and BARs mapped onto the
//! MMIO bus wherever the guest programs them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::config::{PciConfiguration, PciIds};
use super::device::{BarMapping, PciDevice, decoded_bars};
use super::root_port::RootPort;
use super::{BarKind, PciError};
use vm_device::bus::{Bus, BusDevice};

/// Device numbers on bus 0.
pub const DEVICES_PER_BUS: u8 = 32;
/// Bytes of configuration space per function in the ECAM window.
pub const ECAM_FUNCTION_SIZE: u64 = 4096;
/// ECAM window of one bus: 32 devices x 8 functions x 4 KiB.
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
    fn snapshot_state(&self) -> Option<serde_json::Value> {
        self.config.state()
    }
    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), String> {
        self.config.restore_state(state)
    }
}

/// Bus 0's functions as a snapshot keeps them, by device/function number.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PciRootState {
    /// Each function's state.
    pub functions: Vec<FunctionState>,
}

/// One function's saved state.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FunctionState {
    /// Its device/function number on bus 0.
    pub devfn: u8,
    /// What it is (for messages).
    pub name: String,
    /// Its state, as the function gave it.
    pub state: serde_json::Value,
}

/// Why the root complex's state cannot be saved or put back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PciStateError {
    /// A function whose state cannot be saved (a passed-through device, a root port).
    #[error("{name} at 00:{:02x}.{} cannot be snapshotted", devfn >> 3, devfn & 7)]
    NotSaveable {
        /// Its device/function number.
        devfn: u8,
        /// What it is.
        name: String,
    },
    /// The saved functions are not this VM's.
    #[error("the snapshot's PCI functions ({saved}) are not this VM's ({here})")]
    OtherFunctions {
        /// Those saved.
        saved: String,
        /// Those here.
        here: String,
    },
    /// A function refused its saved state.
    #[error("{name} at 00:{:02x}.{}: {why}", devfn >> 3, devfn & 7)]
    Refused {
        /// Its device/function number.
        devfn: u8,
        /// What it is.
        name: String,
        /// Why.
        why: String,
    },
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

impl Slot {
    fn new(device: Arc<Mutex<dyn PciDevice>>) -> Self {
        Slot { device, mapped: Vec::new() }
    }
}

/// A root port on bus 0 and the adapter in its slot, if any.
struct Port {
    port: Arc<Mutex<RootPort>>,
    adapter: Option<Slot>,
}

/// Why a slot operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// No root port at that device number.
    #[error("no root port at 00:{0:02x}.0")]
    NoPort(u8),
    /// The slot holds an adapter already.
    #[error("the slot of root port 00:{0:02x}.0 is occupied")]
    Occupied(u8),
    /// The slot is empty.
    #[error("the slot of root port 00:{0:02x}.0 is empty")]
    Empty(u8),
    /// The guest is letting the adapter go already.
    #[error("the adapter in the slot of root port 00:{0:02x}.0 is being released already")]
    Releasing(u8),
}

/// How an adapter arrives in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// It was there when the guest started: no hot-plug event.
    AtBoot,
    /// Plugged in while the guest runs: presence and link change events.
    HotPlug,
}

/// How an adapter leaves a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Pulled without notice (a cable pulled): presence and link change events.
    Surprise,
    /// After the guest let it go (it turned the slot's power off).
    Released,
}

/// What to do with an adapter once the guest has let it go (turned its slot's power off after
/// an attention button press); it is called on the vCPU thread that wrote the power off, with
/// the root complex locked.
pub type OnRelease = Box<dyn FnOnce(Arc<Mutex<dyn PciDevice>>) + Send>;

/// Bus 0, the root ports on it and the adapters in their slots.
pub struct PciRoot {
    slots: BTreeMap<u8, Slot>,
    ports: BTreeMap<u8, Port>,
    /// Orderly removals asked for and not yet done, by port.
    releases: BTreeMap<u8, OnRelease>,
    mmio: Arc<Bus>,
    io: Arc<Bus>,
}

impl PciRoot {
    /// A root complex with its host bridge at 00:00.0, mapping BARs onto `mmio` and `io`.
    pub fn new(mmio: Arc<Bus>, io: Arc<Bus>) -> Self {
        let mut root = PciRoot { slots: BTreeMap::new(), ports: BTreeMap::new(), releases: BTreeMap::new(), mmio, io };
        root.slots.insert(0, Slot::new(Arc::new(Mutex::new(HostBridge::new()))));
        root
    }

    /// Plugs `device` in as function 0 of device number `device_number`, with its BARs mapped
    /// where it has them already.
    pub fn add_device(&mut self, device_number: u8, device: Arc<Mutex<dyn PciDevice>>) -> Result<(), PciError> {
        if device_number >= DEVICES_PER_BUS || self.slots.contains_key(&(device_number << 3)) {
            return Err(PciError::Slot(device_number));
        }
        let devfn = device_number << 3;
        self.slots.insert(devfn, Slot::new(device));
        self.refresh_bars(Target::Bus0(devfn));
        Ok(())
    }

    /// Adds root port `port` as device number `device_number` of bus 0, its slot empty.
    pub fn add_root_port(&mut self, device_number: u8, port: Arc<Mutex<RootPort>>) -> Result<(), PciError> {
        self.add_device(device_number, port.clone())?;
        self.ports.insert(device_number, Port { port, adapter: None });
        Ok(())
    }

    /// Puts `device` into the slot of the root port at `device_number`, as function 0 of device 0
    /// on the port's secondary bus.
    pub fn plug(
        &mut self,
        device_number: u8,
        device: Arc<Mutex<dyn PciDevice>>,
        how: Arrival,
    ) -> Result<(), SlotError> {
        let entry = self.ports.get_mut(&device_number).ok_or(SlotError::NoPort(device_number))?;
        if entry.adapter.is_some() {
            return Err(SlotError::Occupied(device_number));
        }
        entry.adapter = Some(Slot::new(device));
        let port = entry.port.clone();
        self.refresh_bars(Target::Adapter(device_number));
        match how {
            Arrival::AtBoot => lock(&port).insert_at_boot(),
            Arrival::HotPlug => lock(&port).hot_plug(),
        }
        Ok(())
    }

    /// Asks the guest to let the adapter in the slot of the root port at `device_number` go: the
    /// attention button is pressed, and once the guest turns the slot's power off the adapter
    /// leaves the slot and `on_release` gets it.
    pub fn request_release(&mut self, device_number: u8, on_release: OnRelease) -> Result<(), SlotError> {
        let entry = self.ports.get(&device_number).ok_or(SlotError::NoPort(device_number))?;
        if entry.adapter.is_none() {
            return Err(SlotError::Empty(device_number));
        }
        if self.releases.contains_key(&device_number) {
            return Err(SlotError::Releasing(device_number));
        }
        lock(&entry.port).press_attention_button();
        self.releases.insert(device_number, on_release);
        Ok(())
    }

    /// After a guest write to a root port: the adapter whose release was asked for leaves once
    /// the slot's power is off.
    fn complete_release(&mut self, devfn: u8) {
        let number = devfn >> 3;
        let powered_off = self.ports.get(&number).is_some_and(|p| !lock(&p.port).powered());
        if !powered_off || !self.releases.contains_key(&number) {
            return;
        }
        let on_release = self.releases.remove(&number).expect("checked above");
        if let Ok(device) = self.unplug(number, Removal::Released) {
            on_release(device);
        }
    }

    /// Takes the adapter out of the slot of the root port at `device_number`: its BARs leave the
    /// bus, the port reports the change (a pulled cable: presence and link drop, with events; the
    /// guest ignores them after it turned the power off itself). Returns the device.
    pub fn unplug(&mut self, device_number: u8, how: Removal) -> Result<Arc<Mutex<dyn PciDevice>>, SlotError> {
        let entry = self.ports.get_mut(&device_number).ok_or(SlotError::NoPort(device_number))?;
        let adapter = entry.adapter.take().ok_or(SlotError::Empty(device_number))?;
        lock(&entry.port).surprise_removal();
        if how == Removal::Surprise {
            self.releases.remove(&device_number);
        }
        for old in &adapter.mapped {
            self.bus_for(old.kind).remove(old.addr);
        }
        Ok(adapter.device)
    }

    /// Bus 0's functions' states; refused when one of them cannot be saved.
    pub fn snapshot_state(&self) -> Result<PciRootState, PciStateError> {
        if let Some((&number, port)) = self.ports.iter().find(|(_, p)| p.adapter.is_some()) {
            let name = port.adapter.as_ref().map_or_else(String::new, |a| lock(&a.device).name().to_string());
            return Err(PciStateError::NotSaveable {
                devfn: number << 3,
                name: format!("{name} in the slot of the port"),
            });
        }
        let mut functions = Vec::with_capacity(self.slots.len());
        for (&devfn, slot) in &self.slots {
            let device = lock(&slot.device);
            let name = device.name().to_string();
            let state =
                device.snapshot_state().ok_or_else(|| PciStateError::NotSaveable { devfn, name: name.clone() })?;
            functions.push(FunctionState { devfn, name, state });
        }
        Ok(PciRootState { functions })
    }

    /// Puts back bus 0's functions' states (from [`PciRoot::snapshot_state`] of a VM with the
    /// same functions) and maps their BARs where they were.
    pub fn restore_state(&mut self, saved: &PciRootState) -> Result<(), PciStateError> {
        let saved_numbers: Vec<u8> = saved.functions.iter().map(|f| f.devfn).collect();
        if saved_numbers != self.functions() {
            let list = |numbers: &[u8]| {
                numbers.iter().map(|d| format!("{:02x}.{}", d >> 3, d & 7)).collect::<Vec<_>>().join(", ")
            };
            return Err(PciStateError::OtherFunctions { saved: list(&saved_numbers), here: list(&self.functions()) });
        }
        for function in &saved.functions {
            let Some(slot) = self.slots.get(&function.devfn) else { continue };
            let mut device = lock(&slot.device);
            device.restore_state(&function.state).map_err(|why| PciStateError::Refused {
                devfn: function.devfn,
                name: device.name().to_string(),
                why,
            })?;
            drop(device);
            self.refresh_bars(Target::Bus0(function.devfn));
        }
        Ok(())
    }

    /// The devices on bus 0, by device/function number.
    pub fn functions(&self) -> Vec<u8> {
        self.slots.keys().copied().collect()
    }

    /// The function at `bus`/`devfn`: on bus 0, or the adapter of the root port whose secondary
    /// bus is `bus` (only device 0 exists behind a root port).
    fn target(&self, bus: u8, devfn: u8) -> Option<Target> {
        if bus == 0 {
            return self.slots.contains_key(&devfn).then_some(Target::Bus0(devfn));
        }
        if devfn != 0 {
            return None;
        }
        self.ports
            .iter()
            .find(|(_, p)| p.adapter.is_some() && lock(&p.port).secondary_bus() == Some(bus))
            .map(|(&number, _)| Target::Adapter(number))
    }

    fn slot(&self, target: Target) -> Option<&Slot> {
        match target {
            Target::Bus0(devfn) => self.slots.get(&devfn),
            Target::Adapter(number) => self.ports.get(&number)?.adapter.as_ref(),
        }
    }

    fn slot_mut(&mut self, target: Target) -> Option<&mut Slot> {
        match target {
            Target::Bus0(devfn) => self.slots.get_mut(&devfn),
            Target::Adapter(number) => self.ports.get_mut(&number)?.adapter.as_mut(),
        }
    }

    /// Reads dword `reg` of the function at `bus`/`devfn`; absent functions read all ones.
    pub fn config_read(&self, bus: u8, devfn: u8, reg: usize) -> u32 {
        match self.target(bus, devfn).and_then(|t| self.slot(t)) {
            Some(slot) => lock(&slot.device).config_read(reg),
            None => 0xffff_ffff,
        }
    }

    /// Writes configuration space of the function at `bus`/`devfn`, then moves its BARs if the
    /// write changed where they decode.
    pub fn config_write(&mut self, bus: u8, devfn: u8, offset: usize, data: &[u8]) {
        let Some(target) = self.target(bus, devfn) else { return };
        let Some(slot) = self.slot(target) else { return };
        lock(&slot.device).config_write(offset, data);
        self.refresh_bars(target);
        if let Target::Bus0(devfn) = target {
            self.complete_release(devfn);
        }
    }

    fn bus_for(&self, kind: BarKind) -> &Arc<Bus> {
        if kind == BarKind::Io { &self.io } else { &self.mmio }
    }

    fn refresh_bars(&mut self, target: Target) {
        let (mmio, io) = (self.mmio.clone(), self.io.clone());
        let Some(slot) = self.slot_mut(target) else { return };
        let wanted = lock(&slot.device).bar_mappings();
        if wanted == slot.mapped {
            return;
        }
        let bus_for = |kind| if kind == BarKind::Io { &io } else { &mmio };
        for old in slot.mapped.drain(..) {
            bus_for(old.kind).remove(old.addr);
        }
        for mapping in wanted {
            let region = Arc::new(Mutex::new(BarRegion { device: slot.device.clone(), bar: mapping.bar }));
            match bus_for(mapping.kind).insert(mapping.addr, mapping.size, region) {
                Ok(()) => slot.mapped.push(mapping),
                Err(e) => tracing::warn!("{target}: BAR {} at {:#x} not mapped: {e}", mapping.bar, mapping.addr),
            }
        }
    }
}

/// Where a function sits: on bus 0 (by device/function number), or in the slot of the root
/// port with that device number.
#[derive(Debug, Clone, Copy)]
enum Target {
    Bus0(u8),
    Adapter(u8),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Bus0(devfn) => write!(f, "00:{:02x}.{}", devfn >> 3, devfn & 7),
            Target::Adapter(port) => write!(f, "the slot of 00:{port:02x}.0"),
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

/// The ECAM window: configuration space memory-mapped, 4 KiB per function, 1 MiB per bus.
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

    /// An [`Echo`] that saves its configuration registers as the host bridge does.
    struct SavedEcho(Echo);

    impl PciDevice for SavedEcho {
        fn name(&self) -> &str {
            "saved echo"
        }
        fn config_read(&mut self, reg: usize) -> u32 {
            self.0.config_read(reg)
        }
        fn config_write(&mut self, offset: usize, data: &[u8]) {
            self.0.config_write(offset, data)
        }
        fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
            self.0.bar_read(bar, offset, data)
        }
        fn bar_write(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
        fn bar_mappings(&self) -> Vec<BarMapping> {
            self.0.bar_mappings()
        }
        fn snapshot_state(&self) -> Option<serde_json::Value> {
            self.0.config.state()
        }
        fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), String> {
            self.0.config.restore_state(state)
        }
    }

    fn saved_echo(address: u64) -> Arc<Mutex<SavedEcho>> {
        let echo = Arc::into_inner(echo()).unwrap().into_inner().unwrap();
        let mut echo = SavedEcho(echo);
        echo.0.config.set_bar_address(0, address);
        Arc::new(Mutex::new(echo))
    }

    #[test]
    fn bus_0_s_state_goes_into_a_new_root_with_its_bars_where_the_guest_put_them() {
        let root = |mmio: &Arc<Bus>| PciRoot::new(mmio.clone(), Arc::new(Bus::new()));
        let first_bus = Arc::new(Bus::new());
        let mut first = root(&first_bus);
        first.add_device(2, saved_echo(0xc000_0000)).unwrap();
        // The guest moves the BAR, turns on memory decoding and bus mastering on both functions.
        first.config_write(0, 2 << 3, 0x10, &0xd000_0000u32.to_le_bytes());
        first.config_write(0, 2 << 3, 0x04, &[0x06, 0]);
        first.config_write(0, 0, 0x04, &[0x06, 0]);
        let saved = first.snapshot_state().unwrap();
        let json = serde_json::to_string(&saved).unwrap();

        let second_bus = Arc::new(Bus::new());
        let mut second = root(&second_bus);
        second.add_device(2, saved_echo(0xc000_0000)).unwrap();
        second.restore_state(&serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(second.config_read(0, 0, 1) & 0xffff, 0x0006, "the host bridge's command register");
        assert_eq!(second.config_read(0, 2 << 3, 4), 0xd000_0000);
        let mut data = [0u8; 1];
        use vm_device::bus::Access;
        assert!(second_bus.read(0xd000_0010, &mut data) == Access::Handled && data[0] == 0x10, "the BAR decodes there");
        assert!(second_bus.read(0xc000_0010, &mut data) == Access::Unclaimed, "and not where the new device had it");

        // Refused: a function that keeps no state, another set of functions, another kind.
        let mut plain = root(&Arc::new(Bus::new()));
        plain.add_device(2, echo()).unwrap();
        let refused = plain.snapshot_state().unwrap_err();
        assert_eq!(refused.to_string(), "echo at 00:02.0 cannot be snapshotted");
        let mut fewer = root(&Arc::new(Bus::new()));
        let refused = fewer.restore_state(&saved).unwrap_err();
        assert_eq!(refused.to_string(), "the snapshot's PCI functions (00.0, 02.0) are not this VM's (00.0)");
        let mut other = saved.clone();
        other.functions[0].state = serde_json::to_value(vec![0u32; crate::config::CONFIG_SIZE / 4]).unwrap();
        let refused = second.restore_state(&other).unwrap_err();
        assert!(refused.to_string().contains("saved from another kind of function"), "{refused}");
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

    fn root_with_port(number: u8) -> (Arc<Mutex<PciRoot>>, Arc<Bus>, Arc<Mutex<RootPort>>) {
        let mmio = Arc::new(Bus::new());
        let root = Arc::new(Mutex::new(PciRoot::new(mmio.clone(), Arc::new(Bus::new()))));
        let interrupts = Arc::new(vm_device::interrupt::RecordingInterrupts::default());
        let port = Arc::new(Mutex::new(RootPort::new(1, interrupts).unwrap()));
        lock(&port).assign(1, (0xc000_0000, 0xc0ff_ffff));
        lock(&root).add_root_port(number, port.clone()).unwrap();
        (root, mmio, port)
    }

    #[test]
    fn an_adapter_answers_on_its_ports_secondary_bus_only() {
        let (root, mmio, port) = root_with_port(2);
        let mut ecam = PciConfigMmio::new(root.clone());
        let mut io = PciConfigIo::new(root.clone());
        let vendor = |ecam: &mut PciConfigMmio, offset: u64| {
            let mut id = [0u8; 4];
            ecam.read(offset, &mut id);
            u32::from_le_bytes(id)
        };
        assert_eq!(vendor(&mut ecam, 2 << 15), 0x000c_1b36, "the port on bus 0");
        assert_eq!(vendor(&mut ecam, 1 << 20), 0xffff_ffff, "empty slot");
        lock(&root).plug(2, echo(), Arrival::AtBoot).unwrap();
        assert!(lock(&port).occupied());
        assert_eq!(lock(&port).slot_status() & crate::pcie::SLOT_STATUS_EVENTS, 0);
        assert_eq!(vendor(&mut ecam, 1 << 20), 0x5678_1234, "01:00.0");
        assert_eq!(io_read32(&mut io, CONFIG_ENABLE | 1 << 16), 0x5678_1234, "the same through 0xCF8");
        assert_eq!(vendor(&mut ecam, (1 << 20) | (1 << 15)), 0xffff_ffff, "only device 0 behind a port");
        assert_eq!(vendor(&mut ecam, 2 << 20), 0xffff_ffff, "bus 2 is nobody's");
        // The guest renumbers the port's secondary bus; the adapter follows.
        ecam.write((2 << 15) + 0x19, &[4]);
        assert_eq!(vendor(&mut ecam, 1 << 20), 0xffff_ffff);
        assert_eq!(vendor(&mut ecam, 4 << 20), 0x5678_1234);
        // Its BARs decode once the guest turns memory decoding on, as on bus 0.
        ecam.write((4 << 20) + 4, &2u16.to_le_bytes());
        let mut data = [0u8; 1];
        assert_eq!(mmio.read(0xc000_0010, &mut data), vm_device::bus::Access::Handled);
    }

    #[test]
    fn plug_and_unplug_refuse_what_does_not_fit_and_leave_no_bar_behind() {
        let (root, mmio, port) = root_with_port(3);
        let mut root = lock(&root);
        assert_eq!(root.plug(4, echo(), Arrival::HotPlug).unwrap_err(), SlotError::NoPort(4));
        assert_eq!(root.unplug(3, Removal::Surprise).err(), Some(SlotError::Empty(3)));
        root.plug(3, echo(), Arrival::HotPlug).unwrap();
        assert_eq!(lock(&port).slot_status() & crate::pcie::SLOT_STATUS_PDC, crate::pcie::SLOT_STATUS_PDC);
        assert_eq!(root.plug(3, echo(), Arrival::HotPlug).unwrap_err(), SlotError::Occupied(3));
        root.config_write(1, 0, 4, &2u16.to_le_bytes());
        let mut data = [0u8; 1];
        assert_eq!(mmio.read(0xc000_0000, &mut data), vm_device::bus::Access::Handled);
        let device = root.unplug(3, Removal::Surprise).unwrap();
        assert_eq!(lock(&device).name(), "echo");
        assert_eq!(mmio.read(0xc000_0000, &mut data), vm_device::bus::Access::Unclaimed, "BAR gone");
        assert_eq!(root.config_read(1, 0, 0), 0xffff_ffff);
        assert!(!lock(&port).occupied());
        root.plug(3, echo(), Arrival::HotPlug).unwrap();
        root.unplug(3, Removal::Released).unwrap();
        assert_eq!(root.unplug(3, Removal::Released).err(), Some(SlotError::Empty(3)));
    }

    #[test]
    fn an_orderly_release_ends_when_the_guest_turns_the_slot_off() {
        use crate::pcie::{SLOT_CONTROL, SLOT_CONTROL_PCC, SLOT_STATUS_ABP};
        let (root, mmio, port) = root_with_port(2);
        let released = Arc::new(Mutex::new(None::<String>));
        let on_release = |released: &Arc<Mutex<Option<String>>>| -> OnRelease {
            let released = released.clone();
            Box::new(move |device| *lock(&released) = Some(lock(&device).name().to_string()))
        };
        let mut ecam = PciConfigMmio::new(root.clone());
        assert_eq!(lock(&root).request_release(2, on_release(&released)).err(), Some(SlotError::Empty(2)));
        lock(&root).plug(2, echo(), Arrival::AtBoot).unwrap();
        ecam.write((1 << 20) + 4, &2u16.to_le_bytes());
        lock(&root).request_release(2, on_release(&released)).unwrap();
        assert_ne!(lock(&port).slot_status() & SLOT_STATUS_ABP, 0, "the attention button");
        let again = lock(&root).request_release(2, on_release(&released));
        assert_eq!(again.err(), Some(SlotError::Releasing(2)));
        // The guest unbinds the driver, then turns the slot's power off.
        let control = (2 << 15) + 0x40 + SLOT_CONTROL as u64;
        ecam.write(control, &0x0020u16.to_le_bytes());
        assert!(lock(&released).is_none(), "powered still");
        ecam.write(control, &(0x0020 | SLOT_CONTROL_PCC).to_le_bytes());
        assert_eq!(lock(&released).as_deref(), Some("echo"));
        let mut data = [0u8; 1];
        assert_eq!(mmio.read(0xc000_0000, &mut data), vm_device::bus::Access::Unclaimed, "BAR gone");
        assert!(!lock(&port).occupied());
        // A surprise removal forgets a release that was asked for.
        lock(&root).plug(2, echo(), Arrival::HotPlug).unwrap();
        ecam.write(control, &0x0020u16.to_le_bytes());
        let forgotten = Arc::new(Mutex::new(None::<String>));
        lock(&root).request_release(2, on_release(&forgotten)).unwrap();
        lock(&root).unplug(2, Removal::Surprise).unwrap();
        lock(&root).plug(2, echo(), Arrival::HotPlug).unwrap();
        ecam.write(control, &(0x0020 | SLOT_CONTROL_PCC).to_le_bytes());
        assert!(lock(&forgotten).is_none(), "no release was pending any more");
        assert!(lock(&port).occupied());
    }
}

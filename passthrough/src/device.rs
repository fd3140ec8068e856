//! One PCI device passed through to the guest over a [`VfioBackend`].
//!
//! Configuration space is shadowed where the VMM owns the meaning: the header (IDs, BARs at guest
//! addresses, command register, ROM hidden, multifunction masked, no INTx), the MSI-X capability
//! (emulated; MSI is hidden from the capability list so drivers use MSI-X), and the capability
//! chain around what is hidden. Everything else is forwarded. BARs are trapped and forwarded,
//! except the parts a backend lets the VMM mmap, which become KVM memory slots (never the MSI-X
//! table or PBA pages: those stay trapped and emulated). MSI-X vectors are EventFds the device
//! signals directly, wired to irqfds.

use std::sync::{Arc, Mutex, MutexGuard};

use devices::interrupt::MsiInterrupts;
use devices::pci::config::{BarKind, NUM_BARS, PciConfiguration, PciIds};
use devices::pci::device::{BarMapping, PciDevice, decoded_bars};
use devices::pci::msix::{self, MsixConfig};

use crate::backend::{BackendError, VfioBackend, irq, region};
use crate::slots::{BarWindow, GuestMemorySlots};

/// A backend shared by the device and its DMA mirror.
pub type SharedBackend = Arc<Mutex<Box<dyn VfioBackend>>>;

/// Locks a shared backend.
pub fn lock(backend: &SharedBackend) -> MutexGuard<'_, Box<dyn VfioBackend>> {
    backend.lock().unwrap_or_else(|p| p.into_inner())
}

const CAP_ID_MSI: u8 = 0x05;
const CAP_POINTER: usize = 0x34;
const HEADER_END: usize = 0x40;
const HEADER_TYPE: usize = 0x0e;
const INTERRUPT_PIN: usize = 0x3d;

/// Errors setting a device up.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The device is not usable as it is.
    #[error("{name}: {reason}")]
    Unhealthy {
        /// Which device.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

struct MsixLayout {
    cap: usize,
    table_bar: usize,
    table_offset: u64,
    pba_bar: usize,
    pba_offset: u64,
}

/// A passed-through PCI function.
pub struct PciPassthroughDevice {
    name: String,
    backend: SharedBackend,
    shadow: PciConfiguration,
    /// Device configuration space as read at start (for the capability chain).
    original: [u8; 256],
    /// Offsets whose "next capability" byte the VMM rewrites, and the value it shows.
    next_overrides: Vec<(usize, u8)>,
    first_capability: u8,
    msix: Option<(MsixLayout, MsixConfig)>,
    /// MSI-X message control as the guest last wrote it.
    msix_control: u16,
    msix_enabled_in_device: bool,
    bar_windows: Vec<BarWindow>,
    slots: Arc<dyn GuestMemorySlots>,
    failed: Option<String>,
}

fn read_config(backend: &mut dyn VfioBackend) -> Result<[u8; 256], BackendError> {
    let mut config = [0u8; 256];
    backend.read(region::CONFIG, 0, &mut config)?;
    Ok(config)
}

fn u16_at(c: &[u8; 256], at: usize) -> u16 {
    u16::from_le_bytes([c[at], c[at + 1]])
}

fn u32_at(c: &[u8; 256], at: usize) -> u32 {
    u32::from_le_bytes(c[at..at + 4].try_into().expect("in range"))
}

/// The capability list: (offset, id), with a guard against loops.
fn capabilities(c: &[u8; 256]) -> Vec<(usize, u8)> {
    let mut caps = Vec::new();
    if u16_at(c, 0x06) & (1 << 4) == 0 {
        return caps;
    }
    let mut next = (c[CAP_POINTER] & 0xfc) as usize;
    while next >= HEADER_END && caps.len() < 48 {
        caps.push((next, c[next]));
        next = (c[next + 1] & 0xfc) as usize;
    }
    caps
}

impl PciPassthroughDevice {
    /// Takes the device behind `backend`: resets it, checks that it is healthy, and builds the
    /// shadow configuration. BARs are placed with `place_bar(index, size, kind)`.
    pub fn new(
        backend: SharedBackend,
        interrupts: Arc<dyn MsiInterrupts>,
        slots: Arc<dyn GuestMemorySlots>,
        mut place_bar: impl FnMut(usize, u64, BarKind) -> Result<u64, String>,
    ) -> Result<Self, DeviceError> {
        let name = lock(&backend).name().to_string();
        let unhealthy = |reason: String| DeviceError::Unhealthy { name: name.clone(), reason };
        let config = reset_and_check(&backend, None).map_err(|e| match e {
            DeviceError::Unhealthy { reason, .. } => unhealthy(reason),
            other => other,
        })?;
        let ids = PciIds {
            vendor: u16_at(&config, 0),
            device: u16_at(&config, 2),
            subsystem_vendor: u16_at(&config, 0x2c),
            subsystem: u16_at(&config, 0x2e),
            class: [config[0x0b], config[0x0a], config[0x09]],
            revision: config[0x08],
        };
        let mut shadow = PciConfiguration::new(ids);

        // BARs: sizes from the regions, kinds from the device's own BAR registers.
        let mut index = 0;
        while index < NUM_BARS {
            let low = u32_at(&config, 0x10 + index * 4);
            let kind = if low & 1 == 1 {
                BarKind::Io
            } else if low & 0x6 == 0x4 {
                BarKind::Memory64
            } else {
                BarKind::Memory32
            };
            let size = lock(&backend).region(region::BAR0 + index as u32).map_or(0, |r| r.size);
            if size > 0 {
                let decoded = size.next_power_of_two().max(if kind == BarKind::Io { 4 } else { 16 });
                shadow.add_bar(index, decoded, kind).map_err(|e| unhealthy(e.to_string()))?;
                let addr = place_bar(index, decoded, kind).map_err(unhealthy)?;
                shadow.set_bar_address(index, addr);
            }
            index += if kind == BarKind::Memory64 { 2 } else { 1 };
        }

        // Capabilities: MSI-X emulated, MSI hidden.
        let caps = capabilities(&config);
        let mut msix = None;
        let kept: Vec<usize> = caps.iter().filter(|&&(_, id)| id != CAP_ID_MSI).map(|&(offset, _)| offset).collect();
        let mut next_overrides = Vec::new();
        for (i, &offset) in kept.iter().enumerate() {
            let shown = kept.get(i + 1).copied().unwrap_or(0) as u8;
            if config[offset + 1] & 0xfc != shown {
                next_overrides.push((offset + 1, shown));
            }
        }
        let first_capability = kept.first().copied().unwrap_or(0) as u8;
        if let Some(&(cap, _)) = caps.iter().find(|&&(_, id)| id == msix::CAPABILITY_ID) {
            let control = u16_at(&config, cap + 2);
            let table = u32_at(&config, cap + 4);
            let pba = u32_at(&config, cap + 8);
            let count = ((control & 0x7ff) + 1).min(lock(&backend).irq_count(irq::MSIX)?.max(1) as u16);
            let layout = MsixLayout {
                cap,
                table_bar: (table & 7) as usize,
                table_offset: (table & !7) as u64,
                pba_bar: (pba & 7) as usize,
                pba_offset: (pba & !7) as u64,
            };
            let table = MsixConfig::new(count, interrupts).map_err(|e| unhealthy(e.to_string()))?;
            msix = Some((layout, table));
        }
        let mut device = PciPassthroughDevice {
            name,
            backend,
            shadow,
            original: config,
            next_overrides,
            first_capability,
            msix,
            msix_control: 0,
            msix_enabled_in_device: false,
            bar_windows: Vec::new(),
            slots,
            failed: None,
        };
        device.bar_windows = device.mappable_windows()?;
        device.refresh_slots();
        Ok(device)
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Why the device stopped being used, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The backend (for DMA mapping and teardown).
    pub fn backend(&self) -> SharedBackend {
        self.backend.clone()
    }

    /// The parts of each BAR that can be mmapped: page-aligned, without the MSI-X table and PBA.
    fn mappable_windows(&mut self) -> Result<Vec<BarWindow>, DeviceError> {
        const PAGE: u64 = 4096;
        let mut windows = Vec::new();
        let backend = lock(&self.backend);
        for bar in 0..NUM_BARS {
            let Some(region) = backend.region(region::BAR0 + bar as u32) else { continue };
            if !region.mappable() || self.shadow.bar(bar).is_none() {
                continue;
            }
            let areas = if region.sparse.is_empty() { vec![(0, region.size)] } else { region.sparse.clone() };
            let mut holes = Vec::new();
            if let Some((layout, table)) = &self.msix {
                if layout.table_bar == bar {
                    holes.push((
                        layout.table_offset & !(PAGE - 1),
                        (layout.table_offset + table.table_size()).next_multiple_of(PAGE),
                    ));
                }
                if layout.pba_bar == bar {
                    holes.push((
                        layout.pba_offset & !(PAGE - 1),
                        (layout.pba_offset + table.pba_size()).next_multiple_of(PAGE),
                    ));
                }
            }
            let Some((file, file_offset)) = &region.mmap else { continue };
            for (start, size) in areas {
                let mut pieces = vec![(start.next_multiple_of(PAGE), (start + size) & !(PAGE - 1))];
                for &(hole_start, hole_end) in &holes {
                    pieces = pieces
                        .into_iter()
                        .flat_map(|(s, e)| {
                            if hole_end <= s || hole_start >= e {
                                vec![(s, e)]
                            } else {
                                vec![(s, hole_start.max(s)), (hole_end.min(e), e)]
                            }
                        })
                        .filter(|(s, e)| e > s)
                        .collect();
                }
                for (s, e) in pieces {
                    windows.push(BarWindow::map(file, file_offset + s, bar, s, e - s).map_err(|e| {
                        DeviceError::Unhealthy {
                            name: self.name.clone(),
                            reason: format!("BAR {bar}: mmap failed: {e}"),
                        }
                    })?);
                }
            }
        }
        Ok(windows)
    }

    fn fail(&mut self, error: BackendError) {
        if self.failed.is_none() {
            tracing::error!("{}: {error}; the device is no longer used", self.name);
            self.failed = Some(error.to_string());
        }
    }

    fn refresh_slots(&mut self) {
        let decoded = decoded_bars(&self.shadow);
        for window in &mut self.bar_windows {
            let at = decoded.iter().find(|m| m.bar == window.bar).map(|m| m.addr + window.offset);
            if let Err(e) = window.place(self.slots.as_ref(), at) {
                tracing::warn!("{}: BAR {} window not mapped, accesses trap instead: {e}", self.name, window.bar);
            }
        }
    }

    fn msix_region(&self, bar: usize, offset: u64) -> Option<(bool, u64)> {
        let (layout, table) = self.msix.as_ref()?;
        if bar == layout.table_bar && offset >= layout.table_offset && offset < layout.table_offset + table.table_size()
        {
            return Some((true, offset - layout.table_offset));
        }
        if bar == layout.pba_bar && offset >= layout.pba_offset && offset < layout.pba_offset + table.pba_size() {
            return Some((false, offset - layout.pba_offset));
        }
        None
    }

    fn msix_control_written(&mut self, control: u16) {
        let Some((_, table)) = self.msix.as_mut() else { return };
        table.set_control(control);
        let enable = control & msix::CONTROL_ENABLE != 0;
        if enable == self.msix_enabled_in_device {
            return;
        }
        let result = if enable {
            let fds: Vec<_> = (0..table.count()).filter_map(|v| table.eventfd(v)).collect();
            lock(&self.backend).enable_msix(&fds)
        } else {
            lock(&self.backend).disable_msix()
        };
        match result {
            Ok(()) => self.msix_enabled_in_device = enable,
            Err(e) => self.fail(e),
        }
    }

    /// Resets the device and checks it (at teardown, or between runs).
    pub fn reset(&mut self) -> Result<(), DeviceError> {
        if self.msix_enabled_in_device {
            let _ = lock(&self.backend).disable_msix();
            self.msix_enabled_in_device = false;
        }
        reset_and_check(&self.backend, Some(&self.original)).map(|_| ())
    }
}

/// Resets the device behind `backend` and checks that its configuration space reads back sane:
/// a vendor ID, the same IDs as before (if known), and BARs that answer a size probe and take
/// their old value back.
pub fn reset_and_check(backend: &SharedBackend, before: Option<&[u8; 256]>) -> Result<[u8; 256], DeviceError> {
    let mut b = lock(backend);
    let name = b.name().to_string();
    let unhealthy = |reason: String| DeviceError::Unhealthy { name: name.clone(), reason };
    b.reset()?;
    let config = read_config(b.as_mut())?;
    let vendor = u16_at(&config, 0);
    if vendor == 0xffff || vendor == 0 {
        return Err(unhealthy(format!(
            "configuration space reads vendor {vendor:#06x} after reset: the device is gone or hung"
        )));
    }
    if let Some(before) = before
        && before[..4] != config[..4]
    {
        return Err(unhealthy("the device changed its IDs across a reset".into()));
    }
    for bar in 0..NUM_BARS {
        let size = b.region(region::BAR0 + bar as u32).map_or(0, |r| r.size);
        if size == 0 {
            continue;
        }
        let at = 0x10 + bar as u64 * 4;
        let old = u32_at(&config, at as usize);
        b.write(region::CONFIG, at, &[0xff; 4])?;
        let mut probe = [0u8; 4];
        b.read(region::CONFIG, at, &mut probe)?;
        b.write(region::CONFIG, at, &old.to_le_bytes())?;
        let mut back = [0u8; 4];
        b.read(region::CONFIG, at, &mut back)?;
        let mask = u32::from_le_bytes(probe);
        if mask == 0 || u32::from_le_bytes(back) != old {
            return Err(unhealthy(format!("BAR {bar} does not answer a size probe or restore ({mask:#x})")));
        }
    }
    Ok(config)
}

impl PciDevice for PciPassthroughDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn config_read(&mut self, reg: usize) -> u32 {
        let offset = reg * 4;
        if offset >= 256 {
            return 0;
        }
        let mut value = if offset < HEADER_END {
            self.shadow.read_reg(reg)
        } else if self.failed.is_some() {
            0xffff_ffff
        } else {
            let mut data = [0u8; 4];
            let result = lock(&self.backend).read(region::CONFIG, offset as u64, &mut data);
            match result {
                Ok(()) => u32::from_le_bytes(data),
                Err(e) => {
                    self.fail(e);
                    0xffff_ffff
                }
            }
        };
        let mut bytes = value.to_le_bytes();
        for (i, b) in bytes.iter_mut().enumerate() {
            let at = offset + i;
            match at {
                CAP_POINTER => *b = self.first_capability,
                HEADER_TYPE => *b &= 0x7f,
                INTERRUPT_PIN => *b = 0,
                0x06 if !self.next_overrides.is_empty() || self.first_capability != 0 => *b |= 1 << 4,
                _ => {
                    if let Some(&(_, shown)) = self.next_overrides.iter().find(|&&(o, _)| o == at) {
                        *b = shown;
                    }
                }
            }
        }
        if let Some((layout, table)) = &self.msix
            && offset == layout.cap
        {
            // Message control: table size from the device, enable and mask bits emulated.
            let mut control = (u16::from_le_bytes([bytes[2], bytes[3]]) & 0x07ff).min(table.count() - 1);
            if table.enabled() {
                control |= msix::CONTROL_ENABLE;
            }
            control |= self.msix_control & msix::CONTROL_FUNCTION_MASK;
            bytes[2..4].copy_from_slice(&control.to_le_bytes());
        }
        value = u32::from_le_bytes(bytes);
        value
    }

    fn config_write(&mut self, offset: usize, data: &[u8]) {
        if offset + data.len() > 256 {
            return;
        }
        if offset < HEADER_END {
            self.shadow.write(offset, data);
            // The command register's decode and bus-master bits also go to the device.
            if offset <= 0x04 && offset + data.len() > 0x04 {
                let command = self.shadow.command().to_le_bytes();
                let result = lock(&self.backend).write(region::CONFIG, 0x04, &command);
                if let Err(e) = result {
                    self.fail(e);
                }
            }
            self.refresh_slots();
            return;
        }
        if let Some((layout, _)) = &self.msix {
            let control = layout.cap + 2;
            if offset < control + 2 && offset + data.len() > control {
                let mut word = self.msix_control.to_le_bytes();
                for (i, &b) in data.iter().enumerate() {
                    let at = offset + i;
                    if at == control || at == control + 1 {
                        word[at - control] = b;
                    }
                }
                self.msix_control = u16::from_le_bytes(word);
                self.msix_control_written(self.msix_control);
                return;
            }
        }
        if self.failed.is_none() {
            let result = lock(&self.backend).write(region::CONFIG, offset as u64, data);
            if let Err(e) = result {
                self.fail(e);
            }
        }
    }

    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        if let Some((is_table, at)) = self.msix_region(bar, offset) {
            let table = &self.msix.as_ref().expect("msix_region found it").1;
            return if is_table { table.table_read(at, data) } else { table.pba_read(at, data) };
        }
        if self.failed.is_some() {
            return data.fill(0xff);
        }
        let result = lock(&self.backend).read(region::BAR0 + bar as u32, offset, data);
        if let Err(e) = result {
            data.fill(0xff);
            self.fail(e);
        }
    }

    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if let Some((is_table, at)) = self.msix_region(bar, offset) {
            if is_table {
                self.msix.as_mut().expect("msix_region found it").1.table_write(at, data);
            }
            return;
        }
        if self.failed.is_some() {
            return;
        }
        let result = lock(&self.backend).write(region::BAR0 + bar as u32, offset, data);
        if let Err(e) = result {
            self.fail(e);
        }
    }

    fn bar_mappings(&self) -> Vec<BarMapping> {
        decoded_bars(&self.shadow)
    }
}

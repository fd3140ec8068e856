//! One PCI device passed through to the guest over a [`VfioBackend`].
//!
//! Configuration space is shadowed where the VMM owns the meaning: the header (IDs, BARs at guest
//! addresses, command register, ROM hidden, multifunction masked, no INTx), the MSI and MSI-X
//! capabilities (emulated), and the capability chain (rebuilt, so a device's looping chain still
//! ends). Everything else is forwarded. BARs are trapped and forwarded,
//! except the parts a backend lets the VMM mmap, which become KVM memory slots (never the MSI-X
//! table or PBA pages: those stay trapped and emulated). MSI and MSI-X vectors are EventFds the
//! device signals directly, wired to irqfds.

use std::sync::{Arc, Mutex, MutexGuard};

use pci::PciError;
use pci::config::{BarKind, NUM_BARS, PciConfiguration, PciIds};
use pci::device::{BarMapping, PciDevice, decoded_bars};
use pci::msi::{self, MsiConfig};
use pci::msix::{self, MsixConfig};
use vm_device::interrupt::MsiInterrupts;

use crate::backend::{BackendError, VfioBackend, irq, region};
use crate::slots::{BarWindow, GuestMemorySlots};

/// A backend shared by the device and its DMA mirror.
pub type SharedBackend = Arc<Mutex<Box<dyn VfioBackend>>>;

/// Locks a shared backend.
pub fn lock(backend: &SharedBackend) -> MutexGuard<'_, Box<dyn VfioBackend>> {
    backend.lock().unwrap_or_else(|p| p.into_inner())
}

use pci::regs::{
    BAR0, CAPABILITIES_POINTER as CAP_POINTER, CLASS_BASE, CLASS_PROG_IF, CLASS_SUB, COMMAND, DEVICE_ID, HEADER_END,
    HEADER_TYPE, INTERRUPT_PIN, REVISION, STATUS, STATUS_CAPABILITIES, SUBSYSTEM_ID, SUBSYSTEM_VENDOR_ID, VENDOR_ID,
};

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
    /// The MSI capability's offset and state.
    msi: Option<(usize, MsiConfig)>,
    /// MSI vectors the device currently signals.
    msi_vectors_in_device: u16,
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
    if u16_at(c, STATUS) & STATUS_CAPABILITIES == 0 {
        return caps;
    }
    let mut next = (c[CAP_POINTER] & 0xfc) as usize;
    while next >= HEADER_END && caps.len() < 48 {
        caps.push((next, c[next]));
        next = (c[next + 1] & 0xfc) as usize;
    }
    caps
}

impl Drop for PciPassthroughDevice {
    fn drop(&mut self) {
        // The guest must stop reaching the windows before they are unmapped from this process.
        for window in &mut self.bar_windows {
            if let Err(e) = window.place(self.slots.as_ref(), None) {
                tracing::warn!("{}: removing BAR {} window from the guest: {e}", self.name, window.bar);
            }
        }
    }
}

impl PciPassthroughDevice {
    /// Takes the device behind `backend`: resets it (unless its opening just did), checks that it
    /// is healthy, and builds the shadow configuration. BARs are placed with `place_bar(index, size, kind)`.
    pub fn new(
        backend: SharedBackend,
        interrupts: Arc<dyn MsiInterrupts>,
        slots: Arc<dyn GuestMemorySlots>,
        mut place_bar: impl FnMut(usize, u64, BarKind) -> Result<u64, PciError>,
    ) -> Result<Self, DeviceError> {
        let name = lock(&backend).name().to_string();
        let unhealthy = |reason: String| DeviceError::Unhealthy { name: name.clone(), reason };
        // A function-level reset waits 100 ms or more: a device its opening reset is only checked.
        let fresh = lock(&backend).fresh_from_reset();
        let checked = if fresh { check(&backend, None) } else { reset_and_check(&backend, None) };
        let config = checked.map_err(|e| match e {
            DeviceError::Unhealthy { reason, .. } => unhealthy(reason),
            other => other,
        })?;
        let ids = PciIds {
            vendor: u16_at(&config, VENDOR_ID),
            device: u16_at(&config, DEVICE_ID),
            subsystem_vendor: u16_at(&config, SUBSYSTEM_VENDOR_ID),
            subsystem: u16_at(&config, SUBSYSTEM_ID),
            class: [config[CLASS_BASE], config[CLASS_SUB], config[CLASS_PROG_IF]],
            revision: config[REVISION],
        };
        let mut shadow = PciConfiguration::new(ids);

        // BARs: sizes from the regions, kinds from the device's own BAR registers.
        let mut index = 0;
        while index < NUM_BARS {
            let low = u32_at(&config, BAR0 + index * 4);
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
                let addr = place_bar(index, decoded, kind).map_err(|e| unhealthy(e.to_string()))?;
                shadow.set_bar_address(index, addr);
            }
            index += if kind == BarKind::Memory64 { 2 } else { 1 };
        }

        // Capabilities: MSI and MSI-X emulated, the chain rebuilt.
        let caps = capabilities(&config);
        let mut msix = None;
        let kept: Vec<usize> = caps.iter().map(|&(offset, _)| offset).collect();
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
            let table = MsixConfig::new(count, interrupts.clone()).map_err(|e| unhealthy(e.to_string()))?;
            msix = Some((layout, table));
        }
        let mut msi = None;
        if let Some(&(cap, _)) = caps.iter().find(|&&(_, id)| id == msi::CAPABILITY_ID) {
            let max = lock(&backend).irq_count(irq::MSI)?.max(1);
            let state = MsiConfig::new(u16_at(&config, cap + 2), max, interrupts.clone())
                .map_err(|e| unhealthy(e.to_string()))?;
            msi = Some((cap, state));
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
            msi,
            msi_vectors_in_device: 0,
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
            lock(&self.backend).enable_irqs(irq::MSIX, &fds)
        } else {
            lock(&self.backend).disable_irqs(irq::MSIX)
        };
        match result {
            Ok(()) => self.msix_enabled_in_device = enable,
            Err(e) => self.fail(e),
        }
    }

    /// Hands the device the EventFds of the MSI vectors the guest enabled, when that changed.
    fn msi_written(&mut self) {
        let Some((_, state)) = self.msi.as_ref() else { return };
        let wanted = state.enabled_vectors();
        if wanted == self.msi_vectors_in_device {
            return;
        }
        let fds: Vec<_> = (0..wanted).filter_map(|v| state.eventfd(v)).collect();
        let result = if wanted > 0 {
            lock(&self.backend).enable_irqs(irq::MSI, &fds)
        } else {
            lock(&self.backend).disable_irqs(irq::MSI)
        };
        match result {
            Ok(()) => self.msi_vectors_in_device = wanted,
            Err(e) => self.fail(e),
        }
    }

    /// The device leaves the guest (unplugged): decoding, bus mastering, MSI and MSI-X turned
    /// off as a guest would turn them off (so that its BARs leave the guest's memory map and its
    /// vectors are disarmed), then a reset. Plugged again, it starts from that reset state.
    pub fn quiesce(&mut self) -> Result<(), DeviceError> {
        self.config_write(COMMAND, &0u16.to_le_bytes());
        if let Some(cap) = self.msix.as_ref().map(|(layout, _)| layout.cap) {
            self.config_write(cap + 2, &0u16.to_le_bytes());
        }
        if let Some(cap) = self.msi.as_ref().map(|(cap, _)| *cap) {
            self.config_write(cap + 2, &0u16.to_le_bytes());
        }
        self.reset()
    }

    /// Resets the device and checks it (at teardown, or between runs).
    pub fn reset(&mut self) -> Result<(), DeviceError> {
        if self.msix_enabled_in_device {
            let _ = lock(&self.backend).disable_irqs(irq::MSIX);
            self.msix_enabled_in_device = false;
        }
        if self.msi_vectors_in_device > 0 {
            let _ = lock(&self.backend).disable_irqs(irq::MSI);
            self.msi_vectors_in_device = 0;
        }
        reset_and_check(&self.backend, Some(&self.original)).map(|_| ())
    }
}

/// Resets the device behind `backend` and checks that its configuration space reads back sane
/// (a vendor ID, the same IDs as before if known, BARs that answer a size probe).
pub fn reset_and_check(backend: &SharedBackend, before: Option<&[u8; 256]>) -> Result<[u8; 256], DeviceError> {
    lock(backend).reset()?;
    check(backend, before)
}

/// Checks that the configuration space of the device behind `backend` reads back sane: a vendor
/// ID, the same IDs as before (if known), and BARs that answer a size probe and take their old
/// value back.
fn check(backend: &SharedBackend, before: Option<&[u8; 256]>) -> Result<[u8; 256], DeviceError> {
    let mut b = lock(backend);
    let name = b.name().to_string();
    let unhealthy = |reason: String| DeviceError::Unhealthy { name: name.clone(), reason };
    let config = read_config(b.as_mut())?;
    let vendor = u16_at(&config, VENDOR_ID);
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
        let at = (BAR0 + bar * 4) as u64;
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
                STATUS if !self.next_overrides.is_empty() || self.first_capability != 0 => {
                    *b |= STATUS_CAPABILITIES as u8
                }
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
        if let Some((cap, state)) = &self.msi {
            for (i, b) in bytes.iter_mut().enumerate() {
                let at = offset + i;
                if at >= cap + 2 && at < cap + state.size() {
                    state.read(at - cap, std::slice::from_mut(b));
                }
            }
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
            // The BAR windows the guest reaches directly (KVM slots over the device's mmaps)
            // leave before the device stops decoding and come after it starts: kernel VFIO
            // zaps a BAR's mmap while memory decoding is off, and a vCPU touching a slot over a
            // zapped mmap fails KVM_RUN with EFAULT (seen when a device was pulled while its
            // driver was still at work).
            let decoding = self.shadow.command() & pci::config::COMMAND_MEMORY != 0;
            if !decoding {
                self.refresh_slots();
            }
            // The command register's decode and bus-master bits also go to the device.
            if offset <= COMMAND && offset + data.len() > COMMAND {
                let command = self.shadow.command().to_le_bytes();
                let result = lock(&self.backend).write(region::CONFIG, COMMAND as u64, &command);
                if let Err(e) = result {
                    self.fail(e);
                }
            }
            if decoding {
                self.refresh_slots();
            }
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
        if let Some((cap, state)) = self.msi.as_mut() {
            let (start, end) = (*cap + 2, *cap + state.size());
            if offset < end && offset + data.len() > start {
                let from = offset.max(start);
                let to = (offset + data.len()).min(end);
                state.write(from - *cap, &data[from - offset..to - offset]);
                self.msi_written();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RegionInfo;
    use crate::slots::SlotError;
    use pci::regs::BAR_END;
    use vm_device::interrupt::{InterruptError, MsiMessage};
    use vmm_sys_util::eventfd::EventFd;

    #[derive(Default)]
    struct Log {
        forwarded_writes: Vec<(u32, u64, Vec<u8>)>,
        msix_enabled: Option<usize>,
        msi_enabled: Option<usize>,
        resets: u32,
        /// DMA mappings the backend holds: IOVA to size.
        dma: std::collections::BTreeMap<u64, u64>,
    }

    /// An AQC-like function: 64-bit BAR 0 (64 KiB), 64-bit BAR 2 (4 KiB, MSI-X table and PBA),
    /// an expansion ROM, capabilities PM -> MSI -> MSI-X -> PCIe, multifunction header.
    struct FakeBackend {
        config: [u8; 256],
        regions: Vec<RegionInfo>,
        log: Arc<Mutex<Log>>,
        fail_bar_reads: bool,
        /// What `fresh_from_reset` answers, once.
        fresh: bool,
    }

    fn fake(log: Arc<Mutex<Log>>, fail_bar_reads: bool) -> FakeBackend {
        let mut c = [0u8; 256];
        c[0..4].copy_from_slice(&0x00b1_1d6au32.to_le_bytes());
        c[0x06] = 1 << 4;
        c[0x08..0x0c].copy_from_slice(&0x0200_0001u32.to_le_bytes());
        c[0x0e] = 0x80; // multifunction
        c[0x10] = 0x04; // 64-bit memory
        c[0x18] = 0x04;
        c[0x3d] = 1; // INTA
        c[0x34] = 0x40;
        c[0x40..0x42].copy_from_slice(&[0x01, 0x50]); // PM -> MSI
        c[0x50..0x52].copy_from_slice(&[0x05, 0x70]); // MSI -> MSI-X
        c[0x52..0x54].copy_from_slice(&(0x0180u16 | 3 << 1).to_le_bytes()); // 64-bit, maskable, 8 vectors
        c[0x70..0x72].copy_from_slice(&[0x11, 0xa0]); // MSI-X -> PCIe
        c[0x72..0x74].copy_from_slice(&9u16.to_le_bytes()); // 10 vectors
        c[0x74..0x78].copy_from_slice(&2u32.to_le_bytes()); // table: BAR 2, offset 0
        c[0x78..0x7c].copy_from_slice(&(0x800u32 | 2).to_le_bytes()); // PBA: BAR 2, offset 0x800
        c[0xa0..0xa2].copy_from_slice(&[0x10, 0x00]); // PCIe, end
        let region = |index, size| RegionInfo { index, flags: 3, size, mmap: None, sparse: Vec::new() };
        let regions = vec![
            region(0, 0x10000),
            region(1, 0),
            region(2, 0x1000),
            region(3, 0),
            region(4, 0),
            region(5, 0),
            region(6, 0x10000),
            region(7, 256),
        ];
        FakeBackend { config: c, regions, log, fail_bar_reads, fresh: false }
    }

    impl VfioBackend for FakeBackend {
        fn name(&self) -> &str {
            "fake"
        }
        fn region(&self, index: u32) -> Option<&RegionInfo> {
            self.regions.get(index as usize)
        }
        fn irq_count(&mut self, index: u32) -> Result<u32, BackendError> {
            Ok(match index {
                irq::MSIX => 10,
                irq::MSI => 4,
                _ => 0,
            })
        }
        fn read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), BackendError> {
            if index == region::CONFIG {
                let at = offset as usize;
                data.copy_from_slice(&self.config[at..at + data.len()]);
                // BARs answer size probes like hardware.
                if (BAR0..BAR_END).contains(&at) && self.config[at..at + 4] == [0xff; 4] {
                    data.copy_from_slice(&0xffff_0004u32.to_le_bytes()[..data.len()]);
                }
                return Ok(());
            }
            if self.fail_bar_reads {
                return Err(BackendError::Broken("fake: peer closed the socket".into()));
            }
            data.fill(0x5a);
            Ok(())
        }
        fn write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), BackendError> {
            if index == region::CONFIG {
                let at = offset as usize;
                self.config[at..at + data.len()].copy_from_slice(data);
            }
            self.log.lock().unwrap().forwarded_writes.push((index, offset, data.to_vec()));
            Ok(())
        }
        fn enable_irqs(&mut self, index: u32, fds: &[&EventFd]) -> Result<(), BackendError> {
            let mut log = self.log.lock().unwrap();
            *if index == irq::MSI { &mut log.msi_enabled } else { &mut log.msix_enabled } = Some(fds.len());
            Ok(())
        }
        fn disable_irqs(&mut self, index: u32) -> Result<(), BackendError> {
            let mut log = self.log.lock().unwrap();
            *if index == irq::MSI { &mut log.msi_enabled } else { &mut log.msix_enabled } = None;
            Ok(())
        }
        fn dma_map(&mut self, iova: u64, size: u64, _: u64, _: bool) -> Result<(), BackendError> {
            self.log.lock().unwrap().dma.insert(iova, size);
            Ok(())
        }
        fn dma_unmap(&mut self, iova: u64, _: u64) -> Result<(), BackendError> {
            self.log.lock().unwrap().dma.remove(&iova);
            Ok(())
        }
        fn reset(&mut self) -> Result<(), BackendError> {
            self.log.lock().unwrap().resets += 1;
            Ok(())
        }
        fn fresh_from_reset(&mut self) -> bool {
            std::mem::take(&mut self.fresh)
        }
    }

    struct Interrupts(Mutex<u32>);

    impl MsiInterrupts for Interrupts {
        fn allocate_gsi(&self) -> Result<u32, InterruptError> {
            let mut next = self.0.lock().unwrap();
            *next += 1;
            Ok(*next)
        }
        fn set_route(&self, _: u32, _: MsiMessage) -> Result<(), InterruptError> {
            Ok(())
        }
        fn register_irqfd(&self, _: u32, _: &EventFd) -> Result<(), InterruptError> {
            Ok(())
        }
        fn unregister_irqfd(&self, _: u32, _: &EventFd) -> Result<(), InterruptError> {
            Ok(())
        }
    }

    struct NoSlots;

    impl GuestMemorySlots for NoSlots {
        unsafe fn map(&self, _: u64, _: u64, _: u64) -> Result<u32, SlotError> {
            Err(SlotError::Exhausted)
        }
        fn unmap(&self, _: u32) -> Result<(), SlotError> {
            Ok(())
        }
    }

    fn device(fail_bar_reads: bool) -> (PciPassthroughDevice, Arc<Mutex<Log>>) {
        let (dev, log) = device_of(|log| fake(log, fail_bar_reads));
        // The health check at start probes BARs through the device; what follows is the guest's.
        log.lock().unwrap().forwarded_writes.clear();
        (dev, log)
    }

    /// A device on the backend `make` builds around the log.
    fn device_of(make: impl FnOnce(Arc<Mutex<Log>>) -> FakeBackend) -> (PciPassthroughDevice, Arc<Mutex<Log>>) {
        let log = Arc::new(Mutex::new(Log::default()));
        let backend: SharedBackend = Arc::new(Mutex::new(Box::new(make(log.clone()))));
        let mut next = 0xc000_0000;
        let dev = PciPassthroughDevice::new(
            backend,
            Arc::new(Interrupts(Mutex::new(23))),
            Arc::new(NoSlots),
            |_, size, _| {
                let at = next;
                next += size;
                Ok(at)
            },
        )
        .unwrap();
        (dev, log)
    }

    #[test]
    fn a_device_its_opening_reset_is_checked_not_reset_again_and_later_resets_happen() {
        let (mut dev, log) = device_of(|log| FakeBackend { fresh: true, ..fake(log, false) });
        assert_eq!(log.lock().unwrap().resets, 0, "the opening's reset stands");
        // Checked all the same: its IDs read, its BARs size-probed (all ones, then the old value).
        assert_eq!(dev.config_read(0), 0x00b1_1d6a);
        let probes = log.lock().unwrap().forwarded_writes.iter().filter(|w| w.1 == 0x10).count();
        assert_eq!(probes, 2, "BAR 0 probed and put back");
        dev.reset().unwrap();
        dev.reset().unwrap();
        assert_eq!(log.lock().unwrap().resets, 2, "every later reset is one");
        let (_, probed) = device(false);
        assert_eq!(probed.lock().unwrap().resets, 1, "a device not reset by its opening is reset first");
    }

    #[test]
    fn header_is_shadowed() {
        let (mut dev, log) = device(false);
        assert_eq!(log.lock().unwrap().resets, 1, "reset before use");
        assert_eq!(dev.config_read(0), 0x00b1_1d6a);
        assert_eq!((dev.config_read(0x0c / 4) >> 16) & 0xff, 0x00, "multifunction masked");
        assert_eq!((dev.config_read(0x3c / 4) >> 8) & 0xff, 0, "no INTx pin");
        assert_eq!(dev.config_read(0x30 / 4), 0, "ROM hidden");
        dev.config_write(0x30, &[0xff; 4]);
        assert_eq!(dev.config_read(0x30 / 4), 0);
        assert_eq!(dev.config_read(0x10 / 4), 0xc000_0004, "BAR 0 at its guest address");
        dev.config_write(0x10, &[0xff; 4]);
        assert_eq!(dev.config_read(0x10 / 4), 0xffff_0004, "size probe: 64 KiB");
        dev.config_write(0x10, &0xd000_0000u32.to_le_bytes());
        dev.config_write(0x04, &2u16.to_le_bytes());
        let bars = dev.bar_mappings();
        assert_eq!(
            bars.iter().map(|b| (b.bar, b.addr, b.size)).collect::<Vec<_>>(),
            vec![(0, 0xd000_0000, 0x10000), (2, 0xc001_0000, 0x1000)]
        );
        let forwarded = &log.lock().unwrap().forwarded_writes;
        assert!(forwarded.iter().any(|(r, o, _)| *r == region::CONFIG && *o == 4), "command forwarded");
        assert!(!forwarded.iter().any(|(r, o, _)| *r == region::CONFIG && *o == 0x10), "BARs stay in the shadow");
    }

    #[test]
    fn msi_and_msix_are_emulated() {
        let (mut dev, log) = device(false);
        let mut chain = Vec::new();
        let mut next = (dev.config_read(0x34 / 4) & 0xff) as usize;
        while next != 0 {
            let header = dev.config_read(next / 4);
            chain.push((next, header as u8));
            next = ((header >> 8) & 0xfc) as usize;
        }
        assert_eq!(chain, vec![(0x40, 0x01), (0x50, 0x05), (0x70, 0x11), (0xa0, 0x10)]);
        // The MSI-X table lives in BAR 2 and is not forwarded.
        dev.bar_write(2, 0, &0xfee0_0000u32.to_le_bytes());
        let mut back = [0u8; 4];
        dev.bar_read(2, 0, &mut back);
        assert_eq!(u32::from_le_bytes(back), 0xfee0_0000);
        dev.config_write(0x72, &0x8000u16.to_le_bytes());
        assert_eq!(log.lock().unwrap().msix_enabled, Some(10));
        assert_ne!(dev.config_read(0x70 / 4) >> 16 & 0x8000, 0, "enable bit reads back");
        dev.config_write(0x72, &0u16.to_le_bytes());
        assert_eq!(log.lock().unwrap().msix_enabled, None);
        assert!(
            !log.lock().unwrap().forwarded_writes.iter().any(|(r, _, _)| *r == 2),
            "no table write reached the device"
        );
        dev.config_write(0xa8, &[1, 2]);
        assert!(
            log.lock()
                .unwrap()
                .forwarded_writes
                .iter()
                .any(|(r, o, d)| *r == region::CONFIG && *o == 0xa8 && d == &[1, 2])
        );
    }

    #[test]
    fn msi_vectors_reach_the_device_as_eventfds() {
        let (mut dev, log) = device(false);
        let control = dev.config_read(0x50 / 4) >> 16;
        assert_eq!(control & 0x180, 0x180, "64-bit and per-vector mask as the device has them");
        assert_eq!(control >> 1 & 7, 2, "multiple message capable: 4, what the backend delivers");
        dev.config_write(0x54, &0xfee0_0000u32.to_le_bytes());
        dev.config_write(0x5c, &0x41u16.to_le_bytes());
        assert_eq!(dev.config_read(0x54 / 4), 0xfee0_0000, "address in the shadow");
        dev.config_write(0x52, &(1u16 | 1 << 4).to_le_bytes());
        assert_eq!(log.lock().unwrap().msi_enabled, Some(2), "two vectors enabled");
        assert_eq!(dev.config_read(0x50 / 4) >> 16 & 1, 1, "enable reads back");
        dev.config_write(0x50, &0u32.to_le_bytes());
        assert_eq!(log.lock().unwrap().msi_enabled, None);
        assert_eq!(dev.config_read(0x50 / 4) & 0xffff, 0x7005, "ID and next pointer are not writable");
        assert!(
            !log.lock()
                .unwrap()
                .forwarded_writes
                .iter()
                .any(|(r, o, _)| *r == region::CONFIG && (0x50..0x68).contains(o)),
            "the MSI capability stays in the VMM"
        );
        dev.config_write(0x52, &1u16.to_le_bytes());
        dev.reset().unwrap();
        assert_eq!(log.lock().unwrap().msi_enabled, None, "reset disables MSI in the device");
    }

    #[test]
    fn a_device_that_leaves_the_guest_keeps_nothing_of_it() {
        use vm_device::dma::DmaMapListener;
        let log = Arc::new(Mutex::new(Log::default()));
        let backend: SharedBackend = Arc::new(Mutex::new(Box::new(fake(log.clone(), false))));
        let mut dev = PciPassthroughDevice::new(
            backend.clone(),
            Arc::new(Interrupts(Mutex::new(23))),
            Arc::new(NoSlots),
            |_, _, _| Ok(0xc000_0000),
        )
        .unwrap();
        dev.config_write(0x04, &6u16.to_le_bytes());
        dev.config_write(0x72, &0x8000u16.to_le_bytes());
        dev.config_write(0x52, &1u16.to_le_bytes());
        assert_eq!(log.lock().unwrap().msix_enabled, Some(10));
        let ram = crate::backend::GuestRamMap::new(vec![]);
        let mirror = crate::dma::DmaMirror::new(backend, ram);
        mirror.map(0x1000, 0x8000, 0x1000, true).unwrap();
        mirror.map(0x3000, 0x9000, 0x1000, false).unwrap();
        mirror.map(0x5000, 0xa000, 0x1000, false).unwrap();
        mirror.unmap(0x3000, 0x1000).unwrap();
        assert_eq!(log.lock().unwrap().dma.len(), 2);
        // Unplugged with two mappings the guest never took down.
        let resets = log.lock().unwrap().resets;
        dev.quiesce().unwrap();
        assert_eq!(mirror.unmap_all().unwrap(), 2);
        let log = log.lock().unwrap();
        assert!(log.dma.is_empty(), "nothing mapped on the host");
        assert_eq!((log.msix_enabled, log.msi_enabled, log.resets), (None, None, resets + 1));
        assert_eq!(dev.config_read(0x04 / 4) & 0xffff, 0, "no decoding, no bus mastering");
        assert!(dev.bar_mappings().is_empty());
        assert_eq!(dev.config_read(0x70 / 4) >> 16 & 0x8000, 0, "MSI-X off");
    }

    #[test]
    fn a_broken_backend_ends_the_devices_use() {
        let (mut dev, _log) = device(true);
        let mut data = [0u8; 4];
        dev.bar_read(0, 0x10, &mut data);
        assert_eq!(data, [0xff; 4]);
        assert!(dev.failure().unwrap().contains("peer closed"));
        dev.bar_read(0, 0x10, &mut data);
        assert_eq!(data, [0xff; 4]);
        assert_eq!(dev.config_read(0xa0 / 4), 0xffff_ffff, "forwarded config reads stop too");
        assert_eq!(dev.config_read(0), 0x00b1_1d6a, "the shadowed header still answers");
    }
}

//! The virtio 1.x modern PCI transport: common, notify, ISR, device and PCI-config-access
//! capabilities in one 64-bit memory BAR, MSI-X vectors for configuration changes and queues.
//!
//! BAR 0 layout:
//!
//! | offset | structure |
//! |--------|-----------|
//! | 0x0000 | common configuration |
//! | 0x1000 | ISR status |
//! | 0x2000 | device configuration |
//! | 0x3000 | notifications, 4 bytes per queue |
//! | 0x4000 | MSI-X table |
//! | 0x6000 | MSI-X pending bits |

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::{F_VERSION_1, VirtioDevice, status};
use pci::device::{BarMapping, PciDevice, decoded_bars};
use pci::msix::{self, MsixConfig, MsixState};
use pci::{BarKind, PciConfiguration, PciError, PciIds};
use vm_device::interrupt::MsiInterrupts;

/// Virtio's PCI vendor ID.
pub const VIRTIO_VENDOR: u16 = 0x1af4;
/// Modern device IDs are 0x1040 + the virtio device ID.
pub const MODERN_DEVICE_BASE: u16 = 0x1040;
/// Size of BAR 0.
pub const BAR_SIZE: u64 = 0x8000;
const COMMON: u64 = 0x0000;
const COMMON_LEN: u64 = 0x38;
const ISR: u64 = 0x1000;
const DEVICE_CFG: u64 = 0x2000;
const DEVICE_CFG_LEN: u64 = 0x1000;
const NOTIFY: u64 = 0x3000;
const NOTIFY_MULTIPLIER: u32 = 4;
const MSIX_TABLE: u64 = 0x4000;
const MSIX_PBA: u64 = 0x6000;
/// "No MSI-X vector" in the vector registers.
pub const NO_VECTOR: u16 = 0xffff;

/// Vendor-specific capability ID, used for all virtio structures.
const CAP_VENDOR: u8 = 0x09;
const CFG_COMMON: u8 = 1;
const CFG_NOTIFY: u8 = 2;
const CFG_ISR: u8 = 3;
const CFG_DEVICE: u8 = 4;
const CFG_PCI: u8 = 5;

/// A virtqueue as a snapshot keeps it (virtio-queue's `QueueState`, with serde).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueSaved {
    /// The size the driver chose.
    pub size: u16,
    /// Whether the driver enabled it.
    pub ready: bool,
    /// The descriptor table's guest address.
    pub desc_table: u64,
    /// The available ring's.
    pub avail_ring: u64,
    /// The used ring's.
    pub used_ring: u64,
    /// The next available entry the device takes.
    pub next_avail: u16,
    /// The next used entry the device fills.
    pub next_used: u16,
    /// Whether VIRTIO_F_EVENT_IDX is on.
    pub event_idx: bool,
}

/// The transport and its device as a snapshot keeps them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VirtioPciState {
    /// Configuration registers.
    pub config: Vec<u32>,
    /// The MSI-X table.
    pub msix: MsixState,
    /// Common configuration: the feature selectors, the driver's features, status, the
    /// selected queue, the vectors, the ISR.
    pub device_feature_select: u32,
    /// See `device_feature_select`.
    pub driver_feature_select: u32,
    /// See `device_feature_select`.
    pub driver_features: u64,
    /// See `device_feature_select`.
    pub status: u8,
    /// See `device_feature_select`.
    pub queue_select: u16,
    /// Each queue.
    pub queues: Vec<QueueSaved>,
    /// Each queue's MSI-X vector.
    pub queue_vectors: Vec<u16>,
    /// The configuration change vector.
    pub config_vector: u16,
    /// See `device_feature_select`.
    pub isr: u8,
    /// The device's own state.
    pub device: serde_json::Value,
}

/// The modern PCI transport around a virtio device.
pub struct VirtioPciDevice<D: VirtioDevice> {
    name: String,
    config: PciConfiguration,
    device: D,
    memory: GuestMemoryMmap,
    msix: MsixConfig,
    msix_cap: usize,
    pci_cfg_cap: usize,
    device_feature_select: u32,
    driver_feature_select: u32,
    driver_features: u64,
    status: u8,
    queue_select: u16,
    queues: Vec<Queue>,
    queue_vectors: Vec<u16>,
    config_vector: u16,
    isr: u8,
}

fn vendor_cap(cfg_type: u8, offset: u64, length: u64, extra: &[u8]) -> Vec<u8> {
    let cap_len = 16 + extra.len() as u8;
    let mut body = vec![cap_len, cfg_type, 0, 0, 0, 0];
    body.extend_from_slice(&(offset as u32).to_le_bytes());
    body.extend_from_slice(&(length as u32).to_le_bytes());
    body.extend_from_slice(extra);
    body
}

impl<D: VirtioDevice> VirtioPciDevice<D> {
    /// Wraps `device` with `class` (class, subclass, interface) and one MSI-X vector for the
    /// configuration plus one per queue; BAR 0 goes at `bar_address`.
    pub fn new(
        name: &str,
        device: D,
        class: [u8; 3],
        memory: GuestMemoryMmap,
        interrupts: Arc<dyn MsiInterrupts>,
        bar_address: u64,
    ) -> Result<Self, PciError> {
        let device_type = device.device_type();
        let num_queues = device.queue_max_sizes().len();
        let ids = PciIds {
            vendor: VIRTIO_VENDOR,
            device: MODERN_DEVICE_BASE + device_type,
            subsystem_vendor: VIRTIO_VENDOR,
            subsystem: 0x40 + device_type,
            class,
            revision: 1,
        };
        let mut config = PciConfiguration::new(ids);
        config.add_bar(0, BAR_SIZE, BarKind::Memory64)?;
        config.set_bar_address(0, bar_address);
        let msix = MsixConfig::new(1 + num_queues as u16, interrupts)?;
        let (body, writable) = msix.capability(0, MSIX_TABLE as u32, 0, MSIX_PBA as u32);
        let msix_cap = config.add_capability(msix::CAPABILITY_ID, &body, &writable)?;
        config.add_capability(CAP_VENDOR, &vendor_cap(CFG_COMMON, COMMON, COMMON_LEN, &[]), &[])?;
        let notify_len = num_queues as u64 * NOTIFY_MULTIPLIER as u64;
        config.add_capability(
            CAP_VENDOR,
            &vendor_cap(CFG_NOTIFY, NOTIFY, notify_len, &NOTIFY_MULTIPLIER.to_le_bytes()),
            &[],
        )?;
        config.add_capability(CAP_VENDOR, &vendor_cap(CFG_ISR, ISR, 1, &[]), &[])?;
        config.add_capability(CAP_VENDOR, &vendor_cap(CFG_DEVICE, DEVICE_CFG, DEVICE_CFG_LEN, &[]), &[])?;
        // VIRTIO_PCI_CAP_PCI_CFG: bar, offset, length and the data window are the driver's.
        let pci_cfg_writable =
            [0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        let pci_cfg_cap = config.add_capability(CAP_VENDOR, &vendor_cap(CFG_PCI, 0, 0, &[0; 4]), &pci_cfg_writable)?;
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&max| Queue::new(max).map_err(|e| PciError::Queue { size: max, reason: format!("{e:?}") }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(VirtioPciDevice {
            name: name.to_string(),
            config,
            device,
            memory,
            msix,
            msix_cap,
            pci_cfg_cap,
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            status: 0,
            queue_select: 0,
            queues,
            queue_vectors: vec![NO_VECTOR; num_queues],
            config_vector: NO_VECTOR,
            isr: 0,
        })
    }

    /// The device behind the transport.
    pub fn device(&self) -> &D {
        &self.device
    }

    fn state(&self) -> Option<VirtioPciState> {
        let queues = self
            .queues
            .iter()
            .map(|q| {
                let s = q.state();
                QueueSaved {
                    size: s.size,
                    ready: s.ready,
                    desc_table: s.desc_table,
                    avail_ring: s.avail_ring,
                    used_ring: s.used_ring,
                    next_avail: s.next_avail,
                    next_used: s.next_used,
                    event_idx: s.event_idx_enabled,
                }
            })
            .collect();
        Some(VirtioPciState {
            config: self.config.registers(),
            msix: self.msix.state(),
            device_feature_select: self.device_feature_select,
            driver_feature_select: self.driver_feature_select,
            driver_features: self.driver_features,
            status: self.status,
            queue_select: self.queue_select,
            queues,
            queue_vectors: self.queue_vectors.clone(),
            config_vector: self.config_vector,
            isr: self.isr,
            device: self.device.snapshot_state()?,
        })
    }

    fn restore(&mut self, state: VirtioPciState) -> Result<(), String> {
        if state.queues.len() != self.queues.len() || state.queue_vectors.len() != self.queues.len() {
            return Err(format!("{} queues saved, the device has {}", state.queues.len(), self.queues.len()));
        }
        let mut queues = Vec::with_capacity(self.queues.len());
        for (saved, max) in state.queues.iter().zip(self.device.queue_max_sizes()) {
            let queue = virtio_queue::QueueState {
                max_size: *max,
                next_avail: saved.next_avail,
                next_used: saved.next_used,
                event_idx_enabled: saved.event_idx,
                size: saved.size,
                ready: saved.ready,
                desc_table: saved.desc_table,
                avail_ring: saved.avail_ring,
                used_ring: saved.used_ring,
            };
            queues.push(Queue::try_from(queue).map_err(|e| format!("a saved queue: {e:?}"))?);
        }
        self.config.set_registers(&state.config)?;
        self.msix.restore(&state.msix)?;
        self.device.restore_state(&state.device)?;
        self.queues = queues;
        self.device_feature_select = state.device_feature_select;
        self.driver_feature_select = state.driver_feature_select;
        self.driver_features = state.driver_features;
        self.status = state.status;
        self.queue_select = state.queue_select;
        self.queue_vectors = state.queue_vectors.iter().map(|&v| self.vector_or_none(v)).collect();
        self.config_vector = self.vector_or_none(state.config_vector);
        self.isr = state.isr;
        Ok(())
    }

    fn reset(&mut self) {
        self.device.reset();
        self.driver_features = 0;
        self.status = 0;
        self.queue_select = 0;
        self.isr = 0;
        self.config_vector = NO_VECTOR;
        self.queue_vectors.fill(NO_VECTOR);
        for queue in &mut self.queues {
            queue.reset();
        }
    }

    fn set_status(&mut self, value: u8) {
        if value == 0 {
            self.reset();
            return;
        }
        let mut value = value;
        if value & status::FEATURES_OK != 0 && self.status & status::FEATURES_OK == 0 {
            let offered = self.device.features();
            let acceptable = self.driver_features & !offered == 0 && self.driver_features & F_VERSION_1 != 0;
            if acceptable {
                self.device.ack_features(self.driver_features);
            } else {
                // The device leaves FEATURES_OK clear to refuse the driver's selection.
                value &= !status::FEATURES_OK;
            }
        }
        self.status = value;
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_select as usize)
    }

    fn vector_or_none(&self, vector: u16) -> u16 {
        if vector < self.msix.count() { vector } else { NO_VECTOR }
    }

    fn common_read(&mut self, offset: u64, data: &mut [u8]) {
        let q = self.queue_select as usize;
        let value: u64 = match offset {
            0x00 => self.device_feature_select as u64,
            0x04 => match self.device_feature_select {
                0 => self.device.features() & 0xffff_ffff,
                1 => self.device.features() >> 32,
                _ => 0,
            },
            0x08 => self.driver_feature_select as u64,
            0x0c => match self.driver_feature_select {
                0 => self.driver_features & 0xffff_ffff,
                1 => self.driver_features >> 32,
                _ => 0,
            },
            0x10 => self.config_vector as u64,
            0x12 => self.queues.len() as u64,
            0x14 => self.status as u64,
            0x15 => 0, // configuration generation: the configuration never changes
            0x16 => self.queue_select as u64,
            0x18 => self.queues.get(q).map_or(0, |queue| queue.size()) as u64,
            0x1a => self.queue_vectors.get(q).copied().unwrap_or(NO_VECTOR) as u64,
            0x1c => self.queues.get(q).is_some_and(|queue| queue.ready()) as u64,
            0x1e => q as u64, // queue_notify_off: one slot per queue
            0x20..=0x37 => {
                let Some(queue) = self.queues.get(q) else { return data.fill(0) };
                let address = match offset & !0x7 {
                    0x20 => queue.desc_table(),
                    0x28 => queue.avail_ring(),
                    _ => queue.used_ring(),
                };
                address >> ((offset & 0x4) * 8)
            }
            _ => 0,
        };
        for (i, b) in data.iter_mut().enumerate() {
            *b = (value >> (i * 8)) as u8;
        }
    }

    fn common_write(&mut self, offset: u64, data: &[u8]) {
        let mut bytes = [0u8; 8];
        bytes[..data.len().min(8)].copy_from_slice(&data[..data.len().min(8)]);
        let value = u64::from_le_bytes(bytes);
        let q = self.queue_select as usize;
        let live = self.status & status::DRIVER_OK != 0;
        match offset {
            0x00 => self.device_feature_select = value as u32,
            0x08 => self.driver_feature_select = value as u32,
            0x0c if self.status & status::FEATURES_OK == 0 => match self.driver_feature_select {
                0 => self.driver_features = (self.driver_features & !0xffff_ffff) | (value & 0xffff_ffff),
                1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (value << 32),
                _ => {}
            },
            0x10 => self.config_vector = self.vector_or_none(value as u16),
            0x14 => self.set_status(value as u8),
            0x16 => self.queue_select = value as u16,
            0x18 if !live => {
                if let Some(queue) = self.selected_queue()
                    && queue.try_set_size(value as u16).is_err()
                {
                    tracing::debug!("queue {q}: refused size {value}");
                }
            }
            0x1a => {
                let vector = self.vector_or_none(value as u16);
                if let Some(slot) = self.queue_vectors.get_mut(q) {
                    *slot = vector;
                }
            }
            0x1c if value == 1 => {
                let memory = self.memory.clone();
                if let Some(queue) = self.selected_queue() {
                    queue.set_ready(true);
                    if !queue.is_valid(&memory) {
                        tracing::debug!("queue {q}: enabled with invalid addresses or size");
                        queue.set_ready(false);
                    }
                }
            }
            0x20..=0x37 if !live => {
                let Some(queue) = self.selected_queue() else { return };
                let (low, high) =
                    if offset & 0x4 == 0 { (Some(value as u32), None) } else { (None, Some(value as u32)) };
                match offset & !0x7 {
                    0x20 => queue.set_desc_table_address(low, high),
                    0x28 => queue.set_avail_ring_address(low, high),
                    _ => queue.set_used_ring_address(low, high),
                }
                if data.len() == 8 {
                    let high = Some((value >> 32) as u32);
                    match offset & !0x7 {
                        0x20 => queue.set_desc_table_address(None, high),
                        0x28 => queue.set_avail_ring_address(None, high),
                        _ => queue.set_used_ring_address(None, high),
                    }
                }
            }
            _ => tracing::trace!("{}: ignored common config write at {offset:#x}", self.name),
        }
    }

    fn notify(&mut self, index: usize) {
        if self.status & status::DRIVER_OK == 0 {
            return;
        }
        let Some(queue) = self.queues.get_mut(index) else { return };
        if !queue.ready() {
            return;
        }
        if self.device.process_queue(index, queue, &self.memory)
            && queue.needs_notification(&self.memory).unwrap_or(true)
        {
            self.isr |= 1;
            let vector = self.queue_vectors[index];
            if vector != NO_VECTOR {
                self.msix.notify(vector);
            }
        }
    }

    fn pci_cfg_access(&mut self, write: Option<&[u8]>) {
        let cap = self.pci_cfg_cap;
        let mut field = [0u8; 4];
        self.config.read(cap + 4, &mut field);
        let bar = field[0] as usize;
        self.config.read(cap + 8, &mut field);
        let offset = u32::from_le_bytes(field) as u64;
        self.config.read(cap + 12, &mut field);
        let length = (u32::from_le_bytes(field) as usize).min(4);
        if bar != 0 || !matches!(length, 1 | 2 | 4) {
            return;
        }
        match write {
            Some(data) => {
                let bytes = data[..length.min(data.len())].to_vec();
                self.bar_write(0, offset, &bytes);
            }
            None => {
                let mut bytes = [0u8; 4];
                self.bar_read(0, offset, &mut bytes[..length]);
                self.config.set(cap + 16, &bytes);
            }
        }
    }
}

impl<D: VirtioDevice> PciDevice for VirtioPciDevice<D> {
    fn name(&self) -> &str {
        &self.name
    }

    fn config_read(&mut self, reg: usize) -> u32 {
        if reg * 4 == self.pci_cfg_cap + 16 {
            self.pci_cfg_access(None);
        }
        self.config.read_reg(reg)
    }

    fn config_write(&mut self, offset: usize, data: &[u8]) {
        self.config.write(offset, data);
        let control = self.msix_cap + 2;
        if offset < control + 2 && offset + data.len() > control {
            let mut word = [0u8; 2];
            self.config.read(control, &mut word);
            self.msix.set_control(u16::from_le_bytes(word));
        }
        let window = self.pci_cfg_cap + 16;
        if offset >= window && offset < window + 4 {
            self.pci_cfg_access(Some(data));
        }
    }

    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        if bar != 0 {
            return data.fill(0xff);
        }
        match offset {
            COMMON..0x1000 if offset < COMMON_LEN => self.common_read(offset, data),
            ISR => {
                data.fill(0);
                data[0] = std::mem::take(&mut self.isr);
            }
            DEVICE_CFG..NOTIFY => self.device.read_config(offset - DEVICE_CFG, data),
            MSIX_TABLE..MSIX_PBA => self.msix.table_read(offset - MSIX_TABLE, data),
            MSIX_PBA..BAR_SIZE => self.msix.pba_read(offset - MSIX_PBA, data),
            _ => data.fill(0),
        }
    }

    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if bar != 0 {
            return;
        }
        match offset {
            COMMON..0x1000 if offset < COMMON_LEN => self.common_write(offset, data),
            DEVICE_CFG..NOTIFY => self.device.write_config(offset - DEVICE_CFG, data),
            NOTIFY..MSIX_TABLE => {
                let queue = (offset - NOTIFY) / NOTIFY_MULTIPLIER as u64;
                self.notify(queue as usize);
            }
            MSIX_TABLE..MSIX_PBA => self.msix.table_write(offset - MSIX_TABLE, data),
            _ => {}
        }
    }

    fn bar_mappings(&self) -> Vec<BarMapping> {
        decoded_bars(&self.config)
    }

    fn snapshot_state(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.state()?).ok()
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), String> {
        self.restore(serde_json::from_value(state.clone()).map_err(|e| e.to_string())?)
    }
}

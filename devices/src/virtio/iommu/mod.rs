//! virtio-iommu (virtio 1.2, section 5.13): ATTACH, DETACH, MAP, UNMAP and PROBE on the request
//! queue, counting every map the guest makes.
//!
//! Endpoint IDs are PCI requester IDs (bus << 8 | device << 3 | function), as the VIOT table
//! describes them to the guest.

pub mod domains;
pub mod requests;
pub mod stats;

use std::io::{Read, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use virtio_queue::{DescriptorChain, Queue, QueueT, Reader, Writer};
use vm_memory::GuestMemoryMmap;

use vm_device::dma::{DmaMapError, DmaMapListener};

use zerocopy::{FromBytes, FromZeros, IntoBytes};

use self::domains::{Access, AddressSpaces, Effect, Fault, Limits, Status};
use self::requests::{Attach, Config, Detach, Map, Probe, ProbeResvMem, RequestHead, RequestTail, Unmap};
use vm_spec::counters::IommuCounts;

use self::stats::{IommuStats, RequestKind};
use super::{F_VERSION_1, VirtioDevice};

/// Virtio device ID of the IOMMU.
pub const DEVICE_ID: u16 = 23;
/// PCI class of an IOMMU: system peripheral, IOMMU.
pub const PCI_CLASS: [u8; 3] = [0x08, 0x06, 0x00];
/// Feature: `input_range` is valid.
pub const F_INPUT_RANGE: u64 = 1 << 0;
/// Feature: `domain_range` is valid.
pub const F_DOMAIN_RANGE: u64 = 1 << 1;
/// Feature: MAP and UNMAP.
pub const F_MAP_UNMAP: u64 = 1 << 2;
/// Feature: PROBE.
pub const F_PROBE: u64 = 1 << 4;
/// Feature: the `bypass` config field.
pub const F_BYPASS_CONFIG: u64 = 1 << 6;

const T_ATTACH: u8 = 1;
const T_DETACH: u8 = 2;
const T_MAP: u8 = 3;
const T_UNMAP: u8 = 4;
const T_PROBE: u8 = 5;

/// Bytes of properties a PROBE request carries.
pub const PROBE_SIZE: u32 = 512;
const PROBE_T_RESV_MEM: u16 = 1;
const RESV_MEM_T_MSI: u8 = 1;
/// The x86 MSI doorbell window, reserved in every endpoint's address space.
pub const MSI_WINDOW: (u64, u64) = (0xfee0_0000, 0xfeef_ffff);
/// Requests are 4 KiB-granular; larger pages are welcome.
pub const PAGE_SIZE_MASK: u64 = !0xfff;
/// IOVA space: 48 bits.
pub const INPUT_RANGE: (u64, u64) = (0, (1 << 48) - 1);
/// Domain IDs the driver may use.
pub const DOMAIN_RANGE: (u32, u32) = (1, 0xffff);
/// Most mappings one domain may hold.
pub const MAX_MAPPINGS: usize = 1 << 20;
const QUEUE_SIZE: u16 = 256;

/// What the VMM and passed-through devices share with the IOMMU: its address spaces and counters.
#[derive(Clone)]
pub struct IommuHandle {
    spaces: Arc<Mutex<AddressSpaces>>,
    stats: Arc<IommuStats>,
}

impl IommuHandle {
    fn spaces(&self) -> MutexGuard<'_, AddressSpaces> {
        self.spaces.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Routes the maps and unmaps of `endpoint` to `listener`; tells it at once whether the
    /// endpoint starts in bypass mode.
    pub fn set_listener(&self, endpoint: u32, listener: Arc<dyn DmaMapListener>) -> Result<(), DmaMapError> {
        let mut spaces = self.spaces();
        let bypass = spaces.in_bypass(endpoint);
        spaces.set_listener(endpoint, listener.clone());
        if bypass { listener.bypass(true) } else { Ok(()) }
    }

    /// Stops routing `endpoint`'s maps and unmaps to its listener (its device left the guest).
    pub fn remove_listener(&self, endpoint: u32) {
        self.spaces().remove_listener(endpoint);
    }

    /// Translates a DMA access; a refused access is counted as a fault.
    pub fn translate(&self, endpoint: u32, iova: u64, len: u64, access: Access) -> Result<u64, Fault> {
        let result = self.spaces().translate(endpoint, iova, len, access);
        if result.is_err() {
            self.stats.fault();
        }
        result
    }

    /// The counters.
    pub fn counts(&self) -> IommuCounts {
        self.stats.counts()
    }

    /// Where the guest's swiotlb bounce pool is, `[start, end)`: its maps count as bounced.
    pub fn set_bounce_pool(&self, start: u64, end: u64) {
        self.stats.set_bounce_pool(start, end);
    }

    /// Counts DMA faults seen elsewhere (e.g. by a device model that checks its own mappings).
    pub fn record_faults(&self, count: u64) {
        for _ in 0..count {
            self.stats.fault();
        }
    }
}

/// The virtio-iommu's own state as a snapshot keeps it (its counters start again).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IommuState {
    /// The features the driver accepted.
    pub acked_features: u64,
    /// Endpoints, domains and mappings.
    pub spaces: domains::AddressSpacesState,
}

/// The virtio-iommu device.
pub struct VirtioIommu {
    handle: IommuHandle,
    acked_features: u64,
    initial_bypass: bool,
}

impl VirtioIommu {
    /// An IOMMU in front of `endpoints`, over guest RAM `ram` (`[start, end)` ranges); `bypass`
    /// is the initial value of the `bypass` config field (unattached endpoints pass through).
    pub fn new(endpoints: impl IntoIterator<Item = u32>, ram: Vec<(u64, u64)>, bypass: bool) -> Self {
        let limits = Limits {
            granule: 1 << PAGE_SIZE_MASK.trailing_zeros(),
            input_range: INPUT_RANGE,
            domain_range: DOMAIN_RANGE,
            max_mappings: MAX_MAPPINGS,
            reserved: vec![MSI_WINDOW],
            guest_ram: ram,
        };
        let spaces = AddressSpaces::new(limits, endpoints, bypass);
        VirtioIommu {
            handle: IommuHandle { spaces: Arc::new(Mutex::new(spaces)), stats: Arc::new(IommuStats::default()) },
            acked_features: 0,
            initial_bypass: bypass,
        }
    }

    /// The handle shared with the VMM.
    pub fn handle(&self) -> IommuHandle {
        self.handle.clone()
    }

    fn config(&self) -> Config {
        Config {
            page_size_mask: PAGE_SIZE_MASK.into(),
            input_start: INPUT_RANGE.0.into(),
            input_end: INPUT_RANGE.1.into(),
            domain_start: DOMAIN_RANGE.0.into(),
            domain_end: DOMAIN_RANGE.1.into(),
            probe_size: PROBE_SIZE.into(),
            bypass: self.handle.spaces().bypass() as u8,
            reserved: [0; 3],
        }
    }

    /// Handles one request; returns the number of bytes written (0 when the request could not
    /// be parsed far enough to find its tail, or its type is unknown).
    fn handle_request(&self, mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) -> u32 {
        let (Ok(mut reader), Ok(mut writer)) = (Reader::new(mem, chain.clone()), Writer::new(mem, chain)) else {
            return 0;
        };
        let writable = writer.available_bytes();
        if writable < 4 {
            return 0;
        }
        let mut body = [0u8; size_of::<Probe>()];
        let readable = reader.available_bytes().min(body.len() + size_of::<RequestHead>());
        let mut head = RequestHead::new_zeroed();
        if reader.read_exact(head.as_mut_bytes()).is_err() {
            return self.write_status(
                &mut writer,
                writable,
                Status::Inval,
                RequestKind::Other,
                Effect::default(),
                None,
            );
        }
        let body_len = readable.saturating_sub(size_of::<RequestHead>());
        if reader.read_exact(&mut body[..body_len]).is_err() {
            return 0;
        }
        let body = &body[..body_len];
        let started = Instant::now();
        let bypass_config = self.acked_features & F_BYPASS_CONFIG != 0;
        let (needed, kind) = match head.kind {
            T_ATTACH => (size_of::<Attach>(), RequestKind::Other),
            T_DETACH => (size_of::<Detach>(), RequestKind::Other),
            T_MAP => (size_of::<Map>(), RequestKind::Map),
            T_UNMAP => (size_of::<Unmap>(), RequestKind::Unmap),
            T_PROBE => (size_of::<Probe>(), RequestKind::Other),
            _ => return 0,
        };
        if body_len < needed {
            return self.write_status(&mut writer, writable, Status::Inval, kind, Effect::default(), Some(started));
        }
        let mut spaces = self.handle.spaces();
        let (status, effect) = match head.kind {
            T_ATTACH => match Attach::read_from_prefix(body) {
                Ok((a, _)) if a.reserved != [0; 4] => (Status::Inval, Effect::default()),
                Ok((a, _)) => {
                    (spaces.attach(a.domain.get(), a.endpoint.get(), a.flags.get(), bypass_config), Effect::default())
                }
                Err(_) => (Status::Inval, Effect::default()),
            },
            T_DETACH => match Detach::read_from_prefix(body) {
                Ok((d, _)) => spaces.detach(d.domain.get(), d.endpoint.get()),
                Err(_) => (Status::Inval, Effect::default()),
            },
            T_MAP => match Map::read_from_prefix(body) {
                Ok((m, _)) => spaces.map(
                    m.domain.get(),
                    m.virt_start.get(),
                    m.virt_end.get(),
                    m.phys_start.get(),
                    m.flags.get(),
                    false,
                ),
                Err(_) => (Status::Inval, Effect::default()),
            },
            T_UNMAP => match Unmap::read_from_prefix(body) {
                Ok((u, _)) if u.reserved != [0; 4] => (Status::Inval, Effect::default()),
                Ok((u, _)) => spaces.unmap(u.domain.get(), u.virt_start.get(), u.virt_end.get()),
                Err(_) => (Status::Inval, Effect::default()),
            },
            _ => {
                let endpoint = Probe::read_from_prefix(body).map_or(u32::MAX, |(p, _)| p.endpoint.get());
                drop(spaces);
                return self.probe(&mut writer, writable, endpoint, started);
            }
        };
        drop(spaces);
        self.write_status(&mut writer, writable, status, kind, effect, Some(started))
    }

    /// Writes the tail (the last 4 bytes of the device-writable part) and accounts the request.
    fn write_status(
        &self,
        writer: &mut Writer<'_, ()>,
        writable: usize,
        status: Status,
        kind: RequestKind,
        effect: Effect,
        started: Option<Instant>,
    ) -> u32 {
        let elapsed = started.map_or(0, |t| t.elapsed().as_nanos() as u64);
        self.handle.stats.record(kind, status == Status::Ok, effect, elapsed);
        let mut tail = writer.split_at(writable - size_of::<RequestTail>()).unwrap_or_else(|_| writer.clone());
        let _ = tail.write_all(RequestTail { status: status as u8, reserved: [0; 3] }.as_bytes());
        writable as u32
    }

    fn probe(&self, writer: &mut Writer<'_, ()>, writable: usize, endpoint: u32, started: Instant) -> u32 {
        if self.acked_features & F_PROBE == 0 {
            return 0;
        }
        if !self.handle.spaces().has_endpoint(endpoint) {
            return self.write_status(
                writer,
                writable,
                Status::NoEnt,
                RequestKind::Other,
                Effect::default(),
                Some(started),
            );
        }
        if writable < PROBE_SIZE as usize + 4 {
            return self.write_status(
                writer,
                writable,
                Status::Inval,
                RequestKind::Other,
                Effect::default(),
                Some(started),
            );
        }
        let msi = ProbeResvMem {
            kind: PROBE_T_RESV_MEM.into(),
            length: ((size_of::<ProbeResvMem>() - 4) as u16).into(),
            subtype: RESV_MEM_T_MSI,
            reserved: [0; 3],
            start: MSI_WINDOW.0.into(),
            end: MSI_WINDOW.1.into(),
        };
        let mut properties = vec![0u8; PROBE_SIZE as usize];
        properties[..size_of::<ProbeResvMem>()].copy_from_slice(msi.as_bytes());
        let skip = writable - PROBE_SIZE as usize - size_of::<RequestTail>();
        let mut out = writer.split_at(skip).unwrap_or_else(|_| writer.clone());
        properties.extend_from_slice(RequestTail { status: Status::Ok as u8, reserved: [0; 3] }.as_bytes());
        if out.write_all(&properties).is_err() {
            return 0;
        }
        let elapsed = started.elapsed().as_nanos() as u64;
        self.handle.stats.record(RequestKind::Other, true, Effect::default(), elapsed);
        writable as u32
    }
}

impl VirtioDevice for VirtioIommu {
    fn device_type(&self) -> u16 {
        DEVICE_ID
    }

    fn features(&self) -> u64 {
        F_VERSION_1 | F_INPUT_RANGE | F_DOMAIN_RANGE | F_MAP_UNMAP | F_PROBE | F_BYPASS_CONFIG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.config();
        let config = config.as_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = config.get(offset as usize + i).copied().unwrap_or(0);
        }
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Only `bypass` is writable, only with VIRTIO_IOMMU_F_BYPASS_CONFIG, only 0 or 1.
        if offset == std::mem::offset_of!(Config, bypass) as u64
            && self.acked_features & F_BYPASS_CONFIG != 0
            && let Some(&value) = data.first()
        {
            if value <= 1 {
                self.handle.spaces().set_bypass(value == 1);
            } else {
                tracing::debug!("virtio-iommu: driver wrote {value} to bypass; ignored");
            }
        }
    }

    fn ack_features(&mut self, features: u64) {
        self.acked_features = features;
    }

    fn process_queue(&mut self, index: usize, queue: &mut Queue, mem: &GuestMemoryMmap) -> bool {
        if index != 0 {
            // The event queue: its buffers wait for fault reports.
            return false;
        }
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let len = self.handle_request(mem, chain);
            if queue.add_used(mem, head, len).is_err() {
                tracing::warn!("virtio-iommu: cannot return a used buffer; the request queue is broken");
                break;
            }
            used = true;
        }
        used
    }

    fn snapshot_state(&self) -> Option<serde_json::Value> {
        let state = IommuState { acked_features: self.acked_features, spaces: self.handle.spaces().state() };
        serde_json::to_value(state).ok()
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), String> {
        let state: IommuState = serde_json::from_value(state.clone()).map_err(|e| e.to_string())?;
        if state.acked_features & !self.features() != 0 {
            return Err(format!(
                "features {:#x} acked, this device offers {:#x}",
                state.acked_features,
                self.features()
            ));
        }
        self.handle.spaces().restore(&state.spaces)?;
        self.acked_features = state.acked_features;
        Ok(())
    }

    fn reset(&mut self) {
        self.acked_features = 0;
        let mut spaces = self.handle.spaces();
        let live = spaces.live_mappings();
        spaces.reset();
        spaces.set_bypass(self.initial_bypass);
        drop(spaces);
        self.handle.stats.mappings_dropped(live);
    }
}

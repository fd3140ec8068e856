//! The machine the guest sees: legacy devices on the port bus, the PCI root complex with its
//! configuration windows, PCI devices with BARs in the MMIO windows (on bus 0, or each behind an
//! external-facing root port in a Thunderbolt slot), and optionally a virtio-iommu in front of
//! every other PCI endpoint.

use std::io::Write;
use std::sync::{Arc, Mutex};

use devices::power::{
    ACPI_PM_BASE, ACPI_PM_LEN, AcpiPower, I8042, I8042_BASE, I8042_LEN, PVPANIC_PORT, PostCode, PvPanic,
};
use devices::rtc::{CmosRtc, RTC_BASE, RTC_LEN};
use devices::serial::{COM1_BASE, COM1_IRQ, COM2_BASE, COM2_IRQ, SerialPort, SerialPortState, SerialStats, UART_LEN};
use devices::virtio::iommu::{self, IommuHandle, VirtioIommu};
use devices::virtio::pci::{BAR_SIZE as VIRTIO_BAR_SIZE, VirtioPciDevice};
use kvm_ioctls::VmFd;
use pci::root::{CONFIG_IO_BASE, CONFIG_IO_LEN};
use pci::{PciConfigIo, PciConfigMmio, PciRoot};
use vm_allocator::{AddressAllocator, AllocPolicy};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use passthrough::backend::{BackendError, VfioBackend};
use passthrough::device::{PciPassthroughDevice, SharedBackend};
use passthrough::dma::DmaMirror;
use passthrough::kernel_vfio::OpenedVfio;
use passthrough::vfio_user::{self, VfioUserClient};
use pci::{Arrival, BarKind, PciError, RootPort};

use vm_device::bus::Bus;
use vm_device::guest_event::GuestEventSink;
use vm_device::interrupt::MsiInterrupts;
use vm_device::memory_slots::GuestMemorySlots;
use vm_spec::control::SlotState;
use vm_spec::counters::{COUNTERS_REGION, COUNTERS_SIZE, ModelCounters};
use vm_spec::{DeviceBackend, DeviceCounters, DeviceSpec, DeviceSummary, IommuSpec, Slot};

use crate::acpi::{AcpiPlatform, RootPortNode, ViotTopology};
use crate::hotplug::HotPlugSlot;
use crate::layout::{
    PCI_ECAM_BASE, PCI_ECAM_SIZE, PCI_MMIO32_SIZE, PCI_MMIO32_START, PCI_MMIO64_SIZE, pci_mmio64_start,
};
use crate::memory::GuestRam;
use crate::opening::OpenedDevices;
use crate::snapshot::{PlatformState, SnapshotError};
use crate::{DeviceFailure, Error};

/// Device number of the virtio-iommu on bus 0 (requester ID 0x0008).
pub const VIOMMU_DEVICE: u8 = 1;
/// Device number of the first passed-through device.
pub const FIRST_PASSTHROUGH_DEVICE: u8 = 2;
/// BARs this large go to the 64-bit window.
const LARGE_BAR: u64 = 256 << 20;
/// The memory window of a Thunderbolt slot's root port: what its adapter's BARs must fit in
/// (firmware sizes it for whatever may be plugged later, as a real USB4 port's window is).
pub const PORT_WINDOW: u64 = 16 << 20;
/// The GSI of the ACPI power button (a Generic Event Device interrupt, edge, active high): an
/// IOAPIC-only pin, so a guest that never programmed the 8259 PIC gets no stray vector.
pub const POWER_BUTTON_GSI: u32 = 20;
/// The GSI on which the Generic Event Device announces a new VM generation ID (after a restore).
pub const GENERATION_GSI: u32 = 21;

/// How the platform is put together.
pub struct PlatformConfig {
    /// vCPUs, for the MADT.
    pub vcpus: u32,
    /// A virtio-iommu, and whether unattached endpoints bypass it.
    pub iommu: Option<IommuSpec>,
    /// Devices to pass through.
    pub devices: Vec<DeviceSpec>,
    /// Those of them opened ahead (kernel VFIO, while the RAM was loaded).
    pub opened: OpenedDevices,
    /// Where COM1's output goes.
    pub com1: Box<dyn Write + Send>,
    /// Where COM2's output goes; no COM2 without it.
    pub com2: Option<Box<dyn Write + Send>>,
    /// The devices' state to start from, for a VM restored from a snapshot.
    pub saved: Option<PlatformState>,
}

/// A passed-through device on the bus.
pub struct Passthrough {
    /// How the user named it.
    pub spec: DeviceSpec,
    /// Its address on the guest's bus.
    pub bdf: String,
    /// Its hot-plug slot, in a Thunderbolt slot.
    pub slot: Option<HotPlugSlot>,
    /// The device.
    pub device: Arc<Mutex<PciPassthroughDevice>>,
    /// Its DMA view.
    pub mirror: Arc<DmaMirror>,
}

/// The assembled platform.
pub struct Platform {
    /// Port I/O devices.
    pub io_bus: Arc<Bus>,
    /// MMIO devices (PCI BARs, ECAM).
    pub mmio_bus: Arc<Bus>,
    /// COM1.
    pub serial: Arc<Mutex<SerialPort>>,
    /// What went through COM1.
    pub serial_stats: Arc<SerialStats>,
    /// COM2, when asked for.
    pub com2: Option<(Arc<Mutex<SerialPort>>, Arc<SerialStats>)>,
    /// Signalled to press the ACPI power button.
    pub power_button: EventFd,
    /// Signalled to tell the guest its VM generation ID changed.
    pub generation_changed: EventFd,
    /// The CMOS clock.
    pub rtc: Arc<Mutex<CmosRtc>>,
    /// The PCI root complex.
    pub pci: Arc<Mutex<PciRoot>>,
    /// The virtio-iommu's handle, with `--iommu`.
    pub iommu: Option<IommuHandle>,
    /// What the ACPI tables must describe.
    pub acpi: AcpiPlatform,
    /// Passed-through devices.
    pub passthrough: Vec<Passthrough>,
}

fn requester_id(device: u8) -> u16 {
    (device as u16) << 3
}

/// Where a passed-through device goes: device `number` of bus 0, itself or (in a Thunderbolt
/// slot) its root port, whose secondary bus and memory window `port` holds.
#[derive(Debug, Clone, Copy)]
struct Placement {
    number: u8,
    port: Option<PortPlacement>,
}

#[derive(Debug, Clone, Copy)]
struct PortPlacement {
    bus: u8,
    window: (u64, u64),
}

impl Placement {
    /// The requester ID its DMA carries: device 0 of the port's secondary bus, or its own on bus 0.
    fn requester_id(&self) -> u16 {
        match self.port {
            Some(port) => (port.bus as u16) << 8,
            None => requester_id(self.number),
        }
    }

    fn bdf(&self) -> String {
        match self.port {
            Some(port) => format!("{:02x}:00.0", port.bus),
            None => format!("00:{:02x}.0", self.number),
        }
    }
}

/// Device numbers on bus 0 in spec order; a root port, a secondary bus and a window for each
/// device in a Thunderbolt slot.
fn place_devices(devices: &[DeviceSpec], windows: &mut BarWindows) -> Result<Vec<Placement>, Error> {
    let mut next_bus = 1;
    let mut placements = Vec::with_capacity(devices.len());
    for (i, spec) in devices.iter().enumerate() {
        let number = FIRST_PASSTHROUGH_DEVICE + i as u8;
        let port = match spec.slot {
            Slot::Root => None,
            Slot::Thunderbolt => {
                let base = windows.place_window(PORT_WINDOW).map_err(|e| Error::Platform(format!("{spec}: {e}")))?;
                let bus = next_bus;
                next_bus += 1;
                Some(PortPlacement { bus, window: (base, base + PORT_WINDOW - 1) })
            }
        };
        placements.push(Placement { number, port });
    }
    Ok(placements)
}

/// The legacy devices on the port bus: COM1 (and COM2), the ACPI power block and its button,
/// i8042, pvpanic, the POST port, the CMOS clock.
struct Legacy {
    serial: Arc<Mutex<SerialPort>>,
    serial_stats: Arc<SerialStats>,
    com2: Option<(Arc<Mutex<SerialPort>>, Arc<SerialStats>)>,
    power_button: EventFd,
    generation_changed: EventFd,
    rtc: Arc<Mutex<CmosRtc>>,
}

/// What a passed-through device needs of the platform.
struct PassthroughContext<'a> {
    ram: &'a GuestRam,
    interrupts: &'a Arc<dyn MsiInterrupts>,
    slots: &'a Arc<dyn GuestMemorySlots>,
    iommu: Option<&'a IommuHandle>,
    pci: &'a Arc<Mutex<PciRoot>>,
}

/// Builds the platform for a VM.
pub fn build(
    vm: &VmFd,
    ram: &GuestRam,
    interrupts: Arc<dyn MsiInterrupts>,
    slots: Arc<dyn GuestMemorySlots>,
    events: Arc<dyn GuestEventSink>,
    mut config: PlatformConfig,
) -> Result<Platform, Error> {
    let io_bus = Arc::new(Bus::new());
    let mmio_bus = Arc::new(Bus::new());
    let saved = config.saved.as_ref();
    let legacy = legacy_devices(vm, &io_bus, events, LegacyOutputs { com1: config.com1, com2: config.com2 }, saved)?;
    let pci = Arc::new(Mutex::new(PciRoot::new(mmio_bus.clone(), io_bus.clone())));
    io_bus.insert(CONFIG_IO_BASE, CONFIG_IO_LEN, Arc::new(Mutex::new(PciConfigIo::new(pci.clone()))))?;
    mmio_bus.insert(PCI_ECAM_BASE, PCI_ECAM_SIZE, Arc::new(Mutex::new(PciConfigMmio::new(pci.clone()))))?;
    let mut windows = BarWindows::new(pci_mmio64_start(ram.layout.end()))?;
    let placements = place_devices(&config.devices, &mut windows)?;
    let (iommu, viot) = match config.iommu {
        Some(options) => {
            let (handle, viot) = add_iommu(&pci, ram, &interrupts, &mut windows, &placements, options)?;
            (Some(handle), Some(viot))
        }
        None => (None, None),
    };
    let context = PassthroughContext { ram, interrupts: &interrupts, slots: &slots, iommu: iommu.as_ref(), pci: &pci };
    let mut passthrough = Vec::new();
    for (index, (spec, placement)) in config.devices.iter().zip(&placements).enumerate() {
        let opened = config.opened.take(index);
        passthrough.push(add_passthrough(&context, &mut windows, spec, *placement, opened)?);
    }
    let root_ports = placements
        .iter()
        .filter(|p| p.port.is_some())
        .map(|p| RootPortNode { device: p.number, external_facing: true })
        .collect();
    let acpi = AcpiPlatform {
        vcpus: config.vcpus,
        pci_mmio64_start: pci_mmio64_start(ram.layout.end()),
        viommu: viot,
        com2: legacy.com2.is_some(),
        power_button_gsi: POWER_BUTTON_GSI,
        generation_gsi: GENERATION_GSI,
        root_ports,
    };
    if let Some(saved) = saved {
        lock(&pci).restore_state(&saved.pci).map_err(SnapshotError::Pci)?;
    }
    let Legacy { serial, serial_stats, com2, power_button, generation_changed, rtc } = legacy;
    Ok(Platform {
        io_bus,
        mmio_bus,
        serial,
        serial_stats,
        com2,
        power_button,
        generation_changed,
        rtc,
        pci,
        iommu,
        acpi,
        passthrough,
    })
}

/// Where the serial ports' output goes.
struct LegacyOutputs {
    com1: Box<dyn Write + Send>,
    com2: Option<Box<dyn Write + Send>>,
}

/// The legacy devices on `io_bus`, their interrupts as irqfds; in their `saved` state for a
/// restored VM.
fn legacy_devices(
    vm: &VmFd,
    io_bus: &Arc<Bus>,
    events: Arc<dyn GuestEventSink>,
    outputs: LegacyOutputs,
    saved: Option<&PlatformState>,
) -> Result<Legacy, Error> {
    let irq_line = |gsi: u32, what: &'static str| -> Result<EventFd, Error> {
        let fd = EventFd::new(EFD_NONBLOCK).map_err(Error::Io)?;
        vm.register_irqfd(&fd, gsi).map_err(|source| Error::Kvm { what, source })?;
        Ok(fd)
    };
    let uart = |state: Option<&SerialPortState>, interrupt, sink| match state {
        Some(state) => SerialPort::from_state(state, interrupt, sink)
            .map_err(|e| Error::from(SnapshotError::Device { what: "a serial port", why: e.to_string() })),
        None => Ok(SerialPort::new(interrupt, sink)),
    };
    let (serial, serial_stats) = uart(saved.map(|s| &s.com1), irq_line(COM1_IRQ, "KVM_IRQFD (COM1)")?, outputs.com1)?;
    let serial = Arc::new(Mutex::new(serial));
    io_bus.insert(COM1_BASE, UART_LEN, serial.clone())?;
    let com2 = match outputs.com2 {
        Some(sink) => {
            let state = saved.and_then(|s| s.com2.as_ref());
            let (port, stats) = uart(state, irq_line(COM2_IRQ, "KVM_IRQFD (COM2)")?, sink)?;
            let port = Arc::new(Mutex::new(port));
            io_bus.insert(COM2_BASE, UART_LEN, port.clone())?;
            Some((port, stats))
        }
        None => None,
    };
    let power_button = irq_line(POWER_BUTTON_GSI, "KVM_IRQFD (power button)")?;
    let generation_changed = irq_line(GENERATION_GSI, "KVM_IRQFD (VM generation ID)")?;
    io_bus.insert(ACPI_PM_BASE, ACPI_PM_LEN, Arc::new(Mutex::new(AcpiPower::new(events.clone()))))?;
    io_bus.insert(I8042_BASE, I8042_LEN, Arc::new(Mutex::new(I8042::new(events.clone()))))?;
    io_bus.insert(PVPANIC_PORT, 1, Arc::new(Mutex::new(PvPanic::new(events))))?;
    io_bus.insert(0x80, 1, Arc::new(Mutex::new(PostCode)))?;
    let rtc = match saved {
        Some(saved) => CmosRtc::from_state(&saved.rtc, devices::rtc::host_clock())
            .map_err(|e| SnapshotError::Device { what: "the RTC", why: e.to_string() })?,
        None => CmosRtc::default(),
    };
    let rtc = Arc::new(Mutex::new(rtc));
    io_bus.insert(RTC_BASE, RTC_LEN, rtc.clone())?;
    Ok(Legacy { serial, serial_stats, com2, power_button, generation_changed, rtc })
}

/// The virtio-iommu on bus 0, in front of every function but itself: the host bridge, the
/// passed-through devices and root ports at `placements` and the adapters on the ports'
/// secondary buses; its handle and its VIOT topology.
fn add_iommu(
    pci: &Arc<Mutex<PciRoot>>,
    ram: &GuestRam,
    interrupts: &Arc<dyn MsiInterrupts>,
    windows: &mut BarWindows,
    placements: &[Placement],
    options: IommuSpec,
) -> Result<(IommuHandle, ViotTopology), Error> {
    let mut endpoints: Vec<u32> = lock(pci).functions().into_iter().map(u32::from).collect();
    endpoints.extend(placements.iter().map(|p| requester_id(p.number) as u32));
    endpoints.extend(placements.iter().filter(|p| p.port.is_some()).map(|p| p.requester_id() as u32));
    let ram_ranges = ram.layout.ranges.iter().map(|&(addr, size)| (addr, addr + size)).collect();
    let device = VirtioIommu::new(endpoints, ram_ranges, options.bypass);
    let handle = device.handle();
    let transport = VirtioPciDevice::new(
        "virtio-iommu",
        device,
        iommu::PCI_CLASS,
        ram.memory.clone(),
        interrupts.clone(),
        windows.place(VIRTIO_BAR_SIZE, BarKind::Memory64).map_err(|e| Error::Platform(e.to_string()))?,
    )
    .map_err(|e| Error::Platform(format!("virtio-iommu: {e}")))?;
    lock(pci)
        .add_device(VIOMMU_DEVICE, Arc::new(Mutex::new(transport)))
        .map_err(|e| Error::Platform(format!("virtio-iommu: {e}")))?;
    let own = requester_id(VIOMMU_DEVICE);
    let mut ranges = vec![(0, own - 1), (own + 8, 0xff)];
    if let Some(last_bus) = placements.iter().filter_map(|p| p.port).map(|p| p.bus).max() {
        ranges.push((0x100, (last_bus as u16) << 8 | 0xff));
    }
    Ok((handle, ViotTopology { iommu: own, endpoints: ranges }))
}

/// Device `spec` passed through where `placement` says: its backend opened (or `opened`
/// ahead), its BARs placed (in its root port's window, in a Thunderbolt slot), its DMA mirrored
/// (through the virtio-iommu, or identity-mapped without one).
fn add_passthrough(
    context: &PassthroughContext<'_>,
    windows: &mut BarWindows,
    spec: &DeviceSpec,
    placement: Placement,
    opened: Option<Result<OpenedVfio, BackendError>>,
) -> Result<Passthrough, Error> {
    let bdf = placement.bdf();
    // A vfio-user peer's failures are the peer's; kernel VFIO's are the host's.
    let failure = match spec.backend {
        DeviceBackend::Vfio(_) => DeviceFailure::Host,
        DeviceBackend::VfioUser(_) => DeviceFailure::Peer,
    };
    let fail = |reason: String| Error::Device { device: spec.to_string(), failure, reason };
    let backend_error = |e: BackendError| match e {
        BackendError::NotFound(reason) | BackendError::Invalid(reason) => {
            Error::Device { device: spec.to_string(), failure: DeviceFailure::NotFound, reason }
        }
        other => fail(other.to_string()),
    };
    let ram = context.ram;
    let backend: Box<dyn VfioBackend> = match &spec.backend {
        DeviceBackend::Vfio(host_bdf) => {
            let opened = opened.unwrap_or_else(|| OpenedVfio::open(*host_bdf)).map_err(backend_error)?;
            Box::new(opened.with_ram(ram.dma_view()))
        }
        // A model maps the memory file; private RAM's file lacks what the VM wrote.
        DeviceBackend::VfioUser(_) if ram.private => {
            return Err(fail("a device model cannot share RAM mapped private from a snapshot".into()));
        }
        DeviceBackend::VfioUser(socket) => Box::new(
            VfioUserClient::connect(socket, ram.dma_view(), vfio_user::DEFAULT_TIMEOUT).map_err(backend_error)?,
        ),
    };
    let backend: SharedBackend = Arc::new(Mutex::new(backend));
    let mut port_window = match placement.port {
        Some(port) => Some(BarWindows::window(port.window.0, PORT_WINDOW)?),
        None => None,
    };
    let device = PciPassthroughDevice::new(
        backend.clone(),
        context.interrupts.clone(),
        context.slots.clone(),
        |_, size, kind| match port_window.as_mut() {
            Some(window) => BarWindows::place_in(window, size, kind),
            None => windows.place(size, kind),
        },
    )
    .map_err(|e| fail(e.to_string()))?;
    let mirror = Arc::new(DmaMirror::new(backend, ram.dma_view()));
    // A device that waits for vm.plug gets its DMA routed when it is plugged.
    match context.iommu.filter(|_| spec.plugged) {
        Some(handle) => handle
            .set_listener(placement.requester_id() as u32, mirror.clone())
            .map_err(|e| fail(format!("initial DMA mapping: {e}")))?,
        None if spec.plugged => mirror.map_identity().map_err(|e| fail(format!("mapping guest RAM for DMA: {e}")))?,
        None => {}
    }
    let device = Arc::new(Mutex::new(device));
    place_on_bus(context, placement, device.clone(), spec.plugged).map_err(fail)?;
    let slot = placement.port.map(|_| {
        let state = if spec.plugged { SlotState::Occupied } else { SlotState::Empty };
        HotPlugSlot {
            port: placement.number,
            requester_id: placement.requester_id(),
            state: Arc::new(Mutex::new(state)),
        }
    });
    Ok(Passthrough { spec: spec.clone(), bdf, slot, device, mirror })
}

/// Puts `device` on bus 0, or into the slot of a new root port as `placement` says (the slot
/// left empty when the device is `plugged` later).
fn place_on_bus(
    context: &PassthroughContext<'_>,
    placement: Placement,
    device: Arc<Mutex<PciPassthroughDevice>>,
    plugged: bool,
) -> Result<(), String> {
    let mut pci = lock(context.pci);
    let Some(port) = placement.port else {
        return pci.add_device(placement.number, device).map_err(|e| e.to_string());
    };
    let mut root_port =
        RootPort::new(placement.number as u16, context.interrupts.clone()).map_err(|e| e.to_string())?;
    root_port.assign(port.bus, port.window);
    pci.add_root_port(placement.number, Arc::new(Mutex::new(root_port))).map_err(|e| e.to_string())?;
    if !plugged {
        return Ok(());
    }
    pci.plug(placement.number, device, Arrival::AtBoot).map_err(|e| e.to_string())
}

/// Where BARs go: the 32-bit window, or the 64-bit one for large 64-bit BARs (or when the 32-bit
/// window is full).
struct BarWindows {
    low: AddressAllocator,
    high: AddressAllocator,
}

impl BarWindows {
    fn new(high_start: u64) -> Result<Self, Error> {
        Ok(BarWindows {
            low: Self::window(PCI_MMIO32_START, PCI_MMIO32_SIZE)?,
            high: Self::window(high_start, PCI_MMIO64_SIZE)?,
        })
    }

    fn window(start: u64, size: u64) -> Result<AddressAllocator, Error> {
        AddressAllocator::new(start, size).map_err(|e| Error::Platform(format!("PCI window: {e:?}")))
    }

    /// A bridge's memory window of `size` bytes from the 32-bit window (bridges forward
    /// non-prefetchable memory below 4 GiB only), aligned to its size.
    fn place_window(&mut self, size: u64) -> Result<u64, PciError> {
        let range = self.low.allocate(size, size, AllocPolicy::FirstMatch);
        range.map(|r| r.start()).map_err(|_| PciError::NoAddressSpace(size))
    }

    /// A BAR inside a root port's window: every memory BAR, 64-bit ones too, goes below 4 GiB.
    fn place_in(window: &mut AddressAllocator, size: u64, kind: BarKind) -> Result<u64, PciError> {
        if kind == BarKind::Io {
            return Ok(0);
        }
        let range = window.allocate(size, size, AllocPolicy::FirstMatch);
        range.map(|r| r.start()).map_err(|_| PciError::NoAddressSpace(size))
    }

    fn place(&mut self, size: u64, kind: BarKind) -> Result<u64, PciError> {
        let take = |window: &mut AddressAllocator| {
            window.allocate(size, size, AllocPolicy::FirstMatch).map(|r| r.start()).ok()
        };
        let placed = match kind {
            // No I/O port window is handed out: the BAR stays unassigned (and undecoded).
            BarKind::Io => return Ok(0),
            BarKind::Memory64 if size >= LARGE_BAR => take(&mut self.high).or_else(|| take(&mut self.low)),
            BarKind::Memory64 => take(&mut self.low).or_else(|| take(&mut self.high)),
            BarKind::Memory32 => take(&mut self.low),
        };
        placed.ok_or(PciError::NoAddressSpace(size))
    }
}

impl Passthrough {
    /// What the device counted so far. Locks the device, then its backend (the lock order of
    /// `docs/architecture.md`).
    pub fn counters(&self) -> DeviceCounters {
        let device = lock(&self.device);
        DeviceCounters {
            device: self.spec.to_string(),
            bdf: self.bdf.clone(),
            error: device.failure().map(str::to_string),
            counters: read_counters(&device.backend()),
        }
    }
}

impl Platform {
    /// Why this VM cannot be snapshotted, if it cannot: a passed-through device in the guest
    /// (its state lives in the hardware; a snapshot is taken with the NIC's slot empty, and the
    /// device is plugged into the restored VM).
    pub fn snapshot_refusal(&self) -> Option<String> {
        let present = self.passthrough.iter().find(|p| match &p.slot {
            None => true,
            Some(slot) => *lock(&slot.state) != SlotState::Empty,
        })?;
        let place = if present.slot.is_some() { "plugged into its slot" } else { "on the root bus" };
        Some(format!(
            "a passed-through device is in the guest ({} at {}, {place}), and its state is the hardware's: \
             snapshot with its Thunderbolt slot empty (plugged=false) and plug it after the restore",
            present.spec, present.bdf
        ))
    }

    /// The emulated devices' state (the vCPUs stopped).
    pub fn snapshot_state(&self) -> Result<PlatformState, SnapshotError> {
        if let Some(why) = self.snapshot_refusal() {
            return Err(SnapshotError::NotSaveable(why));
        }
        Ok(PlatformState {
            com1: lock(&self.serial).state(),
            com2: self.com2.as_ref().map(|(port, _)| lock(port).state()),
            rtc: lock(&self.rtc).state(),
            pci: lock(&self.pci).snapshot_state()?,
        })
    }

    /// At the end of a run: collects what passed-through devices counted, folds refused DMA into
    /// the IOMMU's fault count, takes their DMA mappings down and resets them.
    pub fn teardown(&self) -> Vec<DeviceSummary> {
        let mut summaries = Vec::new();
        for p in &self.passthrough {
            let counters = p.counters();
            if let (Some(iommu), Some(model)) = (&self.iommu, counters.counters) {
                iommu.record_faults(model.dma_faults);
            }
            let _ = p.mirror.unmap_identity();
            let reset_ok = match lock(&p.device).reset() {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("{}: reset at teardown: {e}", p.spec);
                    false
                }
            };
            summaries.push(DeviceSummary { device: counters, reset_ok });
        }
        summaries
    }
}

/// Reads a driverlab model's counters region, if the device has one.
fn read_counters(backend: &SharedBackend) -> Option<ModelCounters> {
    let mut backend = passthrough::device::lock(backend);
    let size = backend.region(COUNTERS_REGION)?.size.min(COUNTERS_SIZE) as usize;
    let mut data = [0u8; COUNTERS_SIZE as usize];
    let data = &mut data[..size];
    match backend.read(COUNTERS_REGION, 0, data) {
        Ok(()) => ModelCounters::decode(data),
        Err(BackendError::Invalid(_)) => None,
        Err(e) => {
            tracing::warn!("reading the device's counters: {e}");
            None
        }
    }
}

/// Locks `m`, taking over a lock whose holder panicked.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

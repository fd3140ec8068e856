//! The machine the guest sees: legacy devices on the port bus, the PCI root complex with its
//! configuration windows, PCI devices with BARs in the MMIO windows, and optionally a virtio-iommu
//! in front of every other PCI endpoint.

use std::io::Write;
use std::sync::{Arc, Mutex};

use devices::bus::Bus;
use devices::interrupt::MsiInterrupts;
use devices::pci::root::{CONFIG_IO_BASE, CONFIG_IO_LEN};
use devices::pci::{PciConfigIo, PciConfigMmio, PciRoot};
use devices::power::{
    ACPI_PM_BASE, ACPI_PM_LEN, AcpiPower, GuestEventSink, I8042, I8042_BASE, I8042_LEN, PVPANIC_PORT, PostCode, PvPanic,
};
use devices::serial::{COM1_BASE, COM1_IRQ, COM1_LEN, SerialPort, SerialStats};
use devices::virtio::iommu::{self, IommuHandle, VirtioIommu};
use devices::virtio::pci::{BAR_SIZE as VIRTIO_BAR_SIZE, VirtioPciDevice};
use kvm_ioctls::VmFd;
use vm_allocator::{AddressAllocator, AllocPolicy};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::Error;
use crate::acpi::{AcpiPlatform, ViotTopology};
use crate::layout::{PCI_ECAM_BASE, PCI_ECAM_SIZE, PCI_MMIO32_SIZE, PCI_MMIO32_START, pci_mmio64_start};
use crate::memory::GuestRam;

/// Device number of the virtio-iommu on bus 0 (requester ID 0x0008).
pub const VIOMMU_DEVICE: u8 = 1;

/// How the platform is put together.
#[derive(Debug, Clone, Copy)]
pub struct PlatformConfig {
    /// vCPUs, for the MADT.
    pub vcpus: u32,
    /// A virtio-iommu, and whether unattached endpoints bypass it.
    pub iommu: Option<IommuConfig>,
}

/// virtio-iommu options.
#[derive(Debug, Clone, Copy)]
pub struct IommuConfig {
    /// Initial value of the `bypass` config field.
    pub bypass: bool,
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
    /// The PCI root complex.
    pub pci: Arc<Mutex<PciRoot>>,
    /// The virtio-iommu's handle, with `--iommu`.
    pub iommu: Option<IommuHandle>,
    /// What the ACPI tables must describe.
    pub acpi: AcpiPlatform,
}

fn requester_id(device: u8) -> u16 {
    (device as u16) << 3
}

/// Builds the platform for a VM.
pub fn build(
    vm: &VmFd,
    ram: &GuestRam,
    interrupts: Arc<dyn MsiInterrupts>,
    events: Arc<dyn GuestEventSink>,
    serial_sink: Box<dyn Write + Send>,
    config: PlatformConfig,
) -> Result<Platform, Error> {
    let io_bus = Arc::new(Bus::new());
    let mmio_bus = Arc::new(Bus::new());

    let serial_irq = EventFd::new(EFD_NONBLOCK).map_err(Error::Io)?;
    vm.register_irqfd(&serial_irq, COM1_IRQ).map_err(|source| Error::Kvm { what: "KVM_IRQFD (COM1)", source })?;
    let (serial, serial_stats) = SerialPort::new(serial_irq, serial_sink);
    let serial = Arc::new(Mutex::new(serial));
    io_bus.insert(COM1_BASE, COM1_LEN, serial.clone())?;
    io_bus.insert(ACPI_PM_BASE, ACPI_PM_LEN, Arc::new(Mutex::new(AcpiPower::new(events.clone()))))?;
    io_bus.insert(I8042_BASE, I8042_LEN, Arc::new(Mutex::new(I8042::new(events.clone()))))?;
    io_bus.insert(PVPANIC_PORT, 1, Arc::new(Mutex::new(PvPanic::new(events))))?;
    io_bus.insert(0x80, 1, Arc::new(Mutex::new(PostCode)))?;

    let pci = Arc::new(Mutex::new(PciRoot::new(mmio_bus.clone(), io_bus.clone())));
    io_bus.insert(CONFIG_IO_BASE, CONFIG_IO_LEN, Arc::new(Mutex::new(PciConfigIo::new(pci.clone()))))?;
    mmio_bus.insert(PCI_ECAM_BASE, PCI_ECAM_SIZE, Arc::new(Mutex::new(PciConfigMmio::new(pci.clone()))))?;
    let mut mmio32 = AddressAllocator::new(PCI_MMIO32_START, PCI_MMIO32_SIZE)
        .map_err(|e| Error::Platform(format!("PCI window: {e:?}")))?;
    let mut bar = |size: u64| {
        mmio32
            .allocate(size, size, AllocPolicy::FirstMatch)
            .map(|range| range.start())
            .map_err(|_| Error::Platform(format!("no room for a {size:#x}-byte BAR in the 32-bit PCI window")))
    };

    let mut iommu = None;
    let mut viot = None;
    if let Some(options) = config.iommu {
        // Every function on bus 0 but the IOMMU itself is behind it: today the host bridge.
        let endpoints: Vec<u32> = lock(&pci).functions().into_iter().map(u32::from).collect();
        let ram_ranges = ram.layout.ranges.iter().map(|&(addr, size)| (addr, addr + size)).collect();
        let device = VirtioIommu::new(endpoints, ram_ranges, options.bypass);
        iommu = Some(device.handle());
        let transport = VirtioPciDevice::new(
            "virtio-iommu",
            device,
            iommu::PCI_CLASS,
            ram.memory.clone(),
            interrupts,
            bar(VIRTIO_BAR_SIZE)?,
        )
        .map_err(|e| Error::Platform(format!("virtio-iommu: {e}")))?;
        lock(&pci)
            .add_device(VIOMMU_DEVICE, Arc::new(Mutex::new(transport)))
            .map_err(|e| Error::Platform(format!("virtio-iommu: {e}")))?;
        let own = requester_id(VIOMMU_DEVICE);
        viot = Some(ViotTopology { iommu: own, endpoints: vec![(0, own - 1), (own + 8, 0xff)] });
    }

    let acpi = AcpiPlatform { vcpus: config.vcpus, pci_mmio64_start: pci_mmio64_start(ram.layout.end()), viommu: viot };
    Ok(Platform { io_bus, mmio_bus, serial, serial_stats, pci, iommu, acpi })
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

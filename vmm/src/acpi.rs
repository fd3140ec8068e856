//! ACPI tables, the way Linux 6.12 expects them on a hardware-reduced x86 platform: RSDP, XSDT,
//! FADT, MADT, MCFG, DSDT (with `_OSC` on the host bridge and a node per root port) and, with a
//! virtio-iommu, VIOT. Encoded with the `acpi_tables` crate
//! and placed in the BIOS area, where the RSDP is also found by scanning.

use acpi_tables::Aml;
use acpi_tables::aml::{self, AddressSpace, AddressSpaceCacheable};
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace as GasSpace, GAS};
use acpi_tables::madt::{EnabledStatus, IoApic, LocalInterruptController, MADT, ProcessorLocalApic};
use acpi_tables::mcfg::MCFG;
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::viot::{PciDevice as ViotPciDevice, PciRange, VIOT, VirtIoPciIommu};
use acpi_tables::xsdt::XSDT;
use devices::power::{ACPI_PM_BASE, ACPI_RESET_VALUE, PVPANIC_PORT, SLP_TYP_S5};
use devices::serial::{COM1_BASE, COM1_IRQ, COM2_BASE, COM2_IRQ};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zerocopy::{Immutable, IntoBytes};

use crate::layout::{
    ACPI_RSDP_ADDR, ACPI_TABLES_ADDR, ACPI_TABLES_END, IOAPIC_ADDR, LAPIC_ADDR, PCI_ECAM_BASE, PCI_LAST_BUS,
    PCI_MMIO32_SIZE, PCI_MMIO32_START, PCI_MMIO64_SIZE, VMGENID_ADDR,
};

const OEM_ID: [u8; 6] = *b"DRVLAB";
const OEM_TABLE_ID: [u8; 8] = *b"DRIVERLB";
const OEM_REVISION: u32 = 1;
/// MADT flag: the platform also has dual 8259 PICs.
const MADT_PCAT_COMPAT: u32 = 1;
/// Offset of the MADT's flags field.
const MADT_FLAGS_OFFSET: usize = 40;

/// Errors building or placing the tables.
#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    /// The tables outgrew their space.
    #[error("ACPI tables need {0} bytes, more than the BIOS area holds")]
    TooLarge(usize),
    /// Writing guest memory failed.
    #[error("writing ACPI tables: {0}")]
    Memory(String),
}

/// What the tables describe.
#[derive(Debug, Clone)]
pub struct AcpiPlatform {
    /// vCPUs (one LAPIC each, APIC ID = index).
    pub vcpus: u32,
    /// Start of the PCI 64-bit MMIO window.
    pub pci_mmio64_start: u64,
    /// The virtio-iommu, if any: its PCI requester ID and the requester ID ranges behind it.
    pub viommu: Option<ViotTopology>,
    /// Whether COM2 exists.
    pub com2: bool,
    /// The GSI on which the Generic Event Device signals the power button.
    pub power_button_gsi: u32,
    /// The GSI on which it signals a new VM generation ID (a restored VM).
    pub generation_gsi: u32,
    /// The root ports on bus 0, each with a node of its own under the host bridge.
    pub root_ports: Vec<RootPortNode>,
}

/// A root port as the DSDT describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootPortNode {
    /// Its device number on bus 0.
    pub device: u8,
    /// Whether firmware declares it external-facing (`_DSD` `ExternalFacingPort` = 1): Linux then
    /// marks every device below it untrusted (`pci_acpi_set_external_facing()` in
    /// drivers/pci/pci-acpi.c, `set_pcie_untrusted()` in drivers/pci/probe.c).
    pub external_facing: bool,
}

/// `_OSC` UUID of a PCI host bridge (PCI Firmware 3.3 §4.5.1).
const PCI_HOST_BRIDGE_OSC_UUID: &str = "33DB4D5B-1FF7-401C-9657-7441C03DD766";
/// `_DSD` UUID of the external-facing-port property (Microsoft's, which Linux's
/// drivers/acpi/property.c `prp_guids` accepts).
const EXTERNAL_FACING_PORT_UUID: &str = "EFCC06CC-73AC-4BC3-BFF0-76143807C389";
/// `_OSC` status bits in the first dword: unrecognized UUID, unrecognized revision.
const OSC_UNRECOGNIZED_UUID: u8 = 1 << 2;
const OSC_UNRECOGNIZED_REVISION: u8 = 1 << 3;

/// What the VIOT says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViotTopology {
    /// The virtio-iommu's requester ID (bus << 8 | devfn).
    pub iommu: u16,
    /// Inclusive requester ID ranges whose DMA the IOMMU translates.
    pub endpoints: Vec<(u16, u16)>,
}

/// MADT interrupt source override (type 2).
#[repr(C, packed)]
#[derive(Clone, Copy, IntoBytes, Immutable)]
struct InterruptSourceOverride {
    kind: u8,
    length: u8,
    bus: u8,
    source: u8,
    gsi: u32,
    flags: u16,
}

impl Aml for InterruptSourceOverride {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(self.as_bytes());
    }
}

/// MADT local APIC NMI (type 4).
#[repr(C, packed)]
#[derive(Clone, Copy, IntoBytes, Immutable)]
struct LocalApicNmi {
    kind: u8,
    length: u8,
    processor_uid: u8,
    flags: u16,
    lint: u8,
}

impl Aml for LocalApicNmi {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(self.as_bytes());
    }
}

/// AML already encoded, to nest among other terms.
struct RawAml(Vec<u8>);

impl Aml for RawAml {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(&self.0);
    }
}

fn bytes(table: &dyn Aml) -> Vec<u8> {
    let mut out = Vec::new();
    table.to_aml_bytes(&mut out);
    out
}

fn fix_checksum(table: &mut [u8]) {
    table[9] = 0;
    let sum = table.iter().fold(0u8, |acc, &b| acc.wrapping_add(b));
    table[9] = 0u8.wrapping_sub(sum);
}

/// `_OSC` of the host bridge: for the PCI host bridge UUID, revision 1, the OS gets every
/// control it asks for (native PCIe hot-plug, PME, AER, the PCIe capability: the VMM keeps
/// none of them); anything else is answered with the spec's error bits. Without it Linux leaves
/// native hot-plug to firmware (`negotiate_os_control()` in drivers/acpi/pci_root.c) and pciehp
/// never binds.
fn osc_method(body: &mut Vec<u8>) {
    let cdw1 = aml::Path::new("CDW1");
    let create = aml::CreateDWordField::new(&cdw1, &aml::Arg(3), &aml::ZERO);
    let uuid = aml::Uuid::new(PCI_HOST_BRIDGE_OSC_UUID);
    let bad_revision = aml::Byte::from(OSC_UNRECOGNIZED_REVISION);
    let set_revision = aml::Or::new(&cdw1, &cdw1, &bad_revision);
    let other_revision = aml::NotEqual::new(&aml::Arg(1), &aml::ONE);
    let check_revision = aml::If::new(&other_revision, vec![&set_revision]);
    let is_pci = aml::Equal::new(&aml::Arg(0), &uuid);
    let if_pci = aml::If::new(&is_pci, vec![&check_revision]);
    let bad_uuid = aml::Byte::from(OSC_UNRECOGNIZED_UUID);
    let set_uuid = aml::Or::new(&cdw1, &cdw1, &bad_uuid);
    let otherwise = aml::Else::new(vec![&set_uuid]);
    let result = aml::Return::new(&aml::Arg(3));
    aml::Method::new("_OSC".into(), 4, false, vec![&create, &if_pci, &otherwise, &result]).to_aml_bytes(body);
}

/// A root port's node under the host bridge: `_ADR` (device number, function 0), the slot's
/// number, and for an external-facing port the `_DSD` property that says so.
fn root_port_node(port: &RootPortNode, body: &mut Vec<u8>) {
    let name = format!("RP{:02X}", port.device);
    let address = aml::DWord::from((port.device as u32) << 16);
    let adr = aml::Name::new("_ADR".into(), &address);
    let slot_number = aml::DWord::from(port.device as u32);
    let sun = aml::Name::new("_SUN".into(), &slot_number);
    let uuid = aml::Uuid::new(EXTERNAL_FACING_PORT_UUID);
    let property = aml::Package::new(vec![&"ExternalFacingPort", &aml::ONE]);
    let properties = aml::Package::new(vec![&property]);
    let dsd_package = aml::Package::new(vec![&uuid, &properties]);
    let dsd = aml::Name::new("_DSD".into(), &dsd_package);
    let mut children: Vec<&dyn Aml> = vec![&adr, &sun];
    if port.external_facing {
        children.push(&dsd);
    }
    aml::Device::new(name.as_str().into(), children).to_aml_bytes(body);
}

/// The host bridge `PCI0`: its bus range and windows, `_OSC`, and a node per root port.
fn pci0(platform: &AcpiPlatform) -> Vec<u8> {
    let mmio32_end = (PCI_MMIO32_START + PCI_MMIO32_SIZE - 1) as u32;
    let mmio64_end = platform.pci_mmio64_start + PCI_MMIO64_SIZE - 1;
    let bus = AddressSpace::<u16>::new_bus_number(0, PCI_LAST_BUS as u16);
    let config_ports = aml::IO::new(0xcf8, 0xcf8, 1, 8);
    let io_low = AddressSpace::<u16>::new_io(0x0000, 0x0cf7, None);
    let io_high = AddressSpace::<u16>::new_io(0x0d00, 0xffff, None);
    let mmio32 = AddressSpace::<u32>::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        PCI_MMIO32_START as u32,
        mmio32_end,
        None,
    );
    let mmio64 = AddressSpace::<u64>::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        platform.pci_mmio64_start,
        mmio64_end,
        None,
    );
    let pci_crs = aml::ResourceTemplate::new(vec![&bus, &config_ports, &io_low, &io_high, &mmio32, &mmio64]);
    let pci_hid = aml::EISAName::new("PNP0A08");
    let pci_cid = aml::EISAName::new("PNP0A03");
    let hid = aml::Name::new("_HID".into(), &pci_hid);
    let cid = aml::Name::new("_CID".into(), &pci_cid);
    let adr = aml::Name::new("_ADR".into(), &aml::ZERO);
    let seg = aml::Name::new("_SEG".into(), &aml::ZERO);
    let uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let bbn = aml::Name::new("_BBN".into(), &aml::ZERO);
    let crs = aml::Name::new("_CRS".into(), &pci_crs);
    let mut ports = Vec::new();
    osc_method(&mut ports);
    for port in &platform.root_ports {
        root_port_node(port, &mut ports);
    }
    let ports = RawAml(ports);
    bytes(&aml::Device::new("PCI0".into(), vec![&hid, &cid, &adr, &seg, &uid, &bbn, &crs, &ports]))
}

fn dsdt(platform: &AcpiPlatform) -> Vec<u8> {
    let pci0 = RawAml(pci0(platform));
    let uart_hid = aml::EISAName::new("PNP0501");
    let uart_hid = aml::Name::new("_HID".into(), &uart_hid);
    let com1_uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let com1_io = aml::IO::new(COM1_BASE as u16, COM1_BASE as u16, 1, 8);
    let com1_irq = aml::Interrupt::new(true, true, false, false, COM1_IRQ);
    let com1_res = aml::ResourceTemplate::new(vec![&com1_io, &com1_irq]);
    let com1_crs = aml::Name::new("_CRS".into(), &com1_res);
    let com1 = aml::Device::new("COM1".into(), vec![&uart_hid, &com1_uid, &com1_crs]);
    let com2_uid = aml::Name::new("_UID".into(), &aml::ONE);
    let com2_io = aml::IO::new(COM2_BASE as u16, COM2_BASE as u16, 1, 8);
    let com2_irq = aml::Interrupt::new(true, true, false, false, COM2_IRQ);
    let com2_res = aml::ResourceTemplate::new(vec![&com2_io, &com2_irq]);
    let com2_crs = aml::Name::new("_CRS".into(), &com2_res);
    let com2 = aml::Device::new("COM2".into(), vec![&uart_hid, &com2_uid, &com2_crs]);

    let events = RawAml(event_devices(platform));

    let pvpanic_hid = aml::Name::new("_HID".into(), &"QEMU0001");
    let pvpanic_io = aml::IO::new(PVPANIC_PORT as u16, PVPANIC_PORT as u16, 1, 1);
    let pvpanic_res = aml::ResourceTemplate::new(vec![&pvpanic_io]);
    let pvpanic_crs = aml::Name::new("_CRS".into(), &pvpanic_res);
    let pvpanic = aml::Device::new("PEVT".into(), vec![&pvpanic_hid, &pvpanic_crs]);

    // The CMOS clock, with its ports and no interrupt: Linux's rtc_cmos takes it from here (a
    // platform device of its own would ask for ISA IRQ 8, which a hardware-reduced machine
    // without a legacy PIC does not have).
    let rtc_hid = aml::EISAName::new("PNP0B00");
    let rtc_hid = aml::Name::new("_HID".into(), &rtc_hid);
    let rtc_io = aml::IO::new(devices::rtc::RTC_BASE as u16, devices::rtc::RTC_BASE as u16, 1, 2);
    let rtc_res = aml::ResourceTemplate::new(vec![&rtc_io]);
    let rtc_crs = aml::Name::new("_CRS".into(), &rtc_res);
    let rtc = aml::Device::new("RTC_".into(), vec![&rtc_hid, &rtc_crs]);

    let mut devices: Vec<&dyn Aml> = vec![&pci0, &com1, &rtc];
    if platform.com2 {
        devices.push(&com2);
    }
    devices.extend([&pvpanic as &dyn Aml, &events]);
    let sb = aml::Scope::new("_SB_".into(), devices);
    let s5_type = aml::Byte::from(SLP_TYP_S5);
    let s5_package = aml::Package::new(vec![&s5_type, &s5_type]);
    let s5 = aml::Name::new("_S5_".into(), &s5_package);

    let mut body = Vec::new();
    sb.to_aml_bytes(&mut body);
    s5.to_aml_bytes(&mut body);
    let mut sdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    sdt.append_slice(&body);
    sdt.as_slice().to_vec()
}

/// The power button, the VM generation ID and the Generic Event Device that notifies them.
///
/// The power button is a control-method button (FADT PWR_BUTTON). The generation ID (`VGEN`) is
/// Microsoft's VM Generation ID device as Linux's vmgenid driver matches it (`VMGENCTR`,
/// drivers/virt/vmgenid.c): `ADDR` gives the guest-physical address of its 16 bytes, which the
/// VMM changes when a VM is restored from a snapshot; the notify that follows makes Linux read
/// them and reseed its random number generator (`add_vmfork_randomness()`), so that restored
/// copies of one snapshot do not share their randomness. The GED's interrupts are edges the
/// VMM raises; Linux calls `_EVT` with the GSI (drivers/acpi/evged.c), which tells the two
/// apart. The power button's interrupt comes first (the probe guest takes the first one).
fn event_devices(platform: &AcpiPlatform) -> Vec<u8> {
    let pwrb_hid = aml::EISAName::new("PNP0C0C");
    let pwrb_hid = aml::Name::new("_HID".into(), &pwrb_hid);
    let pwrb_uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let pwrb = aml::Device::new("PWRB".into(), vec![&pwrb_hid, &pwrb_uid]);

    let vgen_hid = aml::Name::new("_HID".into(), &"VMGENCTR");
    let vgen_cid = aml::Name::new("_CID".into(), &"VM_GEN_COUNTER");
    let vgen_ddn = aml::Name::new("_DDN".into(), &"VM_Gen_Counter");
    let (low, high) = (aml::DWord::from(VMGENID_ADDR as u32), aml::DWord::from((VMGENID_ADDR >> 32) as u32));
    let addr_package = aml::Package::new(vec![&low, &high]);
    let addr = aml::Name::new("ADDR".into(), &addr_package);
    let vgen = aml::Device::new("VGEN".into(), vec![&vgen_hid, &vgen_cid, &vgen_ddn, &addr]);

    let ged_hid = aml::Name::new("_HID".into(), &"ACPI0013");
    let ged_uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let button_irq = aml::Interrupt::new(true, true, false, false, platform.power_button_gsi);
    let vgen_irq = aml::Interrupt::new(true, true, false, false, platform.generation_gsi);
    let ged_res = aml::ResourceTemplate::new(vec![&button_irq, &vgen_irq]);
    let ged_crs = aml::Name::new("_CRS".into(), &ged_res);
    let pwrb_path = aml::Path::new("\\_SB_.PWRB");
    let vgen_path = aml::Path::new("\\_SB_.VGEN");
    let (button_gsi, vgen_gsi) =
        (aml::DWord::from(platform.power_button_gsi), aml::DWord::from(platform.generation_gsi));
    let notify_code = aml::Byte::from(0x80u8);
    let press = aml::Notify::new(&pwrb_path, &notify_code);
    let changed = aml::Notify::new(&vgen_path, &notify_code);
    let is_button = aml::Equal::new(&aml::Arg(0), &button_gsi);
    let is_vgen = aml::Equal::new(&aml::Arg(0), &vgen_gsi);
    let if_button = aml::If::new(&is_button, vec![&press]);
    let if_vgen = aml::If::new(&is_vgen, vec![&changed]);
    let evt = aml::Method::new("_EVT".into(), 1, true, vec![&if_button, &if_vgen]);
    let ged = aml::Device::new("GED0".into(), vec![&ged_hid, &ged_uid, &ged_crs, &evt]);

    let mut out = Vec::new();
    for device in [&pwrb as &dyn Aml, &vgen, &ged] {
        device.to_aml_bytes(&mut out);
    }
    out
}

fn fadt(dsdt_addr: u64) -> Vec<u8> {
    let io = |address: u64| GAS::new(GasSpace::SystemIo, 8, 0, AccessSize::ByteAccess, address);
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt_addr)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::ResetRegSup)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    fadt.sleep_control_reg = io(ACPI_PM_BASE);
    fadt.sleep_status_reg = io(ACPI_PM_BASE + 1);
    fadt.reset_reg = io(ACPI_PM_BASE + 2);
    fadt.reset_value = ACPI_RESET_VALUE;
    // Where the CMOS clock keeps the century (Linux's mc146818 reads it from here).
    fadt.century = devices::rtc::CENTURY as u8;
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(*b"DRVLAB\0\0").into();
    bytes(&fadt.finalize())
}

fn madt(vcpus: u32) -> Vec<u8> {
    let mut madt = MADT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION, LocalInterruptController::Address(LAPIC_ADDR as u32));
    for id in 0..vcpus {
        madt.add_structure(ProcessorLocalApic::new(id as u8, id as u8, EnabledStatus::Enabled));
    }
    madt.add_structure(IoApic::new(0, IOAPIC_ADDR as u32, 0));
    // ISA IRQ 0 (the PIT) arrives on GSI 2, edge, active high (bus defaults).
    madt.add_structure(InterruptSourceOverride { kind: 2, length: 10, bus: 0, source: 0, gsi: 2, flags: 0 });
    // LINT1 of every processor is NMI.
    madt.add_structure(LocalApicNmi { kind: 4, length: 6, processor_uid: 0xff, flags: 0, lint: 1 });
    let mut table = bytes(&madt);
    table[MADT_FLAGS_OFFSET..MADT_FLAGS_OFFSET + 4].copy_from_slice(&MADT_PCAT_COMPAT.to_le_bytes());
    fix_checksum(&mut table);
    table
}

fn mcfg() -> Vec<u8> {
    let mut mcfg = MCFG::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    mcfg.add_ecam(PCI_ECAM_BASE, 0, 0, PCI_LAST_BUS);
    bytes(&mcfg)
}

fn bdf(requester_id: u16) -> ViotPciDevice {
    ViotPciDevice::new(0, (requester_id >> 8) as u8, ((requester_id >> 3) & 0x1f) as u8, (requester_id & 7) as u8)
}

fn viot(topology: &ViotTopology) -> Vec<u8> {
    let mut viot = VIOT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    let iommu = viot.add_virtio_pci_iommu(VirtIoPciIommu::new(bdf(topology.iommu)));
    for &(first, last) in &topology.endpoints {
        viot.add_pci_range(PciRange::new(bdf(first), bdf(last), &iommu));
    }
    bytes(&viot)
}

/// The tables, in guest memory order, with the addresses they will have.
pub struct AcpiTables {
    /// `(signature, address, bytes)` of each table after the RSDP.
    pub tables: Vec<([u8; 4], u64, Vec<u8>)>,
    /// The RSDP.
    pub rsdp: Vec<u8>,
}

/// Builds the tables for `platform`.
pub fn build(platform: &AcpiPlatform) -> Result<AcpiTables, AcpiError> {
    let mut tables: Vec<([u8; 4], u64, Vec<u8>)> = Vec::new();
    let mut next = ACPI_TABLES_ADDR;
    let mut place = |signature: [u8; 4], data: Vec<u8>, tables: &mut Vec<_>| {
        let addr = next;
        next = (next + data.len() as u64).next_multiple_of(8);
        tables.push((signature, addr, data));
        addr
    };
    let dsdt_addr = place(*b"DSDT", dsdt(platform), &mut tables);
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(place(*b"FACP", fadt(dsdt_addr), &mut tables));
    xsdt.add_entry(place(*b"APIC", madt(platform.vcpus), &mut tables));
    xsdt.add_entry(place(*b"MCFG", mcfg(), &mut tables));
    if let Some(topology) = &platform.viommu {
        xsdt.add_entry(place(*b"VIOT", viot(topology), &mut tables));
    }
    let xsdt_addr = place(*b"XSDT", bytes(&xsdt), &mut tables);
    if next > ACPI_TABLES_END {
        return Err(AcpiError::TooLarge((next - ACPI_RSDP_ADDR) as usize));
    }
    let rsdp = bytes(&Rsdp::new(OEM_ID, xsdt_addr));
    Ok(AcpiTables { tables, rsdp })
}

/// Writes the tables into guest memory; returns the RSDP address.
pub fn write(mem: &GuestMemoryMmap, tables: &AcpiTables) -> Result<u64, AcpiError> {
    let err = |e: vm_memory::GuestMemoryError| AcpiError::Memory(e.to_string());
    mem.write_slice(&tables.rsdp, GuestAddress(ACPI_RSDP_ADDR)).map_err(err)?;
    for (_, addr, data) in &tables.tables {
        mem.write_slice(data, GuestAddress(*addr)).map_err(err)?;
    }
    Ok(ACPI_RSDP_ADDR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn platform(viommu: bool) -> AcpiPlatform {
        AcpiPlatform {
            vcpus: 2,
            pci_mmio64_start: 1 << 32,
            viommu: viommu
                .then(|| ViotTopology { iommu: 0x08, endpoints: vec![(0x00, 0x07), (0x10, 0xff), (0x100, 0x1ff)] }),
            com2: viommu,
            power_button_gsi: 20,
            generation_gsi: 21,
            root_ports: vec![RootPortNode { device: 2, external_facing: true }],
        }
    }

    fn checksum_ok(table: &[u8]) -> bool {
        table.iter().fold(0u8, |acc, &b| acc.wrapping_add(b)) == 0
    }

    #[test]
    fn every_table_checks_out_and_the_xsdt_lists_them() {
        let acpi = build(&platform(true)).unwrap();
        let signatures: Vec<&[u8; 4]> = acpi.tables.iter().map(|(s, _, _)| s).collect();
        assert_eq!(signatures, vec![b"DSDT", b"FACP", b"APIC", b"MCFG", b"VIOT", b"XSDT"]);
        for (signature, _, data) in &acpi.tables {
            assert_eq!(&data[0..4], signature);
            assert_eq!(u32::from_le_bytes(data[4..8].try_into().unwrap()) as usize, data.len(), "length");
            assert!(checksum_ok(data), "{} checksum", String::from_utf8_lossy(signature));
        }
        assert!(checksum_ok(&acpi.rsdp[..20]) && checksum_ok(&acpi.rsdp));
        assert_eq!(&acpi.rsdp[..8], b"RSD PTR ");
        assert_eq!((acpi.rsdp[15], acpi.rsdp.len()), (2, 36), "ACPI 2.0+ RSDP");
        assert_eq!(u32::from_le_bytes(acpi.rsdp[20..24].try_into().unwrap()), 36);
        let (_, xsdt_addr, xsdt) = acpi.tables.last().unwrap();
        assert_eq!(u64::from_le_bytes(acpi.rsdp[24..32].try_into().unwrap()), *xsdt_addr);
        let entries: Vec<u64> = xsdt[36..].chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(entries, acpi.tables[1..5].iter().map(|(_, a, _)| *a).collect::<Vec<_>>());
        let madt = &acpi.tables[2].2;
        assert_eq!(u32::from_le_bytes(madt[40..44].try_into().unwrap()), MADT_PCAT_COMPAT);
    }

    #[test]
    fn viot_only_with_an_iommu() {
        let acpi = build(&platform(false)).unwrap();
        assert!(acpi.tables.iter().all(|(s, _, _)| s != b"VIOT"));
    }

    /// Decompiles every table with iasl and fails on any error it reports. `DRIVERLAB_IASL` names
    /// the iasl to use (scripts/test.sh fetches a current one, which knows VIOT); otherwise `iasl`
    /// from PATH, and tables it is too old to know are skipped with a message.
    #[test]
    fn iasl_finds_no_error_in_any_table() {
        let configured = std::env::var_os("DRIVERLAB_IASL");
        let iasl = configured.clone().unwrap_or_else(|| "iasl".into());
        if std::process::Command::new(&iasl).arg("-v").output().is_err() {
            let why = "no iasl (scripts/fetch-iasl.sh, or Debian's acpica-tools)";
            testkit::skip("iasl_finds_no_error_in_any_table", testkit::Lacks::Setup, why);
            return;
        }
        let dir = std::env::temp_dir().join(format!("driverlab-acpi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let acpi = build(&platform(true)).unwrap();
        let files: Vec<(String, Vec<u8>)> =
            acpi.tables.iter().map(|(s, _, d)| (String::from_utf8_lossy(s).to_lowercase(), d.clone())).collect();
        // The RSDP is not a system description table and iasl does not take it from a file; its
        // signature, revision and both checksums are checked by the test above.
        for (name, data) in files {
            let path = dir.join(format!("{name}.dat"));
            std::fs::write(&path, &data).unwrap();
            let out = std::process::Command::new(&iasl).arg("-d").arg(&path).current_dir(&dir).output().unwrap();
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "iasl -d {name}: {text}");
            let errors = text.lines().filter(|l| l.contains("Error") && !l.contains("0 Errors")).count();
            assert_eq!(errors, 0, "iasl -d {name}:\n{text}");
            let dsl = std::fs::read_to_string(dir.join(format!("{name}.dsl"))).unwrap();
            if dsl.contains("Unknown ACPI table signature") && configured.is_none() {
                let why = format!(
                    "table {name}: this iasl is too old to decode it (set DRIVERLAB_IASL, see scripts/fetch-iasl.sh)"
                );
                testkit::skip("iasl_finds_no_error_in_any_table", testkit::Lacks::Setup, why);
                continue;
            }
            assert!(!dsl.contains("**** Unknown") && !dsl.contains("Invalid"), "{name}:\n{dsl}");
            if name == "dsdt" {
                // The root port's node and what Linux reads from it, as iasl decodes them.
                for expected in [
                    "Method (_OSC, 4, NotSerialized)",
                    "ToUUID (\"33db4d5b-1ff7-401c-9657-7441c03dd766\")",
                    "Device (RP02)",
                    "Name (_ADR, 0x00020000)",
                    "ToUUID (\"efcc06cc-73ac-4bc3-bff0-76143807c389\")",
                    "\"ExternalFacingPort\"",
                    "0x0000,             // Range Minimum",
                    "0x001F,             // Range Maximum",
                    "Device (VGEN)",
                    "Name (_HID, \"VMGENCTR\")",
                    "0x000FF000",
                    "If ((Arg0 == 0x14))",
                    "Notify (\\_SB.PWRB, 0x80)",
                    "If ((Arg0 == 0x15))",
                    "Notify (\\_SB.VGEN, 0x80)",
                ] {
                    assert!(dsl.contains(expected), "{expected:?} not in:\n{dsl}");
                }
            }
            if name == "viot" {
                assert!(
                    dsl.contains("PCI BDF start : 0100") && dsl.contains("PCI BDF end : 01FF"),
                    "bus 1 behind the IOMMU:\n{dsl}"
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

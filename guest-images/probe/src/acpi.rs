//! ACPI as a kernel finds it: the RSDP (handed over at boot or found in the BIOS area), the XSDT
//! and the tables it lists, each with its checksum checked.

use crate::boot_info::BootInfo;
use crate::{json, mmio, power, report, time};

/// Most tables the probe lists.
const MAX_TABLES: usize = 32;

/// What the probe learned from ACPI.
#[derive(Default)]
pub struct Acpi {
    /// Signatures in XSDT order, then the DSDT.
    signatures: [[u8; 4]; MAX_TABLES],
    count: usize,
    /// Every checksum matched.
    pub checksums_ok: bool,
    /// ECAM base of segment 0, bus 0, from the MCFG.
    pub ecam: Option<u64>,
    /// Enabled local APICs in the MADT.
    pub lapics: Option<u32>,
    /// Address of the VIOT.
    pub viot: Option<u64>,
    /// The first IOAPIC's MMIO address, from the MADT.
    pub ioapic: Option<u64>,
    /// The GSI of the power button's Generic Event Device (`ACPI0013` in the DSDT).
    pub power_button_gsi: Option<u32>,
}

fn checksum(addr: u64, len: usize) -> bool {
    mmio::bytes(addr, len).iter().fold(0u8, |a, &b| a.wrapping_add(b)) == 0
}

fn find_rsdp(boot: &BootInfo) -> Option<u64> {
    if boot.rsdp != 0 && mmio::bytes(boot.rsdp, 8) == b"RSD PTR " {
        return Some(boot.rsdp);
    }
    (0xe_0000..0x10_0000u64).step_by(16).find(|&a| mmio::bytes(a, 8) == b"RSD PTR " && checksum(a, 20))
}

impl Acpi {
    /// Reads the tables; `None` when there is no RSDP.
    pub fn read(boot: &BootInfo) -> Option<Acpi> {
        let rsdp = find_rsdp(boot)?;
        let mut acpi = Acpi { checksums_ok: checksum(rsdp, 20), ..Acpi::default() };
        let revision: u8 = mmio::read(rsdp + 15);
        let (table_list, entry_size) = if revision >= 2 {
            acpi.checksums_ok &= checksum(rsdp, mmio::read::<u32>(rsdp + 20).min(64) as usize);
            (mmio::read::<u64>(rsdp + 24), 8)
        } else {
            (mmio::read::<u32>(rsdp + 16) as u64, 4)
        };
        if table_list == 0 || table_list >= 1 << 32 {
            acpi.checksums_ok = false;
            return Some(acpi);
        }
        let length: u32 = mmio::read(table_list + 4);
        acpi.checksums_ok &= checksum(table_list, length as usize);
        let entries = (length as u64).saturating_sub(36) / entry_size;
        for i in 0..entries {
            let at = table_list + 36 + i * entry_size;
            let table = if entry_size == 8 { mmio::read::<u64>(at) } else { mmio::read::<u32>(at) as u64 };
            acpi.visit(table);
        }
        Some(acpi)
    }

    fn visit(&mut self, table: u64) {
        if table == 0 || table >= 1 << 32 {
            self.checksums_ok = false;
            return;
        }
        let signature: [u8; 4] = mmio::read(table);
        let length: u32 = mmio::read(table + 4);
        self.checksums_ok &= length >= 36 && checksum(table, length as usize);
        if self.count < MAX_TABLES {
            self.signatures[self.count] = signature;
            self.count += 1;
        }
        match &signature {
            b"FACP" if length >= 148 => {
                // The ACPI PM timer (a clock for TSC calibration) and PM1a control (soft-off),
                // on VMMs that model them; driverlab's FADT leaves both zero.
                let pm1a_control: u32 = mmio::read(table + 64);
                let pm_timer: u32 = mmio::read(table + 76);
                time::set_pm_timer(pm_timer);
                power::set_pm1a_control(pm1a_control);
                let x_dsdt: u64 = mmio::read(table + 140);
                let dsdt = if x_dsdt != 0 { x_dsdt } else { mmio::read::<u32>(table + 40) as u64 };
                self.visit(dsdt);
            }
            b"MCFG" if length >= 60 => self.ecam = Some(mmio::read(table + 44)),
            b"APIC" => {
                self.lapics = Some(count_lapics(table, length));
                self.ioapic = ioapic_address(table, length);
            }
            b"DSDT" => {
                let dsdt = mmio::bytes(table, length as usize);
                self.power_button_gsi = ged_gsi(dsdt);
                if let Some(typ) = s5_sleep_type(dsdt) {
                    power::set_s5_sleep_type(typ);
                }
            }
            b"VIOT" => self.viot = Some(table),
            _ => {}
        }
    }

    /// The signatures, as text.
    pub fn signatures(&self) -> impl Iterator<Item = &str> {
        self.signatures[..self.count].iter().map(|s| core::str::from_utf8(s).unwrap_or("????"))
    }

    /// Reports `{"probe":"acpi",...}`.
    pub fn report(&self) {
        json::section("acpi", |o| {
            o.array("tables", |a| {
                for s in self.signatures() {
                    a.str(s);
                }
            })
            .bool("checksums_ok", self.checksums_ok);
        });
        if !self.checksums_ok {
            report::fail("an ACPI checksum is wrong");
        }
    }
}

/// The address of the MADT's first IOAPIC (type 1) entry.
fn ioapic_address(madt: u64, length: u32) -> Option<u64> {
    let mut at = madt + 44;
    while at + 2 <= madt + length as u64 {
        let (kind, len): (u8, u8) = (mmio::read(at), mmio::read(at + 1));
        if len < 2 {
            break;
        }
        if kind == 1 && len >= 12 {
            return Some(mmio::read::<u32>(at + 4) as u64);
        }
        at += len as u64;
    }
    None
}

/// The interrupt of the Generic Event Device: the first Extended Interrupt descriptor (0x89)
/// after the `ACPI0013` string in the DSDT. Not an AML interpreter: enough for the tables a VMM
/// writes, where the device's `_HID` precedes its `_CRS`.
fn ged_gsi(dsdt: &[u8]) -> Option<u32> {
    let hid = dsdt.windows(8).position(|w| w == b"ACPI0013")?;
    let rest = &dsdt[hid..];
    let at = rest.windows(5).position(|w| w[0] == 0x89 && w[1] == 6 && w[2] == 0 && w[4] == 1)?;
    let gsi = rest.get(at + 5..at + 9)?;
    Some(u32::from_le_bytes([gsi[0], gsi[1], gsi[2], gsi[3]]))
}

/// SLP_TYPa of the `\\_S5` package (`Name (_S5, Package () { a, b, ... })`): the first element
/// as a ZeroOp, OneOp or BytePrefix constant.
fn s5_sleep_type(dsdt: &[u8]) -> Option<u8> {
    let at = dsdt.windows(4).position(|w| w == b"_S5_")?;
    let rest = dsdt.get(at + 4..)?;
    // PackageOp, a one-byte PkgLength (the package is short), NumElements, the first element.
    if rest.first() != Some(&0x12) {
        return None;
    }
    match rest.get(3)? {
        0x00 => Some(0),
        0x01 => Some(1),
        0x0a => rest.get(4).copied(),
        _ => None,
    }
}

fn count_lapics(madt: u64, length: u32) -> u32 {
    let mut count = 0;
    let mut at = madt + 44;
    while at + 2 <= madt + length as u64 {
        let (kind, len): (u8, u8) = (mmio::read(at), mmio::read(at + 1));
        if len < 2 {
            break;
        }
        // Type 0: processor local APIC, type 9: local x2APIC; flags bit 0: enabled.
        let enabled = match kind {
            0 => mmio::read::<u32>(at + 4) & 1 != 0,
            9 if len >= 16 => mmio::read::<u32>(at + 8) & 1 != 0,
            _ => false,
        };
        if enabled {
            count += 1;
        }
        at += len as u64;
    }
    count
}

/// Requester-ID ranges the VIOT puts behind its (first) virtio-pci IOMMU: `(first, last)`.
pub fn viot_pci_ranges(viot: u64, out: &mut [(u16, u16)]) -> (Option<u16>, usize) {
    let length: u32 = mmio::read(viot + 4);
    let nodes: u16 = mmio::read(viot + 36);
    let mut offset: u16 = mmio::read(viot + 38);
    let mut iommu = None;
    let mut count = 0;
    for _ in 0..nodes {
        let at = viot + offset as u64;
        if offset as u32 + 4 > length {
            break;
        }
        let (kind, len): (u8, u16) = (mmio::read(at), mmio::read(at + 2));
        match kind {
            // PCI range: endpoint start, segment start/end, BDF start/end, output node.
            1 if count < out.len() => {
                out[count] = (mmio::read(at + 12), mmio::read(at + 14));
                count += 1;
            }
            // virtio-pci IOMMU: segment, BDF.
            3 => iommu = Some(mmio::read(at + 6)),
            _ => {}
        }
        if len == 0 {
            break;
        }
        offset += len;
    }
    (iommu, count)
}

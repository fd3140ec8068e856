//! PCI enumeration through ECAM: IDs, classes, BARs (sized the way firmware sizes them) and
//! capability lookup.

use core::fmt::Write;

use crate::json::StackString;
use crate::{json, lapic, mmio};

/// MSI-X capability ID.
const CAP_MSIX: u8 = 0x11;

/// Most functions the probe records.
pub const MAX_FUNCTIONS: usize = 32;

/// Configuration space access for bus 0 through the ECAM window.
#[derive(Clone, Copy)]
pub struct Ecam {
    base: u64,
}

/// A function on bus 0.
#[derive(Clone, Copy, Default)]
pub struct Function {
    /// Device number.
    pub device: u8,
    /// Function number.
    pub function: u8,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub id: u16,
    /// Class, subclass, interface.
    pub class: u32,
    /// BAR address and size per BAR index (size 0: absent).
    pub bars: [(u64, u64, u8); 6],
}

impl Function {
    /// Requester ID (bus 0).
    pub fn requester_id(&self) -> u16 {
        (self.device as u16) << 3 | self.function as u16
    }
}

impl Ecam {
    /// ECAM at `base`.
    pub fn new(base: u64) -> Ecam {
        Ecam { base }
    }

    fn addr(&self, device: u8, function: u8, offset: u16) -> u64 {
        self.base + ((device as u64) << 15 | (function as u64) << 12 | offset as u64)
    }

    /// Reads a 32-bit register.
    pub fn read32(&self, device: u8, function: u8, offset: u16) -> u32 {
        mmio::read(self.addr(device, function, offset))
    }

    /// Writes a 32-bit register.
    pub fn write32(&self, device: u8, function: u8, offset: u16, value: u32) {
        mmio::write(self.addr(device, function, offset), value)
    }

    /// Reads a 16-bit register.
    pub fn read16(&self, device: u8, function: u8, offset: u16) -> u16 {
        mmio::read(self.addr(device, function, offset))
    }

    /// Writes a 16-bit register.
    pub fn write16(&self, device: u8, function: u8, offset: u16, value: u16) {
        mmio::write(self.addr(device, function, offset), value)
    }

    /// Lets `f` answer memory accesses and master the bus (the command register's bits 1 and 2).
    pub fn enable_memory_and_bus_master(&self, f: &Function) {
        let command = self.read16(f.device, f.function, 4);
        self.write16(f.device, f.function, 4, command | 0x6);
    }

    /// All capabilities: `(id, offset)`.
    pub fn capabilities(&self, device: u8, function: u8) -> impl Iterator<Item = (u8, u16)> + '_ {
        let status = self.read16(device, function, 0x06);
        let mut next = if status & (1 << 4) != 0 { (self.read32(device, function, 0x34) & 0xfc) as u16 } else { 0 };
        let mut budget = 48; // a malformed list must not loop forever
        core::iter::from_fn(move || {
            if next == 0 || budget == 0 {
                return None;
            }
            budget -= 1;
            let here = next;
            let header = self.read16(device, function, here);
            next = (header >> 8) & 0xfc;
            Some((header as u8, here))
        })
    }

    /// Routes MSI-X table entry 0 of function `f` to `vector` on this CPU and turns MSI-X on
    /// (function mask off); false if the function has no MSI-X capability.
    pub fn route_msix_vector0(&self, f: &Function, vector: u8) -> bool {
        let Some((_, cap)) = self.capabilities(f.device, f.function).find(|&(id, _)| id == CAP_MSIX) else {
            return false;
        };
        let table = self.read32(f.device, f.function, cap + 4);
        let base = f.bars[(table & 7) as usize].0 + (table & !7) as u64;
        mmio::write(base, 0xfee0_0000u32 | (lapic::id() << 12));
        mmio::write(base + 4, 0u32);
        mmio::write(base + 8, vector as u32);
        mmio::write(base + 12, 0u32);
        let control = self.read16(f.device, f.function, cap + 2);
        self.write16(f.device, f.function, cap + 2, (control | 0x8000) & !0x4000);
        true
    }

    fn size_bars(&self, device: u8, function: u8, bars: &mut [(u64, u64, u8); 6]) {
        let command = self.read16(device, function, 0x04);
        // Decoding off while the BARs hold all ones.
        self.write16(device, function, 0x04, command & !0x3);
        // A bridge (header type 1) has two BARs; its bus numbers and windows follow them.
        let count = if self.read32(device, function, 0x0c) >> 16 & 0x7f == 1 { 2 } else { 6 };
        let mut index = 0;
        while index < count {
            let offset = 0x10 + index as u16 * 4;
            let low = self.read32(device, function, offset);
            self.write32(device, function, offset, 0xffff_ffff);
            let mask_low = self.read32(device, function, offset);
            self.write32(device, function, offset, low);
            if mask_low == 0 {
                index += 1;
                continue;
            }
            if low & 1 == 1 {
                bars[index] = ((low & !3) as u64, (!(mask_low & !3)).wrapping_add(1) as u64 & 0xffff, 1);
                index += 1;
            } else if low & 0x6 == 0x4 {
                let high = self.read32(device, function, offset + 4);
                self.write32(device, function, offset + 4, 0xffff_ffff);
                let mask_high = self.read32(device, function, offset + 4);
                self.write32(device, function, offset + 4, high);
                let mask = (mask_high as u64) << 32 | (mask_low & !0xf) as u64;
                bars[index] = ((high as u64) << 32 | (low & !0xf) as u64, (!mask).wrapping_add(1), 64);
                index += 2;
            } else {
                bars[index] = ((low & !0xf) as u64, (!(mask_low & !0xf)).wrapping_add(1) as u64, 32);
                index += 1;
            }
        }
        self.write16(device, function, 0x04, command);
    }

    /// Enumerates bus 0 into `out`; returns how many functions were found.
    pub fn enumerate(&self, out: &mut [Function; MAX_FUNCTIONS]) -> usize {
        let mut count = 0;
        for device in 0..32u8 {
            for function in 0..8u8 {
                let ids = self.read32(device, function, 0);
                if ids & 0xffff == 0xffff {
                    if function == 0 {
                        break;
                    }
                    continue;
                }
                if count < MAX_FUNCTIONS {
                    let mut f = Function {
                        device,
                        function,
                        vendor: ids as u16,
                        id: (ids >> 16) as u16,
                        class: self.read32(device, function, 8) >> 8,
                        ..Function::default()
                    };
                    self.size_bars(device, function, &mut f.bars);
                    // Memory BARs above 4 GiB: mapped before anything touches them.
                    for bar in f.bars.iter_mut().filter(|b| b.1 != 0 && b.2 != 1) {
                        if !crate::high_mmio::map(bar.0, bar.1) {
                            crate::report::fail(
                                "a BAR lies where the probe cannot map it (beyond 48 bits, or too many)",
                            );
                            bar.1 = 0;
                        }
                    }
                    out[count] = f;
                    count += 1;
                }
                let multifunction = self.read32(device, function, 0x0c) & (0x80 << 16) != 0;
                if function == 0 && !multifunction {
                    break;
                }
            }
        }
        count
    }
}

/// Reports `{"probe":"pci","devices":[...]}`.
pub fn report(functions: &[Function]) {
    json::section("pci", |o| {
        o.array("devices", |a| {
            for f in functions {
                a.object(|d| {
                    let mut bdf = StackString::<8>::new();
                    let mut id = StackString::<10>::new();
                    let mut class = StackString::<8>::new();
                    let _ = write!(bdf, "00:{:02x}.{:x}", f.device, f.function);
                    let _ = write!(id, "{:04x}:{:04x}", f.vendor, f.id);
                    let _ = write!(class, "{:06x}", f.class);
                    d.str("bdf", bdf.as_str()).str("id", id.as_str()).str("class", class.as_str()).array(
                        "bars",
                        |bars| {
                            for (index, &(addr, size, kind)) in f.bars.iter().enumerate() {
                                if size == 0 {
                                    continue;
                                }
                                bars.object(|b| {
                                    let kind = match kind {
                                        1 => "io",
                                        64 => "mem64",
                                        _ => "mem32",
                                    };
                                    b.u64("bar", index as u64).u64("addr", addr).u64("size", size).str("kind", kind);
                                });
                            }
                        },
                    );
                });
            }
        });
    });
}

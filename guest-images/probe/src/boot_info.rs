//! What the VMM handed over at entry: the command line and the memory map, from either the PVH
//! `hvm_start_info` or the Linux zero page (`boot_params`).

use crate::entry::{ENTRY_LINUX64, ENTRY_PVH};

/// Most memory-map entries the probe keeps (the zero page holds at most 128).
const MAX_E820: usize = 128;
/// Longest command line the probe keeps.
const MAX_CMDLINE: usize = 2048;
/// `hvm_start_info.magic`.
const PVH_MAGIC: u32 = 0x336e_c578;

/// One memory-map entry.
#[derive(Clone, Copy, Default)]
pub struct E820Entry {
    /// First guest-physical address.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// E820 type: 1 RAM, 2 reserved, 3 ACPI reclaimable, 4 ACPI NVS.
    pub kind: u32,
}

/// How the probe was entered.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// PVH: 32-bit entry with `hvm_start_info`.
    Pvh,
    /// Linux 64-bit boot protocol with a zero page.
    Linux64,
}

impl Entry {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Entry::Pvh => "pvh",
            Entry::Linux64 => "linux64",
        }
    }
}

/// The boot information, copied out of guest memory (so the probe may reuse low memory).
pub struct BootInfo {
    /// How the probe was entered.
    pub entry: Entry,
    cmdline: [u8; MAX_CMDLINE],
    cmdline_len: usize,
    e820: [E820Entry; MAX_E820],
    e820_len: usize,
    /// ACPI RSDP address handed over by the VMM, 0 when none.
    pub rsdp: u64,
}

impl BootInfo {
    /// Reads the boot information at `addr` for the given entry kind.
    pub fn read(addr: u64, entry_kind: u64) -> Result<BootInfo, &'static str> {
        match entry_kind {
            ENTRY_PVH => Self::from_pvh(addr),
            ENTRY_LINUX64 => Self::from_zero_page(addr),
            _ => Err("unknown entry kind"),
        }
    }

    /// The command line (empty if none was given or it is not UTF-8).
    pub fn cmdline(&self) -> &str {
        core::str::from_utf8(&self.cmdline[..self.cmdline_len]).unwrap_or("")
    }

    /// The memory map.
    pub fn e820(&self) -> &[E820Entry] {
        &self.e820[..self.e820_len]
    }

    fn from_pvh(addr: u64) -> Result<BootInfo, &'static str> {
        if addr == 0 || addr >= 1 << 32 {
            return Err("hvm_start_info pointer out of range");
        }
        let magic: u32 = read(addr);
        if magic != PVH_MAGIC {
            return Err("hvm_start_info has a bad magic");
        }
        let version: u32 = read(addr + 4);
        let mut info = BootInfo::empty(Entry::Pvh);
        info.copy_cmdline(read(addr + 24));
        info.rsdp = read(addr + 32);
        if version >= 1 {
            let memmap: u64 = read(addr + 40);
            let entries: u32 = read(addr + 48);
            for i in 0..(entries as usize).min(MAX_E820) {
                let e = memmap + i as u64 * 24;
                info.e820[i] = E820Entry { addr: read(e), size: read(e + 8), kind: read(e + 16) };
            }
            info.e820_len = (entries as usize).min(MAX_E820);
        }
        Ok(info)
    }

    fn from_zero_page(addr: u64) -> Result<BootInfo, &'static str> {
        if addr == 0 || addr >= 1 << 32 {
            return Err("boot_params pointer out of range");
        }
        let header: u32 = read(addr + 0x202);
        if header != 0x5372_6448 {
            return Err("boot_params has no HdrS setup header");
        }
        let mut info = BootInfo::empty(Entry::Linux64);
        let cmd_line_ptr = read::<u32>(addr + 0x228) as u64 | (read::<u32>(addr + 0xc8) as u64) << 32;
        info.copy_cmdline(cmd_line_ptr);
        info.rsdp = read(addr + 0x70);
        let entries = (read::<u8>(addr + 0x1e8) as usize).min(MAX_E820);
        for i in 0..entries {
            let e = addr + 0x2d0 + i as u64 * 20;
            info.e820[i] = E820Entry { addr: read(e), size: read(e + 8), kind: read(e + 16) };
        }
        info.e820_len = entries;
        Ok(info)
    }

    fn empty(entry: Entry) -> BootInfo {
        BootInfo {
            entry,
            cmdline: [0; MAX_CMDLINE],
            cmdline_len: 0,
            e820: [E820Entry::default(); MAX_E820],
            e820_len: 0,
            rsdp: 0,
        }
    }

    /// Copies the NUL-terminated command line at `addr`.
    fn copy_cmdline(&mut self, addr: u64) {
        if addr == 0 || addr >= 1 << 32 {
            return;
        }
        for i in 0..MAX_CMDLINE {
            let byte: u8 = read(addr + i as u64);
            if byte == 0 {
                break;
            }
            self.cmdline[i] = byte;
            self.cmdline_len = i + 1;
        }
    }
}

/// Reads a value from identity-mapped guest-physical memory.
fn read<T: Copy>(addr: u64) -> T {
    // SAFETY: the low 4 GiB are identity-mapped and readable; the value is plain data.
    unsafe { core::ptr::read_unaligned(addr as *const T) }
}

//! The PVH `hvm_start_info`, its memory map and module list.

use linux_loader::loader::elf::start_info::{hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{BootError, Initrd};
use crate::layout::{CMDLINE_ADDR, PVH_INFO_ADDR, PVH_MEMMAP_ADDR, PVH_MEMMAP_MAX, PVH_MODLIST_ADDR};
use crate::memory::E820Entry;

/// `hvm_start_info.magic`.
pub const PVH_MAGIC: u32 = 0x336e_c578;
/// Version 1 carries the memory map.
const PVH_VERSION: u32 = 1;

fn write<T: vm_memory::ByteValued>(
    mem: &GuestMemoryMmap,
    value: T,
    addr: u64,
    what: &'static str,
) -> Result<(), BootError> {
    mem.write_obj(value, GuestAddress(addr)).map_err(|e| BootError::GuestMemory { what, reason: e.to_string() })
}

/// Writes `hvm_start_info` at [`PVH_INFO_ADDR`] with the command line, initrd and memory map.
pub(super) fn write_start_info(
    mem: &GuestMemoryMmap,
    cmdline: &str,
    initrd: Option<Initrd>,
    rsdp: Option<u64>,
    e820: &[E820Entry],
) -> Result<(), BootError> {
    if e820.len() > PVH_MEMMAP_MAX {
        return Err(BootError::GuestMemory { what: "the PVH memory map", reason: format!("{} entries", e820.len()) });
    }
    for (i, entry) in e820.iter().enumerate() {
        let item = hvm_memmap_table_entry { addr: entry.addr, size: entry.size, type_: entry.kind as u32, reserved: 0 };
        write(mem, item, PVH_MEMMAP_ADDR + i as u64 * 24, "the PVH memory map")?;
    }
    let mut info = hvm_start_info {
        magic: PVH_MAGIC,
        version: PVH_VERSION,
        cmdline_paddr: if cmdline.is_empty() { 0 } else { CMDLINE_ADDR },
        memmap_paddr: PVH_MEMMAP_ADDR,
        memmap_entries: e820.len() as u32,
        rsdp_paddr: rsdp.unwrap_or(0),
        ..Default::default()
    };
    if let Some(initrd) = initrd {
        let module = hvm_modlist_entry { paddr: initrd.addr, size: initrd.size, ..Default::default() };
        write(mem, module, PVH_MODLIST_ADDR, "the PVH module list")?;
        info.nr_modules = 1;
        info.modlist_paddr = PVH_MODLIST_ADDR;
    }
    write(mem, info, PVH_INFO_ADDR, "hvm_start_info")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{GuestRam, MIB, RamLayout};

    #[test]
    fn start_info_carries_cmdline_memmap_and_initrd() {
        let ram = GuestRam::new(RamLayout::new(32 * MIB)).unwrap();
        let e820 = ram.layout.e820();
        let initrd = Initrd { addr: 0x100_0000, size: 99 };
        write_start_info(&ram.memory, "probe.echo=1", Some(initrd), Some(0xe0000), &e820).unwrap();
        let info: hvm_start_info = ram.memory.read_obj(GuestAddress(PVH_INFO_ADDR)).unwrap();
        assert_eq!((info.magic, info.version), (PVH_MAGIC, 1));
        assert_eq!(
            (info.cmdline_paddr, info.memmap_paddr, info.memmap_entries as usize),
            (CMDLINE_ADDR, PVH_MEMMAP_ADDR, e820.len())
        );
        assert_eq!((info.nr_modules, info.modlist_paddr), (1, PVH_MODLIST_ADDR));
        assert_eq!(info.rsdp_paddr, 0xe0000);
        let module: hvm_modlist_entry = ram.memory.read_obj(GuestAddress(PVH_MODLIST_ADDR)).unwrap();
        assert_eq!((module.paddr, module.size), (0x100_0000, 99));
        let last: hvm_memmap_table_entry =
            ram.memory.read_obj(GuestAddress(PVH_MEMMAP_ADDR + 24 * (e820.len() as u64 - 1))).unwrap();
        let want = e820.last().unwrap();
        assert_eq!((last.addr, last.size, last.type_), (want.addr, want.size, want.kind as u32));
    }
}

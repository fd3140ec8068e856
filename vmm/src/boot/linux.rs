//! The Linux zero page (`boot_params`) for the 64-bit boot protocol.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{BootError, Initrd};
use crate::layout::{CMDLINE_ADDR, ZERO_PAGE_ADDR};
use crate::memory::E820Entry;

/// `boot_flag`: 0xAA55.
const BOOT_FLAG: u16 = 0xaa55;
/// `header`: "HdrS".
const HDRS: u32 = 0x5372_6448;
/// `type_of_loader`: undefined/other loader.
const LOADER_UNDEFINED: u8 = 0xff;
/// `loadflags`: the protected-mode code is loaded at 1 MiB.
const LOADED_HIGH: u8 = 1 << 0;
/// `loadflags`: `heap_end_ptr` is valid.
const CAN_USE_HEAP: u8 = 1 << 7;
/// `kernel_alignment` assumed for a vmlinux that brings no setup header.
const DEFAULT_KERNEL_ALIGNMENT: u32 = 0x100_0000;
/// Most E820 entries the zero page holds.
const E820_MAX: usize = 128;

/// Builds the zero page from the bzImage's setup header (or a minimal one for an ELF kernel) and
/// writes it at [`ZERO_PAGE_ADDR`].
pub(super) fn write_zero_page(
    mem: &GuestMemoryMmap,
    header: Option<setup_header>,
    cmdline: &str,
    initrd: Option<Initrd>,
    rsdp: Option<u64>,
    e820: &[E820Entry],
) -> Result<(), BootError> {
    let mut hdr = match header {
        // A bzImage's own header: kept, with the loader's fields filled in. `cmdline_size` stays
        // the kernel's limit (the boot protocol makes it read-only for loaders).
        Some(hdr) => {
            setup_header { loadflags: hdr.loadflags | LOADED_HIGH | CAN_USE_HEAP, heap_end_ptr: 0xfe00, ..hdr }
        }
        None => setup_header {
            boot_flag: BOOT_FLAG,
            header: HDRS,
            kernel_alignment: DEFAULT_KERNEL_ALIGNMENT,
            cmdline_size: cmdline.len() as u32 + 1,
            ..Default::default()
        },
    };
    hdr.type_of_loader = LOADER_UNDEFINED;
    hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    let mut params = boot_params { hdr, ..Default::default() };
    params.acpi_rsdp_addr = rsdp.unwrap_or(0);
    if let Some(initrd) = initrd {
        params.hdr.ramdisk_image = initrd.addr as u32;
        params.hdr.ramdisk_size = initrd.size as u32;
        params.ext_ramdisk_image = (initrd.addr >> 32) as u32;
        params.ext_ramdisk_size = (initrd.size >> 32) as u32;
    }
    if e820.len() > E820_MAX {
        return Err(BootError::GuestMemory {
            what: "the E820 map",
            reason: format!("{} entries, at most {E820_MAX}", e820.len()),
        });
    }
    for (slot, entry) in params.e820_table.iter_mut().zip(e820) {
        *slot = boot_e820_entry { addr: entry.addr, size: entry.size, r#type: entry.kind as u32 };
    }
    params.e820_entries = e820.len() as u8;
    mem.write_obj(params, GuestAddress(ZERO_PAGE_ADDR))
        .map_err(|e| BootError::GuestMemory { what: "the zero page", reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{GuestRam, MIB, RamLayout};

    #[test]
    fn zero_page_follows_the_boot_protocol() {
        let ram = GuestRam::new(RamLayout::new(64 * MIB)).unwrap();
        let e820 = ram.layout.e820();
        let bz = setup_header {
            header: HDRS,
            version: 0x020f,
            loadflags: LOADED_HIGH,
            code32_start: 0x10_0000,
            cmdline_size: 2047,
            ..Default::default()
        };
        let initrd = Initrd { addr: 0x300_0000, size: 0x1234 };
        write_zero_page(&ram.memory, Some(bz), "console=ttyS0", Some(initrd), Some(0xe0000), &e820).unwrap();
        let p: boot_params = ram.memory.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        let hdr = p.hdr;
        assert_eq!({ hdr.header }, HDRS);
        assert_eq!({ hdr.version }, 0x020f, "the kernel's own header is kept");
        assert_eq!(hdr.type_of_loader, LOADER_UNDEFINED);
        assert_eq!(hdr.loadflags & (LOADED_HIGH | CAN_USE_HEAP), LOADED_HIGH | CAN_USE_HEAP);
        assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_ADDR as u32);
        assert_eq!({ hdr.ramdisk_image }, 0x300_0000);
        assert_eq!({ hdr.ramdisk_size }, 0x1234);
        assert_eq!(p.e820_entries as usize, e820.len());
        assert_eq!({ p.acpi_rsdp_addr }, 0xe0000);
        for (got, want) in p.e820_table.iter().zip(&e820) {
            assert_eq!(({ got.addr }, { got.size }, { got.r#type }), (want.addr, want.size, want.kind as u32));
        }
        // Field offsets the boot protocol fixes (Documentation/arch/x86/boot.rst, zero-page.rst).
        let mut raw = [0u8; 4096];
        ram.memory.read_slice(&mut raw, GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        assert_eq!(raw[0x1e8] as usize, e820.len());
        assert_eq!(u32::from_le_bytes(raw[0x202..0x206].try_into().unwrap()), HDRS);
        assert_eq!(raw[0x210], LOADER_UNDEFINED);
        assert_eq!(u32::from_le_bytes(raw[0x228..0x22c].try_into().unwrap()), CMDLINE_ADDR as u32);
        assert_eq!(u32::from_le_bytes(raw[0x218..0x21c].try_into().unwrap()), 0x300_0000);
        assert_eq!(u64::from_le_bytes(raw[0x2d0 + 20..0x2d0 + 28].try_into().unwrap()), e820[1].addr);
    }

    #[test]
    fn elf_kernels_get_a_minimal_header() {
        let ram = GuestRam::new(RamLayout::new(16 * MIB)).unwrap();
        write_zero_page(&ram.memory, None, "", None, None, &[]).unwrap();
        let p: boot_params = ram.memory.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        let hdr = p.hdr;
        assert_eq!(
            ({ hdr.boot_flag }, { hdr.header }, { hdr.kernel_alignment }),
            (BOOT_FLAG, HDRS, DEFAULT_KERNEL_ALIGNMENT)
        );
        assert_eq!({ hdr.ramdisk_image }, 0);
    }
}

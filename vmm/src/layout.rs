//! The guest-physical address map the VMM builds (x86-64).
//!
//! ```text
//! 0x0000_0500  GDT (boot)                 0x0000_9000  PML4, then PDPT, then 4 page directories
//! 0x0000_0520  IDT (empty)                0x0002_0000  kernel command line (64 KiB reserved)
//! 0x0000_6000  PVH hvm_start_info         0x0009_fc00  end of low RAM (EBDA and BIOS area above)
//! 0x0000_6040  PVH module list            0x0010_0000  kernel (bzImage) / ELF segments from here
//! 0x0000_6100  PVH memory map             0xc000_0000  32-bit MMIO hole (1 GiB) up to 4 GiB
//! 0x0000_7000  zero page (boot_params)    4 GiB        RAM above the hole
//! 0x0000_8ff0  boot stack top
//! ```

/// Boot GDT.
pub const GDT_ADDR: u64 = 0x500;
/// Boot IDT (limit 0: any exception before the kernel loads its own is a triple fault).
pub const IDT_ADDR: u64 = 0x520;
/// PVH `hvm_start_info`.
pub const PVH_INFO_ADDR: u64 = 0x6000;
/// PVH module list (the initrd).
pub const PVH_MODLIST_ADDR: u64 = 0x6040;
/// PVH memory map.
pub const PVH_MEMMAP_ADDR: u64 = 0x6100;
/// Most PVH memory map entries that fit before the zero page.
pub const PVH_MEMMAP_MAX: usize = ((ZERO_PAGE_ADDR - PVH_MEMMAP_ADDR) / 24) as usize;
/// Linux zero page (`boot_params`).
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial stack pointer for the 64-bit entry.
pub const BOOT_STACK_TOP: u64 = 0x8ff0;
/// Boot page tables: PML4, PDPT and four page directories mapping the low 4 GiB.
pub const PML4_ADDR: u64 = 0x9000;
/// Kernel command line.
pub const CMDLINE_ADDR: u64 = 0x20000;
/// Space reserved for the command line.
pub const CMDLINE_SPACE: u64 = 0x10000;
/// End of conventional low memory; the EBDA and BIOS area follow, reserved.
pub const EBDA_START: u64 = 0x9fc00;
/// Start of memory above the legacy BIOS area; kernels are loaded from here.
pub const HIGH_MEMORY_START: u64 = 0x10_0000;
/// Start of the 32-bit MMIO hole.
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
/// End of the 32-bit MMIO hole, where RAM resumes.
pub const FOUR_GIB: u64 = 0x1_0000_0000;

//! The guest-physical address map the VMM builds (x86-64).
//!
//! ```text
//! 0x0000_0500  GDT (boot)                 0x0000_9000  PML4, then PDPT, then 4 page directories
//! 0x0000_0520  IDT (empty)                0x0002_0000  kernel command line (64 KiB reserved)
//! 0x0000_6000  PVH hvm_start_info         0x0009_fc00  end of low RAM (EBDA and BIOS area above)
//! 0x0000_6040  PVH module list            0x0010_0000  kernel (bzImage) / ELF segments from here
//! 0x0000_6100  PVH memory map             0xc000_0000  32-bit MMIO hole (1 GiB) up to 4 GiB
//! 0x0000_7000  zero page (boot_params)    4 GiB        RAM above the hole
//! 0x0000_8ff0  boot stack top            0xc000_0000  PCI 32-bit MMIO window (512 MiB)
//! 0x000e_0000  ACPI RSDP, then tables     0xe000_0000  PCI ECAM, buses 0-31 (32 MiB)
//! 0x000f_f000  VM generation ID (16 bytes)
//!                                         0xfec0_0000  IOAPIC, 0xfee0_0000 LAPIC
//! ```
//!
//! The PCI 64-bit window starts at the first GiB boundary above RAM and 4 GiB. A VM with a
//! payload window (`payload_window_mib`) has it in low RAM just below that RAM's last 2 MiB,
//! reserved in the E820 map, with the initrd below it (`RamLayout::with_payload_window`).

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
/// ACPI RSDP, where Linux also finds it by scanning the BIOS area.
pub const ACPI_RSDP_ADDR: u64 = 0xe_0000;
/// ACPI tables follow the RSDP.
pub const ACPI_TABLES_ADDR: u64 = 0xe_0040;
/// End of the space for ACPI tables.
pub const ACPI_TABLES_END: u64 = VMGENID_ADDR;
/// The VM generation ID's 16 bytes (ACPI `VGEN`), in the reserved BIOS area below 1 MiB.
pub const VMGENID_ADDR: u64 = 0xf_f000;
/// PCI 32-bit memory window for BARs.
pub const PCI_MMIO32_START: u64 = MMIO_HOLE_START;
/// Its size.
pub const PCI_MMIO32_SIZE: u64 = 0x2000_0000;
/// PCI ECAM window.
pub const PCI_ECAM_BASE: u64 = 0xe000_0000;
/// The last bus number the host bridge decodes: bus 0 and one secondary bus per root port (a
/// root port takes a bus-0 device number, so at most 31).
pub const PCI_LAST_BUS: u8 = 31;
/// ECAM size: 1 MiB per bus.
pub const PCI_ECAM_SIZE: u64 = (PCI_LAST_BUS as u64 + 1) << 20;
/// IOAPIC MMIO.
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
/// Local APIC MMIO.
pub const LAPIC_ADDR: u64 = 0xfee0_0000;
/// Size of the PCI 64-bit memory window.
pub const PCI_MMIO64_SIZE: u64 = 64 << 30;

/// Start of the PCI 64-bit window for a guest whose RAM ends at `ram_end`.
pub fn pci_mmio64_start(ram_end: u64) -> u64 {
    ram_end.max(FOUR_GIB).next_multiple_of(1 << 30)
}

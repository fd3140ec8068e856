//! The state the boot vCPU starts in: GDT, identity page tables and registers for the PVH
//! (32-bit, paging off) and Linux 64-bit entries.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::boot::BootEntry;
use crate::layout::{BOOT_STACK_TOP, GDT_ADDR, IDT_ADDR, PML4_ADDR};

/// Code segment selector (`__BOOT_CS` in Linux).
pub const BOOT_CS: u16 = 0x10;
/// Data segment selector (`__BOOT_DS`).
pub const BOOT_DS: u16 = 0x18;
/// Task register selector.
pub const BOOT_TSS: u16 = 0x20;

const CODE64: u64 = 0x00af_9b00_0000_ffff;
const CODE32: u64 = 0x00cf_9b00_0000_ffff;
const DATA: u64 = 0x00cf_9300_0000_ffff;
/// A busy 32/64-bit TSS of 0x68 bytes at address 0, as PVH asks for.
const TSS: u64 = 0x0000_8b00_0000_0067;

const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// Page-table entry flags: present, writable.
const PTE_PRESENT_RW: u64 = 0x3;
/// Large (2 MiB) page.
const PTE_PS: u64 = 0x80;
/// Page directories mapping the low 4 GiB.
const PAGE_DIRECTORIES: u64 = 4;

/// The GDT for `entry`: null, null, code, data, TSS.
pub fn gdt(entry: &BootEntry) -> [u64; 5] {
    let code = match entry {
        BootEntry::Pvh { .. } => CODE32,
        BootEntry::Linux64 { .. } => CODE64,
    };
    [0, 0, code, DATA, TSS]
}

/// Decodes a GDT descriptor into KVM's segment form.
pub fn segment(descriptor: u64, selector: u16) -> kvm_segment {
    let limit = ((descriptor & 0xffff) | ((descriptor >> 32) & 0xf_0000)) as u32;
    let g = ((descriptor >> 55) & 1) as u8;
    let present = ((descriptor >> 47) & 1) as u8;
    kvm_segment {
        base: ((descriptor >> 16) & 0xff_ffff) | ((descriptor >> 32) & 0xff00_0000),
        limit: if g == 1 { (limit << 12) | 0xfff } else { limit },
        selector,
        type_: ((descriptor >> 40) & 0xf) as u8,
        present,
        dpl: ((descriptor >> 45) & 0x3) as u8,
        db: ((descriptor >> 54) & 1) as u8,
        s: ((descriptor >> 44) & 1) as u8,
        l: ((descriptor >> 53) & 1) as u8,
        g,
        avl: ((descriptor >> 52) & 1) as u8,
        unusable: u8::from(present == 0),
        padding: 0,
    }
}

/// Writes the GDT, the (empty) IDT and, for the 64-bit entry, page tables identity-mapping the
/// low 4 GiB with 2 MiB pages.
pub fn write_tables(mem: &GuestMemoryMmap, entry: &BootEntry) -> Result<(), vm_memory::GuestMemoryError> {
    let gdt: Vec<u8> = gdt(entry).iter().flat_map(|d| d.to_le_bytes()).collect();
    mem.write_slice(&gdt, GuestAddress(GDT_ADDR))?;
    mem.write_obj(0u64, GuestAddress(IDT_ADDR))?;
    if let BootEntry::Linux64 { .. } = entry {
        let pdpt = PML4_ADDR + 0x1000;
        let pd = pdpt + 0x1000;
        let mut tables = vec![0u8; (2 + PAGE_DIRECTORIES as usize) * 0x1000];
        tables[..8].copy_from_slice(&(pdpt | PTE_PRESENT_RW).to_le_bytes());
        for i in 0..PAGE_DIRECTORIES {
            let at = 0x1000 + i as usize * 8;
            tables[at..at + 8].copy_from_slice(&((pd + i * 0x1000) | PTE_PRESENT_RW).to_le_bytes());
        }
        for page in 0..PAGE_DIRECTORIES * 512 {
            let at = 0x2000 + page as usize * 8;
            tables[at..at + 8].copy_from_slice(&((page << 21) | PTE_PRESENT_RW | PTE_PS).to_le_bytes());
        }
        mem.write_slice(&tables, GuestAddress(PML4_ADDR))?;
    }
    Ok(())
}

/// Sets the segment and control registers for `entry`, keeping what KVM initialised otherwise.
pub fn configure_sregs(sregs: &mut kvm_sregs, entry: &BootEntry) {
    let gdt = gdt(entry);
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (gdt.len() * 8 - 1) as u16;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 0;
    sregs.cs = segment(gdt[(BOOT_CS / 8) as usize], BOOT_CS);
    let data = segment(gdt[(BOOT_DS / 8) as usize], BOOT_DS);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment(gdt[(BOOT_TSS / 8) as usize], BOOT_TSS);
    match entry {
        BootEntry::Pvh { .. } => {
            sregs.cr0 = CR0_PE | CR0_ET;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
        BootEntry::Linux64 { .. } => {
            sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_PG;
            sregs.cr3 = PML4_ADDR;
            sregs.cr4 = CR4_PAE;
            sregs.efer = EFER_LME | EFER_LMA;
        }
    }
}

/// General-purpose registers at entry.
pub fn boot_regs(entry: &BootEntry) -> kvm_regs {
    let mut regs = kvm_regs { rflags: 0x2, ..Default::default() };
    match *entry {
        BootEntry::Pvh { entry, start_info } => {
            regs.rip = entry;
            regs.rbx = start_info;
        }
        BootEntry::Linux64 { entry, boot_params } => {
            regs.rip = entry;
            regs.rsi = boot_params;
            regs.rsp = BOOT_STACK_TOP;
            regs.rbp = BOOT_STACK_TOP;
        }
    }
    regs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{GuestRam, MIB, RamLayout};

    const LINUX64: BootEntry = BootEntry::Linux64 { entry: 0x100200, boot_params: 0x7000 };
    const PVH: BootEntry = BootEntry::Pvh { entry: 0x100000, start_info: 0x6000 };

    #[test]
    fn segments_decode_from_descriptors() {
        let cs = segment(CODE64, BOOT_CS);
        assert_eq!(
            (cs.base, cs.limit, cs.type_, cs.present, cs.l, cs.db, cs.g, cs.s),
            (0, 0xffff_ffff, 0xb, 1, 1, 0, 1, 1)
        );
        let cs32 = segment(CODE32, BOOT_CS);
        assert_eq!((cs32.l, cs32.db), (0, 1));
        let tr = segment(TSS, BOOT_TSS);
        assert_eq!((tr.limit, tr.type_, tr.s, tr.present, tr.unusable), (0x67, 0xb, 0, 1, 0));
        assert_eq!(segment(0, 0).unusable, 1);
    }

    #[test]
    fn long_mode_entry_state() {
        let mut sregs = kvm_sregs::default();
        configure_sregs(&mut sregs, &LINUX64);
        assert_eq!(sregs.cr0 & (CR0_PE | CR0_PG), CR0_PE | CR0_PG);
        assert_eq!((sregs.cr3, sregs.cr4 & CR4_PAE, sregs.efer), (PML4_ADDR, CR4_PAE, EFER_LME | EFER_LMA));
        assert_eq!((sregs.cs.selector, sregs.cs.l, sregs.ds.selector), (BOOT_CS, 1, BOOT_DS));
        let regs = boot_regs(&LINUX64);
        assert_eq!((regs.rip, regs.rsi, regs.rflags), (0x100200, 0x7000, 2));
    }

    #[test]
    fn pvh_entry_state_is_flat_protected_mode_without_paging() {
        let mut sregs = kvm_sregs { cr0: CR0_PG, efer: EFER_LME, ..Default::default() };
        configure_sregs(&mut sregs, &PVH);
        assert_eq!((sregs.cr0 & CR0_PG, sregs.cr0 & CR0_PE, sregs.efer), (0, CR0_PE, 0));
        assert_eq!((sregs.cs.db, sregs.cs.l, sregs.cs.limit), (1, 0, 0xffff_ffff));
        assert_eq!(boot_regs(&PVH).rbx, 0x6000);
    }

    #[test]
    fn page_tables_identity_map_low_4_gib() {
        let ram = GuestRam::new(RamLayout::new(16 * MIB)).unwrap();
        write_tables(&ram.memory, &LINUX64).unwrap();
        let read = |addr: u64| -> u64 { ram.memory.read_obj(GuestAddress(addr)).unwrap() };
        // Walk 0xfee0_0000 (the LAPIC): PML4[0] -> PDPT[3] -> PD entry 0x1f7.
        let pdpt = read(PML4_ADDR) & !0xfff;
        let pd = read(pdpt + 3 * 8) & !0xfff;
        let pde = read(pd + 0x1f7 * 8);
        assert_eq!(pde & !0x1f_ffff, 0xfee0_0000);
        assert_eq!(pde & (PTE_PS | PTE_PRESENT_RW), PTE_PS | PTE_PRESENT_RW);
        let gdt: u64 = read(GDT_ADDR + BOOT_CS as u64);
        assert_eq!(gdt, CODE64);
    }
}

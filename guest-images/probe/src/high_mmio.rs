//! MMIO above 4 GiB: a VMM may place 64-bit BARs anywhere in the physical address space, and
//! the boot page tables map only the low 4 GiB. This maps the 2 MiB pages a BAR covers,
//! identity, uncached and user-accessible, from CPL3: the page tables live in the probe's own
//! user-accessible memory, and an entry that goes from not present to present needs no TLB
//! invalidation, so no ring switch is needed either.

use core::cell::UnsafeCell;

use crate::entry;

/// Spare tables for the mappings: page-directory-pointer tables and page directories.
const SPARE_TABLES: usize = 8;
/// Present, writable, user.
const TABLE_FLAGS: u64 = 0x7;
/// Present, writable, user, write-through, cache-disabled, 2 MiB page.
const UNCACHED_2M: u64 = 0x9f;
/// The first address the boot tables do not map.
const LOW_LIMIT: u64 = 1 << 32;
/// Physical addresses the probe maps (48 bits: four-level paging).
const ADDRESS_LIMIT: u64 = 1 << 48;

#[repr(C, align(4096))]
struct Tables(UnsafeCell<[[u64; 512]; SPARE_TABLES]>);
// SAFETY: the probe's BSP is the only thread that maps; APs never touch the tables.
unsafe impl Sync for Tables {}

static TABLES: Tables = Tables(UnsafeCell::new([[0; 512]; SPARE_TABLES]));
static mut USED: usize = 0;

/// The next spare table, zeroed, as its physical (identity) address.
fn spare() -> Option<u64> {
    // SAFETY: single-threaded (the BSP); a table is handed out once.
    unsafe {
        if USED == SPARE_TABLES {
            return None;
        }
        let table = &mut (*TABLES.0.get())[USED];
        USED += 1;
        table.fill(0);
        Some(table.as_ptr() as u64)
    }
}

/// The table an entry points at, making one if the entry is not present.
///
/// # Safety
/// `entry` is an entry of a live page table of the probe.
unsafe fn next_level(entry: *mut u64) -> Option<*mut u64> {
    // SAFETY: the caller's promise.
    let value = unsafe { core::ptr::read_volatile(entry) };
    if value & 1 != 0 {
        return Some((value & 0x000f_ffff_ffff_f000) as *mut u64);
    }
    let table = spare()?;
    // SAFETY: as above; the new table is zeroed (nothing present) before it is linked.
    unsafe { core::ptr::write_volatile(entry, table | TABLE_FLAGS) };
    Some(table as *mut u64)
}

/// Maps `[addr, addr + size)` if it lies above 4 GiB (below, the boot tables already do).
/// Returns false if the range is beyond 48 bits or the spare tables ran out.
pub fn map(addr: u64, size: u64) -> bool {
    let end = addr.saturating_add(size.max(1));
    if end <= LOW_LIMIT {
        return true;
    }
    if end > ADDRESS_LIMIT {
        return false;
    }
    let mut page = addr.max(LOW_LIMIT) & !((1 << 21) - 1);
    while page < end {
        // SAFETY: the boot PML4 and the tables linked from it are the probe's live tables, in
        // its own identity-mapped memory.
        let mapped = unsafe {
            let pml4 = (&raw mut entry::pml4).cast::<u64>();
            let pml4e = pml4.add(((page >> 39) & 511) as usize);
            let Some(pdpt) = next_level(pml4e) else { return false };
            let pdpte = pdpt.add(((page >> 30) & 511) as usize);
            match next_level(pdpte) {
                Some(pd) => {
                    let pde = pd.add(((page >> 21) & 511) as usize);
                    if core::ptr::read_volatile(pde) & 1 == 0 {
                        core::ptr::write_volatile(pde, page | UNCACHED_2M);
                    }
                    true
                }
                None => false,
            }
        };
        if !mapped {
            return false;
        }
        page += 1 << 21;
    }
    true
}

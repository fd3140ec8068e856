//! Volatile access to identity-mapped physical memory (MMIO registers, firmware tables, DMA
//! buffers). Everything below 4 GiB is mapped user-accessible, so these work at CPL3.

/// Reads a `T` at physical address `addr`.
pub fn read<T: Copy>(addr: u64) -> T {
    // SAFETY: the low 4 GiB are identity-mapped; callers pass addresses of registers or memory
    // the VMM described (BARs, ACPI tables, RAM).
    unsafe { core::ptr::read_volatile(addr as *const T) }
}

/// Writes a `T` at physical address `addr`.
pub fn write<T: Copy>(addr: u64, value: T) {
    // SAFETY: as for `read`; the targets are device registers or memory the probe owns.
    unsafe { core::ptr::write_volatile(addr as *mut T, value) }
}

/// Reads `len` bytes at `addr` (for firmware tables).
pub fn bytes(addr: u64, len: usize) -> &'static [u8] {
    // SAFETY: identity-mapped memory that nothing writes while the probe reads it.
    unsafe { core::slice::from_raw_parts(addr as *const u8, len) }
}

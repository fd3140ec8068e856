//! Mmapped BAR windows as guest memory: a passed-through BAR's mmap-able parts become KVM memory
//! slots wherever the guest places the BAR, so its accesses never leave the guest.

use std::fs::File;
use std::os::fd::AsRawFd;

pub use vm_device::memory_slots::{GuestMemorySlots, SlotError};

/// One mmapped, page-aligned part of a BAR.
pub struct BarWindow {
    /// BAR index.
    pub bar: usize,
    /// Offset of the window in the BAR.
    pub offset: u64,
    size: u64,
    host: *mut libc::c_void,
    slot: Option<(u32, u64)>,
}

// SAFETY: the mapping is plain shared memory; the pointer is only handed to KVM and munmap.
unsafe impl Send for BarWindow {}

impl BarWindow {
    /// Mmaps `size` bytes at `file_offset` of `file` as part `offset` of BAR `bar`.
    pub fn map(file: &File, file_offset: u64, bar: usize, offset: u64, size: u64) -> std::io::Result<BarWindow> {
        // SAFETY: a fresh shared mapping of a device file; checked for failure below, unmapped on drop.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                file_offset as libc::off_t,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(BarWindow { bar, offset, size, host, slot: None })
    }

    /// Puts the window at guest-physical `gpa` (or takes it out of the guest with `None`).
    pub fn place(&mut self, slots: &dyn GuestMemorySlots, gpa: Option<u64>) -> Result<(), SlotError> {
        if self.slot.map(|(_, at)| at) == gpa {
            return Ok(());
        }
        if let Some((slot, _)) = self.slot.take() {
            slots.unmap(slot)?;
        }
        if let Some(gpa) = gpa {
            // SAFETY: `host` is this window's own page-aligned shared mapping of the device, never
            // a Rust object; it stays mapped until `drop`, and the owning device takes every
            // window out of the guest (`place(.., None)`) before it drops them.
            let slot = unsafe { slots.map(gpa, self.size, self.host as u64) }?;
            self.slot = Some((slot, gpa));
        }
        Ok(())
    }

    /// Where the window is in the guest, if it is.
    pub fn guest_address(&self) -> Option<u64> {
        self.slot.map(|(_, gpa)| gpa)
    }
}

impl Drop for BarWindow {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `map`; the owning device took the
        // window out of the guest first (`PciPassthroughDevice`'s `Drop`).
        unsafe { libc::munmap(self.host, self.size as usize) };
    }
}

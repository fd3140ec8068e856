//! Host memory mapped into the guest's physical address space beyond its RAM: the mmapped BAR
//! windows of passed-through devices, which the VMM turns into KVM memory slots.

/// Errors adding or removing a slot.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The hypervisor has no free slot left.
    #[error("no free guest memory slot")]
    Exhausted,
    /// The hypervisor refused the change.
    #[error("{what}: {source}")]
    Hypervisor {
        /// The operation, e.g. "KVM_SET_USER_MEMORY_REGION slot 3".
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

/// What the VMM offers for mapping host memory into the guest.
pub trait GuestMemorySlots: Send + Sync {
    /// Maps `size` bytes of host memory at `host_addr` at guest-physical `gpa`; returns the slot.
    ///
    /// # Safety
    ///
    /// `host_addr..host_addr + size` must be one page-aligned mapping of this process that stays
    /// mapped, and that no Rust reference points into, until [`GuestMemorySlots::unmap`] has
    /// removed the slot: from the call on, the guest reads and writes it at will.
    unsafe fn map(&self, gpa: u64, size: u64, host_addr: u64) -> Result<u32, SlotError>;
    /// Removes a slot; the guest no longer reaches its memory.
    fn unmap(&self, slot: u32) -> Result<(), SlotError>;
}

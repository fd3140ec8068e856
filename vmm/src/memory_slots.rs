//! KVM memory slots beyond guest RAM: mmapped BAR windows of passed-through devices.

use std::sync::{Arc, Mutex};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_device::memory_slots::{GuestMemorySlots, SlotError};

/// Hands out KVM slots after the ones guest RAM uses.
pub struct KvmSlots {
    vm: Arc<VmFd>,
    state: Mutex<(u32, Vec<u32>)>,
}

impl KvmSlots {
    /// Slots for `vm`, starting at `first`.
    pub fn new(vm: Arc<VmFd>, first: u32) -> Self {
        KvmSlots { vm, state: Mutex::new((first, Vec::new())) }
    }

    /// # Safety
    ///
    /// As [`GuestMemorySlots::map`]: `host_addr..+size` stays mapped and out of Rust's hands until
    /// the slot is deleted (size 0).
    unsafe fn set(&self, slot: u32, gpa: u64, size: u64, host_addr: u64) -> Result<(), SlotError> {
        let region = kvm_userspace_memory_region {
            slot,
            guest_phys_addr: gpa,
            memory_size: size,
            userspace_addr: host_addr,
            flags: 0,
        };
        // SAFETY: the caller's contract (this function's `# Safety`); size 0 deletes the slot.
        unsafe { self.vm.set_user_memory_region(region) }.map_err(|e| SlotError::Hypervisor {
            what: format!("KVM_SET_USER_MEMORY_REGION slot {slot}"),
            source: std::io::Error::from_raw_os_error(e.errno()),
        })
    }
}

impl GuestMemorySlots for KvmSlots {
    unsafe fn map(&self, gpa: u64, size: u64, host_addr: u64) -> Result<u32, SlotError> {
        let slot = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            match state.1.pop() {
                Some(slot) => slot,
                None => {
                    state.0 += 1;
                    state.0 - 1
                }
            }
        };
        // SAFETY: the caller upholds `GuestMemorySlots::map`'s contract, which is `set`'s.
        if let Err(e) = unsafe { self.set(slot, gpa, size, host_addr) } {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).1.push(slot);
            return Err(e);
        }
        tracing::debug!("KVM slot {slot}: {size:#x} bytes of device memory at guest {gpa:#x}");
        Ok(slot)
    }

    fn unmap(&self, slot: u32) -> Result<(), SlotError> {
        // SAFETY: size 0 deletes the slot; no host memory is handed to the guest.
        unsafe { self.set(slot, 0, 0, 0) }?;
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1.push(slot);
        Ok(())
    }
}

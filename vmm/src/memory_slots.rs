//! KVM memory slots beyond guest RAM: mmapped BAR windows of passed-through devices.

use std::sync::{Arc, Mutex};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use passthrough::slots::GuestMemorySlots;

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

    fn set(&self, slot: u32, gpa: u64, size: u64, host_addr: u64) -> Result<(), String> {
        let region = kvm_userspace_memory_region {
            slot,
            guest_phys_addr: gpa,
            memory_size: size,
            userspace_addr: host_addr,
            flags: 0,
        };
        // SAFETY: `host_addr..+size` is a mapping the caller keeps alive until it unmaps the slot
        // (a BarWindow removes its slot before it unmaps); size 0 deletes the slot.
        unsafe { self.vm.set_user_memory_region(region) }.map_err(|e| format!("KVM_SET_USER_MEMORY_REGION: {e}"))
    }
}

impl GuestMemorySlots for KvmSlots {
    fn map(&self, gpa: u64, size: u64, host_addr: u64) -> Result<u32, String> {
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
        self.set(slot, gpa, size, host_addr)?;
        tracing::debug!("KVM slot {slot}: {size:#x} bytes of device memory at guest {gpa:#x}");
        Ok(slot)
    }

    fn unmap(&self, slot: u32) -> Result<(), String> {
        self.set(slot, 0, 0, 0)?;
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1.push(slot);
        Ok(())
    }
}

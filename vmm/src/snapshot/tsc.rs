//! A restored guest's TSC and KVM clock, kept in step.
//!
//! The guest's TSC is the host's plus an offset KVM keeps per vCPU (`KVM_VCPU_TSC_OFFSET`, the
//! vCPU attribute group `KVM_VCPU_TSC_CTRL`); its KVM clock is a nanosecond count KVM derives
//! from the host's TSC too. A snapshot saves each vCPU's offset and the clock with the host TSC
//! it was read at (`KVM_CLOCK_HOST_TSC`). Restored, the clock is set back to its saved value and
//! read again with the host's TSC now; each vCPU's offset is then chosen so that its TSC has
//! moved on from the saved instant exactly as far as the clock has: the guest sees both stand
//! still over the snapshot's wait, and in step. (Writing the TSC MSR alone, at another instant
//! than the clock, left them milliseconds apart in the nested box, enough for Linux's clocksource
//! watchdog to call the TSC unstable.) This is the migration recipe of Linux's
//! Documentation/virt/kvm/devices/vcpu.rst, with no time passing.

use kvm_bindings::{
    KVM_CLOCK_HOST_TSC, KVM_VCPU_TSC_CTRL, KVM_VCPU_TSC_OFFSET, KVMIO, kvm_clock_data, kvm_device_attr,
};
use kvm_ioctls::VcpuFd;
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iow_nr;

use super::vcpu_state::{KvmStateError, kvm};

/// KVM's device-attribute ioctl request numbers (kvm-ioctls keeps its own private).
mod request {
    #![allow(missing_docs)]
    use super::*;
    ioctl_iow_nr!(KVM_SET_DEVICE_ATTR, KVMIO, 0xe1, kvm_device_attr);
    ioctl_iow_nr!(KVM_GET_DEVICE_ATTR, KVMIO, 0xe2, kvm_device_attr);
    ioctl_iow_nr!(KVM_HAS_DEVICE_ATTR, KVMIO, 0xe3, kvm_device_attr);
}
use request::{KVM_GET_DEVICE_ATTR, KVM_HAS_DEVICE_ATTR, KVM_SET_DEVICE_ATTR};

/// One of the device-attribute ioctls on `vcpu` (kvm-ioctls has them for other architectures).
fn attr_ioctl(vcpu: &VcpuFd, request: u64, attr: &kvm_device_attr) -> Result<(), kvm_ioctls::Error> {
    // SAFETY: the three device-attribute ioctls read `attr` and, for GET, write one u64 at
    // `attr.addr`, which points at a u64 its caller keeps alive for the call.
    let ret = unsafe { ioctl_with_ref(vcpu, request, attr) };
    if ret == 0 { Ok(()) } else { Err(kvm_ioctls::Error::last()) }
}

/// The attribute of `vcpu`'s TSC offset, its value at `value`.
fn offset_attr(value: &mut u64) -> kvm_device_attr {
    kvm_device_attr {
        group: KVM_VCPU_TSC_CTRL,
        attr: KVM_VCPU_TSC_OFFSET as u64,
        addr: value as *mut u64 as u64,
        flags: 0,
    }
}

/// `vcpu`'s TSC offset, where KVM gives it (Linux 5.16 and later).
pub(super) fn offset(vcpu: &VcpuFd) -> Option<u64> {
    let mut value = 0u64;
    let attr = offset_attr(&mut value);
    attr_ioctl(vcpu, KVM_HAS_DEVICE_ATTR(), &attr).ok()?;
    attr_ioctl(vcpu, KVM_GET_DEVICE_ATTR(), &attr).ok()?;
    Some(value)
}

/// The saved and the new clock, each with the host TSC it was read at.
#[derive(Debug, Clone, Copy)]
pub struct ClockPair {
    /// As the snapshot saved it.
    pub saved: kvm_clock_data,
    /// As read right after it was set back.
    pub now: kvm_clock_data,
}

impl ClockPair {
    /// The offset that puts a vCPU's TSC where it was at the snapshot (`saved_offset` then)
    /// plus the clock's move since it was set back, at a TSC rate of `tsc_khz`; `None` when a
    /// clock lacks its host TSC.
    pub fn offset(&self, saved_offset: u64, tsc_khz: u32) -> Option<u64> {
        if self.saved.flags & KVM_CLOCK_HOST_TSC == 0 || self.now.flags & KVM_CLOCK_HOST_TSC == 0 {
            return None;
        }
        let moved_ns = self.now.clock.wrapping_sub(self.saved.clock);
        let moved_ticks = (moved_ns as u128 * tsc_khz as u128 / 1_000_000) as u64;
        let guest_then = self.saved.host_tsc.wrapping_add(saved_offset);
        Some(guest_then.wrapping_add(moved_ticks).wrapping_sub(self.now.host_tsc))
    }
}

/// Sets `vcpu`'s TSC offset.
pub(super) fn set_offset(vcpu: &VcpuFd, offset: u64) -> Result<(), KvmStateError> {
    let mut value = offset;
    attr_ioctl(vcpu, KVM_SET_DEVICE_ATTR(), &offset_attr(&mut value)).map_err(kvm("KVM_SET_DEVICE_ATTR (TSC offset)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(ns: u64, host_tsc: u64) -> kvm_clock_data {
        kvm_clock_data { clock: ns, host_tsc, flags: KVM_CLOCK_HOST_TSC, ..Default::default() }
    }

    #[test]
    fn the_tsc_moves_on_as_far_as_the_clock_and_no_further() {
        // Saved at host TSC 10 000 000 with the guest's TSC 4 000 000 behind the host's; set
        // back a minute later (host TSC 70 000 000 000 at 1 GHz), read 2 ms after it was set.
        let offset_then = 0u64.wrapping_sub(4_000_000);
        let pair = ClockPair { saved: clock(5_000_000_000, 10_000_000), now: clock(5_002_000_000, 70_000_000_000) };
        let offset = pair.offset(offset_then, 1_000_000).unwrap();
        let guest_now = 70_000_000_000u64.wrapping_add(offset);
        assert_eq!(guest_now, 6_000_000 + 2_000_000, "its TSC then, plus the clock's 2 ms");
        let no_host_tsc = ClockPair { now: kvm_clock_data { flags: 0, ..pair.now }, ..pair };
        assert_eq!(no_host_tsc.offset(offset_then, 1_000_000), None);
    }

    #[test]
    fn a_vcpu_s_offset_is_read_and_set_where_kvm_has_it() {
        let Ok(kvm_fd) = kvm_ioctls::Kvm::new() else {
            testkit::skip("a_vcpu_s_offset_is_read_and_set_where_kvm_has_it", testkit::Lacks::Setup, "no /dev/kvm");
            return;
        };
        let vm = kvm_fd.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let Some(before) = offset(&vcpu) else {
            testkit::skip(
                "a_vcpu_s_offset_is_read_and_set_where_kvm_has_it",
                testkit::Lacks::Setup,
                "this host's KVM has no KVM_VCPU_TSC_OFFSET",
            );
            return;
        };
        let wanted = before.wrapping_add(123_456_789);
        set_offset(&vcpu, wanted).unwrap();
        let after = offset(&vcpu);
        if after == Some(before) {
            // PVM takes the offset and keeps none: without hardware virtualization its guests'
            // user code reads the host's TSC.
            testkit::skip(
                "a_vcpu_s_offset_is_read_and_set_where_kvm_has_it",
                testkit::Lacks::Hardware,
                "this host's KVM keeps no TSC offset (PVM: no hardware virtualization)",
            );
            return;
        }
        assert_eq!(after, Some(wanted));
    }
}

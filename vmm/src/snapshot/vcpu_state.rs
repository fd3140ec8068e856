//! A vCPU's state as KVM holds it, read and written back: general and special registers, the
//! XSAVE area (the FPU's state with it), XCRs, debug registers, the MSRs KVM lists as saveable, the local APIC, pending events
//! and the MP state. Written back in the order KVM needs (Firecracker's, for x86): the MP state
//! first, then registers, XSAVE, XCRs, debug registers, the LAPIC, MSRs and the events last.

use kvm_bindings::{
    Msrs, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs,
    kvm_xsave,
};
use kvm_ioctls::{Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

/// Errors reading or writing a vCPU's or a VM's KVM state.
#[derive(Debug, thiserror::Error)]
pub enum KvmStateError {
    /// A KVM call failed.
    #[error("KVM state: {what}: {source}")]
    Kvm {
        /// The call.
        what: &'static str,
        /// KVM's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// MSRs could not be put in KVM's list form.
    #[error("KVM state: {0} MSRs do not fit KVM's list")]
    Msrs(usize),
    /// KVM took fewer MSRs back than were saved.
    #[error("KVM state: KVM set {set} of {saved} MSRs (the first refused: {first:#x})")]
    MsrsRefused {
        /// How many it set.
        set: usize,
        /// How many were saved.
        saved: usize,
        /// The first it refused.
        first: u32,
    },
}

/// A KVM call's error as a state error naming the call.
pub(super) fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> KvmStateError {
    move |source| KvmStateError::Kvm { what, source }
}

/// One vCPU's state.
#[derive(Serialize, Deserialize)]
pub struct VcpuState {
    /// General registers.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers.
    pub sregs: kvm_sregs,
    /// The XSAVE area.
    pub xsave: kvm_xsave,
    /// The extended control registers.
    pub xcrs: kvm_xcrs,
    /// Debug registers.
    pub debug_regs: kvm_debugregs,
    /// The MSRs KVM lists as saveable and could read.
    pub msrs: Vec<kvm_msr_entry>,
    /// MSRs KVM lists and refused to read (left at their reset values on restore).
    pub msrs_unread: Vec<u32>,
    /// The local APIC.
    pub lapic: kvm_lapic_state,
    /// Pending exceptions, interrupts, NMIs, SMIs.
    pub events: kvm_vcpu_events,
    /// Running, halted, waiting for SIPI.
    pub mp_state: kvm_mp_state,
    /// Its TSC offset from the host's, where KVM gives it ([`super::tsc`]).
    #[serde(default)]
    pub tsc_offset: Option<u64>,
}

impl std::fmt::Debug for VcpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuState")
            .field("rip", &self.regs.rip)
            .field("msrs", &self.msrs.len())
            .field("msrs_unread", &self.msrs_unread)
            .finish_non_exhaustive()
    }
}

impl VcpuState {
    /// The MSRs KVM lists as saveable (asked of /dev/kvm once, before the vCPU threads run
    /// under their filters).
    pub fn saveable_msrs(kvm_fd: &Kvm) -> Result<Vec<u32>, KvmStateError> {
        Ok(kvm_fd.get_msr_index_list().map_err(kvm("KVM_GET_MSR_INDEX_LIST"))?.as_slice().to_vec())
    }

    /// Reads `vcpu`'s state, the MSRs among `msr_indices` ([`VcpuState::saveable_msrs`]) with it.
    /// The vCPU must not be running.
    pub fn capture(msr_indices: &[u32], vcpu: &VcpuFd) -> Result<VcpuState, KvmStateError> {
        let mp_state = vcpu.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?;
        let (msrs, msrs_unread) = read_msrs(msr_indices, vcpu)?;
        Ok(VcpuState {
            regs: vcpu.get_regs().map_err(kvm("KVM_GET_REGS"))?,
            sregs: vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?,
            xsave: vcpu.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?,
            xcrs: vcpu.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?,
            debug_regs: vcpu.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?,
            msrs,
            msrs_unread,
            lapic: vcpu.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?,
            events: vcpu.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
            mp_state,
            tsc_offset: super::tsc::offset(vcpu),
        })
    }

    /// Writes the state into `vcpu` (a new vCPU with the same CPUID as the one it was read from),
    /// then its TSC in step with the VM's clock when `clock` says where that is
    /// ([`super::tsc`]).
    pub fn restore(&self, vcpu: &VcpuFd, clock: Option<&super::tsc::ClockPair>) -> Result<(), KvmStateError> {
        self.restore_registers(vcpu)?;
        let tsc_khz = vcpu.get_tsc_khz().ok();
        if let (Some(clock), Some(saved), Some(khz)) = (clock, self.tsc_offset, tsc_khz)
            && let Some(offset) = clock.offset(saved, khz)
        {
            super::tsc::set_offset(vcpu, offset)?;
        }
        Ok(())
    }

    fn restore_registers(&self, vcpu: &VcpuFd) -> Result<(), KvmStateError> {
        vcpu.set_mp_state(self.mp_state).map_err(kvm("KVM_SET_MP_STATE"))?;
        vcpu.set_regs(&self.regs).map_err(kvm("KVM_SET_REGS"))?;
        vcpu.set_sregs(&self.sregs).map_err(kvm("KVM_SET_SREGS"))?;
        // SAFETY: the area was read by KVM_GET_XSAVE (4 KiB, the legacy size) on a vCPU of the same
        // CPUID, so it holds no feature this vCPU lacks and no more than the ioctl copies.
        unsafe { vcpu.set_xsave(&self.xsave) }.map_err(kvm("KVM_SET_XSAVE"))?;
        vcpu.set_xcrs(&self.xcrs).map_err(kvm("KVM_SET_XCRS"))?;
        vcpu.set_debug_regs(&self.debug_regs).map_err(kvm("KVM_SET_DEBUGREGS"))?;
        vcpu.set_lapic(&self.lapic).map_err(kvm("KVM_SET_LAPIC"))?;
        let msrs = Msrs::from_entries(&self.msrs).map_err(|_| KvmStateError::Msrs(self.msrs.len()))?;
        let set = vcpu.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
        if set < self.msrs.len() {
            return Err(KvmStateError::MsrsRefused { set, saved: self.msrs.len(), first: self.msrs[set].index });
        }
        vcpu.set_vcpu_events(&self.events).map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
        Ok(())
    }
}

/// Every MSR KVM lists as saveable that the vCPU lets be read, and those it refused: KVM stops
/// a read at the first refused one, so the rest is read again past it.
fn read_msrs(indices: &[u32], vcpu: &VcpuFd) -> Result<(Vec<kvm_msr_entry>, Vec<u32>), KvmStateError> {
    let mut left: &[u32] = indices;
    let (mut read, mut unread) = (Vec::new(), Vec::new());
    while !left.is_empty() {
        let entries: Vec<kvm_msr_entry> =
            left.iter().map(|&index| kvm_msr_entry { index, ..Default::default() }).collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|_| KvmStateError::Msrs(entries.len()))?;
        let n = vcpu.get_msrs(&mut msrs).map_err(kvm("KVM_GET_MSRS"))?;
        read.extend_from_slice(&msrs.as_slice()[..n]);
        if n < left.len() {
            unread.push(left[n]);
            left = &left[n + 1..];
        } else {
            left = &[];
        }
    }
    Ok((read, unread))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VM with the in-kernel irqchip and one vCPU given every CPUID feature KVM supports.
    fn vcpu(kvm_fd: &Kvm) -> (kvm_ioctls::VmFd, VcpuFd) {
        let vm = kvm_fd.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let cpuid = kvm_fd.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES).unwrap();
        vcpu.set_cpuid2(&cpuid).unwrap();
        (vm, vcpu)
    }

    #[test]
    fn a_vcpu_s_state_goes_through_a_snapshot_file_into_a_new_vcpu() {
        let Ok(kvm_fd) = Kvm::new() else {
            testkit::skip(
                "a_vcpu_s_state_goes_through_a_snapshot_file_into_a_new_vcpu",
                testkit::Lacks::Setup,
                "no /dev/kvm",
            );
            return;
        };
        let (_vm, first) = vcpu(&kvm_fd);
        let mut regs = first.get_regs().unwrap();
        (regs.rip, regs.rax, regs.rsp, regs.rflags) = (0x10_0000, 0xdead_beef, 0x8000, 0x2);
        first.set_regs(&regs).unwrap();
        // MSR_KERNEL_GS_BASE: any value a guest may write.
        const KERNEL_GS_BASE: u32 = 0xc000_0102;
        let written = Msrs::from_entries(&[kvm_msr_entry {
            index: KERNEL_GS_BASE,
            data: 0xffff_8880_1234_5000,
            ..Default::default()
        }])
        .unwrap();
        assert_eq!(first.set_msrs(&written).unwrap(), 1);
        let indices = VcpuState::saveable_msrs(&kvm_fd).unwrap();
        let state = VcpuState::capture(&indices, &first).unwrap();
        assert!(state.msrs.iter().any(|m| m.index == KERNEL_GS_BASE && m.data == 0xffff_8880_1234_5000), "{state:?}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vcpu0.snap");
        crate::snapshot::write_snapshot(&path, &state).unwrap();
        let read: VcpuState = crate::snapshot::read_snapshot(&path).unwrap();

        let (_vm2, second) = vcpu(&kvm_fd);
        read.restore(&second, None).unwrap();
        let again = VcpuState::capture(&indices, &second).unwrap();
        let r = again.regs;
        assert_eq!((r.rip, r.rax, r.rsp, r.rflags), (0x10_0000, 0xdead_beef, 0x8000, 0x2));
        assert_eq!(again.sregs.cr0, state.sregs.cr0);
        assert_eq!(again.sregs.cs.selector, state.sregs.cs.selector);
        assert!(again.msrs.iter().any(|m| m.index == KERNEL_GS_BASE && m.data == 0xffff_8880_1234_5000));
        assert_eq!(
            again.lapic.regs[..0x40],
            state.lapic.regs[..0x40],
            "the LAPIC's first registers (its ID, version, TPR)"
        );
        assert_eq!(again.xcrs.xcrs[0].value, state.xcrs.xcrs[0].value);
        assert_eq!(again.mp_state.mp_state, state.mp_state.mp_state);
    }
}

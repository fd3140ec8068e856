//! Model-specific registers every vCPU starts with.

use kvm_bindings::{Msrs, kvm_msr_entry};

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

const MISC_ENABLE_FAST_STRING: u64 = 1;
/// MTRRs enabled, default type write-back.
const MTRR_ENABLE_WRITEBACK: u64 = (1 << 11) | 6;

/// The boot MSR values: syscall and sysenter MSRs cleared, fast strings on, MTRRs enabled with
/// write-back as the default type (so the guest does not see all memory as uncached).
pub fn boot_msrs() -> Msrs {
    let values = [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_LSTAR, 0),
        (MSR_CSTAR, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MSR_MTRR_DEF_TYPE, MTRR_ENABLE_WRITEBACK),
    ];
    let entries: Vec<kvm_msr_entry> =
        values.iter().map(|&(index, data)| kvm_msr_entry { index, data, ..Default::default() }).collect();
    Msrs::from_entries(&entries).expect("fewer entries than the kvm_msrs limit")
}

/// The index of the `n`th boot MSR, for error messages when KVM refuses one.
pub fn boot_msr_index(n: usize) -> Option<u32> {
    boot_msrs().as_slice().get(n).map(|e| e.index)
}

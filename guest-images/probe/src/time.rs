//! Time from the TSC, whose rate the VMM publishes in the hypervisor CPUID timing leaf.

use core::arch::x86_64::_rdtsc;

use crate::entry;

const LEAF_HYPERVISOR: u32 = 0x4000_0000;
const LEAF_HYPERVISOR_TIMING: u32 = 0x4000_0010;
/// Rate assumed when no hypervisor publishes one: timeouts then err on the long side.
const FALLBACK_TSC_KHZ: u64 = 4_000_000;

/// Reads the time-stamp counter (allowed at CPL3; runs natively).
pub fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions.
    unsafe { _rdtsc() }
}

/// The TSC rate in kHz, if the hypervisor publishes it.
pub fn tsc_khz() -> Option<u64> {
    let max = entry::cpuid(LEAF_HYPERVISOR)?.eax;
    if max < LEAF_HYPERVISOR_TIMING {
        return None;
    }
    let khz = entry::cpuid(LEAF_HYPERVISOR_TIMING)?.eax as u64;
    (khz != 0).then_some(khz)
}

/// A point in time `micros` from now, in TSC ticks.
pub fn deadline_after_micros(micros: u64) -> u64 {
    let khz = tsc_khz().unwrap_or(FALLBACK_TSC_KHZ);
    tsc() + micros * khz / 1000
}

/// Spins until `done` returns true or the deadline passes; returns whether `done` did.
pub fn wait_until(deadline: u64, mut done: impl FnMut() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if tsc() > deadline {
            return false;
        }
        core::hint::spin_loop();
    }
}

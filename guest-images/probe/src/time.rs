//! Time from the TSC, whose rate the VMM publishes in the hypervisor CPUID timing leaf, or, on
//! VMMs that publish none (QEMU under TCG), measured against the ACPI PM timer.

use core::arch::x86_64::_rdtsc;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::{entry, port};

/// The FADT's PM timer port (0: none).
static PM_TIMER: AtomicU32 = AtomicU32::new(0);
/// The TSC rate measured against the PM timer, kHz (0: not yet).
static MEASURED_KHZ: AtomicU64 = AtomicU64::new(0);
/// The ACPI PM timer's rate, Hz.
const PM_TIMER_HZ: u64 = 3_579_545;
/// PM timer ticks the measurement spans (about 20 ms).
const PM_TIMER_SPAN: u32 = 71_591;

const LEAF_HYPERVISOR: u32 = 0x4000_0000;
const LEAF_HYPERVISOR_TIMING: u32 = 0x4000_0010;
/// Rate assumed when no hypervisor publishes one: timeouts then err on the long side.
const FALLBACK_TSC_KHZ: u64 = 4_000_000;

/// Reads the time-stamp counter (allowed at CPL3; runs natively).
pub fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions.
    unsafe { _rdtsc() }
}

/// Remembers the FADT's PM timer port, for [`tsc_khz`] on VMMs without a timing leaf.
pub fn set_pm_timer(port: u32) {
    if port <= 0xffff {
        PM_TIMER.store(port, Ordering::Relaxed);
    }
}

/// The TSC rate in kHz: what the hypervisor publishes, else measured against the ACPI PM timer
/// (once ACPI has named it; measured once).
pub fn tsc_khz() -> Option<u64> {
    published_khz().or_else(measured_khz)
}

fn published_khz() -> Option<u64> {
    let max = entry::cpuid(LEAF_HYPERVISOR)?.eax;
    if max < LEAF_HYPERVISOR_TIMING {
        return None;
    }
    let khz = entry::cpuid(LEAF_HYPERVISOR_TIMING)?.eax as u64;
    (khz != 0).then_some(khz)
}

fn measured_khz() -> Option<u64> {
    let known = MEASURED_KHZ.load(Ordering::Relaxed);
    if known != 0 {
        return Some(known);
    }
    let port = PM_TIMER.load(Ordering::Relaxed) as u16;
    if port == 0 {
        return None;
    }
    // The timer counts in 24 bits at least; differences are taken modulo 2^24.
    let ticks = |from: u32| port::inl(port).wrapping_sub(from) & 0xff_ffff;
    let first = port::inl(port);
    // A timer that does not move is not one.
    let spin_start = tsc();
    while ticks(first) == 0 {
        if tsc() - spin_start > 1 << 32 {
            return None;
        }
        core::hint::spin_loop();
    }
    let (t0, p0) = (tsc(), port::inl(port));
    let mut elapsed = 0;
    while elapsed < PM_TIMER_SPAN {
        elapsed = ticks(p0);
    }
    let t1 = tsc();
    let khz = (t1 - t0) * PM_TIMER_HZ / (elapsed as u64 * 1000);
    (khz != 0).then(|| {
        MEASURED_KHZ.store(khz, Ordering::Relaxed);
        khz
    })
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

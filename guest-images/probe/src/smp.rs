//! Starting the application processors with INIT and SIPI, as firmware or a kernel would, to
//! check that every vCPU the VMM promised comes up.

use crate::entry::{self, MAX_APS};
use crate::{json, lapic, report, time};

/// Where the real-mode trampoline is copied; the SIPI vector is this address >> 12.
const AP_TRAMPOLINE_ADDR: u64 = 0x1_0000;
/// ICR: INIT, level assert, to all but self.
const ICR_INIT_ALL_BUT_SELF: u32 = 0x000c_4500;
/// ICR: STARTUP, to all but self (the vector goes in the low byte).
const ICR_SIPI_ALL_BUT_SELF: u32 = 0x000c_4600;
/// How long to wait for the APs after each SIPI.
const AP_WAIT_MICROS: u64 = 100_000;
const EDX_HTT: u32 = 1 << 28;

/// Logical processors the CPU claims: CPUID.1:EBX[23:16] when HTT is set (and the field is
/// filled in: QEMU leaves it 0 for one vCPU), otherwise one.
fn expected_cpus() -> u32 {
    let Some(leaf1) = entry::cpuid(1) else { return 1 };
    if leaf1.edx & EDX_HTT != 0 { ((leaf1.ebx >> 16) & 0xff).max(1) } else { 1 }
}

fn ready() -> u32 {
    // SAFETY: an aligned u32 the APs increment atomically.
    unsafe { core::ptr::read_volatile(&raw const entry::ap_ready) }
}

/// Starts the APs and reports `{"probe":"cpus","expected":N,"started":N,"apic_ids":[...]}`.
/// `madt_cpus` (enabled processors in the MADT), when known, says how many to expect; CPUID
/// otherwise.
pub fn start_aps(madt_cpus: Option<u32>) {
    let expected = madt_cpus.unwrap_or_else(expected_cpus);
    if expected > 1 {
        // SAFETY: the trampoline symbols delimit bytes of the probe image; the destination is
        // low memory the VMM left free (boot information was copied out at entry).
        unsafe {
            let start = &raw const entry::ap_trampoline_start;
            let len = (&raw const entry::ap_trampoline_end).offset_from(start) as usize;
            core::ptr::copy_nonoverlapping(start, AP_TRAMPOLINE_ADDR as *mut u8, len);
        }
        lapic::send_ipi(ICR_INIT_ALL_BUT_SELF);
        let vector = (AP_TRAMPOLINE_ADDR >> 12) as u32;
        // The MP specification sends STARTUP twice; the second only if the APs did not show.
        for _ in 0..2 {
            lapic::send_ipi(ICR_SIPI_ALL_BUT_SELF | vector);
            if time::wait_until(time::deadline_after_micros(AP_WAIT_MICROS), || ready() + 1 >= expected) {
                break;
            }
        }
    }
    let started = ready() + 1;
    json::section("cpus", |o| {
        o.u64("expected", expected as u64).u64("started", started as u64).array("apic_ids", |a| {
            a.u64(lapic::id() as u64);
            for i in 0..(started as usize - 1).min(MAX_APS) {
                // SAFETY: written by AP `i` before it incremented `ap_ready`.
                a.u64(unsafe { core::ptr::read_volatile(&raw const entry::ap_apic_ids[i]) } as u64);
            }
        });
    });
    if started != expected {
        report::fail("not every CPU started");
    }
}

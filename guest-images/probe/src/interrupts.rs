//! The IDT, written at CPL3, and what the CPL0 stubs record.

use crate::entry::{self, ISR_STUB_SIZE, KERNEL_CS};
use crate::{json, power, report};

/// Interrupt gate, present, DPL0.
const GATE_INTERRUPT: u64 = 0x8e;

/// Points every IDT gate at its stub. The IDT is ordinary user-writable memory already loaded
/// with `lidt` at CPL0; gates only need to be valid by the time interrupts are enabled.
pub fn install() {
    let stubs = &raw const entry::isr_stubs as u64;
    for vector in 0..256u64 {
        let handler = stubs + vector * ISR_STUB_SIZE;
        let low =
            (handler & 0xffff) | (KERNEL_CS as u64) << 16 | GATE_INTERRUPT << 40 | ((handler >> 16) & 0xffff) << 48;
        let high = handler >> 32;
        // SAFETY: the probe is single-threaded and interrupts are still disabled.
        unsafe {
            let idt = &raw mut entry::idt;
            (*idt)[vector as usize * 2] = low;
            (*idt)[vector as usize * 2 + 1] = high;
        }
    }
}

/// How many times `vector` has been delivered.
pub fn count(vector: u8) -> u64 {
    // SAFETY: an aligned u64 that the CPL0 stub increments atomically.
    unsafe { core::ptr::read_volatile(&raw const entry::irq_counts[vector as usize]) }
}

/// CPL3 landing point after a CPU exception: reports it and ends the run as a panic.
#[unsafe(no_mangle)]
extern "C" fn probe_fault() -> ! {
    // SAFETY: written once by the CPL0 exception stub before it returned here.
    let [vector, error, rip, cr2] = unsafe { core::ptr::read_volatile(&raw const entry::fault_info) };
    json::section("fault", |o| {
        o.u64("vector", vector).u64("error", error).u64("rip", rip).u64("cr2", cr2);
    });
    report::fail("cpu exception");
    report::done();
    power::panic()
}

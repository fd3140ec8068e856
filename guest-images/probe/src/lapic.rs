//! The local APIC, through its MMIO page (mapped user-accessible and uncached).

/// Base of the xAPIC MMIO page.
const LAPIC_BASE: u64 = 0xfee0_0000;
const REG_ID: u64 = 0x20;
const REG_SVR: u64 = 0xf0;
/// Spurious-interrupt vector register: APIC software-enabled, spurious vector 0xff.
const SVR_ENABLE_SPURIOUS_FF: u32 = 0x1ff;
const REG_ICR_LOW: u64 = 0x300;
const REG_ICR_HIGH: u64 = 0x310;
/// ICR delivery status: the IPI is still being sent.
const ICR_PENDING: u32 = 1 << 12;

fn read(reg: u64) -> u32 {
    // SAFETY: the LAPIC page is identity-mapped; an aligned 32-bit MMIO read.
    unsafe { core::ptr::read_volatile((LAPIC_BASE + reg) as *const u32) }
}

fn write(reg: u64, value: u32) {
    // SAFETY: as for `read`; writes to LAPIC registers have no effect on Rust memory.
    unsafe { core::ptr::write_volatile((LAPIC_BASE + reg) as *mut u32, value) }
}

/// Software-enables the local APIC; until then it accepts no fixed interrupts (MSIs).
pub fn enable() {
    write(REG_SVR, SVR_ENABLE_SPURIOUS_FF);
}

/// This CPU's APIC ID.
pub fn id() -> u32 {
    read(REG_ID) >> 24
}

/// Sends an IPI described by the ICR low word `icr` (destination field 0) and waits until the
/// APIC has sent it.
pub fn send_ipi(icr: u32) {
    write(REG_ICR_HIGH, 0);
    write(REG_ICR_LOW, icr);
    while read(REG_ICR_LOW) & ICR_PENDING != 0 {
        core::hint::spin_loop();
    }
}

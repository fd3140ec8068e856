//! `probe.hold=MS`: after its checks the probe waits for the ACPI power button, the way a kernel
//! honours a graceful shutdown request: the DSDT's Generic Event Device (`ACPI0013`) names the
//! GSI, the IOAPIC routes it to a vector, and the CPL0 stub counts its arrival.

use crate::acpi::Acpi;
use crate::{interrupts, json, lapic, mmio, report, time};

/// The vector the power button's GSI is routed to.
const VECTOR: u8 = 0x60;
/// IOAPIC register select and window offsets.
const IOREGSEL: u64 = 0x00;
const IOWIN: u64 = 0x10;
/// First redirection table register.
const IOREDTBL: u32 = 0x10;

fn ioapic_write(base: u64, register: u32, value: u32) {
    mmio::write(base + IOREGSEL, register);
    mmio::write(base + IOWIN, value);
}

/// Waits up to `hold_ms` for the power button; says `{"probe":"holding",...}` once a press would
/// be seen, reports `{"probe":"hold",...}` and returns whether it was pressed.
pub fn hold(acpi: Option<&Acpi>, hold_ms: u32) -> bool {
    let (Some(gsi), Some(ioapic)) = (acpi.and_then(|a| a.power_button_gsi), acpi.and_then(|a| a.ioapic)) else {
        report::fail("probe.hold: no power button (GED) or IOAPIC in the ACPI tables");
        return false;
    };
    // Fixed delivery, physical destination, edge, active high, unmasked, to this CPU.
    ioapic_write(ioapic, IOREDTBL + 2 * gsi, VECTOR as u32);
    ioapic_write(ioapic, IOREDTBL + 2 * gsi + 1, lapic::id() << 24);
    let before = interrupts::count(VECTOR);
    // From here a press is seen: the host may press now (an earlier press is lost, as on
    // hardware before the OS routes the GED's interrupt).
    json::section("holding", |o| {
        o.u64("gsi", gsi as u64).u64("ms", hold_ms as u64);
    });
    let start = time::tsc();
    let pressed =
        time::wait_until(time::deadline_after_micros(hold_ms as u64 * 1000), || interrupts::count(VECTOR) != before);
    let khz = time::tsc_khz().unwrap_or(1);
    json::section("hold", |o| {
        o.u64("gsi", gsi as u64).bool("power_button", pressed).u64("waited_ms", (time::tsc() - start) / khz);
    });
    pressed
}

//! Ending the run: power off, or signal a panic to the VMM.

use crate::port;

/// driverlab's ACPI sleep control register (hardware-reduced ACPI, also named in the FADT).
const SLEEP_CONTROL_PORT: u16 = 0x600;
/// SLP_TYP = 5 (S5, soft off) with SLP_EN.
const SLEEP_S5: u8 = (5 << 2) | (1 << 5);
/// The pvpanic device's port.
const PVPANIC_PORT: u16 = 0x505;
/// pvpanic's "guest panicked" event.
const PVPANIC_PANICKED: u8 = 1;
/// QEMU's `isa-debug-exit` device as the benchmark configures it (`iobase=0xf4`).
const QEMU_DEBUG_EXIT_PORT: u16 = 0xf4;

/// Powers the machine off. Tries driverlab's sleep register, then QEMU's debug-exit port.
pub fn poweroff() -> ! {
    port::outb(SLEEP_CONTROL_PORT, SLEEP_S5);
    port::outb(QEMU_DEBUG_EXIT_PORT, 0);
    halt_forever()
}

/// Tells the VMM the guest panicked (pvpanic), then powers off if the VMM ignored it.
pub fn panic() -> ! {
    port::outb(PVPANIC_PORT, PVPANIC_PANICKED);
    poweroff()
}

fn halt_forever() -> ! {
    // CPL3 cannot `hlt`; nothing is left to do but wait for the VMM to stop the vCPU.
    loop {
        core::hint::spin_loop();
    }
}

//! Ending the run: power off, or signal a panic to the VMM.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::port;

/// The FADT's PM1a control port (0: none), and the DSDT's `\_S5` SLP_TYPa in bits 16..19, set
/// while the ACPI tables are read.
static PM1A_CONTROL: AtomicU32 = AtomicU32::new(0);
static S5_SLEEP_TYPE: AtomicU32 = AtomicU32::new(0);
/// PM1 control's SLP_EN bit.
const PM1_SLP_EN: u16 = 1 << 13;

/// Remembers the FADT's PM1a control port.
pub fn set_pm1a_control(port: u32) {
    PM1A_CONTROL.store(port, Ordering::Relaxed);
}

/// Remembers the DSDT's SLP_TYPa for S5.
pub fn set_s5_sleep_type(typ: u8) {
    S5_SLEEP_TYPE.store(typ as u32 & 7, Ordering::Relaxed);
}

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

/// Powers the machine off. Tries driverlab's sleep register, then the FADT's PM1a control
/// (QEMU's q35), then QEMU's debug-exit port.
pub fn poweroff() -> ! {
    port::outb(SLEEP_CONTROL_PORT, SLEEP_S5);
    let pm1a = PM1A_CONTROL.load(Ordering::Relaxed);
    if pm1a != 0 && pm1a <= 0xffff {
        let typ = S5_SLEEP_TYPE.load(Ordering::Relaxed) as u16;
        port::outw(pm1a as u16, (typ << 10) | PM1_SLP_EN);
    }
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

//! Report output on COM1, or on COM2 when `probe.out=com2` asks for it. Lines are written with
//! `rep outsb`, so a whole report line costs one VM exit.

use core::sync::atomic::{AtomicU16, Ordering};

use crate::port;

/// Base port of the first 16550 UART.
pub const COM1: u16 = 0x3f8;
/// Base port of the second 16550 UART.
pub const COM2: u16 = 0x2f8;
/// The scratch register's offset.
const SCRATCH: u16 = 7;

/// Where the report goes.
static REPORT_PORT: AtomicU16 = AtomicU16::new(COM1);

/// Writes bytes to the report port's transmit register.
///
/// The probe does not poll the line status register: the VMMs it targets (driverlab, QEMU)
/// accept every byte at once, and each poll would cost a VM exit.
pub fn write(bytes: &[u8]) {
    port::outsb(REPORT_PORT.load(Ordering::Relaxed), bytes);
}

/// Whether a 16550 answers at `base` (its scratch register keeps what is written).
pub fn present(base: u16) -> bool {
    [0x5a, 0xa5].iter().all(|&v| {
        port::outb(base + SCRATCH, v);
        port::inb(base + SCRATCH) == v
    })
}

/// Sends the rest of the report to the UART at `base`.
pub fn report_to(base: u16) {
    REPORT_PORT.store(base, Ordering::Relaxed);
}

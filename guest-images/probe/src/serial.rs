//! COM1 output. Lines are written with `rep outsb`, so a whole report line costs one VM exit.

use crate::port;

/// Base port of the first 16550 UART.
const COM1: u16 = 0x3f8;

/// Writes bytes to COM1's transmit register.
///
/// The probe does not poll the line status register: the VMMs it targets (driverlab, QEMU)
/// accept every byte at once, and each poll would cost a VM exit.
pub fn write(bytes: &[u8]) {
    port::outsb(COM1, bytes);
}

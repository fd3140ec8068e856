//! x86 port I/O. The probe runs at CPL3 with IOPL=3, so these work without a ring switch.

use core::arch::asm;

/// Writes one byte to an I/O port.
pub fn outb(port: u16, value: u8) {
    // SAFETY: port writes have no memory effects visible to Rust; the probe owns the machine.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags)) }
}

/// Reads one byte from an I/O port.
pub fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: port reads have no memory effects visible to Rust; the probe owns the machine.
    unsafe { asm!("in al, dx", in("dx") port, out("al") value, options(nomem, nostack, preserves_flags)) }
    value
}

/// Writes a 16-bit word to an I/O port.
pub fn outw(port: u16, value: u16) {
    // SAFETY: port writes have no memory effects visible to Rust; the probe owns the machine.
    unsafe { asm!("out dx, ax", in("dx") port, in("ax") value, options(nomem, nostack, preserves_flags)) }
}

/// Reads a 32-bit word from an I/O port.
pub fn inl(port: u16) -> u32 {
    let value: u32;
    // SAFETY: port reads have no memory effects visible to Rust; the probe owns the machine.
    unsafe { asm!("in eax, dx", in("dx") port, out("eax") value, options(nomem, nostack, preserves_flags)) }
    value
}

/// Writes a buffer to one port with a single `rep outsb`: one VM exit for the whole buffer.
pub fn outsb(port: u16, bytes: &[u8]) {
    // SAFETY: `rep outsb` only reads `bytes.len()` bytes from `bytes`.
    unsafe {
        asm!("rep outsb", in("dx") port, inout("rsi") bytes.as_ptr() => _,
             inout("rcx") bytes.len() => _, options(nostack, preserves_flags, readonly))
    }
}

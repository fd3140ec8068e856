//! The ways a guest ends its run: ACPI sleep and reset registers, the i8042 reset line, pvpanic.
//!
//! Port map (also described to the guest by the FADT and DSDT once ACPI tables exist):
//!
//! | port  | register                                   | effect                            |
//! |-------|--------------------------------------------|-----------------------------------|
//! | 0x600 | sleep control (SLP_TYP bits 4:2, SLP_EN 5) | SLP_TYP=5 with SLP_EN: power off  |
//! | 0x601 | sleep status                               | reads 0                           |
//! | 0x602 | reset register                             | writing [`ACPI_RESET_VALUE`]: reset |
//! | 0x64  | i8042 command                              | 0xFE: reset (pulse the reset line) |
//! | 0x505 | pvpanic                                    | bit 0 written: guest panicked     |

use std::sync::Arc;

use vm_device::bus::BusDevice;
use vm_device::guest_event::{GuestEvent, GuestEventSink};

/// Port of the ACPI sleep control register; the sleep status and reset registers follow it.
pub const ACPI_PM_BASE: u64 = 0x600;
/// Ports used by [`AcpiPower`].
pub const ACPI_PM_LEN: u64 = 3;
/// Value the guest writes to the reset register to reset.
pub const ACPI_RESET_VALUE: u8 = 0x06;
/// Sleep type for S5 (soft off).
pub const SLP_TYP_S5: u8 = 5;
const SLP_EN: u8 = 1 << 5;

/// First i8042 port (data); the command/status port is at +4.
pub const I8042_BASE: u64 = 0x60;
/// Ports used by [`I8042`].
pub const I8042_LEN: u64 = 5;

/// The pvpanic port (QEMU's ISA pvpanic device, ACPI id QEMU0001).
pub const PVPANIC_PORT: u64 = 0x505;
const PVPANIC_PANICKED: u8 = 1 << 0;
const PVPANIC_CRASH_LOADED: u8 = 1 << 1;

/// ACPI hardware-reduced sleep control/status and reset registers.
pub struct AcpiPower {
    sink: Arc<dyn GuestEventSink>,
}

impl AcpiPower {
    /// Registers that report to `sink`.
    pub fn new(sink: Arc<dyn GuestEventSink>) -> Self {
        AcpiPower { sink }
    }
}

impl BusDevice for AcpiPower {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else { return };
        match offset {
            0 if value & SLP_EN != 0 && (value >> 2) & 0x7 == SLP_TYP_S5 => self.sink.guest_event(GuestEvent::PowerOff),
            2 if value == ACPI_RESET_VALUE => self.sink.guest_event(GuestEvent::Reset),
            _ => tracing::debug!("ACPI PM register {offset} written with {value:#x}, ignored"),
        }
    }
}

/// The i8042 keyboard controller's reset line: vm-superio's `I8042Device`, whose reset trigger
/// ends the run.
pub struct I8042 {
    device: vm_superio::I8042Device<ResetTrigger>,
}

/// Turns the i8042's reset into a [`GuestEvent::Reset`].
struct ResetTrigger(Arc<dyn GuestEventSink>);

impl vm_superio::Trigger for ResetTrigger {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        self.0.guest_event(GuestEvent::Reset);
        Ok(())
    }
}

impl I8042 {
    /// A controller that reports resets to `sink`.
    pub fn new(sink: Arc<dyn GuestEventSink>) -> Self {
        I8042 { device: vm_superio::I8042Device::new(ResetTrigger(sink)) }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        // Status 0: output buffer empty, input buffer empty.
        data.fill(self.device.read(offset as u8));
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let Some(&value) = data.first() {
            let Ok(()) = self.device.write(offset as u8, value);
        }
    }
}

/// QEMU's pvpanic ISA device: the guest announces a panic by writing bit 0.
pub struct PvPanic {
    sink: Arc<dyn GuestEventSink>,
}

impl PvPanic {
    /// A pvpanic port that reports panics to `sink`.
    pub fn new(sink: Arc<dyn GuestEventSink>) -> Self {
        PvPanic { sink }
    }
}

impl BusDevice for PvPanic {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = PVPANIC_PANICKED | PVPANIC_CRASH_LOADED;
        }
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if data.first().is_some_and(|v| v & PVPANIC_PANICKED != 0) {
            self.sink.guest_event(GuestEvent::Panic);
        }
    }
}

/// The POST-code port 0x80: Linux writes it for I/O delays. Accepted and dropped, quietly.
pub struct PostCode;

impl BusDevice for PostCode {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn write(&mut self, _offset: u64, _data: &[u8]) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Events(Mutex<Vec<GuestEvent>>);

    impl GuestEventSink for Events {
        fn guest_event(&self, event: GuestEvent) {
            self.0.lock().unwrap().push(event);
        }
    }

    #[test]
    fn sleep_register_powers_off_only_on_s5_with_enable() {
        let events = Arc::new(Events::default());
        let mut pm = AcpiPower::new(events.clone());
        pm.write(0, &[SLP_TYP_S5 << 2]); // no SLP_EN
        pm.write(0, &[(3 << 2) | SLP_EN]); // S3: not supported, ignored
        assert!(events.0.lock().unwrap().is_empty());
        pm.write(0, &[(SLP_TYP_S5 << 2) | SLP_EN]);
        pm.write(2, &[0x01]);
        pm.write(2, &[ACPI_RESET_VALUE]);
        assert_eq!(*events.0.lock().unwrap(), vec![GuestEvent::PowerOff, GuestEvent::Reset]);
    }

    #[test]
    fn i8042_and_pvpanic() {
        let events = Arc::new(Events::default());
        let mut kbd = I8042::new(events.clone());
        kbd.write(0, &[0xfe]); // data port: not a command
        kbd.write(4, &[0xd1]);
        kbd.write(4, &[0xfe]);
        let mut panic = PvPanic::new(events.clone());
        let mut caps = [0u8];
        panic.read(0, &mut caps);
        assert_eq!(caps[0], 3);
        panic.write(0, &[PVPANIC_CRASH_LOADED]);
        panic.write(0, &[PVPANIC_PANICKED]);
        assert_eq!(*events.0.lock().unwrap(), vec![GuestEvent::Reset, GuestEvent::Panic]);
    }
}

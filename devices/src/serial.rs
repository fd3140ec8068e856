//! COM1 and COM2: 16550 UARTs from vm-superio whose interrupt is an EventFd (wired to an irqfd) and whose
//! output goes to any writer (stdout, a file).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use vm_device::bus::BusDevice;

/// I/O port base of COM1.
pub const COM1_BASE: u64 = 0x3f8;
/// Legacy IRQ line of COM1.
pub const COM1_IRQ: u32 = 4;
/// I/O port base of COM2.
pub const COM2_BASE: u64 = 0x2f8;
/// Legacy IRQ line of COM2.
pub const COM2_IRQ: u32 = 3;
/// Number of registers of either port.
pub const UART_LEN: u64 = 8;

/// Raises the UART's interrupt by signalling an EventFd.
pub struct EventFdTrigger(EventFd);

impl Trigger for EventFdTrigger {
    type E = std::io::Error;

    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// What the guest wrote to the serial port, observed from outside.
#[derive(Debug, Default)]
pub struct SerialStats {
    first_byte: OnceLock<Instant>,
    bytes: AtomicU64,
}

impl SerialStats {
    /// When the guest wrote its first byte, if it has.
    pub fn first_byte(&self) -> Option<Instant> {
        self.first_byte.get().copied()
    }

    /// Bytes the guest has written.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// The writer behind the UART: forwards bytes to the sink and keeps the statistics.
struct Output {
    sink: Box<dyn Write + Send>,
    stats: Arc<SerialStats>,
    failed: bool,
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !buf.is_empty() {
            self.stats.first_byte.get_or_init(Instant::now);
            self.stats.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        }
        if self.failed {
            // The sink is gone (a closed pipe, a full disk): keep the guest running regardless.
            return Ok(buf.len());
        }
        match self.sink.write_all(buf) {
            Ok(()) => Ok(buf.len()),
            Err(e) => {
                tracing::warn!("serial output failed, dropping further output: {e}");
                self.failed = true;
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.sink.flush()
    }
}

/// A 16550 UART on the port bus.
pub struct SerialPort {
    uart: Serial<EventFdTrigger, NoEvents, Output>,
}

impl SerialPort {
    /// A UART that raises `interrupt` and writes what the guest sends to `sink`.
    pub fn new(interrupt: EventFd, sink: Box<dyn Write + Send>) -> (Self, Arc<SerialStats>) {
        let stats = Arc::new(SerialStats::default());
        let output = Output { sink, stats: stats.clone(), failed: false };
        (SerialPort { uart: Serial::new(EventFdTrigger(interrupt), output) }, stats)
    }

    /// Flushes buffered output to the sink.
    pub fn flush(&mut self) {
        let _ = self.uart.writer_mut().flush();
    }
}

impl BusDevice for SerialPort {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Some(first), Ok(reg)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.uart.read(reg);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&value), Ok(reg)) = (data.first(), u8::try_from(offset))
            && let Err(e) = self.uart.write(reg, value)
        {
            tracing::warn!("serial register write failed: {e:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn transmits_and_interrupts_when_enabled() {
        let out = Shared::default();
        let irq = EventFd::new(libc_nonblock()).unwrap();
        let (mut port, stats) = SerialPort::new(irq.try_clone().unwrap(), Box::new(out.clone()));
        assert!(stats.first_byte().is_none());
        port.write(1, &[0x02]); // IER: transmitter holding register empty interrupt
        let _ = irq.read();
        let mut iir = [0u8; 1];
        port.read(2, &mut iir); // reading IIR acknowledges a pending THR-empty interrupt
        for b in b"hi\n" {
            port.write(0, &[*b]);
        }
        assert_eq!(out.0.lock().unwrap().as_slice(), b"hi\n");
        assert_eq!(stats.bytes(), 3);
        assert!(stats.first_byte().is_some());
        assert!(irq.read().unwrap() >= 1);
        let mut lsr = [0u8; 1];
        port.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "THR empty");
    }

    fn libc_nonblock() -> i32 {
        vmm_sys_util::eventfd::EFD_NONBLOCK
    }
}

//! COM1 and COM2: 16550 UARTs from vm-superio whose interrupt is an EventFd (wired to an irqfd) and whose
//! output goes to any writer (stdout, a file).

use std::collections::VecDeque;
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

/// A UART's registers and receive FIFO, as a snapshot keeps them (vm-superio's `SerialState`,
/// with serde).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SerialPortState {
    /// Divisor latch, low and high byte.
    pub baud_divisor: [u8; 2],
    /// Interrupt enable register.
    pub interrupt_enable: u8,
    /// Interrupt identification register.
    pub interrupt_identification: u8,
    /// Line control register.
    pub line_control: u8,
    /// Line status register.
    pub line_status: u8,
    /// Modem control register.
    pub modem_control: u8,
    /// Modem status register.
    pub modem_status: u8,
    /// Scratch register.
    pub scratch: u8,
    /// Received bytes the guest has not read.
    pub in_buffer: Vec<u8>,
}

/// Errors making a UART from a saved state.
#[derive(Debug, thiserror::Error)]
#[error("serial port state: {0}")]
pub struct SerialStateError(String);

/// A 16550 UART on the port bus.
pub struct SerialPort {
    uart: Serial<EventFdTrigger, NoEvents, Output>,
    /// Bytes queued for the guest that its receive FIFO has no room for yet.
    input: VecDeque<u8>,
}

impl SerialPort {
    /// A UART that raises `interrupt` and writes what the guest sends to `sink`.
    pub fn new(interrupt: EventFd, sink: Box<dyn Write + Send>) -> (Self, Arc<SerialStats>) {
        let stats = Arc::new(SerialStats::default());
        let output = Output { sink, stats: stats.clone(), failed: false };
        (SerialPort { uart: Serial::new(EventFdTrigger(interrupt), output), input: VecDeque::new() }, stats)
    }

    /// Flushes buffered output to the sink.
    pub fn flush(&mut self) {
        let _ = self.uart.writer_mut().flush();
    }

    /// Queues `bytes` for the guest to read: the receive FIFO takes what it has room for now
    /// (raising the received-data interrupt if the guest enabled it), the rest as the guest
    /// reads.
    pub fn queue_input(&mut self, bytes: &[u8]) {
        self.input.extend(bytes);
        self.fill_fifo();
    }

    /// Moves queued input into the receive FIFO, as far as it has room.
    fn fill_fifo(&mut self) {
        let room = self.uart.fifo_capacity().min(self.input.len());
        if room == 0 {
            return;
        }
        let chunk: Vec<u8> = self.input.iter().take(room).copied().collect();
        match self.uart.enqueue_raw_bytes(&chunk) {
            Ok(taken) => drop(self.input.drain(..taken)),
            Err(e) => tracing::warn!("serial input: {e:?}"),
        }
    }

    /// Its registers and receive FIFO.
    pub fn state(&self) -> SerialPortState {
        let s = self.uart.state();
        SerialPortState {
            baud_divisor: [s.baud_divisor_low, s.baud_divisor_high],
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// A UART in `state` that raises `interrupt` and writes to `sink` (a restored VM's).
    pub fn from_state(
        state: &SerialPortState,
        interrupt: EventFd,
        sink: Box<dyn Write + Send>,
    ) -> Result<(Self, Arc<SerialStats>), SerialStateError> {
        let saved = vm_superio::serial::SerialState {
            baud_divisor_low: state.baud_divisor[0],
            baud_divisor_high: state.baud_divisor[1],
            interrupt_enable: state.interrupt_enable,
            interrupt_identification: state.interrupt_identification,
            line_control: state.line_control,
            line_status: state.line_status,
            modem_control: state.modem_control,
            modem_status: state.modem_status,
            scratch: state.scratch,
            in_buffer: state.in_buffer.clone(),
        };
        let stats = Arc::new(SerialStats::default());
        let output = Output { sink, stats: stats.clone(), failed: false };
        let uart = Serial::from_state(&saved, EventFdTrigger(interrupt), NoEvents, output)
            .map_err(|e| SerialStateError(format!("{e:?}")))?;
        Ok((SerialPort { uart, input: VecDeque::new() }, stats))
    }
}

impl BusDevice for SerialPort {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Some(first), Ok(reg)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.uart.read(reg);
        }
        if offset == 0 && !self.input.is_empty() {
            // The guest took a byte from the receive buffer: top it up.
            self.fill_fifo();
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

    #[test]
    fn a_port_s_state_makes_the_same_port() {
        let irq = EventFd::new(libc_nonblock()).unwrap();
        let (mut port, _) = SerialPort::new(irq.try_clone().unwrap(), Box::new(Shared::default()));
        port.write(3, &[0x83]); // LCR: DLAB set, 8 bits
        port.write(0, &[0x01]); // divisor low: 115200 baud
        port.write(3, &[0x03]); // LCR: DLAB clear
        port.write(7, &[0x5a]); // scratch
        port.write(1, &[0x01]); // IER: received data
        let state = port.state();
        let json = serde_json::to_string(&state).unwrap();
        let back: SerialPortState = serde_json::from_str(&json).unwrap();
        let out = Shared::default();
        let (mut restored, _) = SerialPort::from_state(&back, irq, Box::new(out.clone())).unwrap();
        assert_eq!(restored.state(), state);
        let mut scratch = [0u8; 1];
        restored.read(7, &mut scratch);
        assert_eq!(scratch[0], 0x5a);
        restored.write(0, b"x");
        assert_eq!(out.0.lock().unwrap().as_slice(), b"x", "the restored port writes to its new sink");
        let full = SerialPortState { in_buffer: vec![0; 4096], ..state };
        assert!(SerialPort::from_state(&full, EventFd::new(0).unwrap(), Box::new(Shared::default())).is_err());
    }

    #[test]
    fn queued_input_reaches_the_guest_past_the_fifo_s_size() {
        let irq = EventFd::new(libc_nonblock()).unwrap();
        let (mut port, _) = SerialPort::new(irq.try_clone().unwrap(), Box::new(Shared::default()));
        port.write(1, &[0x01]); // IER: received data available
        let line: Vec<u8> = (0..200u8).map(|i| b'a' + i % 26).chain(*b"\n").collect();
        port.queue_input(&line);
        assert!(irq.read().unwrap() >= 1, "the guest is told that data arrived");
        let mut got = Vec::new();
        for _ in 0..line.len() + 10 {
            let mut lsr = [0u8; 1];
            port.read(5, &mut lsr);
            if lsr[0] & 0x01 == 0 {
                break;
            }
            let mut byte = [0u8; 1];
            port.read(0, &mut byte);
            got.push(byte[0]);
        }
        assert_eq!(got, line, "every byte, in order, then the buffer empty");
        assert!(port.input.is_empty());
    }

    fn libc_nonblock() -> i32 {
        vmm_sys_util::eventfd::EFD_NONBLOCK
    }
}

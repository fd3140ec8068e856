//! The conformance test device: what a passthrough path must get right, in one small function.
//!
//! - BAR 0 (4 KiB, trapped): identification, scratch registers, and a DMA engine started by a
//!   doorbell that writes a pattern to, or checksums, guest memory at an IOVA, then signals MSI-X
//!   vector 0. DMA outside what the client mapped is refused and counted as a fault.
//! - BAR 1 (4 KiB): the MSI-X table (at 0) and pending bits (at 0x800), emulated by the VMM.
//! - BAR 2 (4 KiB): plain shared memory the client may mmap into the guest.
//!
//! IDs d1ab:7e57 are not assigned to anyone; driverlab uses them for this device only.

use std::fs::File;
use std::sync::Arc;

use super::dma::DmaSpace;
use super::server::{Model, ModelBar, MsixVectors};
use pci::config::BarKind;
use pci::{PciConfiguration, PciIds, msix};

/// Vendor ID of the test device.
pub const VENDOR: u16 = 0xd1ab;
/// Device ID of the test device.
pub const DEVICE: u16 = 0x7e57;
/// Register: reads "DLTD".
pub const REG_MAGIC: u64 = 0x00;
/// Register: interface version.
pub const REG_VERSION: u64 = 0x04;
/// Registers: two read/write scratch words.
pub const REG_SCRATCH: u64 = 0x08;
/// Register: DMA address, low word.
pub const REG_DMA_ADDR_LO: u64 = 0x10;
/// Register: DMA address, high word.
pub const REG_DMA_ADDR_HI: u64 = 0x14;
/// Register: DMA length in bytes (at most 4096).
pub const REG_DMA_LEN: u64 = 0x18;
/// Register: the 32-bit pattern a DMA write repeats.
pub const REG_DMA_PATTERN: u64 = 0x1c;
/// Register: doorbell; writing a command starts it.
pub const REG_DOORBELL: u64 = 0x20;
/// Register: status of the last command.
pub const REG_STATUS: u64 = 0x24;
/// Register: checksum (wrapping sum of bytes) of the last DMA read.
pub const REG_RESULT: u64 = 0x28;
/// Register: DMA faults so far.
pub const REG_FAULTS: u64 = 0x2c;
/// Command: write the pattern to the DMA address.
pub const CMD_DMA_WRITE: u32 = 1;
/// Command: read from the DMA address and checksum it.
pub const CMD_DMA_READ: u32 = 2;
/// Status: idle.
pub const STATUS_IDLE: u32 = 0;
/// Status: the last command completed.
pub const STATUS_DONE: u32 = 1;
/// Status: the last command's DMA was refused.
pub const STATUS_FAULT: u32 = 2;
/// "DLTD".
pub const MAGIC: u32 = u32::from_le_bytes(*b"DLTD");
const MAX_DMA: u32 = 4096;
const BAR_SIZE: u64 = 0x1000;
const MSIX_VECTORS: u16 = 2;

/// The test device.
pub struct TestDevice {
    config: PciConfiguration,
    scratch: [u32; 2],
    dma_addr: u64,
    dma_len: u32,
    pattern: u32,
    status: u32,
    result: u32,
    faults: u32,
    shared: File,
    dma: Arc<DmaSpace>,
    vectors: Arc<MsixVectors>,
}

fn config_space() -> PciConfiguration {
    let ids = PciIds {
        vendor: VENDOR,
        device: DEVICE,
        subsystem_vendor: VENDOR,
        subsystem: DEVICE,
        class: [0xff, 0, 0],
        revision: 1,
    };
    let mut config = PciConfiguration::new(ids);
    for bar in 0..3 {
        config.add_bar(bar, BAR_SIZE, BarKind::Memory32).expect("valid BAR");
    }
    // MSI-X: table at BAR 1 offset 0, pending bits at BAR 1 offset 0x800.
    let mut body = Vec::new();
    body.extend_from_slice(&(MSIX_VECTORS - 1).to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&(0x800u32 | 1).to_le_bytes());
    let writable = (msix::CONTROL_ENABLE | msix::CONTROL_FUNCTION_MASK).to_le_bytes();
    config.add_capability(msix::CAPABILITY_ID, &body, &writable).expect("room for MSI-X");
    config
}

impl TestDevice {
    /// A test device in its power-on state.
    pub fn new() -> std::io::Result<Self> {
        let shared = memfd::MemfdOptions::default()
            .close_on_exec(true)
            .create("driverlab-testdev-bar2")
            .map_err(std::io::Error::other)?
            .into_file();
        shared.set_len(BAR_SIZE)?;
        Ok(TestDevice {
            config: config_space(),
            scratch: [0; 2],
            dma_addr: 0,
            dma_len: 0,
            pattern: 0,
            status: STATUS_IDLE,
            result: 0,
            faults: 0,
            shared,
            dma: Arc::new(DmaSpace::new()),
            vectors: Arc::new(MsixVectors::default()),
        })
    }

    fn run(&mut self, command: u32) {
        let len = self.dma_len.min(MAX_DMA) as usize;
        let outcome = match command {
            CMD_DMA_WRITE => {
                let data: Vec<u8> = self.pattern.to_le_bytes().iter().copied().cycle().take(len).collect();
                self.dma.write(self.dma_addr, &data).map(|_| None)
            }
            CMD_DMA_READ => {
                let mut data = vec![0u8; len];
                self.dma
                    .read(self.dma_addr, &mut data)
                    .map(|_| Some(data.iter().fold(0u32, |a, &b| a.wrapping_add(b as u32))))
            }
            _ => return,
        };
        match outcome {
            Ok(sum) => {
                self.status = STATUS_DONE;
                if let Some(sum) = sum {
                    self.result = sum;
                }
            }
            Err(_) => {
                self.status = STATUS_FAULT;
                self.faults += 1;
            }
        }
        if self.vectors.signal(0) {
            self.dma.count_interrupt();
        }
    }
}

impl Model for TestDevice {
    fn name(&self) -> &'static str {
        "testdev"
    }

    fn config(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }

    fn bars(&self) -> Vec<Option<ModelBar>> {
        vec![
            Some(ModelBar { size: BAR_SIZE, shared: None }),
            Some(ModelBar { size: BAR_SIZE, shared: None }),
            Some(ModelBar { size: BAR_SIZE, shared: self.shared.try_clone().ok() }),
        ]
    }

    fn msix_vectors(&self) -> u32 {
        MSIX_VECTORS as u32
    }

    fn bar_read(&mut self, bar: u32, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let value = match (bar, offset & !3) {
            (0, REG_MAGIC) => MAGIC,
            (0, REG_VERSION) => 1,
            (0, REG_SCRATCH) => self.scratch[0],
            (0, 0x0c) => self.scratch[1],
            (0, REG_DMA_ADDR_LO) => self.dma_addr as u32,
            (0, REG_DMA_ADDR_HI) => (self.dma_addr >> 32) as u32,
            (0, REG_DMA_LEN) => self.dma_len,
            (0, REG_DMA_PATTERN) => self.pattern,
            (0, REG_STATUS) => self.status,
            (0, REG_RESULT) => self.result,
            (0, REG_FAULTS) => self.faults,
            (2, _) => {
                let _ = std::os::unix::fs::FileExt::read_at(&self.shared, data, offset);
                return;
            }
            _ => 0,
        };
        let shift = (offset & 3) * 8;
        for (i, b) in data.iter_mut().enumerate() {
            *b = value.checked_shr(shift as u32 + i as u32 * 8).unwrap_or(0) as u8;
        }
    }

    fn bar_write(&mut self, bar: u32, offset: u64, data: &[u8]) {
        if bar == 2 {
            let _ = std::os::unix::fs::FileExt::write_at(&self.shared, data, offset);
            return;
        }
        if bar != 0 || data.len() != 4 {
            return;
        }
        let value = u32::from_le_bytes(data.try_into().expect("4 bytes"));
        match offset {
            REG_SCRATCH => self.scratch[0] = value,
            0x0c => self.scratch[1] = value,
            REG_DMA_ADDR_LO => self.dma_addr = (self.dma_addr & !0xffff_ffff) | value as u64,
            REG_DMA_ADDR_HI => self.dma_addr = (self.dma_addr & 0xffff_ffff) | (value as u64) << 32,
            REG_DMA_LEN => self.dma_len = value,
            REG_DMA_PATTERN => self.pattern = value,
            REG_DOORBELL => self.run(value),
            _ => {}
        }
    }

    fn reset(&mut self) {
        self.config = config_space();
        self.scratch = [0; 2];
        self.dma_addr = 0;
        self.dma_len = 0;
        self.pattern = 0;
        self.status = STATUS_IDLE;
        self.result = 0;
        let _ = self.shared.set_len(0).and_then(|_| self.shared.set_len(BAR_SIZE));
    }

    fn dma(&self) -> Arc<DmaSpace> {
        self.dma.clone()
    }

    fn vectors(&self) -> Arc<MsixVectors> {
        self.vectors.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_and_refused_dma() {
        let mut dev = TestDevice::new().unwrap();
        let mut word = [0u8; 4];
        dev.bar_read(0, REG_MAGIC, &mut word);
        assert_eq!(&word, b"DLTD");
        dev.bar_write(0, REG_SCRATCH, &0x1234_5678u32.to_le_bytes());
        dev.bar_read(0, REG_SCRATCH, &mut word);
        assert_eq!(u32::from_le_bytes(word), 0x1234_5678);
        dev.bar_write(0, REG_DMA_LEN, &16u32.to_le_bytes());
        dev.bar_write(0, REG_DOORBELL, &CMD_DMA_WRITE.to_le_bytes());
        dev.bar_read(0, REG_STATUS, &mut word);
        assert_eq!(u32::from_le_bytes(word), STATUS_FAULT, "nothing is mapped");
        dev.bar_read(0, REG_FAULTS, &mut word);
        assert_eq!(u32::from_le_bytes(word), 1);
        assert_eq!(dev.dma().counters().dma_faults, 1);
        dev.bar_write(2, 8, &[9, 8, 7]);
        let mut back = [0u8; 3];
        dev.bar_read(2, 8, &mut back);
        assert_eq!(back, [9, 8, 7]);
        dev.reset();
        dev.bar_read(2, 8, &mut back);
        assert_eq!(back, [0; 3], "reset clears the shared BAR");
    }
}

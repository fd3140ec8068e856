//! Driving driverlab's passthrough conformance device (d1ab:7e57, `driverlab model testdev`):
//! registers through BAR 0, shared memory through BAR 2, MSI-X, and DMA that reaches what was
//! mapped and is refused where nothing was.

use core::cell::UnsafeCell;

use crate::dma::DeviceDma;
use crate::pci::{Ecam, Function};
use crate::viommu::Viommu;
use crate::{interrupts, json, mmio, report, time};

const VENDOR: u16 = 0xd1ab;
const DEVICE: u16 = 0x7e57;
const REG_MAGIC: u64 = 0x00;
const REG_VERSION: u64 = 0x04;
const REG_SCRATCH: u64 = 0x08;
const REG_DMA_ADDR_LO: u64 = 0x10;
const REG_DMA_ADDR_HI: u64 = 0x14;
const REG_DMA_LEN: u64 = 0x18;
const REG_DMA_PATTERN: u64 = 0x1c;
const REG_DOORBELL: u64 = 0x20;
const REG_STATUS: u64 = 0x24;
const REG_RESULT: u64 = 0x28;
const CMD_DMA_WRITE: u32 = 1;
const CMD_DMA_READ: u32 = 2;
const STATUS_DONE: u32 = 1;
const STATUS_FAULT: u32 = 2;
const MAGIC: u32 = u32::from_le_bytes(*b"DLTD");
const VECTOR: u8 = 0x42;
const DMA_LEN: u32 = 256;
const PATTERN: u32 = 0xa5c3_5a3c;
/// Far outside anything mapped (or, without an IOMMU, outside guest RAM).
const UNMAPPED_IOVA: u64 = 0xdead_0000_0000;
const TIMEOUT_US: u64 = 1_000_000;

#[repr(C, align(4096))]
struct Page([u8; 4096]);

struct PageCell(UnsafeCell<Page>);

// SAFETY: only the probe's single CPL3 thread and the device (by DMA) touch the page, one at a time.
unsafe impl Sync for PageCell {}

static BUFFER: PageCell = PageCell(UnsafeCell::new(Page([0; 4096])));

struct TestDevice {
    bar0: u64,
    irqs_ok: bool,
}

impl TestDevice {
    fn reg(&self, offset: u64) -> u32 {
        mmio::read(self.bar0 + offset)
    }

    fn set(&self, offset: u64, value: u32) {
        mmio::write(self.bar0 + offset, value)
    }

    /// Starts a DMA command and waits for its interrupt; returns the status register.
    fn dma(&mut self, command: u32, iova: u64) -> u32 {
        self.set(REG_DMA_ADDR_LO, iova as u32);
        self.set(REG_DMA_ADDR_HI, (iova >> 32) as u32);
        self.set(REG_DMA_LEN, DMA_LEN);
        self.set(REG_DMA_PATTERN, PATTERN);
        let before = interrupts::count(VECTOR);
        self.set(REG_DOORBELL, command);
        let arrived = time::wait_until(time::deadline_after_micros(TIMEOUT_US), || interrupts::count(VECTOR) != before);
        self.irqs_ok &= arrived;
        self.reg(REG_STATUS)
    }
}

fn buffer() -> &'static mut [u8; 4096] {
    // SAFETY: single-threaded; callers never hold two of these at once.
    unsafe { &mut (*BUFFER.0.get()).0 }
}

/// Runs the checks and reports `{"probe":"testdev",...}` if the device is there.
pub fn run(ecam: Ecam, functions: &[Function], viommu: Option<&mut Viommu>) {
    let Some(f) = functions.iter().find(|f| f.vendor == VENDOR && f.id == DEVICE) else { return };
    let (bar0, bar2) = (f.bars[0].0, f.bars[2].0);
    if f.bars[0].1 == 0 || f.bars[2].1 == 0 {
        report::fail("testdev: BAR 0 or BAR 2 missing");
        return;
    }
    ecam.enable_memory_and_bus_master(f);
    let mut dev = TestDevice { bar0, irqs_ok: true };

    dev.set(REG_SCRATCH, 0x5a5a_1234);
    let bar0_ok = dev.reg(REG_MAGIC) == MAGIC && dev.reg(REG_VERSION) == 1 && dev.reg(REG_SCRATCH) == 0x5a5a_1234;
    for i in 0..16u64 {
        mmio::write(bar2 + i * 4, 0x1000_0000u32 + i as u32);
    }
    let bar2_ok = (0..16u64).all(|i| mmio::read::<u32>(bar2 + i * 4) == 0x1000_0000 + i as u32);

    let msix_ready = ecam.route_msix_vector0(f, VECTOR);

    // Where the device may DMA: behind the IOMMU, a mapping the probe makes in the device's own
    // domain; otherwise the buffer's own address.
    let gpa = buffer().as_ptr() as u64;
    let rid = f.requester_id();
    let mut setup_error = None;
    let mut dma = match viommu.filter(|v| v.translates(rid)) {
        Some(v) => {
            let domain = v.first_domain + 1;
            DeviceDma::translated(v, domain, rid).unwrap_or_else(|why| {
                setup_error = Some(why);
                DeviceDma::identity()
            })
        }
        None => DeviceDma::identity(),
    };
    let behind_iommu = dma.translated_by_iommu();
    let iova = dma.map(gpa, 4096).unwrap_or_else(|why| {
        setup_error = Some(why);
        gpa
    });

    buffer().fill(0);
    let dma_write_ok = dev.dma(CMD_DMA_WRITE, iova) == STATUS_DONE
        && buffer()[..DMA_LEN as usize].chunks(4).all(|c| c == PATTERN.to_le_bytes())
        && buffer()[DMA_LEN as usize] == 0;
    let mut sum = 0u32;
    for (i, b) in buffer()[..DMA_LEN as usize].iter_mut().enumerate() {
        *b = (i * 7) as u8;
        sum = sum.wrapping_add(*b as u32);
    }
    let dma_read_ok = dev.dma(CMD_DMA_READ, iova) == STATUS_DONE && dev.reg(REG_RESULT) == sum;
    let unmapped = if behind_iommu { iova + 0x10_0000 } else { UNMAPPED_IOVA };
    let unmapped_dma_refused = dev.dma(CMD_DMA_WRITE, unmapped) == STATUS_FAULT;
    let msix = msix_ready && dev.irqs_ok;
    if setup_error.is_none()
        && let Err(why) = dma.unmap(iova, 4096)
    {
        setup_error = Some(why);
    }

    json::section("testdev", |o| {
        o.str("id", "d1ab:7e57")
            .bool("iommu", behind_iommu)
            .bool("bar0_ok", bar0_ok)
            .bool("bar2_ok", bar2_ok)
            .bool("msix", msix)
            .bool("dma_write_ok", dma_write_ok)
            .bool("dma_read_ok", dma_read_ok)
            .bool("unmapped_dma_refused", unmapped_dma_refused);
        if let Some(why) = setup_error {
            o.str("error", why);
        }
    });
    for (ok, what) in [
        (bar0_ok, "testdev: BAR 0 registers"),
        (bar2_ok, "testdev: BAR 2 memory"),
        (msix, "testdev: MSI-X completion"),
        (dma_write_ok, "testdev: DMA write"),
        (dma_read_ok, "testdev: DMA read"),
        (unmapped_dma_refused, "testdev: DMA to an unmapped IOVA was not refused"),
        (setup_error.is_none(), "testdev: virtio-iommu set-up"),
    ] {
        if !ok {
            report::fail(what);
        }
    }
}

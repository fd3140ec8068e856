//! A minimal driver for the Aquantia AQC100 (1d6a:00b1), enough to reproduce in miniature the
//! experiment of the seed patches: bring the NIC up the way atlantic does (reset handshake,
//! firmware version, MAC from the eFuse, link at 10G, rings, MSI-X), receive `probe.frames`
//! frames with the RX buffer strategy of `probe.rx` while counting the IOMMU maps it takes,
//! transmit a few frames and check the NIC counted them.

use core::cell::UnsafeCell;
use core::fmt::Write;

use crate::dma::DeviceDma;
use crate::json::{self, StackString};
use crate::pci::{Ecam, Function};
use crate::receive::{Measured, Stopwatch, Tally};
use crate::rx_buffers::{Buffer, RxBuffers, Strategy};
use crate::viommu::Viommu;
use crate::{interrupts, mmio, report, time};

const VENDOR: u16 = 0x1d6a;
const DEVICE: u16 = 0x00b1;

const GLOBAL_CONTROL: u32 = 0x0000;
const FW_VERSION: u32 = 0x0018;
const MIF_ID: u32 = 0x001c;
const MIF_CMD: u32 = 0x0200;
const MIF_ADDR: u32 = 0x0208;
const MIF_VALUE: u32 = 0x020c;
const RAM_SEMAPHORE: u32 = 0x03a8;
const EFUSE_ADDR: u32 = 0x0364;
const FW_CONTROL: u32 = 0x0368;
const FW_STATE: u32 = 0x0370;
const BOOT_EXIT_CODE: u32 = 0x0388;
const MCP_CONTROL: u32 = 0x0404;
const DAISY_CHAIN_STATUS: u32 = 0x0704;
const ISCR: u32 = 0x2050;
const IMSR: u32 = 0x2060;
const IMCR: u32 = 0x2070;
const IAMR: u32 = 0x2090;
const RING_IRQ_MAP: u32 = 0x2100;
const IRQ_GLOBAL_CONTROL: u32 = 0x2300;
const UNICAST_FILTER_LO: u32 = 0x5110;
const UNICAST_FILTER_HI: u32 = 0x5114;
const RX_CHECKSUM_CONTROL: u32 = 0x5580;
const RX_BUFFER_ENABLE: u32 = 0x5700;
const RX_RING: u32 = 0x5b00;
const TX_CHECKSUM_CONTROL: u32 = 0x7800;
const TX_BUFFER_ENABLE: u32 = 0x7900;
const TX_RING: u32 = 0x7c00;
const TX_GOOD_FRAMES: u32 = 0x8800;
const RING_CONTROL: u32 = 0x08;
const RING_HEAD: u32 = 0x0c;
const RING_TAIL: u32 = 0x10;
const RX_BUFFER_SIZE: u32 = 0x18;
const RING_ENABLE: u32 = 1 << 31;
const RATE_10G: u32 = 0x800;

const RXD_DD: u16 = 1;
const RXD_EOP: u16 = 2;
const RXD_L4_VALID: u16 = 1 << 5;
const RXD_ERRORS: u16 = 0x7 << 2;
const TXD_DATA: u32 = 1;
const TXD_EOP: u32 = 1 << 21;
const TXD_IP_CHECKSUM: u32 = 1 << 24;
const TXD_L4_CHECKSUM: u32 = 1 << 25;
const TXD_WRITEBACK: u32 = 1 << 27;

/// The LAPIC vector the NIC's MSI-X vector 0 is routed to.
const VECTOR: u8 = 0x50;
const RX_RING_SIZE: u32 = 256;
const TX_RING_SIZE: u32 = 64;
/// Refills are handed to the NIC in batches, as atlantic does.
const REFILL_BATCH: u32 = 32;
/// Frames the probe transmits.
const TX_FRAMES: u32 = 32;
const TX_FRAME_LEN: usize = 1514;
/// The generator's MAC, the probe's transmit target.
const PEER_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x00, 0x01];
const TIMEOUT_US: u64 = 2_000_000;

/// What `probe.nic`, `probe.rx` and `probe.frames` asked for.
#[derive(Clone, Copy)]
pub struct NicOptions {
    /// RX buffer strategy.
    pub strategy: Strategy,
    /// Frames to receive.
    pub frames: u32,
}

#[repr(C, align(4096))]
struct DmaMemory {
    rx_ring: [u8; 4096],
    tx_ring: [u8; 4096],
    tx_buffers: [u8; TX_RING_SIZE as usize * 2048],
}

struct DmaMemoryCell(UnsafeCell<DmaMemory>);

// SAFETY: only the probe's single CPL3 thread and the NIC (by DMA) touch this memory.
unsafe impl Sync for DmaMemoryCell {}

static MEMORY: DmaMemoryCell = DmaMemoryCell(UnsafeCell::new(DmaMemory {
    rx_ring: [0; 4096],
    tx_ring: [0; 4096],
    tx_buffers: [0; TX_RING_SIZE as usize * 2048],
}));

struct Regs(u64);

impl Regs {
    fn read(&self, reg: u32) -> u32 {
        mmio::read(self.0 + reg as u64)
    }

    fn write(&self, reg: u32, value: u32) {
        mmio::write(self.0 + reg as u64, value)
    }

    fn wait(&self, mut done: impl FnMut(&Regs) -> bool) -> bool {
        time::wait_until(time::deadline_after_micros(TIMEOUT_US), || done(self))
    }

    /// Reads firmware memory through the MIF window (B1: the address advances after each word).
    fn mif_read(&self, addr: u32, out: &mut [u32]) -> Result<(), &'static str> {
        if !self.wait(|r| r.read(RAM_SEMAPHORE) == 1) {
            return Err("the firmware RAM semaphore stayed taken");
        }
        self.write(MIF_ADDR, addr);
        let b1 = self.read(MIF_ID) & 0xf == 0xa;
        for (i, word) in out.iter_mut().enumerate() {
            let before = addr + 4 * i as u32;
            self.write(MIF_CMD, 0x8000);
            let done = if b1 {
                self.wait(|r| r.read(MIF_ADDR) != before)
            } else {
                self.wait(|r| r.read(MIF_CMD) & 0x100 == 0)
            };
            if !done {
                return Err("a firmware memory read timed out");
            }
            *word = self.read(MIF_VALUE);
        }
        self.write(RAM_SEMAPHORE, 1);
        Ok(())
    }
}

struct Outcome {
    fw: u32,
    mac: [u8; 6],
    link_mbps: u32,
    received: Received,
    tx_frames: u32,
    tx_counted: u32,
}

fn memory() -> &'static mut DmaMemory {
    // SAFETY: single-threaded; the driver holds the only reference for the run.
    unsafe { &mut *MEMORY.0.get() }
}

/// Runs the NIC section if `options` asks for it (then a missing NIC is a failure).
pub fn run(ecam: Ecam, functions: &[Function], viommu: Option<&mut Viommu>, options: Option<NicOptions>) {
    let Some(options) = options else { return };
    let Some(f) = functions.iter().find(|f| f.vendor == VENDOR && f.id == DEVICE) else {
        report::fail("probe.nic=aqc100 given, but there is no AQC100 (1d6a:00b1) on the bus");
        return;
    };
    let mut dma = match DeviceDma::for_function(viommu, f.requester_id(), 2) {
        Ok(dma) => dma,
        Err(why) => return fail(why),
    };
    match drive(ecam, f, &mut dma, options) {
        Ok(outcome) => {
            let Received { tally, checksums_ok, msix, measured } = &outcome.received;
            let mut fw = StackString::<16>::new();
            let _ = write!(fw, "{}.{}.{}", outcome.fw >> 24, (outcome.fw >> 16) & 0xff, outcome.fw & 0xffff);
            let mac = json::mac(outcome.mac);
            json::section("nic", |o| {
                o.str("id", "1d6a:00b1")
                    .str("fw", fw.as_str())
                    .str("mac", mac.as_str())
                    .u64("link_mbps", outcome.link_mbps as u64)
                    .str("rx_strategy", options.strategy.name())
                    .u64("rx_frames", tally.frames)
                    .u64("rx_bytes", tally.bytes)
                    .u64("tx_frames", outcome.tx_frames as u64)
                    .u64("tx_counted", outcome.tx_counted as u64)
                    .bool("iommu", dma.translated_by_iommu())
                    .u64("iommu_maps", dma.maps)
                    .u64("iommu_unmaps", dma.unmaps)
                    .u64("initial_maps", measured.initial_maps)
                    .ratio("maps_per_frame", measured.receive_maps, tally.frames)
                    .u64("elapsed_ns", measured.elapsed_ns)
                    .bool("in_order", tally.sequence.in_order())
                    .u64("missing_frames", tally.sequence.missing)
                    .u64("reordered_frames", tally.sequence.reordered)
                    .bool("checksums_ok", *checksums_ok)
                    .u64("rx_interrupts", measured.rx_interrupts)
                    .bool("msix", *msix);
            });
            for (ok, what) in [
                (tally.sequence.in_order(), "nic: frames arrived out of sequence"),
                (*checksums_ok, "nic: a frame's checksum status was not good"),
                (*msix, "nic: RX interrupts did not arrive as MSI-X"),
                (outcome.tx_counted == outcome.tx_frames, "nic: the NIC did not count every transmitted frame"),
            ] {
                if !ok {
                    report::fail(what);
                }
            }
        }
        Err(why) => fail(why),
    }
}

fn fail(why: &'static str) {
    json::section("nic", |o| {
        o.str("id", "1d6a:00b1").str("error", why);
    });
    report::fail(why);
}

/// The reset handshake of atlantic's ROM-boot-loader path.
fn reset(regs: &Regs) -> Result<(), &'static str> {
    if regs.read(DAISY_CHAIN_STATUS) == 0x0600_0000 && regs.read(BOOT_EXIT_CODE) == 0 {
        return Err("neither RBL nor FLB firmware started");
    }
    regs.write(MCP_CONTROL, 0x40e1);
    regs.write(0x3a0, 1);
    regs.write(0x32a8, 0);
    regs.write(BOOT_EXIT_CODE, 0xdead);
    let gsr = regs.read(GLOBAL_CONTROL);
    regs.write(GLOBAL_CONTROL, (gsr & !0x4000) | 0x8000);
    regs.write(MCP_CONTROL, 0x40e0);
    if !regs.wait(|r| !matches!(r.read(BOOT_EXIT_CODE) & 0xffff, 0 | 0xdead)) {
        return Err("RBL restart failed");
    }
    if regs.read(BOOT_EXIT_CODE) & 0xffff == 0xf1a7 {
        return Err("no firmware");
    }
    if !regs.wait(|r| r.read(FW_VERSION) != 0) {
        return Err("the firmware did not start");
    }
    Ok(())
}

fn write_rx_descriptor(slot: u32, buffer: &Buffer) {
    let at = &mut memory().rx_ring[slot as usize * 16..slot as usize * 16 + 16];
    at[..8].copy_from_slice(&buffer.iova.to_le_bytes());
    at[8..].fill(0);
}

/// Status and length of RX descriptor `slot` once written back.
fn rx_writeback(slot: u32) -> (u16, u16) {
    let at = memory().rx_ring.as_ptr() as u64 + slot as u64 * 16;
    let word: u32 = mmio::read(at + 8);
    (word as u16, (word >> 16) as u16)
}

fn drive(ecam: Ecam, f: &Function, dma: &mut DeviceDma, options: NicOptions) -> Result<Outcome, &'static str> {
    if f.bars[0].1 < 0x1_0000 {
        return Err("nic: BAR 0 is missing or smaller than 64 KiB");
    }
    ecam.enable_memory_and_bus_master(f);
    let regs = Regs(f.bars[0].0);
    let (fw, mac) = bring_up(&regs)?;
    route_interrupts(ecam, f, &regs)?;
    let rings = Rings::map(dma)?;
    rings.program(&regs, mac);
    regs.write(FW_CONTROL, RATE_10G);
    if !regs.wait(|r| r.read(FW_STATE) & RATE_10G != 0) {
        return Err("nic: the link did not come up at 10G");
    }
    regs.write(RX_BUFFER_ENABLE, 1);
    regs.write(TX_BUFFER_ENABLE, 1);

    let buffers = RxBuffers::start(options.strategy);
    let received = receive(&regs, dma, buffers, options.frames)?;
    let tx_counted = transmit(&regs, &rings, mac)?;

    // Stop the NIC, then give back every mapping.
    regs.write(IMCR, !0);
    regs.write(RX_BUFFER_ENABLE, 0);
    regs.write(TX_BUFFER_ENABLE, 0);
    regs.write(RX_RING + RING_CONTROL, 0);
    regs.write(TX_RING + RING_CONTROL, 0);
    buffers.release_all(dma)?;
    rings.unmap(dma)?;
    Ok(Outcome { fw, mac, link_mbps: 10_000, received, tx_frames: TX_FRAMES, tx_counted })
}

/// Resets the NIC and reads its firmware version and its MAC from the eFuse.
fn bring_up(regs: &Regs) -> Result<(u32, [u8; 6]), &'static str> {
    reset(regs)?;
    let fw = regs.read(FW_VERSION);
    if !(2..=4).contains(&(fw >> 24)) {
        return Err("nic: firmware version is not 2.x, 3.x or 4.x");
    }
    let efuse = regs.read(EFUSE_ADDR);
    if efuse == 0 {
        return Err("nic: no eFuse address");
    }
    let mut words = [0u32; 2];
    regs.mif_read(efuse + 160, &mut words)?;
    let (a, b) = (words[0].to_be_bytes(), words[1].to_be_bytes());
    Ok((fw, [a[0], a[1], a[2], a[3], b[0], b[1]]))
}

/// Interrupts: MSI-X, everything auto-masked, RX and TX of ring 0 on vector 0.
fn route_interrupts(ecam: Ecam, f: &Function, regs: &Regs) -> Result<(), &'static str> {
    regs.write(IRQ_GLOBAL_CONTROL, 0x2000_0022);
    regs.write(IAMR, !0);
    regs.write(IMCR, !0);
    regs.write(ISCR, !0);
    regs.write(RING_IRQ_MAP, 0x8000_8000);
    if !ecam.route_msix_vector0(f, VECTOR) {
        return Err("nic: no MSI-X capability");
    }
    Ok(())
}

/// The rings and the TX buffers, mapped once like coherent DMA memory: their IOVAs.
struct Rings {
    rx_ring: u64,
    tx_ring: u64,
    tx_buffers: u64,
}

impl Rings {
    fn map(dma: &mut DeviceDma) -> Result<Rings, &'static str> {
        let mem = memory();
        Ok(Rings {
            rx_ring: dma.map(mem.rx_ring.as_ptr() as u64, 4096)?,
            tx_ring: dma.map(mem.tx_ring.as_ptr() as u64, 4096)?,
            tx_buffers: dma.map(mem.tx_buffers.as_ptr() as u64, mem.tx_buffers.len() as u64)?,
        })
    }

    /// Tells the NIC where its rings are, its unicast filter and its checksum offloads.
    fn program(&self, regs: &Regs, mac: [u8; 6]) {
        regs.write(RX_RING, self.rx_ring as u32);
        regs.write(RX_RING + 4, (self.rx_ring >> 32) as u32);
        regs.write(RX_RING + RX_BUFFER_SIZE, 2);
        regs.write(RX_RING + RING_CONTROL, RING_ENABLE | (RX_RING_SIZE / 8) << 3);
        regs.write(TX_RING, self.tx_ring as u32);
        regs.write(TX_RING + 4, (self.tx_ring >> 32) as u32);
        regs.write(TX_RING + RING_CONTROL, RING_ENABLE | (TX_RING_SIZE / 8) << 3);
        regs.write(UNICAST_FILTER_LO, u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]));
        regs.write(UNICAST_FILTER_HI, 1 << 31 | u16::from_be_bytes([mac[0], mac[1]]) as u32);
        regs.write(RX_CHECKSUM_CONTROL, 3);
        regs.write(TX_CHECKSUM_CONTROL, 3);
    }

    fn unmap(&self, dma: &mut DeviceDma) -> Result<(), &'static str> {
        dma.unmap(self.rx_ring, 4096)?;
        dma.unmap(self.tx_ring, 4096)?;
        dma.unmap(self.tx_buffers, memory().tx_buffers.len() as u64)
    }
}

/// What the receive loop saw.
struct Received {
    tally: Tally,
    checksums_ok: bool,
    msix: bool,
    measured: Measured,
}

/// The RX ring as the driver keeps it: the buffer in each slot, the next slot the NIC writes
/// back (`head`), the next the driver fills (`tail`), and refills not yet handed over.
struct RxRing {
    slots: [Buffer; RX_RING_SIZE as usize],
    head: u32,
    tail: u32,
    unflushed: u32,
}

impl RxRing {
    /// Every slot but one holds a fresh buffer.
    fn fill(buffers: &mut RxBuffers, dma: &mut DeviceDma) -> Result<RxRing, &'static str> {
        let mut ring =
            RxRing { slots: [Buffer::default(); RX_RING_SIZE as usize], head: 0, tail: RX_RING_SIZE - 1, unflushed: 0 };
        for slot in 0..RX_RING_SIZE - 1 {
            ring.slots[slot as usize] = buffers.take(dma)?;
            write_rx_descriptor(slot, &ring.slots[slot as usize]);
        }
        Ok(ring)
    }

    /// Hands the refilled slots to the NIC.
    fn flush(&mut self, regs: &Regs) {
        regs.write(RX_RING + RING_TAIL, self.tail);
        self.unflushed = 0;
    }
}

/// Receives `frames` frames: waits for an interrupt (or a written-back descriptor), drains the
/// ring, refills it in batches, unmasks the interrupt, until all have arrived.
fn receive(regs: &Regs, dma: &mut DeviceDma, buffers: &mut RxBuffers, frames: u32) -> Result<Received, &'static str> {
    let mut ring = RxRing::fill(buffers, dma)?;
    let stopwatch = Stopwatch::start(VECTOR, dma);
    let mut last_irqs = interrupts::count(VECTOR);
    regs.write(IMSR, 1);
    ring.flush(regs);

    let (mut tally, mut checksums_ok, mut msix) = (Tally::default(), true, true);
    while !tally.has(frames) {
        let woke = time::wait_until(time::deadline_after_micros(TIMEOUT_US), || {
            interrupts::count(VECTOR) != last_irqs || rx_writeback(ring.head).0 & RXD_DD != 0
        });
        if !woke {
            return Err("nic: frames stopped arriving");
        }
        let irqs = interrupts::count(VECTOR);
        if irqs == last_irqs {
            // A frame is there but its interrupt is not (yet): give it a moment, then count it.
            msix &= time::wait_until(time::deadline_after_micros(TIMEOUT_US), || interrupts::count(VECTOR) != irqs);
        }
        last_irqs = interrupts::count(VECTOR);
        checksums_ok &= drain(regs, dma, buffers, &mut ring, &mut tally, frames)?;
        regs.write(IMSR, 1);
    }
    Ok(Received { tally, checksums_ok, msix, measured: stopwatch.stop(dma) })
}

/// Takes every written-back frame (up to `frames` in all), refilling each slot; whether every
/// frame's checksum status was good.
fn drain(
    regs: &Regs,
    dma: &mut DeviceDma,
    buffers: &mut RxBuffers,
    ring: &mut RxRing,
    tally: &mut Tally,
    frames: u32,
) -> Result<bool, &'static str> {
    let mut checksums_ok = true;
    while !tally.has(frames) {
        let (status, len) = rx_writeback(ring.head);
        if status & RXD_DD == 0 {
            break;
        }
        let buffer = ring.slots[ring.head as usize];
        if status & RXD_EOP == 0 || status & RXD_ERRORS != 0 {
            checksums_ok = false;
        } else {
            checksums_ok &= status & RXD_L4_VALID != 0;
            tally.sequence_in(mmio::bytes(buffer.gpa, len as usize));
        }
        tally.count(len as u64);
        buffers.release(buffer, dma)?;
        let fresh = buffers.take(dma)?;
        ring.slots[ring.tail as usize] = fresh;
        write_rx_descriptor(ring.tail, &fresh);
        ring.tail = (ring.tail + 1) % RX_RING_SIZE;
        ring.head = (ring.head + 1) % RX_RING_SIZE;
        ring.unflushed += 1;
        if ring.unflushed >= REFILL_BATCH {
            ring.flush(regs);
        }
    }
    if ring.unflushed > 0 {
        ring.flush(regs);
    }
    Ok(checksums_ok)
}

/// Transmits `TX_FRAMES` UDP frames to the peer, checksums left to the NIC; how many the NIC
/// counted.
fn transmit(regs: &Regs, rings: &Rings, mac: [u8; 6]) -> Result<u32, &'static str> {
    let mem = memory();
    let counted_before = regs.read(TX_GOOD_FRAMES);
    for i in 0..TX_FRAMES as usize {
        let frame = &mut mem.tx_buffers[i * 2048..i * 2048 + TX_FRAME_LEN];
        udp_frame(frame, mac, i as u32);
        let desc = &mut mem.tx_ring[i * 16..i * 16 + 16];
        let control =
            TXD_DATA | (TX_FRAME_LEN as u32) << 4 | TXD_EOP | TXD_WRITEBACK | TXD_IP_CHECKSUM | TXD_L4_CHECKSUM;
        desc[..8].copy_from_slice(&(rings.tx_buffers + i as u64 * 2048).to_le_bytes());
        desc[8..12].copy_from_slice(&control.to_le_bytes());
        desc[12..16].copy_from_slice(&((TX_FRAME_LEN as u32) << 14).to_le_bytes());
    }
    regs.write(TX_RING + RING_TAIL, TX_FRAMES);
    if !regs.wait(|r| r.read(TX_RING + RING_HEAD) == TX_FRAMES) {
        return Err("nic: transmitted descriptors were not completed");
    }
    Ok(regs.read(TX_GOOD_FRAMES).wrapping_sub(counted_before))
}

/// A UDP/IPv4 frame from `mac` to the peer with sequence number `seq`; checksums left zero.
fn udp_frame(frame: &mut [u8], mac: [u8; 6], seq: u32) {
    let len = frame.len();
    frame.fill(0);
    frame[..6].copy_from_slice(&PEER_MAC);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    frame[14] = 0x45;
    frame[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    frame[22] = 64;
    frame[23] = 17;
    frame[26..30].copy_from_slice(&[10, 0, 0, 2]);
    frame[30..34].copy_from_slice(&[10, 0, 0, 1]);
    frame[34..36].copy_from_slice(&9u16.to_be_bytes());
    frame[36..38].copy_from_slice(&9u16.to_be_bytes());
    frame[38..40].copy_from_slice(&((len - 34) as u16).to_be_bytes());
    frame[42..46].copy_from_slice(&seq.to_be_bytes());
}

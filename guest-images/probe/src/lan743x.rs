//! A minimal driver for the Microchip LAN7430 (1055:7430), the way Linux's lan743x driver
//! brings it up: chip ID, light reset, PHY reset, the MAC from its registers, the PHY's link
//! over MDIO, the DMA controller with the descriptor spacing of `probe.dspace` (16 bytes as in
//! Linux 6.12, 64 as before seed 004), RX channel 0 on MSI-X vector 0 with head write-back. It
//! receives `probe.frames` frames with the RX buffers of `probe.rx`, counting the IOMMU maps,
//! and checks every write-back landed in its slot.

use core::cell::UnsafeCell;

use crate::dma::DeviceDma;
use crate::json;
use crate::nic::NicOptions;
use crate::pci::{Ecam, Function};
use crate::receive::{Measured, Stopwatch, Tally};
use crate::rx_buffers::{Buffer, RxBuffers};
use crate::viommu::Viommu;
use crate::{interrupts, mmio, report, time};

const VENDOR: u16 = 0x1055;
const DEVICE: u16 = 0x7430;
const ID_REV: u32 = 0x000;
const HW_CFG: u32 = 0x010;
const HW_CFG_LRST: u32 = 1 << 1;
const PMT_CTL: u32 = 0x014;
const PMT_CTL_ETH_PHY_RST: u32 = 1 << 4;
const PMT_CTL_READY: u32 = 1 << 7;
const MAC_RX: u32 = 0x104;
const MAC_RX_ADDRH: u32 = 0x118;
const MAC_RX_ADDRL: u32 = 0x11c;
const MAC_MII_ACC: u32 = 0x120;
const MAC_MII_DATA: u32 = 0x124;
const FCT_RX_CTL: u32 = 0x0ac;
const RFE_CTL: u32 = 0x508;
const INT_EN_SET: u32 = 0x788;
const INT_EN_CLR: u32 = 0x78c;
const INT_VEC_EN_SET: u32 = 0x794;
const INT_VEC_EN_CLR: u32 = 0x798;
const INT_VEC_MAP0: u32 = 0x7a0;
const DMAC_CFG: u32 = 0xc00;
const DMAC_CMD: u32 = 0xc0c;
const DMAC_INT_STS: u32 = 0xc10;
const DMAC_INT_EN_SET: u32 = 0xc14;
const RX_CFG_A: u32 = 0xc40;
const RX_CFG_B: u32 = 0xc44;
const RX_BASE_ADDRH: u32 = 0xc48;
const RX_BASE_ADDRL: u32 = 0xc4c;
const RX_HEAD_WRITEBACK_ADDRH: u32 = 0xc50;
const RX_HEAD_WRITEBACK_ADDRL: u32 = 0xc54;
const RX_HEAD: u32 = 0xc58;
const RX_TAIL: u32 = 0xc5c;
const RX_CFG_C: u32 = 0xc64;
const STAT_RX_TOTAL_FRAMES: u32 = 0x1254;
const RX_OWN: u32 = 1 << 15;
const RX_FS_LS: u32 = 3 << 30;
const RX_STATUS_ERRORS: u32 = (1 << 17) | (1 << 16) | 1;
/// RX_TAIL's flags: re-enable the channel's interrupt and its vector.
const TAIL_REARM: u32 = (1 << 30) | (1 << 29);
const INT_BIT_MAS: u32 = 1;
const INT_SET: u32 = 0x784;
const INT_STS: u32 = 0x780;
const INT_BIT_SW_GP: u32 = 1 << 9;
const INT_BIT_DMA_RX0: u32 = 1 << 24;
const DMAC_RXFRM0: u32 = 1 << 16;
/// The LAPIC vector MSI-X vector 0 is routed to.
const VECTOR: u8 = 0x51;
const RING: u32 = 128;
const BUFFER_LEN: u32 = 1518;
const TIMEOUT_US: u64 = 2_000_000;

#[repr(C, align(4096))]
struct DmaMemory {
    /// 128 descriptors at up to 128 bytes apart.
    ring: [u8; 128 * RING as usize],
    writeback: [u8; 4096],
}

struct DmaMemoryCell(UnsafeCell<DmaMemory>);

// SAFETY: only the probe's single CPL3 thread and the NIC (by DMA) touch this memory.
unsafe impl Sync for DmaMemoryCell {}

static MEMORY: DmaMemoryCell =
    DmaMemoryCell(UnsafeCell::new(DmaMemory { ring: [0; 128 * RING as usize], writeback: [0; 4096] }));

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

    fn mdio_read(&self, reg: u32) -> Option<u32> {
        self.write(MAC_MII_ACC, 1 << 11 | reg << 6 | 1);
        self.wait(|r| r.read(MAC_MII_ACC) & 1 == 0).then(|| self.read(MAC_MII_DATA) & 0xffff)
    }
}

struct Outcome {
    phy: Phy,
    received: Received,
    counted: u32,
    sw_interrupt: bool,
}

fn memory() -> &'static mut DmaMemory {
    // SAFETY: single-threaded; the driver holds the only reference for the run.
    unsafe { &mut *MEMORY.0.get() }
}

/// Runs the LAN7430 section if `options` asks for it (then a missing NIC is a failure).
pub fn run(ecam: Ecam, functions: &[Function], viommu: Option<&mut Viommu>, options: Option<(NicOptions, u32)>) {
    let Some((options, spacing)) = options else { return };
    let Some(f) = functions.iter().find(|f| f.vendor == VENDOR && f.id == DEVICE) else {
        report::fail("probe.nic=lan743x given, but there is no LAN7430 (1055:7430) on the bus");
        return;
    };
    let mut dma = match DeviceDma::for_function(viommu, f.requester_id(), 3) {
        Ok(dma) => dma,
        Err(why) => return fail(why),
    };
    match drive(ecam, f, &mut dma, options, spacing) {
        Ok(o) => {
            let Received { tally, slots_ok, measured } = &o.received;
            let mac = json::mac(o.phy.mac);
            json::section("nic", |s| {
                s.str("id", "1055:7430")
                    .str("mac", mac.as_str())
                    .u64("phy_id", o.phy.id as u64)
                    .u64("link_mbps", o.phy.link_mbps as u64)
                    .u64("descriptor_spacing", spacing as u64)
                    .str("rx_strategy", options.strategy.name())
                    .u64("rx_frames", tally.frames)
                    .u64("rx_bytes", tally.bytes)
                    .u64("rx_counted", o.counted as u64)
                    .bool("iommu", dma.translated_by_iommu())
                    .u64("iommu_maps", dma.maps)
                    .u64("iommu_unmaps", dma.unmaps)
                    .u64("initial_maps", measured.initial_maps)
                    .ratio("maps_per_frame", measured.receive_maps, tally.frames)
                    .u64("elapsed_ns", measured.elapsed_ns)
                    .bool("in_order", tally.sequence.in_order())
                    .u64("missing_frames", tally.sequence.missing)
                    .u64("reordered_frames", tally.sequence.reordered)
                    .bool("slots_ok", *slots_ok)
                    .u64("rx_interrupts", measured.rx_interrupts)
                    .bool("sw_interrupt", o.sw_interrupt)
                    .bool("msix", o.sw_interrupt && (tally.frames == 0 || measured.rx_interrupts > 0));
            });
            for (ok, what) in [
                (tally.sequence.in_order(), "nic: frames arrived out of sequence"),
                (*slots_ok, "nic: a write-back was not where the descriptor spacing puts it"),
                (o.sw_interrupt, "nic: the software interrupt did not arrive as MSI-X"),
                (tally.frames == 0 || measured.rx_interrupts > 0, "nic: RX interrupts did not arrive as MSI-X"),
                // The NIC also counts what it put in the ring after the last frame the probe took.
                (
                    (tally.frames..=tally.frames + RING as u64).contains(&(o.counted as u64)),
                    "nic: the NIC's frame counter does not match the frames received",
                ),
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
        o.str("id", "1055:7430").str("error", why);
    });
    report::fail(why);
}

fn slot(spacing: u32, index: u32) -> u64 {
    memory().ring.as_ptr() as u64 + (index * spacing) as u64
}

fn post(spacing: u32, index: u32, buffer: &Buffer) {
    let at = slot(spacing, index);
    mmio::write(at + 4, buffer.iova as u32);
    mmio::write(at + 8, (buffer.iova >> 32) as u32);
    mmio::write(at + 12, 0u32);
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
    mmio::write(at, RX_OWN | BUFFER_LEN);
}

fn drive(
    ecam: Ecam,
    f: &Function,
    dma: &mut DeviceDma,
    options: NicOptions,
    spacing: u32,
) -> Result<Outcome, &'static str> {
    if f.bars[0].1 < 0x2000 {
        return Err("nic: BAR 0 is missing or smaller than 8 KiB");
    }
    ecam.enable_memory_and_bus_master(f);
    let regs = Regs(f.bars[0].0);
    let phy = bring_up(&regs)?;
    start_dma_controller(ecam, f, &regs, spacing)?;
    let rings = Rings::map(dma, spacing)?;
    let buffers = RxBuffers::start(options.strategy);
    let mut slots = [Buffer::default(); RING as usize];
    for (i, slot) in (0..RING).zip(slots.iter_mut()) {
        *slot = buffers.take(dma)?;
        post(spacing, i, slot);
    }
    rings.start_channel(&regs)?;
    let counted_before = regs.read(STAT_RX_TOTAL_FRAMES);
    regs.write(INT_VEC_EN_SET, 1);
    let sw_interrupt = software_interrupt(&regs);
    regs.write(INT_VEC_EN_SET, 1);
    let received = receive(&regs, dma, buffers, &mut slots, options.frames, spacing)?;
    let counted = regs.read(STAT_RX_TOTAL_FRAMES).wrapping_sub(counted_before);

    // Stop, then give back every mapping.
    regs.write(MAC_RX, regs.read(MAC_RX) & !1);
    regs.write(FCT_RX_CTL, 1 << 24);
    regs.write(DMAC_CMD, 1);
    regs.write(INT_EN_CLR, !0);
    // The ring's own buffers were taken from the pool too; release_all returns them.
    buffers.release_all(dma)?;
    rings.unmap(dma)?;
    Ok(Outcome { phy, received, counted, sw_interrupt })
}

/// What the bring-up read: the MAC, the PHY's ID and its link speed.
struct Phy {
    mac: [u8; 6],
    id: u32,
    link_mbps: u32,
}

/// Checks the chip ID, resets the chip and its PHY, reads the MAC and the PHY's link over MDIO.
fn bring_up(regs: &Regs) -> Result<Phy, &'static str> {
    if regs.read(ID_REV) & 0xfff0_0000 != 0x7430_0000 {
        return Err("nic: ID_REV is not a LAN743x's");
    }
    regs.write(HW_CFG, regs.read(HW_CFG) | HW_CFG_LRST);
    if !regs.wait(|r| r.read(HW_CFG) & HW_CFG_LRST == 0) {
        return Err("nic: the light reset did not end");
    }
    regs.write(PMT_CTL, regs.read(PMT_CTL) | PMT_CTL_ETH_PHY_RST);
    if !regs.wait(|r| r.read(PMT_CTL) & (PMT_CTL_ETH_PHY_RST | PMT_CTL_READY) == PMT_CTL_READY) {
        return Err("nic: the PHY reset did not end");
    }
    let (l, h) = (regs.read(MAC_RX_ADDRL), regs.read(MAC_RX_ADDRH));
    let mac = [l as u8, (l >> 8) as u8, (l >> 16) as u8, (l >> 24) as u8, h as u8, (h >> 8) as u8];
    let (Some(id1), Some(id2), Some(bmsr)) = (regs.mdio_read(2), regs.mdio_read(3), regs.mdio_read(1)) else {
        return Err("nic: an MDIO access did not complete");
    };
    if bmsr & 0x24 != 0x24 {
        return Err("nic: the PHY reports no link");
    }
    let link_mbps = if regs.mdio_read(10).is_some_and(|s| s & 0x0800 != 0) { 1000 } else { 100 };
    Ok(Phy { mac, id: id1 << 16 | id2, link_mbps })
}

/// The DMA controller at the chosen spacing; RX channel 0 on vector 0.
fn start_dma_controller(ecam: Ecam, f: &Function, regs: &Regs, spacing: u32) -> Result<(), &'static str> {
    regs.write(DMAC_CMD, 1 << 31);
    regs.write(DMAC_CFG, 0x0001_0060 | spacing.trailing_zeros().saturating_sub(4));
    regs.write(INT_VEC_EN_CLR, !0);
    regs.write(INT_VEC_MAP0, 0);
    if !ecam.route_msix_vector0(f, VECTOR) {
        return Err("nic: no MSI-X capability");
    }
    regs.write(INT_EN_SET, INT_BIT_MAS);
    Ok(())
}

/// The descriptor ring and the head write-back word, mapped once: their IOVAs.
struct Rings {
    ring: u64,
    ring_len: u64,
    writeback: u64,
}

impl Rings {
    fn map(dma: &mut DeviceDma, spacing: u32) -> Result<Rings, &'static str> {
        let mem = memory();
        let ring_len = ((RING * spacing) as u64).next_multiple_of(4096);
        let rings = Rings {
            ring: dma.map(mem.ring.as_ptr() as u64, ring_len)?,
            ring_len,
            writeback: dma.map(mem.writeback.as_ptr() as u64, 4096)?,
        };
        mem.ring.fill(0);
        mem.writeback.fill(0);
        Ok(rings)
    }

    /// Points RX channel 0 at the ring, starts it and the MAC's receive path.
    fn start_channel(&self, regs: &Regs) -> Result<(), &'static str> {
        regs.write(DMAC_CMD, 1 << 8);
        regs.write(RX_BASE_ADDRH, (self.ring >> 32) as u32);
        regs.write(RX_BASE_ADDRL, self.ring as u32);
        regs.write(RX_HEAD_WRITEBACK_ADDRH, (self.writeback >> 32) as u32);
        regs.write(RX_HEAD_WRITEBACK_ADDRL, self.writeback as u32);
        regs.write(RX_CFG_A, 0x4710_0420);
        regs.write(RX_CFG_B, 0x0004_0000 | RING);
        regs.write(RX_CFG_C, 0x48);
        regs.write(RX_TAIL, RING - 1);
        if regs.read(RX_HEAD) != 0 {
            return Err("nic: RX_HEAD is not 0 after the channel's reset");
        }
        regs.write(INT_EN_SET, INT_BIT_DMA_RX0);
        regs.write(DMAC_INT_STS, DMAC_RXFRM0);
        regs.write(DMAC_INT_EN_SET, DMAC_RXFRM0);
        regs.write(DMAC_CMD, 1 << 4);
        regs.write(FCT_RX_CTL, 1 << 28);
        regs.write(RFE_CTL, 1 << 8);
        Ok(())
    }

    fn unmap(&self, dma: &mut DeviceDma) -> Result<(), &'static str> {
        dma.unmap(self.ring, self.ring_len)?;
        dma.unmap(self.writeback, 4096)
    }
}

/// The software interrupt, as the lan743x driver tests its vectors at open: it must arrive
/// whether or not frames do (a host NIC's check receives none). Whether it arrived.
fn software_interrupt(regs: &Regs) -> bool {
    let before = interrupts::count(VECTOR);
    regs.write(INT_EN_SET, INT_BIT_SW_GP);
    regs.write(INT_SET, INT_BIT_SW_GP);
    let arrived = time::wait_until(time::deadline_after_micros(TIMEOUT_US), || interrupts::count(VECTOR) != before);
    regs.write(INT_EN_CLR, INT_BIT_SW_GP);
    regs.write(INT_STS, INT_BIT_SW_GP);
    arrived
}

/// What the receive loop saw.
struct Received {
    tally: Tally,
    slots_ok: bool,
    measured: Measured,
}

/// Enables the MAC's receiver and receives `frames` frames: waits for the head write-back to
/// move, takes each frame, checks its write-back landed in its slot, reposts the slot.
fn receive(
    regs: &Regs,
    dma: &mut DeviceDma,
    buffers: &mut RxBuffers,
    slots: &mut [Buffer; RING as usize],
    frames: u32,
    spacing: u32,
) -> Result<Received, &'static str> {
    let stopwatch = Stopwatch::start(VECTOR, dma);
    regs.write(MAC_RX, regs.read(MAC_RX) | 1);
    let (mut tally, mut slots_ok) = (Tally::default(), true);
    let (mut head, mut tail) = (0u32, RING - 1);
    let writeback = memory().writeback.as_ptr() as u64;
    let head_written = || mmio::read::<u32>(writeback);
    while !tally.has(frames) {
        if !time::wait_until(time::deadline_after_micros(TIMEOUT_US), || head_written() != head) {
            return Err("nic: frames stopped arriving");
        }
        let now = head_written() % RING;
        while head != now && !tally.has(frames) {
            let at = slot(spacing, head);
            let (data0, data1): (u32, u32) = (mmio::read(at), mmio::read(at + 4));
            // The write-back must be in this slot: owned by the host, first and last buffer.
            slots_ok &= data0 & RX_OWN == 0 && data0 & RX_FS_LS == RX_FS_LS;
            slots_ok &= data1 & RX_STATUS_ERRORS & !1 == 0;
            let len = (data0 >> 16) & 0x3fff;
            let buffer = slots[head as usize];
            tally.sequence_in(mmio::bytes(buffer.gpa, (len as usize).min(BUFFER_LEN as usize)));
            tally.count(len.saturating_sub(4) as u64);
            buffers.release(buffer, dma)?;
            let fresh = buffers.take(dma)?;
            slots[head as usize] = fresh;
            post(spacing, head, &fresh);
            tail = head;
            head = (head + 1) % RING;
        }
        regs.write(RX_TAIL, TAIL_REARM | tail);
    }
    Ok(Received { tally, slots_ok, measured: stopwatch.stop(dma) })
}

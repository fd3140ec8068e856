//! Where RX buffers come from, in the three ways the seed patches compare. Every buffer is
//! 2 KiB (the hardware's buffer size); what differs is how buffers are mapped for DMA:
//!
//! - `flip`: one 4 KiB page mapped per two buffers and unmapped once both are consumed, as the
//!   stock atlantic driver does at page order 0 when the stack holds on to its buffers: half a
//!   map and half an unmap per frame.
//! - `order3`: one 32 KiB mapping split into sixteen buffers, as with a page order of 3: a
//!   sixteenth of a map per frame.
//! - `pool`: buffers mapped once when the ring is first filled and recycled after that, as
//!   page_pool does: no maps per frame.

use core::cell::UnsafeCell;

use crate::dma::DeviceDma;

/// Bytes per RX buffer.
pub const BUFFER_SIZE: u64 = 2048;
const PAGE: u64 = 4096;
const CHUNK: u64 = 32 * 1024;
const ARENA_SIZE: usize = 4 << 20;
const PAGES: usize = ARENA_SIZE / PAGE as usize;
const CHUNKS: usize = ARENA_SIZE / CHUNK as usize;

/// How buffers are mapped.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// A 4 KiB page per two buffers, unmapped when both are consumed.
    Flip,
    /// A 32 KiB mapping per sixteen buffers.
    Order3,
    /// Mapped once, recycled.
    Pool,
}

impl Strategy {
    /// Parses `flip`, `order3` or `pool`.
    pub fn parse(name: &str) -> Option<Strategy> {
        match name {
            "flip" => Some(Strategy::Flip),
            "order3" => Some(Strategy::Order3),
            "pool" => Some(Strategy::Pool),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Flip => "flip",
            Strategy::Order3 => "order3",
            Strategy::Pool => "pool",
        }
    }

    /// The mapping unit: (bytes, buffers in it).
    fn unit(self) -> (u64, u32) {
        match self {
            Strategy::Flip | Strategy::Pool => (PAGE, (PAGE / BUFFER_SIZE) as u32),
            Strategy::Order3 => (CHUNK, (CHUNK / BUFFER_SIZE) as u32),
        }
    }
}

#[repr(C, align(32768))]
struct Arena([u8; ARENA_SIZE]);

struct ArenaCell(UnsafeCell<Arena>);

// SAFETY: only the probe's single CPL3 thread and the device (by DMA) touch the arena.
unsafe impl Sync for ArenaCell {}

static ARENA: ArenaCell = ArenaCell(UnsafeCell::new(Arena([0; ARENA_SIZE])));

/// A mapped unit of memory (a page or a chunk) and how many of its buffers are still out.
#[derive(Clone, Copy, Default)]
struct Unit {
    iova: u64,
    outstanding: u32,
    mapped: bool,
}

/// A buffer handed to the NIC: guest-physical and device addresses, and its unit.
#[derive(Clone, Copy, Default)]
pub struct Buffer {
    /// Guest-physical address (where the probe reads the frame).
    pub gpa: u64,
    /// Device address (what goes in the descriptor).
    pub iova: u64,
    unit: u16,
}

/// The buffer source.
pub struct RxBuffers {
    strategy: Strategy,
    units: [Unit; PAGES],
    free: [u16; PAGES],
    free_count: usize,
    /// The unit being split into buffers, and the next buffer in it.
    current: Option<(u16, u32)>,
    /// Pool: recycled buffers ready for reuse.
    recycled: [Buffer; PAGES * 2],
    recycled_count: usize,
}

struct RxBuffersCell(UnsafeCell<RxBuffers>);

// SAFETY: only the probe's single CPL3 thread uses the buffer source.
unsafe impl Sync for RxBuffersCell {}

static RX_BUFFERS: RxBuffersCell = RxBuffersCell(UnsafeCell::new(RxBuffers {
    strategy: Strategy::Flip,
    units: [Unit { iova: 0, outstanding: 0, mapped: false }; PAGES],
    free: [0; PAGES],
    free_count: 0,
    current: None,
    recycled: [Buffer { gpa: 0, iova: 0, unit: 0 }; PAGES * 2],
    recycled_count: 0,
}));

impl RxBuffers {
    /// The buffer source (too big for the probe's stack, so a static), reset to `strategy`.
    pub fn start(strategy: Strategy) -> &'static mut RxBuffers {
        // SAFETY: single-threaded, and the NIC driver calls this once per run and keeps the only
        // reference.
        let this = unsafe { &mut *RX_BUFFERS.0.get() };
        let count = if strategy == Strategy::Order3 { CHUNKS } else { PAGES };
        for (i, slot) in this.free.iter_mut().enumerate().take(count) {
            *slot = (count - 1 - i) as u16;
        }
        this.strategy = strategy;
        this.units.fill(Unit::default());
        this.free_count = count;
        this.current = None;
        this.recycled_count = 0;
        this
    }

    fn unit_gpa(&self, unit: u16) -> u64 {
        let base = ARENA.0.get() as u64;
        base + unit as u64 * self.strategy.unit().0
    }

    /// A buffer for the ring.
    pub fn take(&mut self, dma: &mut DeviceDma) -> Result<Buffer, &'static str> {
        if self.strategy == Strategy::Pool && self.recycled_count > 0 {
            self.recycled_count -= 1;
            return Ok(self.recycled[self.recycled_count]);
        }
        let (bytes, per_unit) = self.strategy.unit();
        let (unit, index) = match self.current {
            Some((unit, index)) if index < per_unit => (unit, index),
            _ => {
                if self.free_count == 0 {
                    return Err("out of RX buffer memory");
                }
                self.free_count -= 1;
                let unit = self.free[self.free_count];
                let iova = dma.map(self.unit_gpa(unit), bytes)?;
                self.units[unit as usize] = Unit { iova, outstanding: 0, mapped: true };
                (unit, 0)
            }
        };
        self.current = Some((unit, index + 1));
        let gpa = self.unit_gpa(unit);
        let u = &mut self.units[unit as usize];
        u.outstanding += 1;
        let offset = index as u64 * BUFFER_SIZE;
        Ok(Buffer { gpa: gpa + offset, iova: u.iova + offset, unit })
    }

    /// The probe is done with a buffer's frame.
    pub fn release(&mut self, buffer: Buffer, dma: &mut DeviceDma) -> Result<(), &'static str> {
        if self.strategy == Strategy::Pool {
            self.recycled[self.recycled_count] = buffer;
            self.recycled_count += 1;
            return Ok(());
        }
        let (bytes, per_unit) = self.strategy.unit();
        let unit = &mut self.units[buffer.unit as usize];
        unit.outstanding -= 1;
        let exhausted = self.current.is_none_or(|(u, i)| u != buffer.unit || i >= per_unit);
        if unit.outstanding == 0 && exhausted && unit.mapped {
            unit.mapped = false;
            let iova = unit.iova;
            dma.unmap(iova, bytes)?;
            self.free[self.free_count] = buffer.unit;
            self.free_count += 1;
        }
        Ok(())
    }

    /// Unmaps everything still mapped (at the end of the run).
    pub fn release_all(&mut self, dma: &mut DeviceDma) -> Result<(), &'static str> {
        let bytes = self.strategy.unit().0;
        for unit in self.units.iter_mut().filter(|u| u.mapped) {
            unit.mapped = false;
            dma.unmap(unit.iova, bytes)?;
        }
        self.current = None;
        self.recycled_count = 0;
        Ok(())
    }
}

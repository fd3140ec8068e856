//! What both NIC drivers count while they receive: frames, bytes and the generator's sequence
//! numbers (`Tally`), and the time, interrupts and IOMMU maps the receive loop took
//! (`Stopwatch`).

use crate::dma::DeviceDma;
use crate::sequence::SequenceCheck;
use crate::{interrupts, time};

/// Where the frame generator puts its sequence number.
const SEQUENCE_OFFSET: usize = 42;

/// Frames and bytes received, and the order the generator's frames came in.
#[derive(Default)]
pub struct Tally {
    /// Frames taken from the ring.
    pub frames: u64,
    /// Their bytes, as the NIC reported them.
    pub bytes: u64,
    /// Their sequence numbers.
    pub sequence: SequenceCheck,
}

impl Tally {
    /// Counts a frame of `bytes` bytes.
    pub fn count(&mut self, bytes: u64) {
        self.frames += 1;
        self.bytes += bytes;
    }

    /// Reads the generator's sequence number from `frame`, when it is long enough to hold one.
    pub fn sequence_in(&mut self, frame: &[u8]) {
        if let Some(seq) = frame.get(SEQUENCE_OFFSET..SEQUENCE_OFFSET + 8) {
            self.sequence.saw(u64::from_be_bytes(seq.try_into().unwrap_or_default()));
        }
    }

    /// Whether `wanted` frames have arrived.
    pub fn has(&self, wanted: u32) -> bool {
        self.frames >= wanted as u64
    }
}

/// The start of a receive loop: when, how many interrupts on its vector, how many maps.
pub struct Stopwatch {
    vector: u8,
    tsc_khz: u64,
    tsc: u64,
    interrupts: u64,
    maps: u64,
}

/// What a receive loop took.
pub struct Measured {
    /// Maps before the loop: filling the ring.
    pub initial_maps: u64,
    /// Maps the loop took.
    pub receive_maps: u64,
    /// Wall time of the loop.
    pub elapsed_ns: u64,
    /// Interrupts on the vector during the loop.
    pub rx_interrupts: u64,
}

impl Stopwatch {
    /// Starts timing a loop whose interrupts arrive on `vector` and whose maps `dma` counts.
    pub fn start(vector: u8, dma: &DeviceDma) -> Stopwatch {
        // The rate first: measuring it (once) must not count as receive time.
        let tsc_khz = time::tsc_khz().unwrap_or(1);
        Stopwatch { vector, tsc_khz, tsc: time::tsc(), interrupts: interrupts::count(vector), maps: dma.maps }
    }

    /// What the loop took, now that it is over.
    pub fn stop(&self, dma: &DeviceDma) -> Measured {
        Measured {
            initial_maps: self.maps,
            receive_maps: dma.maps - self.maps,
            elapsed_ns: (time::tsc() - self.tsc) * 1_000_000 / self.tsc_khz,
            rx_interrupts: interrupts::count(self.vector) - self.interrupts,
        }
    }
}

//! The AQC100 model's receive path on the host alone: how many frames a second one core writes
//! through it into mapped memory, next to bare copies of the same frames into the same memory
//! (`driverlab bench model-rx`, docs/benchmarks.md). No VM, no vfio-user: the NIC's own code.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use super::nic::Nic;
use super::regs;
use crate::dma::DmaSpace;
use crate::nic_model::{NicReceive, NicRegisters};
use crate::wire::generator::{GeneratorConfig, generator};

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum RxBenchError {
    /// Memory for the ring and buffers, or its DMA map.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The model did not deliver every frame of a round.
    #[error("round {round}: {delivered} of {frames} frames delivered")]
    Short {
        /// The round, from 0.
        round: usize,
        /// Frames delivered.
        delivered: u64,
        /// Frames sent.
        frames: u64,
    },
}

const MAC: [u8; 6] = [0x02, 0x1d, 0x6a, 0x00, 0x00, 0x01];
const IOVA: u64 = 0x1_0000_0000;
/// The atlantic driver's default RX ring size (AQ_CFG_RXDS_DEF).
const RING: u32 = 2048;
const BUFFER: u64 = 2048;
/// 10GbE line rate for 1514-byte frames (1538 bytes on the wire with preamble, FCS and gap).
pub const LINE_RATE_1514: f64 = 10e9 / (1538.0 * 8.0);

/// What the host-only receive benchmark measured, round by round.
#[derive(Debug, Clone)]
pub struct ModelRxBench {
    /// Frames per round.
    pub frames: u64,
    /// Frame size.
    pub size: usize,
    /// Time of each round through the model's receive path.
    pub model: Vec<Duration>,
    /// Time of each round of bare DMA copies of the same frames into the same memory.
    pub copy: Vec<Duration>,
}

/// Frames per second of a round.
fn pps(frames: u64, time: &Duration) -> f64 {
    frames as f64 / time.as_secs_f64()
}

impl ModelRxBench {
    /// Frames per second through the model: (median, best) over the rounds.
    pub fn model_pps(&self) -> (f64, f64) {
        rates(self.frames, &self.model)
    }

    /// Frames per second of bare copies: (median, best).
    pub fn copy_pps(&self) -> (f64, f64) {
        rates(self.frames, &self.copy)
    }
}

fn rates(frames: u64, times: &[Duration]) -> (f64, f64) {
    let mut rates: Vec<f64> = times.iter().map(|t| pps(frames, t)).collect();
    rates.sort_by(f64::total_cmp);
    let median = rates.get(rates.len() / 2).copied().unwrap_or(0.0);
    (median, rates.last().copied().unwrap_or(0.0))
}

fn memfd(size: u64) -> std::io::Result<File> {
    let file = memfd::MemfdOptions::default()
        .close_on_exec(true)
        .create("driverlab-bench")
        .map_err(std::io::Error::other)?
        .into_file();
    file.set_len(size)?;
    Ok(file)
}

/// Receives `frames` generated frames of `size` bytes through the model's receive path on this
/// thread, with a "driver" that hands the ring back whenever it fills; then copies as many
/// frames into the same memory through the same DMA map, as the reference. `rounds` times,
/// alternating, so that interference from elsewhere on the host shows as spread between rounds.
pub fn model_rx(frames: u64, size: usize, rounds: usize) -> Result<ModelRxBench, RxBenchError> {
    let per_frame = (size as u64).div_ceil(BUFFER);
    let buffers = RING as u64 * per_frame.max(1) * BUFFER;
    let ring_bytes = RING as u64 * 16;
    let memory = memfd(ring_bytes + buffers)?;
    let dma = DmaSpace::new();
    dma.map(IOVA, ring_bytes + buffers, &memory, 0, true)?;
    let config = GeneratorConfig { pps: None, size, count: None };
    let (backend, _) = generator(config, MAC);
    let (mut source, sink) = (backend.source, backend.sink);
    let mut nic = Nic::new(MAC, sink);
    for (reg, value) in [
        (regs::FW_CONTROL, regs::RATE_10G),
        (regs::UNICAST_FILTER_LO, u32::from_be_bytes([MAC[2], MAC[3], MAC[4], MAC[5]])),
        (regs::UNICAST_FILTER_HI, regs::UNICAST_FILTER_ENABLE | u16::from_be_bytes([MAC[0], MAC[1]]) as u32),
        (regs::RX_CHECKSUM_CONTROL, regs::RX_CHECKSUM_IPV4 | regs::RX_CHECKSUM_L4),
        (regs::RX_RING_BASE + regs::RING_ADDR_LO, IOVA as u32),
        (regs::RX_RING_BASE + regs::RING_ADDR_HI, (IOVA >> 32) as u32),
        (regs::RX_RING_BASE + regs::RX_RING_BUFFER_SIZE, 2),
        (regs::RX_RING_BASE + regs::RING_CONTROL, regs::RING_ENABLE | (RING / 8) << 3),
        (regs::RX_BUFFER_ENABLE, 1),
    ] {
        nic.write(reg, value, &dma);
    }
    // The driver's descriptors: buffer addresses, rewritten whenever the ring is handed back.
    let mut descriptors = vec![0u8; ring_bytes as usize];
    for (i, d) in descriptors.chunks_mut(16).enumerate() {
        d[..8].copy_from_slice(&(IOVA + ring_bytes + i as u64 * BUFFER).to_le_bytes());
    }
    let mut tail = 0u32;
    let mut hand_back = |nic: &mut Nic| -> Result<(), RxBenchError> {
        memory.write_all_at(&descriptors, 0)?;
        tail = (tail + RING - 1) % RING;
        nic.write(regs::RX_RING_BASE + regs::RING_TAIL, tail, &dma);
        Ok(())
    };
    let frame = vec![0x5au8; size];
    let mut result = ModelRxBench { frames, size, model: Vec::new(), copy: Vec::new() };
    for round in 0..rounds.max(1) {
        let before = nic.stats().rx.frames();
        let start = Instant::now();
        let mut received = 0;
        while received < frames {
            if !nic.rx_room(size) {
                hand_back(&mut nic)?;
            }
            let Some(frame) = source.receive()? else { continue };
            nic.receive(frame, &dma);
            received += 1;
        }
        result.model.push(start.elapsed());
        let delivered = nic.stats().rx.frames() - before;
        if delivered != frames {
            return Err(RxBenchError::Short { round, delivered, frames });
        }

        let start = Instant::now();
        for i in 0..frames {
            let slot = i % (RING as u64 * per_frame.max(1));
            let _ = dma.write(IOVA + ring_bytes + slot * BUFFER, &frame);
        }
        result.copy.push(start.elapsed());
    }
    Ok(result)
}

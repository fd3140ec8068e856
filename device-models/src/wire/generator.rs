//! A deterministic frame source for the NIC: UDP/IPv4 frames of one size addressed to the NIC,
//! each carrying a sequence number, either as fast as the ring takes them (the default: nothing
//! is dropped, the guest sets the pace) or at a fixed rate (frames that find no descriptor are
//! dropped, as on a wire). Its sink counts what the guest transmits.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::wire::backend::{Backend, FrameSink, FrameSource, Readiness};
use crate::wire::offload;

pub use vm_spec::model_control::{MAX_FRAME as MAX_SIZE, MIN_FRAME as MIN_SIZE};
/// Where the sequence number sits in each frame (start of the UDP payload).
pub const SEQUENCE_OFFSET: usize = 42;
/// The generator's own MAC address (the "peer").
pub const PEER_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x00, 0x01];

pub use vm_spec::model_control::GeneratorConfig;

/// What the guest transmitted into the generator.
#[derive(Debug, Default)]
pub struct SinkCounts {
    /// Frames sent.
    pub frames: AtomicU64,
    /// Bytes sent.
    pub bytes: AtomicU64,
}

struct Source {
    config: GeneratorConfig,
    template: Vec<u8>,
    /// Checksum sum of the template with a zero sequence number.
    base_sum: u64,
    sent: u64,
    start: Instant,
}

impl Source {
    fn due(&self) -> Option<Instant> {
        let pps = self.config.pps?;
        Some(self.start + Duration::from_nanos((self.sent as u128 * 1_000_000_000 / pps as u128) as u64))
    }

    fn exhausted(&self) -> bool {
        self.config.count.is_some_and(|c| self.sent >= c)
    }
}

/// Builds the frame template: headers, a zero sequence number, a fixed byte pattern.
fn template(size: usize, dst: [u8; 6]) -> (Vec<u8>, u64) {
    let mut f = vec![0u8; size];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&PEER_MAC);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((size - 14) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    f[34..36].copy_from_slice(&9u16.to_be_bytes());
    f[36..38].copy_from_slice(&9u16.to_be_bytes());
    f[38..40].copy_from_slice(&((size - 34) as u16).to_be_bytes());
    for (i, b) in f[SEQUENCE_OFFSET + 8..].iter_mut().enumerate() {
        *b = i as u8;
    }
    offload::insert_checksums(&mut f, true, false);
    let udp_len = size - 34;
    let pseudo = offload::sum16(&f[26..34], 17 + udp_len as u64);
    let base_sum = offload::sum16(&f[34..], pseudo);
    (f, base_sum)
}

impl FrameSource for Source {
    fn receive(&mut self) -> io::Result<Option<&[u8]>> {
        if self.exhausted() || self.due().is_some_and(|due| Instant::now() < due) {
            return Ok(None);
        }
        // The template becomes the frame: only the sequence number and checksum change.
        let frame = &mut self.template[..];
        let seq = self.sent.to_be_bytes();
        frame[SEQUENCE_OFFSET..SEQUENCE_OFFSET + 8].copy_from_slice(&seq);
        let mut checksum = offload::fold(offload::sum16(&seq, self.base_sum));
        if checksum == 0 {
            checksum = 0xffff;
        }
        frame[40..42].copy_from_slice(&checksum.to_be_bytes());
        self.sent += 1;
        Ok(Some(&self.template))
    }

    fn readiness(&self) -> Readiness {
        if self.exhausted() {
            return Readiness::Exhausted;
        }
        self.due().map_or(Readiness::At(Instant::now()), Readiness::At)
    }

    fn lossless(&self) -> bool {
        self.config.pps.is_none()
    }

    fn max_frame(&self) -> usize {
        self.config.size
    }

    fn carrier(&mut self) -> bool {
        true
    }
}

struct Sink(Arc<SinkCounts>);

impl FrameSink for Sink {
    fn transmit(&mut self, frame: &[u8]) -> io::Result<()> {
        self.0.frames.fetch_add(1, Ordering::Relaxed);
        self.0.bytes.fetch_add(frame.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// A generator backend sending to `dst`, and the counts of what the guest sent it.
pub fn generator(config: GeneratorConfig, dst: [u8; 6]) -> (Backend, Arc<SinkCounts>) {
    let (template, base_sum) = template(config.size, dst);
    let counts = Arc::new(SinkCounts::default());
    let source = Source { config, template, base_sum, sent: 0, start: Instant::now() };
    let backend =
        Backend { source: Box::new(source), sink: Box::new(Sink(counts.clone())), description: config.to_string() };
    (backend, counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        assert_eq!("".parse::<GeneratorConfig>().unwrap(), GeneratorConfig::default());
        let c: GeneratorConfig = "pps=1000, size=64,count=5".parse().unwrap();
        assert_eq!(c, GeneratorConfig { pps: Some(1000), size: 64, count: Some(5) });
        assert_eq!("pps=0".parse::<GeneratorConfig>().unwrap().pps, None, "0 is flat out");
        assert!("size=59".parse::<GeneratorConfig>().unwrap_err().contains("60 to"));
        assert!("speed=3".parse::<GeneratorConfig>().unwrap_err().contains("unknown"));
        assert!("pps".parse::<GeneratorConfig>().is_err());
        assert!("pps=x".parse::<GeneratorConfig>().is_err());
    }

    #[test]
    fn frames_are_valid_numbered_and_counted() {
        let config = GeneratorConfig { pps: None, size: 1514, count: Some(3) };
        let (mut backend, _) = generator(config, [2, 0, 0, 0, 0, 9]);
        for seq in 0..3u64 {
            let frame = backend.source.receive().unwrap().unwrap().to_vec();
            assert_eq!(frame.len(), 1514);
            let frame = &frame[..];
            assert_eq!(&frame[..6], &[2, 0, 0, 0, 0, 9]);
            assert_eq!(frame[SEQUENCE_OFFSET..SEQUENCE_OFFSET + 8], seq.to_be_bytes());
            let check = offload::check_rx(frame, true, true);
            assert_eq!(check.l4_checksum, offload::Checksum::Good, "frame {seq}");
        }
        assert_eq!(backend.source.receive().unwrap(), None);
        assert_eq!(backend.source.readiness(), Readiness::Exhausted);
    }

    #[test]
    fn paced_frames_wait_for_their_time() {
        let config = GeneratorConfig { pps: Some(1), size: 60, count: None };
        let (mut backend, counts) = generator(config, [2, 0, 0, 0, 0, 9]);
        assert!(backend.source.receive().unwrap().is_some(), "the first is due at once");
        assert_eq!(backend.source.receive().unwrap(), None, "the next in a second");
        assert!(matches!(backend.source.readiness(), Readiness::At(_)));
        assert!(!backend.source.lossless());
        backend.sink.transmit(&[0; 100]).unwrap();
        assert_eq!(counts.bytes.load(Ordering::Relaxed), 100);
    }
}

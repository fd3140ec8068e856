//! The model driven the way the atlantic driver drives it, against guest memory in a memfd.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::interrupts::GLOBAL_CONTROL as IRQ_CONTROL;
use super::regs::*;
use super::*;
use crate::server::Model;
use crate::test_support::{eventfd, fired, memfd};
use crate::wire::backend::{Backend, FrameSink, unplugged};
use crate::wire::generator::{GeneratorConfig, SEQUENCE_OFFSET, generator};
use crate::wire::offload;

const IOVA: u64 = 0x10_0000;
const MEMORY: u64 = 4 << 20;
const RX_RING_AT: u64 = IOVA;
const TX_RING_AT: u64 = IOVA + 0x1000;
const RX_BUFFERS: u64 = IOVA + 0x10_0000;
const TX_BUFFERS: u64 = IOVA + 0x30_0000;
const RING: u32 = 64;

struct Guest {
    model: Aqc100,
    memory: File,
    vector0: File,
}

impl Guest {
    fn new(backend: Backend) -> Guest {
        let model = Aqc100::new(MacAddress(DEFAULT_MAC), backend).unwrap();
        let memory = memfd(MEMORY);
        model.dma().map(IOVA, MEMORY, &memory, 0, true).unwrap();
        let vector0 = eventfd();
        model.vectors().set(0, vec![vector0.try_clone().unwrap()]);
        Guest { model, memory, vector0 }
    }

    fn write(&mut self, reg: u32, value: u32) {
        self.model.bar_write(0, reg as u64, &value.to_le_bytes());
    }

    fn read(&mut self, reg: u32) -> u32 {
        let mut data = [0u8; 4];
        self.model.bar_read(0, reg as u64, &mut data);
        u32::from_le_bytes(data)
    }

    fn poke(&self, iova: u64, data: &[u8]) {
        self.memory.write_all_at(data, iova - IOVA).unwrap();
    }

    fn peek(&self, iova: u64, len: usize) -> Vec<u8> {
        let mut data = vec![0u8; len];
        self.memory.read_exact_at(&mut data, iova - IOVA).unwrap();
        data
    }

    /// What atlantic's hw_atl_b0 init does that matters here, with ring 0 on vector 0.
    fn bring_up(&mut self) {
        self.write(GLOBAL_CONTROL, SOFT_RESET);
        assert_ne!(self.read(BOOT_EXIT_CODE) & 0xffff, 0);
        self.write(FW_CONTROL, 0xf20);
        self.write(IRQ_CONTROL, 0x2000_0022);
        self.write(IAMR, !0);
        self.write(RING_IRQ_MAP_BASE, 0x8080_0000 | 0x8000);
        self.write(RX_CHECKSUM_CONTROL, 3);
        self.write(TX_CHECKSUM_CONTROL, 3);
        self.write(LSO_FLAGS_FIRST_MID, 0x0ff6_0ff6);
        self.write(LSO_FLAGS_LAST, 0x0f7f);
        let m = DEFAULT_MAC;
        self.write(UNICAST_FILTER_LO, u32::from_be_bytes([m[2], m[3], m[4], m[5]]));
        self.write(UNICAST_FILTER_HI, UNICAST_FILTER_ENABLE | u16::from_be_bytes([m[0], m[1]]) as u32);
        self.write(RX_RING_BASE + RING_ADDR_LO, RX_RING_AT as u32);
        self.write(RX_RING_BASE + RING_ADDR_HI, 0);
        self.write(RX_RING_BASE + RX_RING_BUFFER_SIZE, 2);
        self.write(RX_RING_BASE + RING_CONTROL, RING_ENABLE | (RING / 8) << 3);
        self.write(TX_RING_BASE + RING_ADDR_LO, TX_RING_AT as u32);
        self.write(TX_RING_BASE + RING_CONTROL, RING_ENABLE | (RING / 8) << 3);
        self.write(RX_BUFFER_ENABLE, 1);
        self.write(TX_BUFFER_ENABLE, 1);
        self.write(IMSR, !0);
        assert_eq!(self.read(FW_STATE), RATE_10G, "link up at 10G");
        fired(&self.vector0);
    }

    /// Gives the NIC `count` RX descriptors from index `first`, 2 KiB buffers each.
    fn post_rx(&mut self, first: u32, count: u32) {
        for i in first..first + count {
            let index = i % RING;
            let mut desc = [0u8; 16];
            desc[..8].copy_from_slice(&(RX_BUFFERS + index as u64 * 2048).to_le_bytes());
            self.poke(RX_RING_AT + index as u64 * 16, &desc);
        }
        self.write(RX_RING_BASE + RING_TAIL, (first + count) % RING);
    }

    fn wait_rx_head(&mut self, head: u32) {
        let start = Instant::now();
        while self.read(RX_RING_BASE + RING_HEAD) != head {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "RX head stuck at {}",
                self.read(RX_RING_BASE + RING_HEAD)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn writeback(&self, index: u32) -> (u32, u16, u16) {
        let d = self.peek(RX_RING_AT + index as u64 * 16, 16);
        (
            u32::from_le_bytes(d[0..4].try_into().unwrap()),
            u16::from_le_bytes([d[8], d[9]]),
            u16::from_le_bytes([d[10], d[11]]),
        )
    }
}

#[test]
fn generated_frames_land_in_posted_buffers_with_writeback_and_interrupts() {
    let config = GeneratorConfig { pps: None, size: 1514, count: Some(5) };
    let (backend, _) = generator(config, DEFAULT_MAC);
    let mut guest = Guest::new(backend);
    guest.bring_up();
    guest.post_rx(0, 16);
    guest.wait_rx_head(5);
    for i in 0..5u32 {
        let (type_word, status, len) = guest.writeback(i);
        assert_eq!(status & (RXD_DD | RXD_EOP), RXD_DD | RXD_EOP, "frame {i}");
        assert_eq!(status & RXD_STAT_L4_VALID, RXD_STAT_L4_VALID, "UDP checksum verified");
        assert_eq!(len, 1514);
        assert_eq!((type_word >> RXD_PACKET_TYPE_SHIFT) & 0x1f, 1 << 2, "IPv4 UDP");
        assert_eq!((type_word >> RXD_CHECKSUM_CHECKED_SHIFT) & 3, 3);
        let frame = guest.peek(RX_BUFFERS + i as u64 * 2048, 1514);
        assert_eq!(frame[SEQUENCE_OFFSET..SEQUENCE_OFFSET + 8], (i as u64).to_be_bytes());
    }
    assert_eq!(guest.writeback(5).1 & RXD_DD, 0, "nothing beyond");
    assert_eq!(fired(&guest.vector0), 1, "one interrupt, then auto-masked");
    guest.write(IMSR, 1);
    assert_eq!(fired(&guest.vector0), 1, "the latched frames fire on re-enable");
    assert_eq!(guest.read(RX_GOOD_FRAMES), 5);
    assert_eq!(guest.read(RX_GOOD_OCTETS), 5 * 1514);
    let counters = guest.model.counters();
    assert_eq!((counters.rx_frames, counters.rx_bytes, counters.dma_faults), (5, 5 * 1514, 0));
}

/// Device Control's offset: the PCI Express capability found by walking the list.
fn devctl(guest: &mut Guest) -> usize {
    let config = guest.model.config();
    let mut byte = [0u8; 1];
    config.read(0x34, &mut byte);
    let mut at = byte[0] as usize;
    while at != 0 {
        let mut header = [0u8; 2];
        config.read(at, &mut header);
        if header[0] == 0x10 {
            let mut devcap = [0u8; 4];
            config.read(at + 4, &mut devcap);
            assert_ne!(u32::from_le_bytes(devcap) & 1 << 28, 0, "Function Level Reset offered");
            return at + 8;
        }
        at = header[1] as usize;
    }
    panic!("no PCI Express capability");
}

#[test]
fn a_function_level_reset_stops_a_running_ring_and_keeps_the_clients_maps() {
    // A ring one VM left running must not write into the next VM's memory: vfio-pci resets the
    // function between them.
    let config = GeneratorConfig { pps: Some(2000), size: 60, count: None };
    let (backend, _) = generator(config, DEFAULT_MAC);
    let mut guest = Guest::new(backend);
    guest.bring_up();
    guest.post_rx(0, 2);
    guest.wait_rx_head(2);
    let devctl = devctl(&mut guest);
    guest.model.config_write(devctl as u64, &0x8000u16.to_le_bytes());
    let mut control = [0u8; 2];
    guest.model.config().read(devctl, &mut control);
    assert_eq!(u16::from_le_bytes(control) & 0x8000, 0, "the FLR bit reads 0");
    // The old driver's descriptors and buffers, as the next VM's memory would hold them.
    guest.post_rx(2, RING - 2);
    guest.poke(RX_BUFFERS, &vec![0u8; RING as usize * 2048]);
    std::thread::sleep(Duration::from_millis(100));
    assert!(guest.peek(RX_BUFFERS, RING as usize * 2048).iter().all(|&b| b == 0), "no DMA after the reset");
    assert_eq!(guest.read(RX_RING_BASE + RING_HEAD), 0, "the ring is back at power-on");
    // The client's DMA maps and eventfds are its own: a driver brings the card up again.
    guest.bring_up();
    guest.post_rx(0, 4);
    guest.wait_rx_head(4);
    assert_eq!(guest.writeback(0).1 & RXD_DD, RXD_DD, "frames land after the new bring-up");
}

#[test]
fn a_jumbo_frame_spans_descriptors() {
    let config = GeneratorConfig { pps: None, size: 5000, count: Some(1) };
    let (backend, _) = generator(config, DEFAULT_MAC);
    let mut guest = Guest::new(backend);
    guest.bring_up();
    guest.post_rx(0, 8);
    guest.wait_rx_head(3);
    let wb: Vec<_> = (0..3).map(|i| guest.writeback(i)).collect();
    assert_eq!(wb[0].1 & (RXD_DD | RXD_EOP), RXD_DD, "first: done, not the end");
    assert_eq!(wb[1].1 & (RXD_DD | RXD_EOP), RXD_DD);
    assert_eq!(wb[2].1 & (RXD_DD | RXD_EOP), RXD_DD | RXD_EOP);
    assert!(wb.iter().all(|w| w.2 == 5000), "every piece carries the whole length");
    let tail = guest.peek(RX_BUFFERS + 2 * 2048, 5000 - 4096);
    assert_eq!(tail[tail.len() - 1], ((5000 - SEQUENCE_OFFSET - 8 - 1) % 256) as u8, "the pattern runs on");
}

#[test]
fn frames_wait_for_descriptors_when_the_source_is_lossless() {
    let config = GeneratorConfig { pps: None, size: 60, count: Some(100) };
    let (backend, _) = generator(config, DEFAULT_MAC);
    let mut guest = Guest::new(backend);
    guest.bring_up();
    let mut posted = 0;
    for _ in 0..10 {
        guest.post_rx(posted, 10);
        posted += 10;
        guest.wait_rx_head(posted % RING);
    }
    let status = guest.model.handle().status();
    assert_eq!((status.counters.rx_frames, status.counters.rx_dropped), (100, 0));
}

struct Capture(Arc<Mutex<Vec<Vec<u8>>>>);

impl FrameSink for Capture {
    fn transmit(&mut self, frame: &[u8]) -> std::io::Result<()> {
        self.0.lock().unwrap().push(frame.to_vec());
        Ok(())
    }
}

fn capturing() -> (Backend, Arc<Mutex<Vec<Vec<u8>>>>) {
    let frames = Arc::new(Mutex::new(Vec::new()));
    let backend = Backend { sink: Box::new(Capture(frames.clone())), ..unplugged() };
    (backend, frames)
}

fn tx_descriptor(guest: &Guest, index: u32, address: u64, control: u32, control2: u32) {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&address.to_le_bytes());
    d[8..12].copy_from_slice(&control.to_le_bytes());
    d[12..16].copy_from_slice(&control2.to_le_bytes());
    guest.poke(TX_RING_AT + index as u64 * 16, &d);
}

/// An IPv4/TCP frame with `payload`, checksums left for the NIC.
fn tcp_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 54];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&DEFAULT_MAC);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((40 + payload.len()) as u16).to_be_bytes());
    f[18..20].copy_from_slice(&0x1000u16.to_be_bytes());
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[10, 0, 0, 2]);
    f[30..34].copy_from_slice(&[10, 0, 0, 1]);
    f[38..42].copy_from_slice(&7u32.to_be_bytes());
    f[46] = 5 << 4;
    f[47] = 0x18; // ACK PSH
    f.extend_from_slice(payload);
    f
}

#[test]
fn transmits_apply_checksum_offload_and_tso_and_complete_by_head() {
    let (backend, frames) = capturing();
    let mut guest = Guest::new(backend);
    guest.bring_up();

    // A plain frame in two buffers (header, payload) with checksum offload.
    let frame = tcp_frame(&[0x55; 946]);
    guest.poke(TX_BUFFERS, &frame[..54]);
    guest.poke(TX_BUFFERS + 0x1000, &frame[54..]);
    let len = frame.len() as u32;
    tx_descriptor(&guest, 0, TX_BUFFERS, TXD_TYPE_DATA | 54 << 4 | TXD_IP_CHECKSUM | TXD_L4_CHECKSUM, len << 14);
    tx_descriptor(&guest, 1, TX_BUFFERS + 0x1000, TXD_TYPE_DATA | (len - 54) << 4 | TXD_EOP, len << 14);
    guest.write(TX_RING_BASE + RING_TAIL, 2);
    assert_eq!(guest.read(TX_RING_BASE + RING_HEAD), 2, "completed");
    assert_eq!(fired(&guest.vector0), 1, "TX interrupt");
    {
        let sent = frames.lock().unwrap();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].len(), frame.len());
        let check = offload::check_rx(&sent[0], true, true);
        assert_eq!(check.l4_checksum, offload::Checksum::Good, "checksums filled in");
    }

    // A 4000-byte TSO packet: context descriptor, then one data descriptor.
    let big = tcp_frame(&vec![0xaa; 4000]);
    guest.poke(TX_BUFFERS + 0x2000, &big);
    let context = TXD_TYPE_CONTEXT | TXC_TCP | 14 << 24;
    let context2 = 1448 << 16 | 20 << 8 | 20 >> 1;
    tx_descriptor(&guest, 2, 0, context, context2);
    let data = TXD_TYPE_DATA | (big.len() as u32) << 4 | TXD_EOP | TXD_LSO | TXD_IP_CHECKSUM | TXD_L4_CHECKSUM;
    tx_descriptor(&guest, 3, TX_BUFFERS + 0x2000, data, 4000 << 14 | TXD_CONTEXT_ENABLE);
    guest.write(IMSR, 1);
    guest.write(TX_RING_BASE + RING_TAIL, 4);
    assert_eq!(guest.read(TX_RING_BASE + RING_HEAD), 4);
    let sent = frames.lock().unwrap();
    let segments = &sent[1..];
    assert_eq!(segments.iter().map(Vec::len).collect::<Vec<_>>(), vec![1502, 1502, 1158]);
    for (i, s) in segments.iter().enumerate() {
        assert_eq!(offload::check_rx(s, true, true).l4_checksum, offload::Checksum::Good, "segment {i}");
        let seq = u32::from_be_bytes(s[38..42].try_into().unwrap());
        assert_eq!(seq, 7 + 1448 * i as u32);
    }
    assert_eq!(segments[0][47] & 0x08, 0, "PSH only on the last segment");
    assert_eq!(segments[2][47] & 0x08, 0x08);
    let status = guest.model.handle().status();
    assert_eq!(status.counters.tx_frames, 4);
}

#[test]
fn refused_dma_is_counted_and_never_stalls_the_rings() {
    let (backend, frames) = capturing();
    let mut guest = Guest::new(backend);
    guest.bring_up();
    // TX from an address nobody mapped: dropped, counted, completed.
    tx_descriptor(&guest, 0, 0xdead_0000, TXD_TYPE_DATA | 100 << 4 | TXD_EOP, 100 << 14);
    guest.write(TX_RING_BASE + RING_TAIL, 1);
    assert_eq!(guest.read(TX_RING_BASE + RING_HEAD), 1);
    assert!(frames.lock().unwrap().is_empty());
    assert_eq!(guest.model.handle().status().counters.tx_errors, 1);
    assert_eq!(guest.model.counters().dma_faults, 1);

    // An RX ring whose descriptors live outside the mapping.
    let config = GeneratorConfig { pps: None, size: 60, count: Some(1) };
    let (backend, _) = generator(config, DEFAULT_MAC);
    let mut guest = Guest::new(backend);
    guest.bring_up();
    guest.write(RX_RING_BASE + RING_CONTROL, 0);
    guest.write(RX_RING_BASE + RING_ADDR_LO, 0x7000_0000);
    guest.write(RX_RING_BASE + RING_CONTROL, RING_ENABLE | (RING / 8) << 3);
    guest.write(RX_RING_BASE + RING_TAIL, 4);
    guest.wait_rx_head(1);
    let status = guest.model.handle().status();
    assert_eq!((status.counters.rx_frames, status.counters.rx_errors), (0, 1));
    assert!(guest.model.counters().dma_faults >= 1);
}

#[test]
fn link_down_drops_and_the_driver_sees_it() {
    let config = GeneratorConfig { pps: Some(100_000), size: 60, count: Some(50) };
    let (backend, _) = generator(config, DEFAULT_MAC);
    let mut guest = Guest::new(backend);
    guest.bring_up();
    guest.model.handle().set_link(false);
    assert_eq!(guest.read(FW_STATE), 0);
    guest.post_rx(0, 32);
    let start = Instant::now();
    while guest.model.handle().status().counters.rx_dropped + guest.model.handle().status().counters.rx_filtered < 50 {
        assert!(start.elapsed() < Duration::from_secs(5), "the generator's frames were not dropped");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(guest.read(RX_RING_BASE + RING_HEAD), 0);
    assert_eq!(guest.model.handle().status().counters.rx_frames, 0);
    guest.model.handle().set_link(true);
    assert_eq!(guest.read(FW_STATE), RATE_10G);
    assert_eq!(guest.model.handle().status().link_mbps, 10_000);
}

#[test]
fn mac_addresses_parse_and_print() {
    let mac: MacAddress = "02:1d:6a:00:00:01".parse().unwrap();
    assert_eq!(mac, MacAddress(DEFAULT_MAC));
    assert_eq!(mac.to_string(), "02:1d:6a:00:00:01");
    assert!("03:00:00:00:00:01".parse::<MacAddress>().unwrap_err().contains("group"));
    assert!("02:00:00:00:01".parse::<MacAddress>().is_err());
    assert!("zz:00:00:00:00:01".parse::<MacAddress>().is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever a hostile driver writes, in whatever order, the model answers and survives.
    #[test]
    fn hostile_register_writes_never_panic(writes in prop::collection::vec((0u32..0x10000, any::<u32>()), 1..200)) {
        let config = GeneratorConfig { pps: None, size: 1514, count: Some(200) };
        let (backend, _) = generator(config, DEFAULT_MAC);
        let mut guest = Guest::new(backend);
        guest.bring_up();
        guest.post_rx(0, 32);
        for (reg, value) in writes {
            guest.write(reg & !3, value);
            guest.read(reg & !3);
        }
        guest.write(TX_RING_BASE + RING_TAIL, 63);
        guest.model.bar_write(0, 0xfffe, &[1, 2]);
        guest.model.bar_read(0, 0x1_0000, &mut [0; 4]);
        let _ = guest.model.handle().status();
    }
}

//! The LAN7430 model driven the way Linux's lan743x driver (6.12) drives it, against guest
//! memory in a memfd.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::regs::*;
use super::*;
use crate::server::Model;
use crate::test_support::{eventfd, fired, memfd};
use crate::wire::backend::{Backend, FrameSink, unplugged};
use crate::wire::generator::{GeneratorConfig, generator};
use vm_spec::pcie_link::Transactions;

const IOVA: u64 = 0x10_0000;
const MEMORY: u64 = 4 << 20;
const RX_RING_AT: u64 = IOVA;
const TX_RING_AT: u64 = IOVA + 0x4000;
const RX_WRITEBACK: u64 = IOVA + 0x8000;
const TX_WRITEBACK: u64 = IOVA + 0x8100;
const RX_BUFFERS: u64 = IOVA + 0x10_0000;
const TX_BUFFERS: u64 = IOVA + 0x30_0000;
const RING: u32 = 128;
const RX0: u32 = RX_CFG_A_0;
const TX0: u32 = TX_CFG_A_0;

struct Capture(Arc<Mutex<Vec<Vec<u8>>>>);

impl FrameSink for Capture {
    fn transmit(&mut self, frame: &[u8]) -> std::io::Result<()> {
        self.0.lock().unwrap().push(frame.to_vec());
        Ok(())
    }
}

struct Guest {
    model: Lan743x,
    memory: File,
    vectors: Vec<File>,
}

impl Guest {
    fn new(backend: Backend) -> Guest {
        let model = Lan743x::new(MacAddress(DEFAULT_MAC), backend).unwrap();
        let memory = memfd(MEMORY);
        model.dma().map(IOVA, MEMORY, &memory, 0, true).unwrap();
        let vectors: Vec<File> = (0..nic::VECTORS).map(|_| eventfd()).collect();
        for (i, v) in vectors.iter().enumerate() {
            model.vectors().set(i, vec![v.try_clone().unwrap()]);
        }
        Guest { model, memory, vectors }
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

    fn u32_at(&self, iova: u64) -> u32 {
        u32::from_le_bytes(self.peek(iova, 4).try_into().unwrap())
    }

    /// An MDIO read of the PHY at `address`, as `lan743x_mdiobus_read_c22` does it.
    fn mdio_read(&mut self, address: u32, reg: u32) -> u32 {
        assert_eq!(self.read(MAC_MII_ACC) & MAC_MII_ACC_MII_BUSY, 0);
        self.write(MAC_MII_ACC, address << 11 | reg << 6 | MAC_MII_ACC_MII_BUSY);
        assert_eq!(self.read(MAC_MII_ACC) & MAC_MII_ACC_MII_BUSY, 0, "busy clears");
        self.read(MAC_MII_DATA) & 0xffff
    }

    /// Probe and open as 6.12's driver does them, with `spacing` (16 or 64) and 6 vectors:
    /// RX channel 0 on vector 2, TX on vector 1.
    fn open(&mut self, spacing: u64) {
        assert_eq!(self.read(ID_REV), 0x7430_0010);
        let value = self.read(HW_CFG) | HW_CFG_LRST;
        self.write(HW_CFG, value);
        assert_eq!(self.read(HW_CFG) & HW_CFG_LRST, 0, "the light reset ends at once");
        let value = self.read(PMT_CTL) | PMT_CTL_ETH_PHY_RST;
        self.write(PMT_CTL, value);
        assert_eq!(self.read(PMT_CTL) & (PMT_CTL_ETH_PHY_RST | PMT_CTL_READY), PMT_CTL_READY);
        self.write(DMAC_CMD, DMAC_CMD_SWR);
        self.write(DMAC_CFG, 0x0001_0060 | dmac_cfg_dspace(spacing));
        // Interrupts: vector 0 for the shared sources, the software interrupt test.
        self.write(INT_VEC_EN_SET, 1);
        self.write(INT_EN_SET, INT_BIT_MAS);
        self.write(INT_EN_SET, INT_BIT_SW_GP);
        self.write(INT_SET, INT_BIT_SW_GP);
        assert_eq!(fired(&self.vectors[0]), 1, "the software interrupt test's vector 0");
        assert_eq!(self.read(INT_STS_R2C) & 0x201, 0x201, "MAS and SW_GP, as the ISR needs");
        self.write(INT_VEC_EN_CLR, 1);
        self.write(INT_EN_CLR, INT_BIT_SW_GP);
        self.write(INT_VEC_EN_SET, 1);
        assert_eq!(fired(&self.vectors[0]), 0, "no second interrupt");
        self.write(INT_VEC_MAP1, 1);
        self.write(INT_VEC_MAP0, 0x5432);
        self.write(INT_VEC_EN_AUTO_CLR, 0x3c);
        self.write(INT_VEC_EN_SET, 0x3c);
        // MAC and filter.
        let value = self.read(MAC_RX) | MAC_RX_RXEN;
        self.write(MAC_RX, value);
        let value = self.read(MAC_TX) | MAC_TX_TXEN;
        self.write(MAC_TX, value);
        self.write(RFE_CTL, RFE_CTL_AB | RFE_CTL_IP_COE | RFE_CTL_TCP_UDP_COE);
        // RX channel 0.
        for i in 0..RING {
            self.post_rx(i, spacing);
        }
        self.write(DMAC_CMD, 1 << 8);
        self.write(RX0 + CH_BASE_ADDRH, 0);
        self.write(RX0 + CH_BASE_ADDRL, RX_RING_AT as u32);
        self.write(RX0 + CH_HEAD_WRITEBACK_ADDRH, 0);
        self.write(RX0 + CH_HEAD_WRITEBACK_ADDRL, RX_WRITEBACK as u32);
        self.write(RX0 + CH_CFG_A, 0x4710_0420);
        self.write(RX0 + CH_CFG_B, 0x0004_0000 | RING);
        self.write(RX0 + CH_CFG_C, 0x48);
        self.write(RX0 + CH_TAIL, RING - 1);
        assert_eq!(self.read(RX0 + CH_HEAD), 0, "rx_open needs head 0");
        self.write(INT_EN_SET, int_bit_dma_rx(0));
        self.write(DMAC_INT_STS, dmac_int_bit_rxfrm(0));
        self.write(DMAC_INT_EN_SET, dmac_int_bit_rxfrm(0));
        self.write(DMAC_CMD, 1 << 4);
        self.write(FCT_RX_CTL, 1 << 28);
        // TX channel 0.
        self.write(FCT_TX_CTL, 1 << 28);
        self.write(DMAC_CMD, 1 << 24);
        self.write(TX0 + CH_BASE_ADDRL, TX_RING_AT as u32);
        self.write(TX0 + CH_CFG_B, 0x0004_0000 | RING);
        self.write(TX0 + CH_CFG_A, 0x5010_0427);
        self.write(TX0 + CH_HEAD_WRITEBACK_ADDRL, TX_WRITEBACK as u32);
        self.write(TX0 + CH_TAIL, 0);
        self.write(TX0 + CH_CFG_C, 0x48);
        self.write(DMAC_INT_EN_SET, dmac_int_bit_tx_ioc(0));
        self.write(DMAC_CMD, 1 << 20);
        // Frames may arrive (and vector 2 fire) from the channel's start on: only the software
        // test's vector 0 is drained.
        fired(&self.vectors[0]);
    }

    /// Gives descriptor `index` a 2 KiB buffer (1518 bytes posted, as at MTU 1500).
    fn post_rx(&mut self, index: u32, spacing: u64) {
        let buffer = RX_BUFFERS + index as u64 * 2048;
        let mut desc = [0u8; 16];
        desc[0..4].copy_from_slice(&(RX_DESC_DATA0_OWN | 1518).to_le_bytes());
        desc[4..8].copy_from_slice(&(buffer as u32).to_le_bytes());
        desc[8..12].copy_from_slice(&((buffer >> 32) as u32).to_le_bytes());
        self.poke(RX_RING_AT + index as u64 * spacing, &desc);
    }

    fn wait_rx_head(&mut self, head: u32) {
        let start = Instant::now();
        while self.read(RX0 + CH_HEAD) != head {
            assert!(start.elapsed() < Duration::from_secs(5), "RX head stuck at {}", self.read(RX0 + CH_HEAD));
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn probe_finds_the_chip_its_mac_and_the_gigabit_phy() {
    let mut g = Guest::new(unplugged());
    assert_eq!(g.read(ID_REV), ID_REV_LAN7430_B0);
    let (l, h) = (g.read(MAC_RX_ADDRL), g.read(MAC_RX_ADDRH));
    let mac = [l as u8, (l >> 8) as u8, (l >> 16) as u8, (l >> 24) as u8, h as u8, (h >> 8) as u8];
    assert_eq!(mac, DEFAULT_MAC, "the permanent MAC, as loaded from the EEPROM at reset");
    assert_eq!((g.mdio_read(1, 2), g.mdio_read(1, 3)), (0x0007, 0xc132), "the LAN88xx PHY at address 1");
    assert_eq!(g.mdio_read(2, 2), 0xffff, "nothing at address 2");
    assert_eq!(g.mdio_read(1, 1) & 0x24, 0x24, "link up, autonegotiation complete");
    assert_eq!(g.mdio_read(1, 10) & 0x0800, 0x0800, "the partner does 1000 full");
    assert_eq!(g.read(DP_SEL) & DP_SEL_DPRDY, DP_SEL_DPRDY);
    g.write(MAC_RX_ADDRL, 0x1234_5678);
    g.write(HW_CFG, HW_CFG_LRST);
    assert_eq!(g.read(MAC_RX_ADDRL), l, "the light reset reloads the MAC");
    g.write(MAC_RX, MAC_RX_RXEN);
    assert_eq!(g.read(MAC_RX) & (MAC_RX_RXEN | MAC_RX_RXD), MAC_RX_RXEN);
    g.write(MAC_RX, 0);
    assert_eq!(g.read(MAC_RX) & MAC_RX_RXD, MAC_RX_RXD, "disabled reads back as such");
}

/// Receives generated frames at a descriptor spacing: each write-back lands at its slot.
fn receive_at(spacing: u64) {
    let config: GeneratorConfig = "size=1514,count=200".parse().unwrap();
    let (backend, _) = generator(config, DEFAULT_MAC);
    let mut g = Guest::new(backend);
    g.open(spacing);
    g.wait_rx_head(127);
    for i in 0..127u32 {
        let at = RX_RING_AT + i as u64 * spacing;
        let data0 = g.u32_at(at);
        assert_eq!(data0 & RX_DESC_DATA0_OWN, 0, "descriptor {i} given back");
        assert_eq!(data0 & (RX_DESC_DATA0_FS | RX_DESC_DATA0_LS), RX_DESC_DATA0_FS | RX_DESC_DATA0_LS, "{i}");
        assert_eq!((data0 & RX_DESC_DATA0_FRAME_LENGTH_MASK) >> 16, 1518, "frame and FCS");
        assert_eq!(g.u32_at(at + 4) & 0x3_0001, 0, "checksums verified: {:#x}", g.u32_at(at + 4));
    }
    if spacing > 16 {
        assert_eq!(g.u32_at(RX_RING_AT + 16), 0, "nothing written between slots");
    }
    assert_eq!(g.u32_at(RX_WRITEBACK), 127, "the head written back");
    assert!(fired(&g.vectors[2]) >= 1, "RX channel 0 on vector 2");
    // On the bus: packed descriptors come 4 to a 64-byte fetch (the device owns 127 of them
    // from 0), spaced ones one per fetch; each 1,518-byte frame is 24 line writes, the last
    // partial; each write-back (16-byte descriptor, 4-byte head) is a partial line.
    let bus = g.model.counters().link.rx;
    let fetches = if spacing == 16 { 127u64.div_ceil(4) } else { 127 };
    assert_eq!(bus.descriptor_reads, Transactions { tlps: fetches, bytes: 127 * 16 }, "spacing {spacing}");
    assert_eq!(bus.read_completions, fetches);
    assert_eq!(bus.buffer_writes, Transactions { tlps: 127 * 24, bytes: 127 * 1518 });
    assert_eq!(bus.descriptor_writes, Transactions { tlps: 127, bytes: 127 * 16 });
    assert_eq!(bus.head_writes, Transactions { tlps: 127, bytes: 127 * 4 });
    assert_eq!(bus.partial_writes, 127 * 3);
    assert_eq!(g.model.counters().link.tx.descriptor_reads.tlps, 0, "nothing sent");
    // The ring is full (the tail keeps one slot): the generator waits. The NAPI completion
    // re-posts and re-arms through the tail's flags.
    for i in 0..127 {
        g.post_rx(i, spacing);
    }
    g.write(RX0 + CH_TAIL, TAIL_SET_TOP_INT_EN | TAIL_SET_TOP_INT_VEC_EN | 126);
    g.wait_rx_head((127 + 73) % RING);
    assert_eq!(g.model.counters().rx_frames, 200);
    // Descriptor 127 is the ring's last (a fetch of one), then 0 to 71 from the start.
    let fetches = if spacing == 16 { 32 + 1 + 18 } else { 200 };
    assert_eq!(g.model.counters().link.rx.descriptor_reads.tlps, fetches, "spacing {spacing}");
    assert_eq!(g.read(STAT_RX_TOTAL_FRAMES), 200);
}

#[test]
fn frames_land_in_slots_sixteen_bytes_apart() {
    receive_at(16);
}

#[test]
fn frames_land_in_slots_sixty_four_bytes_apart_after_the_spacing_revert() {
    receive_at(64);
}

#[test]
fn every_spacing_field_reads_back_as_its_spacing() {
    use crate::nic_model::NicRegisters;
    let mut nic = Nic::new(DEFAULT_MAC, Box::new(Capture(Arc::default())));
    let dma = crate::dma::DmaSpace::new();
    for bytes in [16, 32, 64, 128] {
        nic.write(DMAC_CFG, 0x0001_0060 | dmac_cfg_dspace(bytes), &dma);
        assert_eq!(nic.descriptor_spacing(), bytes);
    }
}

#[test]
fn a_transmitted_frame_gets_its_checksums_and_completes_on_vector_1() {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let backend = Backend { sink: Box::new(Capture(sent.clone())), ..unplugged() };
    let mut g = Guest::new(backend);
    g.open(16);
    // A UDP/IPv4 frame with blank checksums, in two buffers.
    let mut frame = [0u8; 14 + 20 + 8 + 100];
    frame[..6].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    frame[6..12].copy_from_slice(&DEFAULT_MAC);
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    frame[14] = 0x45;
    frame[16..18].copy_from_slice(&((20 + 8 + 100) as u16).to_be_bytes());
    frame[22] = 64;
    frame[23] = 17;
    frame[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    frame[38..40].copy_from_slice(&108u16.to_be_bytes());
    g.poke(TX_BUFFERS, &frame[..42]);
    g.poke(TX_BUFFERS + 0x1000, &frame[42..]);
    let csum = TX_DESC_DATA0_ICE | TX_DESC_DATA0_IPE | TX_DESC_DATA0_TPE | (1 << 17);
    let first = TX_DESC_DATA0_FS | csum | 42;
    let last = TX_DESC_DATA0_LS | TX_DESC_DATA0_IOC | (1 << 17) | 100;
    for (i, (data0, buffer)) in [(first, TX_BUFFERS), (last, TX_BUFFERS + 0x1000)].into_iter().enumerate() {
        let mut desc = [0u8; 16];
        desc[0..4].copy_from_slice(&data0.to_le_bytes());
        desc[4..8].copy_from_slice(&(buffer as u32).to_le_bytes());
        desc[12..16].copy_from_slice(&((frame.len() as u32) << 16).to_le_bytes());
        g.poke(TX_RING_AT + i as u64 * 16, &desc);
    }
    let before = g.model.counters().link.tx;
    g.write(TX0 + CH_TAIL, TAIL_SET_DMAC_INT_EN | TAIL_SET_TOP_INT_EN | TAIL_SET_TOP_INT_VEC_EN | 2);
    // On the bus: both descriptors in one 32-byte fetch (the tail gave the device 2), the
    // buffers in one request each (100 bytes from a line boundary: 2 completions), the head
    // written back, one MSI-X write.
    let bus = g.model.counters().link.tx.minus(&before);
    assert_eq!(bus.descriptor_reads, Transactions { tlps: 1, bytes: 32 });
    assert_eq!(bus.buffer_reads, Transactions { tlps: 2, bytes: 142 });
    assert_eq!(bus.read_completions, 1 + 1 + 2);
    assert_eq!(bus.head_writes, Transactions { tlps: 1, bytes: 4 });
    assert_eq!(bus.interrupts, Transactions { tlps: 1, bytes: 4 });
    assert_eq!((bus.partial_writes, bus.buffer_writes.tlps, bus.descriptor_writes.tlps), (1, 0, 0));
    let sent = sent.lock().unwrap();
    assert_eq!(sent.len(), 1);
    let check = crate::wire::offload::check_rx(&sent[0], true, true);
    assert_eq!(check.l4_checksum, crate::wire::offload::Checksum::Good, "checksums inserted");
    assert_eq!(g.u32_at(TX_WRITEBACK), 2, "the head written back");
    assert_eq!(fired(&g.vectors[1]), 1, "TX completion on vector 1");
    assert_eq!(g.read(STAT_TX_TOTAL_FRAMES), 1);
}

#[test]
fn dma_outside_the_maps_is_refused_and_counted() {
    let config: GeneratorConfig = "size=1514,count=500".parse().unwrap();
    let (backend, _) = generator(config, DEFAULT_MAC);
    let mut g = Guest::new(backend);
    g.open(16);
    // The ring fills (the generator waits for room), then its descriptors move to an address
    // nobody mapped and are given to the device again: the device cannot read them.
    g.wait_rx_head(127);
    g.write(RX0 + CH_BASE_ADDRL, 0x4000_0000);
    g.write(RX0 + CH_TAIL, 126);
    let start = Instant::now();
    while g.model.counters().dma_faults == 0 {
        assert!(start.elapsed() < Duration::from_secs(5), "no DMA fault counted");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(g.read(RX0 + CH_HEAD), 127, "nothing taken from the unmapped ring");
    assert_eq!(g.model.counters().rx_frames, 127);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn hostile_register_writes_never_take_the_model_down(writes in proptest::collection::vec((0u32..0x2000, any::<u32>()), 1..200)) {
        let mut g = Guest::new(unplugged());
        g.open(16);
        for (reg, value) in writes {
            g.write(reg & !3, value);
            let _ = g.read(reg & !3);
        }
        // Still answering as the chip it is.
        prop_assert_eq!(g.read(ID_REV), ID_REV_LAN7430_B0);
    }
}

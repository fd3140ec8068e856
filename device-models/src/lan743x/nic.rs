//! The LAN7430's register block (BAR 0): identity and resets, the MAC with its MDIO bus to the
//! PHY, the FIFO controller's enables, the receive filter, the interrupt block with its vector
//! map, the DMA controller's commands, and the statistics. The rings' data path is in
//! [`super::rings`].

use super::channel::{Channel, RunState};
use super::phy::{self, Phy};
use super::regs::*;
use crate::dma::DmaSpace;
use crate::nic_model::{NicCounters, NicRegisters};
use crate::wire::backend::FrameSink;

/// The register block's size.
pub const BAR0_SIZE: u64 = 0x2000;
/// MSI-X vectors.
pub const VECTORS: usize = 8;
const WORDS: usize = (BAR0_SIZE / 4) as usize;
const MAC_RX_RESET: u32 = 0x05ee_0000;
const MAC_CR_RESET: u32 = 0x0000_1800;

pub use crate::nic_model::Effects;

/// The NIC's state.
pub struct Nic {
    mac: [u8; 6],
    /// Plain registers (read back what was written).
    regs: Vec<u32>,
    pub(super) phy: Phy,
    pub(super) sink: Box<dyn FrameSink>,
    carrier: bool,
    admin_up: bool,
    int_en: u32,
    sw_interrupt: bool,
    vec_en: u32,
    /// The vectors' lines as last evaluated (for edge detection).
    level: u32,
    pub(super) dmac_int_sts: u32,
    pub(super) dmac_int_en: u32,
    pub(super) rx: [Channel; RX_CHANNELS],
    pub(super) tx: [Channel; TX_CHANNELS],
    fct_rx_en: u32,
    fct_tx_en: u32,
    ptp_enabled: bool,
    /// The statistics block (0x1200-0x12ff), 32-bit counters.
    stats: [u32; 64],
    pub(super) totals: NicCounters,
}

impl Nic {
    /// Power-on state of everything but the PHY, the wire and the totals (`HW_CFG.LRST`).
    fn light_reset(&mut self) {
        self.regs.fill(0);
        let m = self.mac;
        self.set(MAC_RX_ADDRL, u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
        self.set(MAC_RX_ADDRH, u32::from(m[4]) | u32::from(m[5]) << 8);
        self.set(MAC_CR, MAC_CR_RESET);
        self.set(MAC_RX, MAC_RX_RESET);
        self.int_en = 0;
        self.sw_interrupt = false;
        self.vec_en = 0;
        self.level = 0;
        self.dmac_int_sts = 0;
        self.dmac_int_en = 0;
        self.rx = Default::default();
        self.tx = Default::default();
        self.fct_rx_en = 0;
        self.fct_tx_en = 0;
        self.ptp_enabled = false;
        self.stats = [0; 64];
    }

    fn get(&self, reg: u32) -> u32 {
        self.regs.get((reg / 4) as usize).copied().unwrap_or(0)
    }

    fn set(&mut self, reg: u32, value: u32) {
        if let Some(slot) = self.regs.get_mut((reg / 4) as usize) {
            *slot = value;
        }
    }

    /// The permanent MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Whether frames can pass: the PHY links on the wire and the link is administratively up.
    pub fn link_up(&self) -> bool {
        self.admin_up && self.phy.link(self.carrier)
    }

    /// Link speed (0: down).
    pub fn link_mbps(&self) -> u32 {
        if self.link_up() { 1000 } else { 0 }
    }

    /// Descriptor spacing in bytes (16 << `DMAC_CFG.MAX_DSPACE`).
    pub fn descriptor_spacing(&self) -> u64 {
        16 << (self.get(DMAC_CFG) & DMAC_CFG_MAX_DSPACE_MASK)
    }

    /// The receive path is open: receiver and FIFO enabled, channel 0 started.
    pub fn rx_enabled(&self) -> bool {
        self.get(MAC_RX) & MAC_RX_RXEN != 0 && self.fct_rx_en & 1 != 0 && self.rx[0].run.started
    }

    /// The transmit path is open.
    pub fn tx_enabled(&self) -> bool {
        self.get(MAC_TX) & MAC_TX_TXEN != 0 && self.fct_tx_en & 1 != 0 && self.tx[0].run.started
    }

    /// The receive filter: whether a frame to `dst` is taken.
    pub fn accepts(&self, dst: &[u8]) -> bool {
        let ctl = self.get(RFE_CTL);
        if dst.len() < 6 {
            return false;
        }
        if dst[..6] == [0xff; 6] {
            return ctl & RFE_CTL_AB != 0;
        }
        if dst[0] & 1 == 1 {
            if ctl & (RFE_CTL_AM | RFE_CTL_MCAST_HASH) != 0 {
                return true;
            }
            return ctl & RFE_CTL_DA_PERFECT != 0 && (1..RFE_ADDR_FILT_ENTRIES).any(|i| self.filter_matches(i, dst));
        }
        ctl & RFE_CTL_AU != 0 || dst[..6] == self.station_address()
    }

    fn filter_matches(&self, entry: u32, dst: &[u8]) -> bool {
        let hi = self.get(RFE_ADDR_FILT_HI_0 + 8 * entry);
        let lo = self.get(RFE_ADDR_FILT_HI_0 + 8 * entry + 4);
        hi & RFE_ADDR_FILT_HI_VALID != 0 && lo.to_le_bytes() == dst[..4] && (hi as u16).to_le_bytes() == dst[4..6]
    }

    /// The address the MAC answers to (`MAC_RX_ADDRH/L`).
    fn station_address(&self) -> [u8; 6] {
        let (l, h) = (self.get(MAC_RX_ADDRL).to_le_bytes(), self.get(MAC_RX_ADDRH).to_le_bytes());
        [l[0], l[1], l[2], l[3], h[0], h[1]]
    }

    /// Receive checksum verification as `RFE_CTL` enables it: (verify IPv4 headers, verify L4).
    pub fn rx_checksums(&self) -> (bool, bool) {
        let ctl = self.get(RFE_CTL);
        (ctl & RFE_CTL_IP_COE != 0, ctl & RFE_CTL_TCP_UDP_COE != 0)
    }

    /// Counts a frame in the statistics block: `rx` or sent, `bytes` long, to `dst`.
    pub fn count(&mut self, rx: bool, dst: &[u8], bytes: usize) {
        let (frames, octets) = match (rx, dst.first().map(|b| b & 1 == 1), dst.get(..6) == Some(&[0xff; 6][..])) {
            (true, _, true) => (STAT_RX_BROADCAST_FRAMES, STAT_RX_BROADCAST_BYTE_COUNT),
            (true, Some(true), _) => (STAT_RX_MULTICAST_FRAMES, STAT_RX_MULTICAST_BYTE_COUNT),
            (true, _, _) => (STAT_RX_UNICAST_FRAMES, STAT_RX_UNICAST_BYTE_COUNT),
            (false, _, true) => (STAT_TX_BROADCAST_FRAMES, STAT_TX_BROADCAST_BYTE_COUNT),
            (false, Some(true), _) => (STAT_TX_MULTICAST_FRAMES, STAT_TX_MULTICAST_BYTE_COUNT),
            (false, _, _) => (STAT_TX_UNICAST_FRAMES, STAT_TX_UNICAST_BYTE_COUNT),
        };
        let total = if rx { STAT_RX_TOTAL_FRAMES } else { STAT_TX_TOTAL_FRAMES };
        for (reg, n) in [(frames, 1), (octets, bytes as u32), (total, 1)] {
            self.bump(reg, n);
        }
    }

    /// Adds `n` to the counter at `reg`.
    pub fn bump(&mut self, reg: u32, n: u32) {
        if let Some(c) = self.stats.get_mut(((reg - STAT_RX_FCS_ERRORS) / 4) as usize) {
            *c = c.wrapping_add(n);
        }
    }

    fn channel(&self, rx: bool, ch: usize) -> &Channel {
        if rx { &self.rx[ch] } else { &self.tx[ch] }
    }

    fn channel_mut(&mut self, rx: bool, ch: usize) -> &mut Channel {
        if rx { &mut self.rx[ch] } else { &mut self.tx[ch] }
    }

    /// A TAIL write's flag bits: arm the channel's enables.
    fn arm(&mut self, value: u32, rx: bool, ch: usize) {
        let (top, dmac, map) = if rx {
            (int_bit_dma_rx(ch), dmac_int_bit_rxfrm(ch), self.get(INT_VEC_MAP0))
        } else {
            (int_bit_dma_tx(ch), dmac_int_bit_tx_ioc(ch), self.get(INT_VEC_MAP1))
        };
        if !rx && value & TAIL_SET_DMAC_INT_EN != 0 {
            self.dmac_int_en |= dmac;
        }
        if value & TAIL_SET_TOP_INT_EN != 0 {
            self.int_en |= top;
        }
        if value & TAIL_SET_TOP_INT_VEC_EN != 0 {
            self.vec_en |= 1 << ((map >> (4 * ch)) & 7);
        }
    }

    /// An MDIO access, done at once (BUSY never reads set).
    fn mdio(&mut self, value: u32) {
        self.set(MAC_MII_ACC, value & !MAC_MII_ACC_MII_BUSY);
        if value & MAC_MII_ACC_MII_BUSY == 0 {
            return;
        }
        let address = ((value & MAC_MII_ACC_PHY_ADDR_MASK) >> 11) as u8;
        let reg = ((value & MAC_MII_ACC_MIIRINDA_MASK) >> 6) as u8;
        let write = value & 0x6 == MAC_MII_ACC_MII_WRITE;
        if address != phy::ADDRESS {
            if !write {
                self.set(MAC_MII_DATA, 0xffff);
            }
        } else if write {
            self.phy.write(reg, self.get(MAC_MII_DATA) as u16);
        } else {
            let data = self.phy.read(reg, self.carrier);
            self.set(MAC_MII_DATA, u32::from(data));
        }
    }

    fn dmac_command(&mut self, value: u32) {
        if value & DMAC_CMD_SWR != 0 {
            self.rx = Default::default();
            self.tx = Default::default();
            self.dmac_int_sts = 0;
            self.dmac_int_en = 0;
        }
        for ch in 0..RX_CHANNELS {
            if value & (1 << (8 + ch)) != 0 {
                self.rx[ch].reset();
            }
            self.rx[ch].run = run_command(self.rx[ch].run, value >> (4 + ch), value >> ch);
        }
        for ch in 0..TX_CHANNELS {
            if value & (1 << (24 + ch)) != 0 {
                self.tx[ch].reset();
            }
            self.tx[ch].run = run_command(self.tx[ch].run, value >> (20 + ch), value >> (16 + ch));
        }
    }

    fn dmac_state(&self) -> u32 {
        let mut out = 0;
        for (ch, c) in self.rx.iter().enumerate() {
            out |= u32::from(c.run.started) << (4 + ch) | u32::from(c.run.stopped) << ch;
        }
        for (ch, c) in self.tx.iter().enumerate() {
            out |= u32::from(c.run.started) << (20 + ch) | u32::from(c.run.stopped) << (16 + ch);
        }
        out
    }

    /// The interrupt sources' raw status, in `INT_STS` bits (before enables).
    fn sources(&self) -> u32 {
        let dmac = self.dmac_int_sts & self.dmac_int_en;
        let mut status = if self.sw_interrupt { INT_BIT_SW_GP } else { 0 };
        for ch in 0..RX_CHANNELS {
            if dmac & dmac_int_bit_rxfrm(ch) != 0 {
                status |= int_bit_dma_rx(ch);
            }
        }
        for ch in 0..TX_CHANNELS {
            if dmac & dmac_int_bit_tx_ioc(ch) != 0 {
                status |= int_bit_dma_tx(ch);
            }
        }
        status
    }

    /// `INT_STS`: the sources, and `MAS` when an enabled one is set under the master enable.
    fn status(&self) -> u32 {
        let sources = self.sources();
        let master = self.int_en & INT_BIT_MAS != 0 && sources & self.int_en & !INT_BIT_MAS != 0;
        sources | if master { INT_BIT_MAS } else { 0 }
    }

    /// What a read of `INT_STS_R2C` that returned `status` clears.
    fn read_to_clear(&mut self, status: u32) {
        self.sw_interrupt = false;
        for ch in 0..RX_CHANNELS {
            let cfg_c = self.rx[ch].cfg_c;
            if status & int_bit_dma_rx(ch) != 0 && cfg_c & CFG_C_INT_STS_R2C_MODE_MASK != 0 {
                self.dmac_int_sts &= !dmac_int_bit_rxfrm(ch);
                if cfg_c & CFG_C_INT_EN_R2C != 0 {
                    self.int_en &= !int_bit_dma_rx(ch);
                }
            }
        }
        for ch in 0..TX_CHANNELS {
            let cfg_c = self.tx[ch].cfg_c;
            if status & int_bit_dma_tx(ch) != 0 && cfg_c & CFG_C_INT_STS_R2C_MODE_MASK != 0 {
                self.dmac_int_sts &= !dmac_int_bit_tx_ioc(ch);
                if cfg_c & CFG_C_INT_EN_R2C != 0 {
                    self.int_en &= !int_bit_dma_tx(ch);
                }
            }
        }
        self.level = self.lines();
    }

    /// The vector each enabled, set source drives, as vector bits.
    fn asserted(&self) -> u32 {
        if self.int_en & INT_BIT_MAS == 0 {
            return 0;
        }
        let active = self.sources() & self.int_en;
        let (map0, map1) = (self.get(INT_VEC_MAP0), self.get(INT_VEC_MAP1));
        let mut vectors = 0;
        if active & (INT_BIT_SW_GP | INT_BIT_1588) != 0 {
            vectors |= 1;
        }
        for ch in 0..RX_CHANNELS {
            if active & int_bit_dma_rx(ch) != 0 {
                vectors |= 1 << ((map0 >> (4 * ch)) & 7);
            }
        }
        for ch in 0..TX_CHANNELS {
            if active & int_bit_dma_tx(ch) != 0 {
                vectors |= 1 << ((map1 >> (4 * ch)) & 7);
            }
        }
        vectors
    }

    fn lines(&self) -> u32 {
        self.asserted() & self.vec_en
    }

    /// Signals the vectors whose line rose since the last look (an edge per assertion, as an
    /// MSI-X message is), applying the auto-clears of what fired.
    pub fn evaluate(&mut self) -> u32 {
        let lines = self.lines();
        let rising = lines & !self.level;
        if rising != 0 {
            let auto = self.get(INT_VEC_EN_AUTO_CLR);
            self.vec_en &= !(rising & auto);
            let (map0, map1) = (self.get(INT_VEC_MAP0), self.get(INT_VEC_MAP1));
            let active = self.sources() & self.int_en;
            for ch in 0..RX_CHANNELS {
                if active & int_bit_dma_rx(ch) != 0 && rising & (1 << ((map0 >> (4 * ch)) & 7)) != 0 {
                    let cfg_c = self.rx[ch].cfg_c;
                    self.auto_clear(cfg_c, int_bit_dma_rx(ch), dmac_int_bit_rxfrm(ch));
                }
            }
            for ch in 0..TX_CHANNELS {
                if active & int_bit_dma_tx(ch) != 0 && rising & (1 << ((map1 >> (4 * ch)) & 7)) != 0 {
                    let cfg_c = self.tx[ch].cfg_c;
                    self.auto_clear(cfg_c, int_bit_dma_tx(ch), dmac_int_bit_tx_ioc(ch));
                }
            }
        }
        self.level = self.lines();
        rising
    }

    fn auto_clear(&mut self, cfg_c: u32, top: u32, dmac: u32) {
        if cfg_c & CFG_C_TOP_INT_EN_AUTO_CLR != 0 {
            self.int_en &= !top;
        }
        if cfg_c & CFG_C_DMA_INT_STS_AUTO_CLR != 0 {
            self.dmac_int_sts &= !dmac;
        }
    }

    /// The totals for the model's status.
    pub fn totals(&self) -> NicCounters {
        self.totals
    }
}

/// A channel register's (RX?, channel, offset in the channel's block).
fn channel_of(reg: u32) -> Option<(bool, usize, u32)> {
    let rx_end = RX_CFG_A_0 + CHANNEL_STRIDE * RX_CHANNELS as u32;
    let tx_end = TX_CFG_A_0 + CHANNEL_STRIDE * TX_CHANNELS as u32;
    if (RX_CFG_A_0..rx_end).contains(&reg) {
        let at = reg - RX_CFG_A_0;
        Some((true, (at / CHANNEL_STRIDE) as usize, at % CHANNEL_STRIDE))
    } else if (TX_CFG_A_0..tx_end).contains(&reg) {
        let at = reg - TX_CFG_A_0;
        Some((false, (at / CHANNEL_STRIDE) as usize, at % CHANNEL_STRIDE))
    } else {
        None
    }
}

/// An EN/DIS command pair for channel `ch` on an enable mask.
fn command(mask: u32, ch: usize, enable: u32, disable: u32) -> u32 {
    let bit = 1 << ch;
    if enable & bit != 0 {
        mask | bit
    } else if disable & bit != 0 {
        mask & !bit
    } else {
        mask
    }
}

/// A START/STOP command pair on a channel's run state.
fn run_command(state: RunState, start: u32, stop: u32) -> RunState {
    if start & 1 != 0 {
        RunState { started: true, stopped: false }
    } else if stop & 1 != 0 {
        RunState { started: false, stopped: true }
    } else {
        state
    }
}

impl NicRegisters for Nic {
    /// A NIC with permanent address `mac` sending to `sink`.
    fn new(mac: [u8; 6], sink: Box<dyn FrameSink>) -> Nic {
        let mut nic = Nic {
            mac,
            regs: vec![0; WORDS],
            phy: Phy::default(),
            sink,
            carrier: true,
            admin_up: true,
            int_en: 0,
            sw_interrupt: false,
            vec_en: 0,
            level: 0,
            dmac_int_sts: 0,
            dmac_int_en: 0,
            rx: Default::default(),
            tx: Default::default(),
            fct_rx_en: 0,
            fct_tx_en: 0,
            ptp_enabled: false,
            stats: [0; 64],
            totals: NicCounters::default(),
        };
        nic.light_reset();
        nic
    }

    /// Back to the state of a NIC just powered on (the PHY too).
    fn power_on_reset(&mut self) {
        self.light_reset();
        self.phy = Phy::default();
    }

    /// The wire's carrier.
    fn set_carrier(&mut self, carrier: bool) -> Effects {
        let changed = carrier != self.carrier;
        self.carrier = carrier;
        Effects { vectors: 0, rx_changed: changed }
    }

    /// The link administratively up or down (the control socket's `link down`).
    fn set_admin_up(&mut self, up: bool) -> Effects {
        self.admin_up = up;
        Effects { vectors: 0, rx_changed: true }
    }

    /// Reads the register at `reg` (a read of `INT_STS_R2C` clears what it reports).
    fn read(&mut self, reg: u32) -> u32 {
        match reg {
            ID_REV => ID_REV_LAN7430_B0,
            FPGA_REV => 0,
            PMT_CTL => self.get(reg) | PMT_CTL_READY,
            DP_SEL => self.get(reg) | DP_SEL_DPRDY,
            MAC_RX => self.get(reg) | if self.get(reg) & MAC_RX_RXEN == 0 { MAC_RX_RXD } else { 0 },
            MAC_TX => self.get(reg) | if self.get(reg) & MAC_TX_TXEN == 0 { MAC_TX_TXD } else { 0 },
            FCT_RX_CTL => self.fct_rx_en << 28,
            FCT_TX_CTL => self.fct_tx_en << 28,
            INT_STS => self.status(),
            INT_STS_R2C => {
                let status = self.status();
                self.read_to_clear(status);
                status
            }
            INT_EN_SET | INT_EN_CLR => self.int_en,
            INT_VEC_EN_SET | INT_VEC_EN_CLR => self.vec_en,
            PTP_CMD_CTL => {
                if self.ptp_enabled {
                    PTP_CMD_CTL_PTP_ENABLE
                } else {
                    0
                }
            }
            DMAC_CMD => self.dmac_state(),
            DMAC_INT_STS => self.dmac_int_sts,
            DMAC_INT_EN_SET | DMAC_INT_EN_CLR => self.dmac_int_en,
            STAT_RX_FCS_ERRORS..=STAT_TX_COUNTER_ROLLOVER_STATUS => {
                self.stats[((reg - STAT_RX_FCS_ERRORS) / 4) as usize]
            }
            _ => match channel_of(reg) {
                Some((rx, ch, CH_HEAD)) => self.channel(rx, ch).head,
                _ => self.get(reg),
            },
        }
    }

    /// Writes `value` to the register at `reg`.
    fn write(&mut self, reg: u32, value: u32, dma: &DmaSpace) -> Effects {
        let mut effects = Effects::default();
        match reg {
            ID_REV | FPGA_REV => {}
            HW_CFG if value & HW_CFG_LRST != 0 => {
                self.light_reset();
                self.set(HW_CFG, value & !HW_CFG_LRST);
                effects.rx_changed = true;
            }
            PMT_CTL => {
                if value & PMT_CTL_ETH_PHY_RST != 0 {
                    self.phy = Phy::default();
                    effects.rx_changed = true;
                }
                self.set(reg, value & !(PMT_CTL_ETH_PHY_RST | PMT_CTL_READY));
            }
            // No EEPROM: a command completes at once with a timeout.
            E2P_CMD => {
                let timeout = if value & E2P_CMD_EPC_BUSY != 0 { E2P_CMD_EPC_TIMEOUT } else { 0 };
                self.set(reg, (value & !E2P_CMD_EPC_BUSY) | timeout);
            }
            MAC_CR => {
                if value & MAC_CR_CNTR_RST != 0 {
                    self.stats = [0; 64];
                }
                self.set(reg, value & !MAC_CR_CNTR_RST);
            }
            MAC_RX | MAC_TX => {
                self.set(reg, value & !MAC_RX_RXD);
                effects.rx_changed = true;
            }
            MAC_MII_ACC => self.mdio(value),
            FCT_RX_CTL => {
                for ch in 0..RX_CHANNELS {
                    self.fct_rx_en = command(self.fct_rx_en, ch, value >> 28, value >> 24);
                }
                effects.rx_changed = true;
            }
            FCT_TX_CTL => self.fct_tx_en = command(self.fct_tx_en, 0, value >> 28, value >> 24),
            INT_SET => self.sw_interrupt |= value & INT_BIT_SW_GP != 0,
            INT_STS => {
                if value & INT_BIT_SW_GP != 0 {
                    self.sw_interrupt = false;
                }
            }
            INT_EN_SET => self.int_en |= value,
            INT_EN_CLR => self.int_en &= !value,
            INT_VEC_EN_SET => self.vec_en |= value & 0xff,
            INT_VEC_EN_CLR => self.vec_en &= !value,
            PTP_CMD_CTL => {
                if value & PTP_CMD_CTL_PTP_ENABLE != 0 {
                    self.ptp_enabled = true;
                }
                if value & PTP_CMD_CTL_PTP_DISABLE != 0 {
                    self.ptp_enabled = false;
                }
            }
            DMAC_CMD => {
                self.dmac_command(value);
                effects.rx_changed = true;
            }
            DMAC_INT_STS => self.dmac_int_sts &= !value,
            DMAC_INT_EN_SET => self.dmac_int_en |= value,
            DMAC_INT_EN_CLR => self.dmac_int_en &= !value,
            STAT_RX_FCS_ERRORS..=STAT_TX_COUNTER_ROLLOVER_STATUS => {}
            _ => match channel_of(reg) {
                Some((_, _, CH_HEAD)) => {}
                Some((true, ch, CH_TAIL)) => {
                    self.arm(value, true, ch);
                    self.rx[ch].tail = value & 0xffff;
                    effects.rx_changed = true;
                }
                Some((false, ch, CH_TAIL)) => {
                    self.arm(value, false, ch);
                    self.tx[ch].tail = value & 0xffff;
                    effects.merge(self.transmit(ch, dma));
                }
                Some((rx, ch, offset)) => {
                    self.channel_mut(rx, ch).set(offset, value);
                    self.set(reg, value);
                }
                None => self.set(reg, value),
            },
        }
        effects.vectors |= self.evaluate();
        effects
    }
}

//! Register offsets and fields of the LAN7430, by the names Linux's `lan743x_main.h` gives them
//! (without the trailing underscore). `tests/lan743x_registers.rs` checks them against the
//! driver's header.

/// Chip ID and revision: LAN7430, revision B0.
pub const ID_REV: u32 = 0x000;
/// What the model's ID_REV reads.
pub const ID_REV_LAN7430_B0: u32 = 0x7430_0010;
/// FPGA revision (0 on silicon).
pub const FPGA_REV: u32 = 0x004;
/// Hardware configuration.
pub const HW_CFG: u32 = 0x010;
/// Light reset of the register block; self-clearing.
pub const HW_CFG_LRST: u32 = 1 << 1;
/// Power management control.
pub const PMT_CTL: u32 = 0x014;
/// The PHY's reset; self-clearing.
pub const PMT_CTL_ETH_PHY_RST: u32 = 1 << 4;
/// The device is ready.
pub const PMT_CTL_READY: u32 = 1 << 7;
/// Data port select.
pub const DP_SEL: u32 = 0x024;
/// The data port is ready.
pub const DP_SEL_DPRDY: u32 = 1 << 31;
/// Data port command, address and data.
pub const DP_CMD: u32 = 0x028;
/// Data port address.
pub const DP_ADDR: u32 = 0x02c;
/// Data port data.
pub const DP_DATA_0: u32 = 0x030;
/// EEPROM command.
pub const E2P_CMD: u32 = 0x040;
/// EEPROM busy.
pub const E2P_CMD_EPC_BUSY: u32 = 1 << 31;
/// EEPROM timeout (no EEPROM).
pub const E2P_CMD_EPC_TIMEOUT: u32 = 1 << 10;
/// FIFO controller: RX control (EN/DIS/RESET per channel).
pub const FCT_RX_CTL: u32 = 0x0ac;
/// FIFO controller: TX control.
pub const FCT_TX_CTL: u32 = 0x0c4;
/// MAC control.
pub const MAC_CR: u32 = 0x100;
/// Resets the statistics counters; self-clearing.
pub const MAC_CR_CNTR_RST: u32 = 1 << 5;
/// MAC receiver.
pub const MAC_RX: u32 = 0x104;
/// Receiver enable.
pub const MAC_RX_RXEN: u32 = 1 << 0;
/// Receiver disabled (status).
pub const MAC_RX_RXD: u32 = 1 << 1;
/// MAC transmitter.
pub const MAC_TX: u32 = 0x108;
/// Transmitter enable.
pub const MAC_TX_TXEN: u32 = 1 << 0;
/// Transmitter disabled (status).
pub const MAC_TX_TXD: u32 = 1 << 1;
/// MAC address, bytes 4 and 5.
pub const MAC_RX_ADDRH: u32 = 0x118;
/// MAC address, bytes 0 to 3.
pub const MAC_RX_ADDRL: u32 = 0x11c;
/// MDIO access.
pub const MAC_MII_ACC: u32 = 0x120;
/// MDIO: PHY address field.
pub const MAC_MII_ACC_PHY_ADDR_MASK: u32 = 0x0000_f800;
/// MDIO: register index field.
pub const MAC_MII_ACC_MIIRINDA_MASK: u32 = 0x0000_07c0;
/// MDIO: the write operation (bits 2:1 = 01).
pub const MAC_MII_ACC_MII_WRITE: u32 = 0x2;
/// MDIO: busy.
pub const MAC_MII_ACC_MII_BUSY: u32 = 1 << 0;
/// MDIO data.
pub const MAC_MII_DATA: u32 = 0x124;
/// Receive filter: perfect address filters, HI then LO, 8 bytes apart; 33 entries.
pub const RFE_ADDR_FILT_HI_0: u32 = 0x400;
/// An address filter entry is valid.
pub const RFE_ADDR_FILT_HI_VALID: u32 = 1 << 31;
/// Address filter entries.
pub const RFE_ADDR_FILT_ENTRIES: u32 = 33;
/// Receive filter control.
pub const RFE_CTL: u32 = 0x508;
/// Verify TCP/UDP checksums.
pub const RFE_CTL_TCP_UDP_COE: u32 = 1 << 12;
/// Verify IPv4 header checksums.
pub const RFE_CTL_IP_COE: u32 = 1 << 11;
/// Accept broadcast.
pub const RFE_CTL_AB: u32 = 1 << 10;
/// Accept all multicast.
pub const RFE_CTL_AM: u32 = 1 << 9;
/// Accept all unicast.
pub const RFE_CTL_AU: u32 = 1 << 8;
/// Multicast through the hash table.
pub const RFE_CTL_MCAST_HASH: u32 = 1 << 3;
/// Destination address perfect filtering.
pub const RFE_CTL_DA_PERFECT: u32 = 1 << 1;
/// Interrupt status.
pub const INT_STS: u32 = 0x780;
/// Software-set interrupt status.
pub const INT_SET: u32 = 0x784;
/// Interrupt enable, set.
pub const INT_EN_SET: u32 = 0x788;
/// Interrupt enable, clear.
pub const INT_EN_CLR: u32 = 0x78c;
/// Interrupt status, read-to-clear.
pub const INT_STS_R2C: u32 = 0x790;
/// Vector enable, set.
pub const INT_VEC_EN_SET: u32 = 0x794;
/// Vector enable, clear.
pub const INT_VEC_EN_CLR: u32 = 0x798;
/// Vectors whose enable clears when they fire.
pub const INT_VEC_EN_AUTO_CLR: u32 = 0x79c;
/// RX channel to vector map (a nibble per channel).
pub const INT_VEC_MAP0: u32 = 0x7a0;
/// TX channel to vector map.
pub const INT_VEC_MAP1: u32 = 0x7a4;
/// Master interrupt enable / any interrupt.
pub const INT_BIT_MAS: u32 = 1 << 0;
/// The software interrupt.
pub const INT_BIT_SW_GP: u32 = 1 << 9;
/// The PTP interrupt.
pub const INT_BIT_1588: u32 = 1 << 7;
/// DMA RX channel `ch`'s interrupt.
pub const fn int_bit_dma_rx(ch: usize) -> u32 {
    1 << (24 + ch)
}
/// DMA TX channel `ch`'s interrupt.
pub const fn int_bit_dma_tx(ch: usize) -> u32 {
    1 << (16 + ch)
}
/// PTP command and control.
pub const PTP_CMD_CTL: u32 = 0xa00;
/// PTP enable (command, and state).
pub const PTP_CMD_CTL_PTP_ENABLE: u32 = 1 << 2;
/// PTP disable.
pub const PTP_CMD_CTL_PTP_DISABLE: u32 = 1 << 1;
/// DMA controller configuration (bits 1:0 the descriptor spacing).
pub const DMAC_CFG: u32 = 0xc00;
/// Descriptor spacing field.
pub const DMAC_CFG_MAX_DSPACE_MASK: u32 = 0x3;

/// The descriptor spacing field's value for descriptors `bytes` apart (16, 32, 64 or 128): the
/// spacing is 16 bytes shifted left by the field.
pub const fn dmac_cfg_dspace(bytes: u64) -> u32 {
    (bytes / 16).trailing_zeros()
}
/// DMA controller command.
pub const DMAC_CMD: u32 = 0xc0c;
/// Resets the whole controller.
pub const DMAC_CMD_SWR: u32 = 1 << 31;
/// DMA interrupt status (RX frame: bit 16 + ch; TX done: bit ch).
pub const DMAC_INT_STS: u32 = 0xc10;
/// DMA interrupt enable, set.
pub const DMAC_INT_EN_SET: u32 = 0xc14;
/// DMA interrupt enable, clear.
pub const DMAC_INT_EN_CLR: u32 = 0xc18;
/// RX channel `ch`'s frame interrupt.
pub const fn dmac_int_bit_rxfrm(ch: usize) -> u32 {
    1 << (16 + ch)
}
/// TX channel `ch`'s completion interrupt.
pub const fn dmac_int_bit_tx_ioc(ch: usize) -> u32 {
    1 << ch
}
/// RX channels and their register blocks.
pub const RX_CHANNELS: usize = 4;
/// TX channels.
pub const TX_CHANNELS: usize = 1;
/// The first RX channel's registers; channels are `CHANNEL_STRIDE` apart.
pub const RX_CFG_A_0: u32 = 0xc40;
/// The first TX channel's registers.
pub const TX_CFG_A_0: u32 = 0xd40;
/// Between channels.
pub const CHANNEL_STRIDE: u32 = 0x40;
/// Within a channel block: configuration A.
pub const CH_CFG_A: u32 = 0x00;
/// Configuration B (ring length in bits 15:0; RX: padding in 25:24).
pub const CH_CFG_B: u32 = 0x04;
/// Ring base, high and low.
pub const CH_BASE_ADDRH: u32 = 0x08;
/// Ring base, low.
pub const CH_BASE_ADDRL: u32 = 0x0c;
/// Head write-back address, high.
pub const CH_HEAD_WRITEBACK_ADDRH: u32 = 0x10;
/// Head write-back address, low.
pub const CH_HEAD_WRITEBACK_ADDRL: u32 = 0x14;
/// Head (read only).
pub const CH_HEAD: u32 = 0x18;
/// Tail (with interrupt-arming flags in the top bits).
pub const CH_TAIL: u32 = 0x1c;
/// Configuration C (interrupt auto-clear and read-to-clear modes).
pub const CH_CFG_C: u32 = 0x24;
/// Head write-back enabled (CFG_A, RX and TX).
pub const CFG_A_HP_WB_EN: u32 = 1 << 5;
/// CFG_B's ring length field.
pub const CFG_B_RING_LEN_MASK: u32 = 0xffff;
/// RX CFG_B: padding before the frame.
pub const RX_CFG_B_RX_PAD_MASK: u32 = 0x0300_0000;
/// CFG_C: the channel's INT_EN bit clears when its vector fires.
pub const CFG_C_TOP_INT_EN_AUTO_CLR: u32 = 1 << 6;
/// CFG_C: a read of INT_STS_R2C clears the channel's INT_EN bit.
pub const CFG_C_INT_EN_R2C: u32 = 1 << 4;
/// CFG_C: the channel's DMAC_INT_STS bit clears when its vector fires.
pub const CFG_C_DMA_INT_STS_AUTO_CLR: u32 = 1 << 3;
/// CFG_C: read-to-clear of the channel's DMAC_INT_STS bit.
pub const CFG_C_INT_STS_R2C_MODE_MASK: u32 = 0x7;
/// TAIL: also set the channel's DMAC_INT_EN bit (TX).
pub const TAIL_SET_DMAC_INT_EN: u32 = 1 << 31;
/// TAIL: also set the channel's INT_EN bit.
pub const TAIL_SET_TOP_INT_EN: u32 = 1 << 30;
/// TAIL: also set the channel's vector's INT_VEC_EN bit.
pub const TAIL_SET_TOP_INT_VEC_EN: u32 = 1 << 29;
/// RX descriptor data0: owned by the device.
pub const RX_DESC_DATA0_OWN: u32 = 1 << 15;
/// RX descriptor data0: first buffer of a frame.
pub const RX_DESC_DATA0_FS: u32 = 1 << 31;
/// RX descriptor data0: last buffer of a frame.
pub const RX_DESC_DATA0_LS: u32 = 1 << 30;
/// RX descriptor data0: frame length (with FCS), bits 29:16.
pub const RX_DESC_DATA0_FRAME_LENGTH_MASK: u32 = 0x3fff_0000;
/// RX descriptor data0: buffer length.
pub const RX_DESC_DATA0_BUF_LENGTH_MASK: u32 = 0x3fff;
/// RX descriptor data1: IP checksum error.
pub const RX_DESC_DATA1_STATUS_ICE: u32 = 1 << 17;
/// RX descriptor data1: TCP/UDP checksum error.
pub const RX_DESC_DATA1_STATUS_TCE: u32 = 1 << 16;
/// RX descriptor data1: checksums not checked.
pub const RX_DESC_DATA1_STATUS_ICSM: u32 = 1 << 0;
/// TX descriptor data0: descriptor type (01: extension).
pub const TX_DESC_DATA0_DTYPE_MASK: u32 = 0xc000_0000;
/// TX descriptor data0: an extension descriptor.
pub const TX_DESC_DATA0_DTYPE_EXT: u32 = 0x4000_0000;
/// TX descriptor data0: first buffer.
pub const TX_DESC_DATA0_FS: u32 = 1 << 29;
/// TX descriptor data0: last buffer.
pub const TX_DESC_DATA0_LS: u32 = 1 << 28;
/// TX descriptor data0: an extension descriptor follows.
pub const TX_DESC_DATA0_EXT: u32 = 1 << 27;
/// TX descriptor data0: interrupt on completion.
pub const TX_DESC_DATA0_IOC: u32 = 1 << 26;
/// TX descriptor data0: insert checksums.
pub const TX_DESC_DATA0_ICE: u32 = 1 << 22;
/// TX descriptor data0: IPv4 header checksum.
pub const TX_DESC_DATA0_IPE: u32 = 1 << 21;
/// TX descriptor data0: TCP/UDP checksum.
pub const TX_DESC_DATA0_TPE: u32 = 1 << 20;
/// TX descriptor data0: buffer length.
pub const TX_DESC_DATA0_BUF_LENGTH_MASK: u32 = 0xffff;
/// TX extension descriptor: large send (TSO).
pub const TX_DESC_DATA0_EXT_LSO: u32 = 0x0020_0000;
/// TX descriptor data3: frame length, or the MSS for TSO.
pub const TX_DESC_DATA3_FRAME_LENGTH_MSS_MASK: u32 = 0x3fff_0000;
/// Statistics: the first counter.
pub const STAT_RX_FCS_ERRORS: u32 = 0x1200;
/// Frames dropped on receive.
pub const STAT_RX_DROPPED_FRAMES: u32 = 0x1218;
/// Unicast bytes received.
pub const STAT_RX_UNICAST_BYTE_COUNT: u32 = 0x121c;
/// Broadcast bytes received.
pub const STAT_RX_BROADCAST_BYTE_COUNT: u32 = 0x1220;
/// Multicast bytes received.
pub const STAT_RX_MULTICAST_BYTE_COUNT: u32 = 0x1224;
/// Unicast frames received.
pub const STAT_RX_UNICAST_FRAMES: u32 = 0x1228;
/// Broadcast frames received.
pub const STAT_RX_BROADCAST_FRAMES: u32 = 0x122c;
/// Multicast frames received.
pub const STAT_RX_MULTICAST_FRAMES: u32 = 0x1230;
/// Frames received.
pub const STAT_RX_TOTAL_FRAMES: u32 = 0x1254;
/// Unicast bytes sent.
pub const STAT_TX_UNICAST_BYTE_COUNT: u32 = 0x12a0;
/// Broadcast bytes sent.
pub const STAT_TX_BROADCAST_BYTE_COUNT: u32 = 0x12a4;
/// Multicast bytes sent.
pub const STAT_TX_MULTICAST_BYTE_COUNT: u32 = 0x12a8;
/// Unicast frames sent.
pub const STAT_TX_UNICAST_FRAMES: u32 = 0x12ac;
/// Broadcast frames sent.
pub const STAT_TX_BROADCAST_FRAMES: u32 = 0x12b0;
/// Multicast frames sent.
pub const STAT_TX_MULTICAST_FRAMES: u32 = 0x12b4;
/// Frames sent.
pub const STAT_TX_TOTAL_FRAMES: u32 = 0x12d8;
/// The last statistics register.
pub const STAT_TX_COUNTER_ROLLOVER_STATUS: u32 = 0x12fc;

//! The AQC100 registers and descriptor bits the model gives meaning to. Every value here is also
//! listed in [`LINUX`] under the name the Linux atlantic driver gives it, so a test can check the
//! model against the driver's own definitions (`hw_atl/hw_atl_llh_internal.h` and friends).

/// Global control: bit 15 starts a global soft reset (self-clearing).
pub const GLOBAL_CONTROL: u32 = 0x0000;
/// Global soft reset bit.
pub const SOFT_RESET: u32 = 1 << 15;
/// Firmware version (major in the top byte).
pub const FW_VERSION: u32 = 0x0018;
/// MIF ID: the low nibble is the chip revision (0xA: B1).
pub const MIF_ID: u32 = 0x001c;
/// MIF command: 0x8000 reads firmware memory at [`MIF_ADDR`] into [`MIF_VALUE`].
pub const MIF_CMD: u32 = 0x0200;
/// MIF address; advances by 4 after each read (the driver waits for that on B1).
pub const MIF_ADDR: u32 = 0x0208;
/// MIF data.
pub const MIF_VALUE: u32 = 0x020c;
/// MIF command: read a dword.
pub const MIF_CMD_READ: u32 = 0x8000;
/// Scratch pad registers 0.. (four bytes apart).
pub const SCRATCH_PAD_BASE: u32 = 0x0300;
/// Firmware upload: the data word (scratch pad 10).
pub const UPLOAD_DATA: u32 = 0x0328;
/// Firmware upload: area (top nibble) and offset (scratch pad 11); the area clears when done.
pub const UPLOAD_TARGET: u32 = 0x032c;
/// Upload area: the RPC buffer.
pub const AREA_RPC: u32 = 0x8000_0000;
/// Upload area: the settings block.
pub const AREA_SETTINGS: u32 = 0x2000_0000;
/// Firmware RPC buffer address.
pub const FW_RPC_ADDR: u32 = 0x0334;
/// RPC control written by the driver (transaction ID and length).
pub const RPC_CONTROL: u32 = 0x0338;
/// RPC state: the firmware echoes the control word when it is done.
pub const RPC_STATE: u32 = 0x033c;
/// Firmware mailbox address.
pub const FW_MBOX_ADDR: u32 = 0x0360;
/// Firmware eFuse (permanent MAC) address.
pub const FW_EFUSE_ADDR: u32 = 0x0364;
/// Requested link rates.
pub const FW_CONTROL: u32 = 0x0368;
/// Requested options (pause, statistics toggle, ...).
pub const FW_CONTROL2: u32 = 0x036c;
/// Link state: the rate the link is up at, 0 when down.
pub const FW_STATE: u32 = 0x0370;
/// Options state: follows [`FW_CONTROL2`].
pub const FW_STATE2: u32 = 0x0374;
/// Boot exit code of the ROM boot loader (non-zero: RBL boot).
pub const BOOT_EXIT_CODE: u32 = 0x0388;
/// CPU semaphores 0.. (four bytes apart).
pub const CPU_SEMAPHORE_BASE: u32 = 0x03a0;
/// The firmware RAM semaphore's index.
pub const SEMAPHORE_RAM: u32 = 2;
/// MCP control: bit 1 interrupts the firmware (self-clearing).
pub const MCP_CONTROL: u32 = 0x0404;
/// The "interrupt the firmware" bit.
pub const MCP_FORCE_INTERRUPT: u32 = 1 << 1;
/// Flash boot loader status.
pub const DAISY_CHAIN_STATUS: u32 = 0x0704;

/// Link rate: 10 Gbit/s.
pub const RATE_10G: u32 = 0x800;
/// Link rate: 5 Gbit/s.
pub const RATE_5G: u32 = 0x400;
/// Link rate: 2.5 Gbit/s.
pub const RATE_2G5: u32 = 0x200;
/// Link rate: 1 Gbit/s.
pub const RATE_1G: u32 = 0x100;
/// Link rate: 100 Mbit/s.
pub const RATE_100M: u32 = 0x20;

/// Interrupt status (one bit per interrupt cause/vector).
pub const ISR: u32 = 0x2000;
/// Interrupt status clear (write 1s).
pub const ISCR: u32 = 0x2050;
/// Interrupt mask set (write 1s to enable).
pub const IMSR: u32 = 0x2060;
/// Interrupt mask clear (write 1s to disable).
pub const IMCR: u32 = 0x2070;
/// Interrupt auto-mask: a cause that fires is disabled until set again.
pub const IAMR: u32 = 0x2090;
/// Ring-to-vector map: one register per pair of rings.
pub const RING_IRQ_MAP_BASE: u32 = 0x2100;
/// General interrupt map registers (index 3, low byte: the link interrupt).
pub const GENERAL_IRQ_MAP_BASE: u32 = 0x2180;
/// The map index of the link interrupt.
pub const LINK_IRQ_MAP_INDEX: u32 = 3;
/// Map entry enable bit (in each byte-wide entry of the general map).
pub const MAP_ENABLE: u32 = 1 << 7;

/// RX ring registers: base, then `RX_RING_STRIDE` per ring.
pub const RX_RING_BASE: u32 = 0x5b00;
/// Distance between RX rings' registers.
pub const RX_RING_STRIDE: u32 = 0x20;
/// TX ring registers: base, then `TX_RING_STRIDE` per ring.
pub const TX_RING_BASE: u32 = 0x7c00;
/// Distance between TX rings' registers.
pub const TX_RING_STRIDE: u32 = 0x40;
/// Ring register: descriptor base address, low word.
pub const RING_ADDR_LO: u32 = 0x00;
/// Ring register: descriptor base address, high word.
pub const RING_ADDR_HI: u32 = 0x04;
/// Ring register: control (enable, length).
pub const RING_CONTROL: u32 = 0x08;
/// Ring register: head (the next descriptor the device uses).
pub const RING_HEAD: u32 = 0x0c;
/// Ring register: tail (the first descriptor the device may not use).
pub const RING_TAIL: u32 = 0x10;
/// RX ring register: data buffer size in KiB.
pub const RX_RING_BUFFER_SIZE: u32 = 0x18;
/// Ring control: enable.
pub const RING_ENABLE: u32 = 1 << 31;
/// Ring control: length in units of 8 descriptors.
pub const RING_LENGTH_MASK: u32 = 0x1ff8;
/// Ring control (RX): strip VLAN tags.
pub const RX_RING_VLAN_STRIP: u32 = 1 << 29;
/// Head and tail pointer mask.
pub const RING_POINTER_MASK: u32 = 0x1fff;
/// Buffer size field mask (KiB).
pub const BUFFER_SIZE_MASK: u32 = 0x1f;
/// Number of rings of each kind.
pub const RINGS: usize = 32;

/// L2 filter control: broadcast enable (bit 0), promiscuous (bit 3).
pub const L2_FILTER_CONTROL: u32 = 0x5100;
/// Promiscuous mode bit.
pub const PROMISCUOUS: u32 = 1 << 3;
/// Unicast filter address, low word (filter n at +8n).
pub const UNICAST_FILTER_LO: u32 = 0x5110;
/// Unicast filter address high half and enable (bit 31).
pub const UNICAST_FILTER_HI: u32 = 0x5114;
/// Unicast filter enable bit.
pub const UNICAST_FILTER_ENABLE: u32 = 1 << 31;
/// Number of unicast filters.
pub const UNICAST_FILTERS: u32 = 38;
/// RSS key write: bit 5 starts a write (self-clearing).
pub const RSS_KEY_WRITE: u32 = 0x54d0;
/// RSS key write enable bit.
pub const RSS_KEY_WRITE_ENABLE: u32 = 1 << 5;
/// RSS redirection write: bit 4 starts a write (self-clearing).
pub const RSS_REDIRECTION_WRITE: u32 = 0x54e0;
/// RSS redirection write enable bit.
pub const RSS_REDIRECTION_WRITE_ENABLE: u32 = 1 << 4;
/// RX checksum offload: bit 1 IPv4, bit 0 TCP/UDP.
pub const RX_CHECKSUM_CONTROL: u32 = 0x5580;
/// RX IPv4 header checksum checking.
pub const RX_CHECKSUM_IPV4: u32 = 1 << 1;
/// RX TCP/UDP checksum checking.
pub const RX_CHECKSUM_L4: u32 = 1 << 0;
/// RX packet buffer: bit 0 enables reception.
pub const RX_BUFFER_ENABLE: u32 = 0x5700;
/// RX descriptor cache init (a write toggles it).
pub const RX_DESC_CACHE_INIT: u32 = 0x5a00;
/// RX descriptor cache init done (bit 0).
pub const RX_DESC_CACHE_INIT_DONE: u32 = 0x5a10;
/// RX good frames counter (64-bit, low word first).
pub const RX_GOOD_FRAMES: u32 = 0x6800;
/// RX good octets counter (64-bit).
pub const RX_GOOD_OCTETS: u32 = 0x6808;
/// RX frames dropped for want of descriptors.
pub const RX_DROPPED_FRAMES: u32 = 0x6818;

/// TX offload control: bit 1 IPv4 checksum, bit 0 TCP/UDP checksum.
pub const TX_CHECKSUM_CONTROL: u32 = 0x7800;
/// TSO: TCP flag masks for the first (bits 11:0) and middle (bits 27:16) segments.
pub const LSO_FLAGS_FIRST_MID: u32 = 0x7820;
/// TSO: TCP flag mask for the last segment (bits 11:0).
pub const LSO_FLAGS_LAST: u32 = 0x7824;
/// TX packet buffer: bit 0 enables transmission.
pub const TX_BUFFER_ENABLE: u32 = 0x7900;
/// TX good frames counter (64-bit).
pub const TX_GOOD_FRAMES: u32 = 0x8800;
/// TX good octets counter (64-bit).
pub const TX_GOOD_OCTETS: u32 = 0x8808;

/// Descriptor size in bytes.
pub const DESCRIPTOR_SIZE: u64 = 16;
/// TX descriptor type: data.
pub const TXD_TYPE_DATA: u32 = 1;
/// TX descriptor type: context.
pub const TXD_TYPE_CONTEXT: u32 = 2;
/// TX descriptor: buffer length field.
pub const TXD_LENGTH_MASK: u32 = 0x000f_fff0;
/// TX descriptor: end of packet.
pub const TXD_EOP: u32 = 0x0020_0000;
/// TX descriptor: insert the context's VLAN tag.
pub const TXD_VLAN: u32 = 1 << 22;
/// TX descriptor: compute the IPv4 header checksum.
pub const TXD_IP_CHECKSUM: u32 = 1 << 24;
/// TX descriptor: compute the TCP/UDP checksum.
pub const TXD_L4_CHECKSUM: u32 = 1 << 25;
/// TX descriptor: segment (TSO/USO) with the context's parameters.
pub const TXD_LSO: u32 = 1 << 26;
/// TX descriptor (second word): use the context.
pub const TXD_CONTEXT_ENABLE: u32 = 0x2000;
/// TX context: IPv6.
pub const TXC_IPV6: u32 = 1 << 21;
/// TX context: TCP (else UDP).
pub const TXC_TCP: u32 = 1 << 22;
/// TX context: VLAN tag field.
pub const TXC_VLAN_MASK: u32 = 0x000f_fff0;
/// TX context: L2 header length field.
pub const TXC_L2_LENGTH_MASK: u32 = 0x7f00_0000;
/// TX context: low bit of the L3 header length.
pub const TXC_L3_LENGTH_LSB: u32 = 0x8000_0000;
/// TX context (second word): L3 header length >> 1.
pub const TXC_L3_LENGTH_MASK: u32 = 0x0000_00ff;
/// TX context (second word): L4 header length.
pub const TXC_L4_LENGTH_MASK: u32 = 0x0000_ff00;
/// TX context (second word): MSS.
pub const TXC_MSS_MASK: u32 = 0xffff_0000;

/// RX write-back status: descriptor done.
pub const RXD_DD: u16 = 0x0001;
/// RX write-back status: end of packet.
pub const RXD_EOP: u16 = 0x0002;
/// RX write-back status: MAC error (rx_stat bit 0).
pub const RXD_STAT_MAC_ERROR: u16 = 0x0004;
/// RX write-back status: IPv4 header checksum bad (rx_stat bit 1).
pub const RXD_STAT_IP_ERROR: u16 = 0x0008;
/// RX write-back status: TCP/UDP checksum bad (rx_stat bit 2).
pub const RXD_STAT_L4_ERROR: u16 = 0x0010;
/// RX write-back status: TCP/UDP checksum valid (rx_stat bit 3).
pub const RXD_STAT_L4_VALID: u16 = 0x0020;
/// RX write-back type: packet type field shift.
pub const RXD_PACKET_TYPE_SHIFT: u32 = 4;
/// RX write-back type: VLAN packet type bit (within the packet type).
pub const RXD_PACKET_TYPE_VLAN: u32 = 1 << 5;
/// RX write-back type: checksums checked (bits 20:19).
pub const RXD_CHECKSUM_CHECKED_SHIFT: u32 = 19;

/// A value the model uses, under the name Linux's atlantic driver defines it by.
#[derive(Debug, Clone, Copy)]
pub enum LinuxDefinition {
    /// `#define NAME value` (or `NAME = value` in an enum).
    Value(&'static str, u32),
    /// `#define NAME(x) (base + (x) * stride)`.
    Indexed(&'static str, u32, u32),
    /// `static u32 NAME[] = { first, second, ... }`: the first two elements (even and odd ring).
    Array(&'static str, [u32; 2]),
}

use LinuxDefinition::{Array, Indexed, Value};

/// Everything above that the Linux driver also defines, by its Linux name.
pub const LINUX: &[LinuxDefinition] = &[
    Value("HW_ATL_GLB_SOFT_RES_ADR", GLOBAL_CONTROL),
    Value("HW_ATL_GLB_SOFT_RES_MSK", SOFT_RESET),
    Value("HW_ATL_MPI_FW_VERSION", FW_VERSION),
    Value("HW_ATL_GLB_MIF_ID_ADR", MIF_ID),
    Value("HW_ATL_MIF_CMD", MIF_CMD),
    Value("HW_ATL_MIF_ADDR", MIF_ADDR),
    Value("HW_ATL_MIF_VAL", MIF_VALUE),
    Indexed("HW_ATL_GLB_CPU_SCRATCH_SCP_ADR", SCRATCH_PAD_BASE, 4),
    Value("HW_ATL_MPI_RPC_ADDR", FW_RPC_ADDR),
    Value("HW_ATL_RPC_CONTROL_ADR", RPC_CONTROL),
    Value("HW_ATL_RPC_STATE_ADR", RPC_STATE),
    Value("HW_ATL_FW2X_MPI_MBOX_ADDR", FW_MBOX_ADDR),
    Value("HW_ATL_FW2X_MPI_EFUSE_ADDR", FW_EFUSE_ADDR),
    Value("HW_ATL_FW2X_MPI_CONTROL_ADDR", FW_CONTROL),
    Value("HW_ATL_FW2X_MPI_CONTROL2_ADDR", FW_CONTROL2),
    Value("HW_ATL_FW2X_MPI_STATE_ADDR", FW_STATE),
    Value("HW_ATL_FW2X_MPI_STATE2_ADDR", FW_STATE2),
    Value("HW_ATL_MPI_BOOT_EXIT_CODE", BOOT_EXIT_CODE),
    Indexed("HW_ATL_GLB_CPU_SEM_ADR", CPU_SEMAPHORE_BASE, 4),
    Value("HW_ATL_FW_SM_RAM", SEMAPHORE_RAM),
    Value("HW_ATL_MCP_UP_FORCE_INTERRUPT_ADR", MCP_CONTROL),
    Value("HW_ATL_MCP_UP_FORCE_INTERRUPT_MSK", MCP_FORCE_INTERRUPT),
    Value("HW_ATL_MPI_DAISY_CHAIN_STATUS", DAISY_CHAIN_STATUS),
    Value("FW2X_RATE_10G", RATE_10G),
    Value("FW2X_RATE_5G", RATE_5G),
    Value("FW2X_RATE_2G5", RATE_2G5),
    Value("FW2X_RATE_1G", RATE_1G),
    Value("FW2X_RATE_100M", RATE_100M),
    Value("HW_ATL_ITR_ISRLSW_ADR", ISR),
    Value("HW_ATL_ITR_ISCRLSW_ADR", ISCR),
    Value("HW_ATL_ITR_IMSRLSW_ADR", IMSR),
    Value("HW_ATL_ITR_IMCRLSW_ADR", IMCR),
    Value("HW_ATL_ITR_IAMRLSW_ADR", IAMR),
    Indexed("HW_ATL_GEN_INTR_MAP_ADR", GENERAL_IRQ_MAP_BASE, 4),
    Array("itr_imr_rxr_adr", [RING_IRQ_MAP_BASE, RING_IRQ_MAP_BASE]),
    Array("itr_imr_rxr_msk", [0x1f << 8, 0x1f]),
    Array("itr_imr_rxren_msk", [1 << 15, 1 << 7]),
    Array("itr_imr_txt_adr", [RING_IRQ_MAP_BASE, RING_IRQ_MAP_BASE]),
    Array("itr_imr_txt_msk", [0x1f << 24, 0x1f << 16]),
    Array("itr_imr_txten_msk", [1 << 31, 1 << 23]),
    Indexed("HW_ATL_RX_DMA_DESC_BASE_ADDRLSW_ADR", RX_RING_BASE + RING_ADDR_LO, RX_RING_STRIDE),
    Indexed("HW_ATL_RX_DMA_DESC_BASE_ADDRMSW_ADR", RX_RING_BASE + RING_ADDR_HI, RX_RING_STRIDE),
    Indexed("HW_ATL_RDM_DESCDEN_ADR", RX_RING_BASE + RING_CONTROL, RX_RING_STRIDE),
    Value("HW_ATL_RDM_DESCDEN_MSK", RING_ENABLE),
    Indexed("HW_ATL_RDM_DESCDLEN_ADR", RX_RING_BASE + RING_CONTROL, RX_RING_STRIDE),
    Value("HW_ATL_RDM_DESCDLEN_MSK", RING_LENGTH_MASK),
    Indexed("HW_ATL_RPO_DESCDVL_STRIP_ADR", RX_RING_BASE + RING_CONTROL, RX_RING_STRIDE),
    Value("HW_ATL_RPO_DESCDVL_STRIP_MSK", RX_RING_VLAN_STRIP),
    Indexed("HW_ATL_RDM_DESCDHD_ADR", RX_RING_BASE + RING_HEAD, RX_RING_STRIDE),
    Value("HW_ATL_RDM_DESCDHD_MSK", RING_POINTER_MASK),
    Indexed("HW_ATL_RX_DMA_DESC_TAIL_PTR_ADR", RX_RING_BASE + RING_TAIL, RX_RING_STRIDE),
    Indexed("HW_ATL_RDM_DESCDDATA_SIZE_ADR", RX_RING_BASE + RX_RING_BUFFER_SIZE, RX_RING_STRIDE),
    Value("HW_ATL_RDM_DESCDDATA_SIZE_MSK", BUFFER_SIZE_MASK),
    Indexed("HW_ATL_TX_DMA_DESC_BASE_ADDRLSW_ADR", TX_RING_BASE + RING_ADDR_LO, TX_RING_STRIDE),
    Indexed("HW_ATL_TX_DMA_DESC_BASE_ADDRMSW_ADR", TX_RING_BASE + RING_ADDR_HI, TX_RING_STRIDE),
    Indexed("HW_ATL_TDM_DESCDEN_ADR", TX_RING_BASE + RING_CONTROL, TX_RING_STRIDE),
    Value("HW_ATL_TDM_DESCDEN_MSK", RING_ENABLE),
    Indexed("HW_ATL_TDM_DESCDLEN_ADR", TX_RING_BASE + RING_CONTROL, TX_RING_STRIDE),
    Value("HW_ATL_TDM_DESCDLEN_MSK", RING_LENGTH_MASK),
    Indexed("HW_ATL_TDM_DESCDHD_ADR", TX_RING_BASE + RING_HEAD, TX_RING_STRIDE),
    Value("HW_ATL_TDM_DESCDHD_MSK", RING_POINTER_MASK),
    Indexed("HW_ATL_TX_DMA_DESC_TAIL_PTR_ADR", TX_RING_BASE + RING_TAIL, TX_RING_STRIDE),
    Value("HW_ATL_RPFL2BC_EN_ADR", L2_FILTER_CONTROL),
    Value("HW_ATL_RPFL2PROMIS_MODE_ADR", L2_FILTER_CONTROL),
    Value("HW_ATL_RPFL2PROMIS_MODE_MSK", PROMISCUOUS),
    Indexed("HW_ATL_RPFL2UC_DAFLSW_ADR", UNICAST_FILTER_LO, 8),
    Indexed("HW_ATL_RPFL2UC_DAFMSW_ADR", UNICAST_FILTER_HI, 8),
    Value("HW_ATL_RPFL2UC_DAFMSW_MSK", 0xffff),
    Indexed("HW_ATL_RPFL2UC_ENF_ADR", UNICAST_FILTER_HI, 8),
    Value("HW_ATL_RPFL2UC_ENF_MSK", UNICAST_FILTER_ENABLE),
    Value("HW_ATL_B0_UCAST_FILTERS_MAX", UNICAST_FILTERS),
    Value("HW_ATL_RPF_RSS_KEY_WR_ENI_ADR", RSS_KEY_WRITE),
    Value("HW_ATL_RPF_RSS_KEY_WR_ENI_MSK", RSS_KEY_WRITE_ENABLE),
    Value("HW_ATL_RPF_RSS_REDIR_WR_ENI_ADR", RSS_REDIRECTION_WRITE),
    Value("HW_ATL_RPF_RSS_REDIR_WR_ENI_MSK", RSS_REDIRECTION_WRITE_ENABLE),
    Value("HW_ATL_RPO_IPV4CHK_EN_ADR", RX_CHECKSUM_CONTROL),
    Value("HW_ATL_RPO_IPV4CHK_EN_MSK", RX_CHECKSUM_IPV4),
    Value("HW_ATL_RPOL4CHK_EN_ADR", RX_CHECKSUM_CONTROL),
    Value("HW_ATL_RPOL4CHK_EN_MSK", RX_CHECKSUM_L4),
    Value("HW_ATL_RPB_RX_BUF_EN_ADR", RX_BUFFER_ENABLE),
    Value("HW_ATL_RPB_RX_BUF_EN_MSK", 1),
    Value("HW_ATL_RDM_RX_DMA_DESC_CACHE_INIT_ADR", RX_DESC_CACHE_INIT),
    Value("RDM_RX_DMA_DESC_CACHE_INIT_DONE_ADR", RX_DESC_CACHE_INIT_DONE),
    Value("HW_ATL_STATS_RX_DMA_GOOD_PKT_COUNTERLSW", RX_GOOD_FRAMES),
    Value("HW_ATL_STATS_RX_DMA_GOOD_OCTET_COUNTERLSW", RX_GOOD_OCTETS),
    Value("HW_ATL_RPB_RX_DMA_DROP_PKT_CNT_ADR", RX_DROPPED_FRAMES),
    Value("HW_ATL_TPO_IPV4CHK_EN_ADR", TX_CHECKSUM_CONTROL),
    Value("HW_ATL_TPOL4CHK_EN_ADR", TX_CHECKSUM_CONTROL),
    Value("HW_ATL_THM_LSO_TCP_FLAG_FIRST_ADR", LSO_FLAGS_FIRST_MID),
    Value("HW_ATL_THM_LSO_TCP_FLAG_FIRST_MSK", 0x0fff),
    Value("HW_ATL_THM_LSO_TCP_FLAG_MID_ADR", LSO_FLAGS_FIRST_MID),
    Value("HW_ATL_THM_LSO_TCP_FLAG_MID_MSK", 0x0fff_0000),
    Value("HW_ATL_THM_LSO_TCP_FLAG_LAST_ADR", LSO_FLAGS_LAST),
    Value("HW_ATL_THM_LSO_TCP_FLAG_LAST_MSK", 0x0fff),
    Value("HW_ATL_TPB_TX_BUF_EN_ADR", TX_BUFFER_ENABLE),
    Value("HW_ATL_TPB_TX_BUF_EN_MSK", 1),
    Value("HW_ATL_STATS_TX_DMA_GOOD_PKT_COUNTERLSW", TX_GOOD_FRAMES),
    Value("HW_ATL_STATS_TX_DMA_GOOD_OCTET_COUNTERLSW", TX_GOOD_OCTETS),
    Value("HW_ATL_B0_TXD_SIZE", DESCRIPTOR_SIZE as u32),
    Value("HW_ATL_B0_RXD_SIZE", DESCRIPTOR_SIZE as u32),
    Value("HW_ATL_B0_TXD_CTL_DESC_TYPE_TXD", TXD_TYPE_DATA),
    Value("HW_ATL_B0_TXD_CTL_DESC_TYPE_TXC", TXD_TYPE_CONTEXT),
    Value("HW_ATL_B0_TXD_CTL_BLEN", TXD_LENGTH_MASK),
    Value("HW_ATL_B0_TXD_CTL_EOP", TXD_EOP),
    Value("HW_ATL_B0_TXD_CTL2_CTX_EN", TXD_CONTEXT_ENABLE),
    Value("HW_ATL_B0_TXC_CTL_VLAN", TXC_VLAN_MASK),
    Value("HW_ATL_B0_TXC_CTL_L2LEN", TXC_L2_LENGTH_MASK),
    Value("HW_ATL_B0_TXC_CTL_L3LEN", TXC_L3_LENGTH_LSB),
    Value("HW_ATL_B0_TXC_LEN2_L3LEN", TXC_L3_LENGTH_MASK),
    Value("HW_ATL_B0_TXC_LEN2_L4LEN", TXC_L4_LENGTH_MASK),
    Value("HW_ATL_B0_TXC_LEN2_MSSLEN", TXC_MSS_MASK),
    Value("HW_ATL_B0_RXD_WB_STAT2_DD", RXD_DD as u32),
    Value("HW_ATL_B0_RXD_WB_STAT2_EOP", RXD_EOP as u32),
    Value("HW_ATL_B0_RXD_WB_STAT2_MACERR", RXD_STAT_MAC_ERROR as u32),
    Value("HW_ATL_B0_RXD_WB_STAT2_IP4ERR", RXD_STAT_IP_ERROR as u32),
    Value("HW_ATL_B0_RXD_WB_STAT2_TCPUPDERR", RXD_STAT_L4_ERROR as u32),
    Value("HW_ATL_B0_RXD_WB_STAT_PKTTYPE_SHIFT", RXD_PACKET_TYPE_SHIFT),
    Value("HW_ATL_B0_RXD_WB_STAT_RXCTRL_SHIFT", RXD_CHECKSUM_CHECKED_SHIFT),
];

/// `BIT(n)` definitions Linux spells as bit numbers: (name, bit) pairs the test resolves too.
pub const LINUX_BITS: &[(&str, u32)] = &[
    ("HW_ATL_B0_TXD_CTL_CMD_VLAN", TXD_VLAN),
    ("HW_ATL_B0_TXD_CTL_CMD_IPCSO", TXD_IP_CHECKSUM),
    ("HW_ATL_B0_TXD_CTL_CMD_TUCSO", TXD_L4_CHECKSUM),
    ("HW_ATL_B0_TXD_CTL_CMD_LSO", TXD_LSO),
    ("HW_ATL_B0_TXD_CTL_CMD_IPV6", TXC_IPV6),
    ("HW_ATL_B0_TXD_CTL_CMD_TCP", TXC_TCP),
    ("HW_ATL_B0_RXD_WB_PKTTYPE_VLAN", RXD_PACKET_TYPE_VLAN),
];

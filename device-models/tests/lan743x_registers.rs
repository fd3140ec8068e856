//! Checks every register offset, bit and descriptor field the LAN7430 model uses against the
//! Linux lan743x driver's own definitions (`drivers/net/ethernet/microchip/lan743x_main.h` of
//! Debian's linux-source-6.12; `scripts/fetch-atlantic-source.sh` unpacks it next to the
//! atlantic driver, and `scripts/test.sh` exports its folder as DRIVERLAB_LAN743X_SOURCE). A
//! changed mask or offset fails the test; it skips, saying why, where the source is absent.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

use std::collections::HashMap;
use std::path::PathBuf;

use device_models::lan743x::regs::*;

/// `#define NAME body` and `#define NAME(param) body`.
fn defines(text: &str) -> HashMap<String, (Option<String>, String)> {
    let mut out = HashMap::new();
    for line in text.replace("\\\n", " ").lines() {
        let line = line.split("/*").next().unwrap_or("").trim();
        let Some(rest) = line.strip_prefix("#define") else { continue };
        let rest = rest.trim();
        let name_end = rest.find(|c: char| c.is_whitespace() || c == '(').unwrap_or(rest.len());
        let name = &rest[..name_end];
        let after = &rest[name_end..];
        if let Some(params) = after.strip_prefix('(') {
            let Some((param, body)) = params.split_once(')') else { continue };
            out.insert(name.to_string(), (Some(param.trim().to_string()), body.trim().to_string()));
        } else {
            out.insert(name.to_string(), (None, after.trim().to_string()));
        }
    }
    out
}

/// Evaluates the C integer expressions the header uses: numbers, `BIT(n)`, `*`, `+`, `<<`, `|`,
/// parentheses, and other defines by name.
struct Eval<'a> {
    defs: &'a HashMap<String, (Option<String>, String)>,
    bound: Vec<(String, u64)>,
}

impl Eval<'_> {
    fn value(&self, expr: &str) -> Option<u64> {
        let tokens = tokenize(expr);
        let mut at = 0;
        let v = self.or(&tokens, &mut at)?;
        (at == tokens.len()).then_some(v)
    }

    fn or(&self, t: &[String], at: &mut usize) -> Option<u64> {
        let mut v = self.shift(t, at)?;
        while t.get(*at).map(String::as_str) == Some("|") {
            *at += 1;
            v |= self.shift(t, at)?;
        }
        Some(v)
    }

    fn shift(&self, t: &[String], at: &mut usize) -> Option<u64> {
        let mut v = self.sum(t, at)?;
        while t.get(*at).map(String::as_str) == Some("<<") {
            *at += 1;
            v = v.checked_shl(self.sum(t, at)? as u32)?;
        }
        Some(v)
    }

    fn sum(&self, t: &[String], at: &mut usize) -> Option<u64> {
        let mut v = self.product(t, at)?;
        while t.get(*at).map(String::as_str) == Some("+") {
            *at += 1;
            v += self.product(t, at)?;
        }
        Some(v)
    }

    fn product(&self, t: &[String], at: &mut usize) -> Option<u64> {
        let mut v = self.atom(t, at)?;
        while t.get(*at).map(String::as_str) == Some("*") {
            *at += 1;
            v = v.checked_mul(self.atom(t, at)?)?;
        }
        Some(v)
    }

    fn atom(&self, t: &[String], at: &mut usize) -> Option<u64> {
        let token = t.get(*at)?.clone();
        *at += 1;
        if token == "(" {
            let v = self.or(t, at)?;
            (t.get(*at).map(String::as_str) == Some(")")).then(|| *at += 1)?;
            return Some(v);
        }
        if let Some(hex) = token.strip_prefix("0x").or_else(|| token.strip_prefix("0X")) {
            return u64::from_str_radix(hex.trim_end_matches(['u', 'U', 'l', 'L']), 16).ok();
        }
        if token.chars().all(|c| c.is_ascii_digit()) {
            return token.parse().ok();
        }
        if let Some((_, v)) = self.bound.iter().find(|(n, _)| *n == token) {
            return Some(*v);
        }
        // A call: BIT(x) or another define with a parameter.
        if t.get(*at).map(String::as_str) == Some("(") {
            *at += 1;
            let arg = self.or(t, at)?;
            (t.get(*at).map(String::as_str) == Some(")")).then(|| *at += 1)?;
            if token == "BIT" {
                return 1u64.checked_shl(arg as u32);
            }
            return self.call(&token, Some(arg));
        }
        self.call(&token, None)
    }

    fn call(&self, name: &str, arg: Option<u64>) -> Option<u64> {
        let (param, body) = self.defs.get(name)?;
        let mut bound = self.bound.clone();
        if let (Some(param), Some(arg)) = (param, arg) {
            bound.push((param.clone(), arg));
        }
        Eval { defs: self.defs, bound }.value(body)
    }
}

fn tokenize(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '<' && chars.get(i + 1) == Some(&'<') {
            out.push("<<".into());
            i += 2;
        } else if "()|+*".contains(c) {
            out.push(c.to_string());
            i += 1;
        } else {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            if i == start {
                out.push(c.to_string());
                i += 1;
            } else {
                out.push(chars[start..i].iter().collect());
            }
        }
    }
    out
}

#[test]
fn the_model_uses_the_driver_s_offsets_bits_and_fields() {
    let Some(dir) = std::env::var_os("DRIVERLAB_LAN743X_SOURCE").map(PathBuf::from) else {
        let why = "DRIVERLAB_LAN743X_SOURCE is not set (scripts/test.sh sets it from scripts/fetch-atlantic-source.sh)";
        testkit::skip("the_model_uses_the_driver_s_offsets_bits_and_fields", testkit::Lacks::Setup, why);
        return;
    };
    let header = dir.join("lan743x_main.h");
    let text = std::fs::read_to_string(&header).unwrap_or_else(|e| panic!("{}: {e}", header.display()));
    let defs = defines(&text);
    let eval = Eval { defs: &defs, bound: Vec::new() };
    let rx = |ch: u32, offset: u32| u64::from(RX_CFG_A_0 + ch * CHANNEL_STRIDE + offset);
    let tx = |offset: u32| u64::from(TX_CFG_A_0 + offset);
    let checks: Vec<(&str, u64)> = vec![
        ("ID_REV", ID_REV.into()),
        ("FPGA_REV", FPGA_REV.into()),
        ("HW_CFG", HW_CFG.into()),
        ("HW_CFG_LRST_", HW_CFG_LRST.into()),
        ("PMT_CTL", PMT_CTL.into()),
        ("PMT_CTL_ETH_PHY_RST_", PMT_CTL_ETH_PHY_RST.into()),
        ("PMT_CTL_READY_", PMT_CTL_READY.into()),
        ("DP_SEL", DP_SEL.into()),
        ("DP_SEL_DPRDY_", DP_SEL_DPRDY.into()),
        ("DP_CMD", DP_CMD.into()),
        ("DP_ADDR", DP_ADDR.into()),
        ("DP_DATA_0", DP_DATA_0.into()),
        ("E2P_CMD", E2P_CMD.into()),
        ("E2P_CMD_EPC_BUSY_", E2P_CMD_EPC_BUSY.into()),
        ("E2P_CMD_EPC_TIMEOUT_", E2P_CMD_EPC_TIMEOUT.into()),
        ("FCT_RX_CTL", FCT_RX_CTL.into()),
        ("FCT_TX_CTL", FCT_TX_CTL.into()),
        ("MAC_CR", MAC_CR.into()),
        ("MAC_CR_CNTR_RST_", MAC_CR_CNTR_RST.into()),
        ("MAC_RX", MAC_RX.into()),
        ("MAC_RX_RXEN_", MAC_RX_RXEN.into()),
        ("MAC_RX_RXD_", MAC_RX_RXD.into()),
        ("MAC_TX", MAC_TX.into()),
        ("MAC_TX_TXEN_", MAC_TX_TXEN.into()),
        ("MAC_TX_TXD_", MAC_TX_TXD.into()),
        ("MAC_RX_ADDRH", MAC_RX_ADDRH.into()),
        ("MAC_RX_ADDRL", MAC_RX_ADDRL.into()),
        ("MAC_MII_ACC", MAC_MII_ACC.into()),
        ("MAC_MII_ACC_PHY_ADDR_MASK_", MAC_MII_ACC_PHY_ADDR_MASK.into()),
        ("MAC_MII_ACC_MIIRINDA_MASK_", MAC_MII_ACC_MIIRINDA_MASK.into()),
        ("MAC_MII_ACC_MII_WRITE_", MAC_MII_ACC_MII_WRITE.into()),
        ("MAC_MII_ACC_MII_BUSY_", MAC_MII_ACC_MII_BUSY.into()),
        ("MAC_MII_DATA", MAC_MII_DATA.into()),
        ("RFE_ADDR_FILT_HI(0)", RFE_ADDR_FILT_HI_0.into()),
        ("RFE_ADDR_FILT_LO(0)", (RFE_ADDR_FILT_HI_0 + 4).into()),
        ("RFE_ADDR_FILT_HI(1)", (RFE_ADDR_FILT_HI_0 + 8).into()),
        ("RFE_ADDR_FILT_HI_VALID_", RFE_ADDR_FILT_HI_VALID.into()),
        ("RFE_CTL", RFE_CTL.into()),
        ("RFE_CTL_TCP_UDP_COE_", RFE_CTL_TCP_UDP_COE.into()),
        ("RFE_CTL_IP_COE_", RFE_CTL_IP_COE.into()),
        ("RFE_CTL_AB_", RFE_CTL_AB.into()),
        ("RFE_CTL_AM_", RFE_CTL_AM.into()),
        ("RFE_CTL_AU_", RFE_CTL_AU.into()),
        ("RFE_CTL_MCAST_HASH_", RFE_CTL_MCAST_HASH.into()),
        ("RFE_CTL_DA_PERFECT_", RFE_CTL_DA_PERFECT.into()),
        ("INT_STS", INT_STS.into()),
        ("INT_SET", INT_SET.into()),
        ("INT_EN_SET", INT_EN_SET.into()),
        ("INT_EN_CLR", INT_EN_CLR.into()),
        ("INT_STS_R2C", INT_STS_R2C.into()),
        ("INT_VEC_EN_SET", INT_VEC_EN_SET.into()),
        ("INT_VEC_EN_CLR", INT_VEC_EN_CLR.into()),
        ("INT_VEC_EN_AUTO_CLR", INT_VEC_EN_AUTO_CLR.into()),
        ("INT_VEC_MAP0", INT_VEC_MAP0.into()),
        ("INT_VEC_MAP1", INT_VEC_MAP1.into()),
        ("INT_BIT_MAS_", INT_BIT_MAS.into()),
        ("INT_BIT_SW_GP_", INT_BIT_SW_GP.into()),
        ("INT_BIT_1588_", INT_BIT_1588.into()),
        ("INT_BIT_DMA_RX_(2)", int_bit_dma_rx(2).into()),
        ("INT_BIT_DMA_TX_(0)", int_bit_dma_tx(0).into()),
        ("PTP_CMD_CTL", PTP_CMD_CTL.into()),
        ("PTP_CMD_CTL_PTP_ENABLE_", PTP_CMD_CTL_PTP_ENABLE.into()),
        ("PTP_CMD_CTL_PTP_DISABLE_", PTP_CMD_CTL_PTP_DISABLE.into()),
        ("DMAC_CFG", DMAC_CFG.into()),
        ("DMAC_CFG_MAX_DSPACE_128_", DMAC_CFG_MAX_DSPACE_MASK.into()),
        ("DMAC_CFG_MAX_DSPACE_16_", dmac_cfg_dspace(16).into()),
        ("DMAC_CFG_MAX_DSPACE_32_", dmac_cfg_dspace(32).into()),
        ("DMAC_CFG_MAX_DSPACE_64_", dmac_cfg_dspace(64).into()),
        ("DMAC_CMD", DMAC_CMD.into()),
        ("DMAC_CMD_SWR_", DMAC_CMD_SWR.into()),
        ("DMAC_CMD_START_R_(1)", 1 << (4 + 1)),
        ("DMAC_CMD_STOP_R_(1)", 1 << 1),
        ("DMAC_CMD_RX_SWR_(3)", 1 << (8 + 3)),
        ("DMAC_CMD_START_T_(0)", 1 << 20),
        ("DMAC_CMD_STOP_T_(0)", 1 << 16),
        ("DMAC_CMD_TX_SWR_(0)", 1 << 24),
        ("DMAC_INT_STS", DMAC_INT_STS.into()),
        ("DMAC_INT_EN_SET", DMAC_INT_EN_SET.into()),
        ("DMAC_INT_EN_CLR", DMAC_INT_EN_CLR.into()),
        ("DMAC_INT_BIT_RXFRM_(3)", dmac_int_bit_rxfrm(3).into()),
        ("DMAC_INT_BIT_TX_IOC_(0)", dmac_int_bit_tx_ioc(0).into()),
        ("RX_CFG_A(1)", rx(1, CH_CFG_A)),
        ("RX_CFG_A_RX_HP_WB_EN_", CFG_A_HP_WB_EN.into()),
        ("RX_CFG_B(1)", rx(1, CH_CFG_B)),
        ("RX_CFG_B_RX_PAD_MASK_", RX_CFG_B_RX_PAD_MASK.into()),
        ("RX_CFG_B_RX_RING_LEN_MASK_", CFG_B_RING_LEN_MASK.into()),
        ("RX_BASE_ADDRH(2)", rx(2, CH_BASE_ADDRH)),
        ("RX_BASE_ADDRL(2)", rx(2, CH_BASE_ADDRL)),
        ("RX_HEAD_WRITEBACK_ADDRH(3)", rx(3, CH_HEAD_WRITEBACK_ADDRH)),
        ("RX_HEAD_WRITEBACK_ADDRL(3)", rx(3, CH_HEAD_WRITEBACK_ADDRL)),
        ("RX_HEAD(1)", rx(1, CH_HEAD)),
        ("RX_TAIL(1)", rx(1, CH_TAIL)),
        ("RX_TAIL_SET_TOP_INT_EN_", TAIL_SET_TOP_INT_EN.into()),
        ("RX_TAIL_SET_TOP_INT_VEC_EN_", TAIL_SET_TOP_INT_VEC_EN.into()),
        ("RX_CFG_C(1)", rx(1, CH_CFG_C)),
        ("RX_CFG_C_RX_TOP_INT_EN_AUTO_CLR_", CFG_C_TOP_INT_EN_AUTO_CLR.into()),
        ("RX_CFG_C_RX_INT_EN_R2C_", CFG_C_INT_EN_R2C.into()),
        ("RX_CFG_C_RX_DMA_INT_STS_AUTO_CLR_", CFG_C_DMA_INT_STS_AUTO_CLR.into()),
        ("RX_CFG_C_RX_INT_STS_R2C_MODE_MASK_", CFG_C_INT_STS_R2C_MODE_MASK.into()),
        ("TX_CFG_A(0)", tx(CH_CFG_A)),
        ("TX_CFG_A_TX_HP_WB_EN_", CFG_A_HP_WB_EN.into()),
        ("TX_CFG_B(0)", tx(CH_CFG_B)),
        ("TX_CFG_B_TX_RING_LEN_MASK_", CFG_B_RING_LEN_MASK.into()),
        ("TX_BASE_ADDRH(0)", tx(CH_BASE_ADDRH)),
        ("TX_BASE_ADDRL(0)", tx(CH_BASE_ADDRL)),
        ("TX_HEAD_WRITEBACK_ADDRH(0)", tx(CH_HEAD_WRITEBACK_ADDRH)),
        ("TX_HEAD_WRITEBACK_ADDRL(0)", tx(CH_HEAD_WRITEBACK_ADDRL)),
        ("TX_HEAD(0)", tx(CH_HEAD)),
        ("TX_TAIL(0)", tx(CH_TAIL)),
        ("TX_TAIL_SET_DMAC_INT_EN_", TAIL_SET_DMAC_INT_EN.into()),
        ("TX_TAIL_SET_TOP_INT_EN_", TAIL_SET_TOP_INT_EN.into()),
        ("TX_TAIL_SET_TOP_INT_VEC_EN_", TAIL_SET_TOP_INT_VEC_EN.into()),
        ("TX_CFG_C(0)", tx(CH_CFG_C)),
        ("TX_CFG_C_TX_TOP_INT_EN_AUTO_CLR_", CFG_C_TOP_INT_EN_AUTO_CLR.into()),
        ("TX_CFG_C_TX_INT_EN_R2C_", CFG_C_INT_EN_R2C.into()),
        ("TX_CFG_C_TX_DMA_INT_STS_AUTO_CLR_", CFG_C_DMA_INT_STS_AUTO_CLR.into()),
        ("TX_CFG_C_TX_INT_STS_R2C_MODE_MASK_", CFG_C_INT_STS_R2C_MODE_MASK.into()),
        ("RX_DESC_DATA0_OWN_", RX_DESC_DATA0_OWN.into()),
        ("RX_DESC_DATA0_FS_", RX_DESC_DATA0_FS.into()),
        ("RX_DESC_DATA0_LS_", RX_DESC_DATA0_LS.into()),
        ("RX_DESC_DATA0_FRAME_LENGTH_MASK_", RX_DESC_DATA0_FRAME_LENGTH_MASK.into()),
        ("RX_DESC_DATA0_BUF_LENGTH_MASK_", RX_DESC_DATA0_BUF_LENGTH_MASK.into()),
        ("RX_DESC_DATA1_STATUS_ICE_", RX_DESC_DATA1_STATUS_ICE.into()),
        ("RX_DESC_DATA1_STATUS_TCE_", RX_DESC_DATA1_STATUS_TCE.into()),
        ("RX_DESC_DATA1_STATUS_ICSM_", RX_DESC_DATA1_STATUS_ICSM.into()),
        ("TX_DESC_DATA0_DTYPE_MASK_", TX_DESC_DATA0_DTYPE_MASK.into()),
        ("TX_DESC_DATA0_DTYPE_EXT_", TX_DESC_DATA0_DTYPE_EXT.into()),
        ("TX_DESC_DATA0_FS_", TX_DESC_DATA0_FS.into()),
        ("TX_DESC_DATA0_LS_", TX_DESC_DATA0_LS.into()),
        ("TX_DESC_DATA0_EXT_", TX_DESC_DATA0_EXT.into()),
        ("TX_DESC_DATA0_IOC_", TX_DESC_DATA0_IOC.into()),
        ("TX_DESC_DATA0_ICE_", TX_DESC_DATA0_ICE.into()),
        ("TX_DESC_DATA0_IPE_", TX_DESC_DATA0_IPE.into()),
        ("TX_DESC_DATA0_TPE_", TX_DESC_DATA0_TPE.into()),
        ("TX_DESC_DATA0_BUF_LENGTH_MASK_", TX_DESC_DATA0_BUF_LENGTH_MASK.into()),
        ("TX_DESC_DATA0_EXT_LSO_", TX_DESC_DATA0_EXT_LSO.into()),
        ("TX_DESC_DATA3_FRAME_LENGTH_MSS_MASK_", TX_DESC_DATA3_FRAME_LENGTH_MSS_MASK.into()),
        ("STAT_RX_FCS_ERRORS", STAT_RX_FCS_ERRORS.into()),
        ("STAT_RX_DROPPED_FRAMES", STAT_RX_DROPPED_FRAMES.into()),
        ("STAT_RX_UNICAST_BYTE_COUNT", STAT_RX_UNICAST_BYTE_COUNT.into()),
        ("STAT_RX_BROADCAST_BYTE_COUNT", STAT_RX_BROADCAST_BYTE_COUNT.into()),
        ("STAT_RX_MULTICAST_BYTE_COUNT", STAT_RX_MULTICAST_BYTE_COUNT.into()),
        ("STAT_RX_UNICAST_FRAMES", STAT_RX_UNICAST_FRAMES.into()),
        ("STAT_RX_BROADCAST_FRAMES", STAT_RX_BROADCAST_FRAMES.into()),
        ("STAT_RX_MULTICAST_FRAMES", STAT_RX_MULTICAST_FRAMES.into()),
        ("STAT_RX_TOTAL_FRAMES", STAT_RX_TOTAL_FRAMES.into()),
        ("STAT_TX_UNICAST_BYTE_COUNT", STAT_TX_UNICAST_BYTE_COUNT.into()),
        ("STAT_TX_BROADCAST_BYTE_COUNT", STAT_TX_BROADCAST_BYTE_COUNT.into()),
        ("STAT_TX_MULTICAST_BYTE_COUNT", STAT_TX_MULTICAST_BYTE_COUNT.into()),
        ("STAT_TX_UNICAST_FRAMES", STAT_TX_UNICAST_FRAMES.into()),
        ("STAT_TX_BROADCAST_FRAMES", STAT_TX_BROADCAST_FRAMES.into()),
        ("STAT_TX_MULTICAST_FRAMES", STAT_TX_MULTICAST_FRAMES.into()),
        ("STAT_TX_TOTAL_FRAMES", STAT_TX_TOTAL_FRAMES.into()),
        ("STAT_TX_COUNTER_ROLLOVER_STATUS", STAT_TX_COUNTER_ROLLOVER_STATUS.into()),
        ("PCI_DEVICE_ID_SMSC_LAN7430", device_models::lan743x::DEVICE.into()),
        ("ID_REV_ID_LAN7430_", u64::from(ID_REV_LAN7430_B0 & 0xffff_0000)),
        ("ID_REV_CHIP_REV_B0_", u64::from(ID_REV_LAN7430_B0 & 0xffff)),
    ];
    let mut wrong = Vec::new();
    for (name, ours) in &checks {
        match eval.value(name) {
            Some(theirs) if theirs == *ours => {}
            Some(theirs) => wrong.push(format!("{name}: the driver says {theirs:#x}, the model {ours:#x}")),
            None => wrong.push(format!("{name}: not found or not understood in {}", header.display())),
        }
    }
    assert!(wrong.is_empty(), "{} of {} differ:\n{}", wrong.len(), checks.len(), wrong.join("\n"));
    eprintln!("{} definitions agree with {}", checks.len(), header.display());
}

#[test]
fn the_evaluator_reads_the_header_s_forms() {
    let text = "#define A (0x10)\n#define B(ch) (0xC40 + ((ch) << 6))\n#define C BIT(3)\n#define D (A | C)\n\
                #define E(ch) BIT(16 + (ch))\n#define G(x) (0x400 + (8 * (x)))\n";
    let defs = defines(text);
    let eval = Eval { defs: &defs, bound: Vec::new() };
    assert_eq!(eval.value("A"), Some(0x10));
    assert_eq!(eval.value("B(2)"), Some(0xcc0));
    assert_eq!(eval.value("D"), Some(0x18));
    assert_eq!(eval.value("E(3)"), Some(1 << 19));
    assert_eq!(eval.value("G(2)"), Some(0x410));
    assert_eq!(eval.value("F"), None, "an unknown name is not zero");
}

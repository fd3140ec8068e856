//! The LAN7430's internal PHY at MDIO address 1, as phylib and Linux's "Microchip LAN88xx" PHY
//! driver (or the generic PHY driver) see it: the clause-22 registers of a 1000BASE-T PHY
//! that links at 1000 Mbit/s full duplex when the wire has a carrier, extended pages selected by
//! register 31 (plain storage, read back), and clause-45 MMD registers reached through
//! registers 13 and 14.

use std::collections::BTreeMap;

/// The MDIO address the PHY answers on.
pub const ADDRESS: u8 = 1;
/// PHYSID1 and PHYSID2: Microchip's LAN88xx.
pub const PHY_ID: u32 = 0x0007_c132;

const BMCR: u8 = 0;
const BMSR: u8 = 1;
const PHYSID1: u8 = 2;
const PHYSID2: u8 = 3;
const ADVERTISE: u8 = 4;
const LPA: u8 = 5;
const EXPANSION: u8 = 6;
const CTRL1000: u8 = 9;
const STAT1000: u8 = 10;
const MMD_CTRL: u8 = 13;
const MMD_DATA: u8 = 14;
const ESTATUS: u8 = 15;
const PAGE: u8 = 31;

const BMCR_RESET: u16 = 0x8000;
const BMCR_ANRESTART: u16 = 0x0200;
const BMCR_PDOWN: u16 = 0x0800;
const BMCR_DEFAULT: u16 = 0x1140;
/// 10/100 half and full, extended status, preamble suppression, autonegotiation.
const BMSR_ABILITIES: u16 = 0x7949;
const BMSR_LSTATUS: u16 = 0x0004;
const BMSR_ANEGCOMPLETE: u16 = 0x0020;
/// The link partner: acknowledge, both pause bits, 10/100 half and full, 802.3.
const LPA_UP: u16 = 0x4de1;
/// Master, local and remote receivers OK, 1000 full.
const STAT1000_UP: u16 = 0x7800;
const ESTATUS_1000: u16 = 0x3000;
/// MMD control: function bits (00: address).
const MMD_FUNCTION_MASK: u16 = 0xc000;

/// The PHY's state.
#[derive(Debug, Clone)]
pub struct Phy {
    bmcr: u16,
    advertise: u16,
    ctrl1000: u16,
    page: u16,
    /// Registers 16-30 of each page (page, register) -> value.
    paged: BTreeMap<(u16, u8), u16>,
    mmd_ctrl: u16,
    mmd_address: u16,
    /// MMD registers: (device, register) -> value.
    mmd: BTreeMap<(u16, u16), u16>,
}

impl Default for Phy {
    fn default() -> Self {
        let mut mmd = BTreeMap::new();
        // The LAN88xx driver reads MMD 3's chip ID and revision at probe.
        mmd.insert((3, 0x806d), 0x7430);
        mmd.insert((3, 0x806e), 0x0001);
        Phy {
            bmcr: BMCR_DEFAULT,
            advertise: 0x01e1,
            ctrl1000: 0x0300,
            page: 0,
            paged: BTreeMap::new(),
            mmd_ctrl: 0,
            mmd_address: 0,
            mmd,
        }
    }
}

impl Phy {
    /// Whether the link is up on a wire with `carrier`: not powered down, autonegotiating (the
    /// model has no forced modes) with a partner.
    pub fn link(&self, carrier: bool) -> bool {
        carrier && self.bmcr & BMCR_PDOWN == 0
    }

    /// Reads register `reg`.
    pub fn read(&mut self, reg: u8, carrier: bool) -> u16 {
        let up = self.link(carrier);
        match reg {
            BMCR => self.bmcr,
            BMSR => BMSR_ABILITIES | if up { BMSR_LSTATUS | BMSR_ANEGCOMPLETE } else { 0 },
            PHYSID1 => (PHY_ID >> 16) as u16,
            PHYSID2 => PHY_ID as u16,
            ADVERTISE => self.advertise,
            LPA if up => LPA_UP,
            EXPANSION if up => 1,
            CTRL1000 => self.ctrl1000,
            STAT1000 if up => STAT1000_UP,
            MMD_CTRL => self.mmd_ctrl,
            MMD_DATA => {
                let key = (self.mmd_ctrl & 0x1f, self.mmd_address);
                if self.mmd_ctrl & MMD_FUNCTION_MASK == 0 {
                    self.mmd_address
                } else {
                    self.mmd.get(&key).copied().unwrap_or(0)
                }
            }
            ESTATUS => ESTATUS_1000,
            16..=30 => self.paged.get(&(self.page, reg)).copied().unwrap_or(0),
            PAGE => self.page,
            _ => 0,
        }
    }

    /// Writes register `reg`.
    pub fn write(&mut self, reg: u8, value: u16) {
        match reg {
            BMCR if value & BMCR_RESET != 0 => *self = Phy { mmd: self.mmd.clone(), ..Phy::default() },
            // Autonegotiation restarts and completes at once: the restart bit never stays set.
            BMCR => self.bmcr = value & !BMCR_ANRESTART,
            ADVERTISE => self.advertise = value,
            CTRL1000 => self.ctrl1000 = value,
            MMD_CTRL => self.mmd_ctrl = value,
            MMD_DATA => {
                if self.mmd_ctrl & MMD_FUNCTION_MASK == 0 {
                    self.mmd_address = value;
                } else {
                    self.mmd.insert((self.mmd_ctrl & 0x1f, self.mmd_address), value);
                }
            }
            16..=30 => {
                self.paged.insert((self.page, reg), value);
            }
            PAGE => self.page = value,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_links_at_gigabit_with_a_carrier_and_resets_cleanly() {
        let mut phy = Phy::default();
        assert_eq!(((phy.read(PHYSID1, true) as u32) << 16) | phy.read(PHYSID2, true) as u32, PHY_ID);
        assert_eq!(phy.read(BMSR, true) & (BMSR_LSTATUS | BMSR_ANEGCOMPLETE), BMSR_LSTATUS | BMSR_ANEGCOMPLETE);
        assert_eq!(phy.read(STAT1000, true) & 0x8800, 0x0800, "1000 full, no master/slave failure");
        assert_eq!(phy.read(BMSR, false) & BMSR_LSTATUS, 0, "no carrier, no link");
        phy.write(BMCR, BMCR_DEFAULT | BMCR_ANRESTART);
        assert_eq!(phy.read(BMCR, true) & BMCR_ANRESTART, 0);
        phy.write(BMCR, BMCR_DEFAULT | BMCR_PDOWN);
        assert_eq!(phy.read(STAT1000, true), 0, "powered down");
        phy.write(BMCR, BMCR_RESET);
        assert_eq!(phy.read(BMCR, true), BMCR_DEFAULT, "the reset bit clears itself");
    }

    #[test]
    fn pages_and_the_indirect_mmd_registers_read_back() {
        let mut phy = Phy::default();
        phy.write(PAGE, 0x52b5);
        phy.write(16, 0x8f82);
        phy.write(PAGE, 0);
        assert_eq!(phy.read(16, true), 0, "page 0 is another page");
        phy.write(PAGE, 0x52b5);
        assert_eq!(phy.read(16, true), 0x8f82);
        // MMD 3, register 0x806a: address, then data without increment.
        phy.write(MMD_CTRL, 3);
        phy.write(MMD_DATA, 0x806a);
        phy.write(MMD_CTRL, 0x4003);
        phy.write(MMD_DATA, 0x2000);
        phy.write(MMD_CTRL, 3);
        phy.write(MMD_DATA, 0x806d);
        phy.write(MMD_CTRL, 0x4003);
        assert_eq!(phy.read(MMD_DATA, true), 0x7430, "the chip ID the driver reads");
    }
}

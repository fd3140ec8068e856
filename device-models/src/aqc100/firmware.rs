//! The AQC100's management firmware as the driver sees it (the "2.x/3.x" interface): the boot
//! handshake, firmware memory read through the MIF window, uploads into the RPC and settings
//! areas, the RPC echo, link control and the statistics mailbox.
//!
//! The boot is the fast ROM-boot-loader path: the boot exit code is a constant non-zero value
//! that ignores the driver's writes, and the version is there from the start, so the driver's
//! reset polls finish on their first read.

use super::regs;
use super::stats::MacStats;

/// The version the model reports: 3.1.38 (a 3.x firmware; the driver takes its 2.x/3.x path).
pub const VERSION: u32 = 0x0301_0026;
/// Boot exit code: any non-zero value other than 0xDEAD ("restart pending") and 0xF1A7 ("no
/// firmware") means the ROM boot loader started the firmware.
const BOOT_OK: u32 = 0x0000_0001;
/// Flash boot loader status: anything but 0x0600_0000 ("not started").
const DAISY_CHAIN_OK: u32 = 0x0000_0010;
/// MIF ID: chip revision B1 in the low nibble.
const MIF_ID_B1: u32 = 0x0000_000a;

/// Firmware memory as the MIF window addresses it.
const RAM_BASE: u32 = 0x1fb0_0000;
const RAM_SIZE: usize = 0x8000;
/// The mailbox: header (12 bytes), statistics (15 dwords), then the info block.
pub const MBOX_ADDR: u32 = RAM_BASE + 0x1000;
/// The RPC buffer.
pub const RPC_ADDR: u32 = RAM_BASE + 0x3000;
/// The settings block.
pub const SETTINGS_ADDR: u32 = RAM_BASE + 0x4000;
/// The eFuse image (the permanent MAC at +160).
pub const EFUSE_ADDR: u32 = RAM_BASE + 0x5000;
const MBOX_STATS: u32 = 12;
const MBOX_INFO: u32 = MBOX_STATS + 15 * 4;
const INFO_PHY_TEMPERATURE: u32 = 8;
const INFO_SETTING_ADDRESS: u32 = 196;
const INFO_SETTING_LENGTH: u32 = 200;
const SETTINGS_LENGTH: u32 = 0x100;
const EFUSE_MAC: u32 = 40 * 4;
/// PHY temperature in 1/256 degrees Celsius (40 C).
const PHY_TEMPERATURE: u32 = 40 * 256;
const ALL_RATES: u32 = regs::RATE_10G | regs::RATE_5G | regs::RATE_2G5 | regs::RATE_1G | regs::RATE_100M;

/// The firmware's state.
pub struct Firmware {
    ram: Vec<u8>,
    mif_addr: u32,
    mif_value: u32,
    upload_data: u32,
    upload_target: u32,
    rpc_control: u32,
    control: u32,
    control2: u32,
    mcp_control: u32,
    mac: [u8; 6],
}

impl Firmware {
    /// The firmware of a NIC whose permanent address is `mac`, as after power-on.
    pub fn new(mac: [u8; 6]) -> Self {
        let mut fw = Firmware {
            ram: vec![0; RAM_SIZE],
            mif_addr: 0,
            mif_value: 0,
            upload_data: 0,
            upload_target: 0,
            rpc_control: 0,
            control: 0,
            control2: 0,
            mcp_control: 0,
            mac,
        };
        fw.store(MBOX_ADDR + MBOX_INFO + INFO_PHY_TEMPERATURE, PHY_TEMPERATURE);
        fw.store(MBOX_ADDR + MBOX_INFO + INFO_SETTING_ADDRESS, SETTINGS_ADDR);
        fw.store(MBOX_ADDR + MBOX_INFO + INFO_SETTING_LENGTH, SETTINGS_LENGTH);
        fw.store(EFUSE_ADDR + EFUSE_MAC, u32::from_be_bytes([mac[0], mac[1], mac[2], mac[3]]));
        fw.store(EFUSE_ADDR + EFUSE_MAC + 4, u32::from_be_bytes([mac[4], mac[5], 0, 0]));
        fw
    }

    /// The permanent MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn store(&mut self, addr: u32, value: u32) {
        if let Some(at) = addr.checked_sub(RAM_BASE).map(|a| a as usize).filter(|a| a + 4 <= RAM_SIZE) {
            self.ram[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }
    }

    fn load(&self, addr: u32, stats: &MacStats) -> u32 {
        let stats_start = MBOX_ADDR + MBOX_STATS;
        if (stats_start..stats_start + 15 * 4).contains(&addr) {
            return stats.mailbox_word(((addr - stats_start) / 4) as usize);
        }
        addr.checked_sub(RAM_BASE)
            .map(|a| a as usize)
            .filter(|a| a + 4 <= RAM_SIZE)
            .map_or(0, |at| u32::from_le_bytes(self.ram[at..at + 4].try_into().expect("4 bytes")))
    }

    /// Whether the driver asked for any rate the link can run at.
    pub fn link_requested(&self) -> bool {
        self.control & ALL_RATES != 0
    }

    /// The rate bit the link comes up at: the fastest one requested.
    fn negotiated_rate(&self) -> u32 {
        let requested = self.control & ALL_RATES;
        [regs::RATE_10G, regs::RATE_5G, regs::RATE_2G5, regs::RATE_1G, regs::RATE_100M]
            .into_iter()
            .find(|&r| requested & r != 0)
            .unwrap_or(0)
    }

    /// Link speed in Mbit/s with the link up, for reports.
    pub fn link_mbps(&self) -> u32 {
        match self.negotiated_rate() {
            regs::RATE_10G => 10_000,
            regs::RATE_5G => 5_000,
            regs::RATE_2G5 => 2_500,
            regs::RATE_1G => 1_000,
            regs::RATE_100M => 100,
            _ => 0,
        }
    }

    /// A register read in the firmware's range, or `None` if the register is not the firmware's.
    pub fn read(&self, reg: u32, link_up: bool) -> Option<u32> {
        Some(match reg {
            regs::FW_VERSION => VERSION,
            regs::MIF_ID => MIF_ID_B1,
            regs::MIF_CMD => 0, // never busy
            regs::MIF_ADDR => self.mif_addr,
            regs::MIF_VALUE => self.mif_value,
            regs::UPLOAD_DATA => self.upload_data,
            regs::UPLOAD_TARGET => self.upload_target,
            regs::FW_RPC_ADDR => RPC_ADDR,
            regs::RPC_CONTROL => self.rpc_control,
            regs::RPC_STATE => self.rpc_control,
            regs::FW_MBOX_ADDR => MBOX_ADDR,
            regs::FW_EFUSE_ADDR => EFUSE_ADDR,
            regs::FW_CONTROL => self.control,
            regs::FW_CONTROL2 => self.control2,
            regs::FW_STATE => {
                if link_up {
                    self.negotiated_rate()
                } else {
                    0
                }
            }
            regs::FW_STATE2 => self.control2,
            regs::BOOT_EXIT_CODE => BOOT_OK,
            regs::DAISY_CHAIN_STATUS => DAISY_CHAIN_OK,
            r if r == regs::CPU_SEMAPHORE_BASE + 4 * regs::SEMAPHORE_RAM => 1, // always free
            regs::MCP_CONTROL => self.mcp_control,
            _ => return None,
        })
    }

    /// A register write in the firmware's range; false if the register is not the firmware's.
    pub fn write(&mut self, reg: u32, value: u32, stats: &MacStats) -> bool {
        match reg {
            regs::MIF_CMD => {
                if value & regs::MIF_CMD_READ != 0 {
                    self.mif_value = self.load(self.mif_addr, stats);
                    self.mif_addr = self.mif_addr.wrapping_add(4);
                }
            }
            regs::MIF_ADDR => self.mif_addr = value,
            regs::MIF_VALUE => self.mif_value = value,
            regs::UPLOAD_DATA => self.upload_data = value,
            regs::UPLOAD_TARGET => self.upload_target = value,
            regs::RPC_CONTROL => self.rpc_control = value,
            regs::FW_CONTROL => self.control = value,
            regs::FW_CONTROL2 => self.control2 = value,
            regs::MCP_CONTROL => {
                if value & regs::MCP_FORCE_INTERRUPT != 0 {
                    self.upload();
                }
                self.mcp_control = value & !regs::MCP_FORCE_INTERRUPT;
            }
            // Read-only or ignored: the version, boot codes, semaphores, RPC state.
            regs::FW_VERSION
            | regs::MIF_ID
            | regs::FW_RPC_ADDR
            | regs::RPC_STATE
            | regs::FW_MBOX_ADDR
            | regs::FW_EFUSE_ADDR
            | regs::FW_STATE
            | regs::FW_STATE2
            | regs::BOOT_EXIT_CODE
            | regs::DAISY_CHAIN_STATUS => {}
            r if (regs::CPU_SEMAPHORE_BASE..regs::CPU_SEMAPHORE_BASE + 0x20).contains(&r) => {}
            _ => return false,
        }
        true
    }

    /// The firmware takes the word in [`regs::UPLOAD_DATA`] into the area and offset named by
    /// [`regs::UPLOAD_TARGET`], then clears the area nibble to say it is done.
    fn upload(&mut self) {
        let offset = self.upload_target & 0xffff;
        let base = match self.upload_target & 0xf000_0000 {
            regs::AREA_RPC => Some(RPC_ADDR),
            regs::AREA_SETTINGS => Some(SETTINGS_ADDR),
            _ => None,
        };
        if let Some(base) = base {
            self.store(base + offset, self.upload_data);
        }
        self.upload_target &= 0x0fff_ffff;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mif_read(fw: &mut Firmware, addr: u32, stats: &MacStats) -> u32 {
        fw.write(regs::MIF_ADDR, addr, stats);
        fw.write(regs::MIF_CMD, regs::MIF_CMD_READ, stats);
        assert_eq!(fw.read(regs::MIF_ADDR, true), Some(addr + 4), "B1: the address advances");
        fw.read(regs::MIF_VALUE, true).unwrap()
    }

    #[test]
    fn the_driver_finds_mailbox_settings_and_mac() {
        let stats = MacStats::default();
        let mut fw = Firmware::new([0x02, 0x1d, 0x6a, 0x01, 0x02, 0x03]);
        let mbox = fw.read(regs::FW_MBOX_ADDR, true).unwrap();
        assert_eq!(mif_read(&mut fw, mbox + 268, &stats), SETTINGS_ADDR, "info.setting_address");
        let efuse = fw.read(regs::FW_EFUSE_ADDR, true).unwrap();
        let words = [mif_read(&mut fw, efuse + 160, &stats), mif_read(&mut fw, efuse + 164, &stats)];
        // The driver byte-swaps both words and takes the first six bytes.
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.swap_bytes().to_le_bytes()).collect();
        assert_eq!(&bytes[..6], &[0x02, 0x1d, 0x6a, 0x01, 0x02, 0x03]);
        assert_eq!(fw.read(regs::BOOT_EXIT_CODE, true), Some(BOOT_OK));
        fw.write(regs::BOOT_EXIT_CODE, 0xdead, &stats);
        assert_eq!(fw.read(regs::BOOT_EXIT_CODE, true), Some(BOOT_OK), "ignores the driver's 0xDEAD");
    }

    #[test]
    fn link_uploads_and_rpc() {
        let stats = MacStats::default();
        let mut fw = Firmware::new([2, 0, 0, 0, 0, 1]);
        assert_eq!(fw.read(regs::FW_STATE, true), Some(0), "nothing requested");
        fw.write(regs::FW_CONTROL, 0xf20, &stats);
        assert_eq!(fw.read(regs::FW_STATE, true), Some(regs::RATE_10G));
        assert_eq!(fw.read(regs::FW_STATE, false), Some(0), "down");
        assert_eq!(fw.link_mbps(), 10_000);
        fw.write(regs::FW_CONTROL2, 1 << 30, &stats);
        assert_eq!(fw.read(regs::FW_STATE2, true), Some(1 << 30), "statistics toggle acknowledged");

        fw.write(regs::UPLOAD_DATA, 0x1234, &stats);
        fw.write(regs::UPLOAD_TARGET, regs::AREA_SETTINGS | 8, &stats);
        fw.write(regs::MCP_CONTROL, regs::MCP_FORCE_INTERRUPT, &stats);
        assert_eq!(fw.read(regs::UPLOAD_TARGET, true), Some(8), "area cleared: done");
        assert_eq!(fw.read(regs::MCP_CONTROL, true), Some(0), "self-clearing");
        assert_eq!(mif_read(&mut fw, SETTINGS_ADDR + 8, &stats), 0x1234);

        fw.write(regs::RPC_CONTROL, 0x0040_0007, &stats);
        assert_eq!(fw.read(regs::RPC_STATE, true), Some(0x0040_0007), "RPC answered");
    }
}

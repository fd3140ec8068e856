//! The NICs driverlab knows by name: the chips its device models implement and the probe guest
//! drives. Each knows its PCI identity, the Linux driver that binds it, the probe's name for it
//! (`probe.nic=`) and the model's subcommand (`driverlab model KIND`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A NIC driverlab models and drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(rename_all = "lowercase"))]
pub enum NicKind {
    /// Aquantia (Marvell) AQC100 10G, driven by Linux's `atlantic`.
    Aqc100,
    /// Microchip LAN7430 1G, driven by Linux's `lan743x`.
    Lan743x,
}

impl NicKind {
    /// Every kind, in the order help texts list them.
    pub const ALL: [NicKind; 2] = [NicKind::Aqc100, NicKind::Lan743x];

    /// Its name: the model's subcommand, the probe's `probe.nic=` value, a nested box's card.
    pub fn name(self) -> &'static str {
        match self {
            NicKind::Aqc100 => "aqc100",
            NicKind::Lan743x => "lan743x",
        }
    }

    /// The Linux driver that binds it.
    pub fn linux_driver(self) -> &'static str {
        match self {
            NicKind::Aqc100 => "atlantic",
            NicKind::Lan743x => "lan743x",
        }
    }

    /// The kind a Linux driver drives, if driverlab knows it.
    pub fn from_linux_driver(driver: &str) -> Option<NicKind> {
        NicKind::ALL.into_iter().find(|k| k.linux_driver() == driver)
    }

    /// PCI vendor and device ID.
    pub const fn pci_id(self) -> (u16, u16) {
        match self {
            NicKind::Aqc100 => (0x1d6a, 0x00b1),
            NicKind::Lan743x => (0x1055, 0x7430),
        }
    }

    /// Its link and DMA engine as the bus accounting and cost model see them.
    pub fn link_profile(self) -> crate::pcie_link::LinkProfile {
        match self {
            NicKind::Aqc100 => crate::pcie_link::LinkProfile::aqc100(),
            NicKind::Lan743x => crate::pcie_link::LinkProfile::lan743x(),
        }
    }

    /// The names of every kind, for error messages: `aqc100, lan743x`.
    pub fn names() -> String {
        NicKind::ALL.map(NicKind::name).join(", ")
    }
}

impl fmt::Display for NicKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`NicKind`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a NIC driverlab models; there is {names}", names = NicKind::names())]
pub struct UnknownNic(pub String);

impl FromStr for NicKind {
    type Err = UnknownNic;

    fn from_str(s: &str) -> Result<NicKind, UnknownNic> {
        NicKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| UnknownNic(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_drivers_and_ids_go_both_ways() {
        for kind in NicKind::ALL {
            assert_eq!(kind.name().parse::<NicKind>(), Ok(kind));
            assert_eq!(NicKind::from_linux_driver(kind.linux_driver()), Some(kind));
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{kind}\""));
        }
        assert_eq!(NicKind::Aqc100.pci_id(), (0x1d6a, 0x00b1));
        assert_eq!(NicKind::from_linux_driver("e1000e"), None);
        let error = "e1000e".parse::<NicKind>().unwrap_err().to_string();
        assert!(error.contains("aqc100, lan743x"), "{error}");
    }
}

//! PCI: configuration space, the device trait, the root complex with its two configuration
//! mechanisms (0xCF8/0xCFC and ECAM), and MSI-X.
//!
//! Emulated devices (virtio) and, later, passed-through devices implement [`PciDevice`]; the
//! [`PciRoot`] maps their BARs onto the MMIO bus wherever the guest programs them.

pub mod config;
pub mod device;
pub mod msix;
pub mod root;

pub use config::{BarKind, PciConfiguration, PciIds};
pub use device::{BarMapping, PciDevice};
pub use msix::MsixConfig;
pub use root::{PciConfigIo, PciConfigMmio, PciRoot};

/// Errors building PCI devices and the bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PciError {
    /// A BAR that cannot exist.
    #[error("BAR {index}: {reason}")]
    Bar {
        /// BAR index.
        index: usize,
        /// Why.
        reason: &'static str,
    },
    /// Configuration space is full.
    #[error("no room for a {0}-byte capability in configuration space")]
    NoCapabilitySpace(usize),
    /// A device number already in use or out of range.
    #[error("PCI device number {0} is taken or above 31")]
    Slot(u8),
    /// No room for a BAR in the MMIO windows.
    #[error("no room for a BAR of {0:#x} bytes in the PCI MMIO windows")]
    NoAddressSpace(u64),
    /// MSI-X set-up failed.
    #[error("MSI-X: {0}")]
    Msix(String),
}

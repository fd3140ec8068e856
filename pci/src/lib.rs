//! PCI for driverlab: configuration space, the device trait, the root complex with its two
//! configuration mechanisms (0xCF8/0xCFC and ECAM), PCIe root ports with hot-plug slots, MSI and
//! MSI-X.
//!
//! Its own crate, as Cloud Hypervisor keeps `pci` apart from `devices`: the VMM's emulated
//! devices (virtio) and passed-through devices implement [`PciDevice`], the [`PciRoot`] maps their
//! BARs onto the MMIO bus wherever the guest programs them, and the device models (in their own
//! processes) build their configuration space with it, without linking the VMM's devices.

pub mod config;
pub mod device;
pub mod msi;
pub mod msix;
pub mod pcie;
pub mod regs;
pub mod root;
pub mod root_port;
mod vector;

pub use config::{BarKind, PciConfiguration, PciIds};
pub use device::{BarMapping, PciDevice};
pub use msi::{MsiConfig, MsiState};
pub use msix::{MsixConfig, MsixState};
pub use root::{
    Arrival, FunctionState, PciConfigIo, PciConfigMmio, PciRoot, PciRootState, PciStateError, Removal, SlotError,
};
pub use root_port::{RootPort, RootPortState};

/// Errors building PCI devices and the bus.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// A BAR that cannot exist.
    #[error("BAR {index}: {reason}")]
    Bar {
        /// BAR index.
        index: usize,
        /// What is wrong with it.
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
    /// An MSI or MSI-X vector could not be wired up.
    #[error("MSI vector: {0}")]
    Vector(#[source] vm_device::interrupt::InterruptError),
    /// An MSI-X table size out of range.
    #[error("MSI-X: {0} vectors; 1 to 2048 are possible")]
    MsixSize(usize),
    /// A virtqueue that cannot be created.
    #[error("virtqueue of {size}: {reason}")]
    Queue {
        /// Its size.
        size: u16,
        /// Why (virtio-queue's error).
        reason: String,
    },
}

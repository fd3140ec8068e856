//! A software Microchip LAN7430 (1055:7430) that the unmodified Linux lan743x driver drives,
//! served over vfio-user.
//!
//! - BAR 0 (8 KiB, 64-bit): the registers ([`nic`]): identity and resets, the MAC and its MDIO
//!   bus to the internal PHY ([`phy`]), the receive filter, the interrupt block, the DMA
//!   controller, 4 RX and 1 TX channels ([`rings`]) with their descriptor spacing, statistics.
//! - BAR 2 (4 KiB, 64-bit): the MSI-X table and pending bits (8 vectors), emulated by the VMM.
//! - A data-path thread takes frames from the backend ([`crate::wire`]: a TAP or the frame
//!   generator) into RX channel 0 while the vfio-user thread serves register accesses;
//!   transmits happen on the TX tail write.
//!
//! DMA reaches only what the client mapped ([`DmaSpace`]): anything else is refused, counted as a
//! fault, and the frame is dropped.

pub mod channel;
pub mod nic;
pub mod phy;
pub mod regs;
pub mod rings;

use self::nic::{BAR0_SIZE, Nic};
use crate::nic_model::{MacAddress, NicCore, NicHandle, NicModel, NicStatus};

/// Microchip's (SMSC's) vendor ID.
pub const VENDOR: u16 = vm_spec::NicKind::Lan743x.pci_id().0;
/// The LAN7430's device ID.
pub const DEVICE: u16 = vm_spec::NicKind::Lan743x.pci_id().1;
/// The MAC address used when none is given: locally administered, stable.
pub const DEFAULT_MAC: [u8; 6] = [0x02, 0x10, 0x55, 0x74, 0x30, 0x01];

/// The LAN7430 model.
pub type Lan743x = NicModel<Nic>;
/// A handle for controlling a running LAN7430 from another thread.
pub type Lan743xHandle = NicHandle<Nic>;

impl NicCore for Nic {
    const KIND: vm_spec::NicKind = vm_spec::NicKind::Lan743x;
    const BAR0_SIZE: u64 = BAR0_SIZE;
    const VECTORS: u32 = nic::VECTORS as u32;

    fn subsystem() -> (u16, u16, u8) {
        (VENDOR, 0x0001, 0x00)
    }

    fn status(&self) -> NicStatus {
        NicStatus { link_mbps: self.link_mbps(), mac: MacAddress(self.mac()), counters: self.totals() }
    }
}

#[cfg(test)]
mod tests;

//! A software Aquantia AQC100 (1d6a:00b1) that the unmodified Linux atlantic driver can drive,
//! served over vfio-user.
//!
//! - BAR 0 (64 KiB, 64-bit): the registers ([`nic`]): the firmware interface ([`firmware`]), the
//!   interrupt block ([`interrupts`]), 32 RX and 32 TX rings ([`rings`], [`rx`], [`tx`]) with the
//!   B0 descriptor formats and offloads ([`crate::wire::offload`]), statistics ([`stats`]).
//! - BAR 2 (4 KiB, 64-bit): the MSI-X table and pending bits (32 vectors), emulated by the VMM.
//! - A data-path thread takes frames from the backend ([`crate::wire::tap`] or [`crate::wire::generator`]) into RX ring 0
//!   while the vfio-user thread serves register accesses; transmits happen on the TX tail write.
//!   The backends and the frame offloads are the wire's ([`crate::wire`]).
//!
//! DMA reaches only what the client mapped ([`DmaSpace`]): anything else is refused, counted as a
//! fault, and the frame is dropped.

pub mod firmware;
pub mod interrupts;
pub mod nic;
pub mod regs;
pub mod rings;
pub mod rx;
pub mod rx_bench;
pub mod stats;
pub mod tx;

use self::nic::Nic;
pub use crate::nic_model::{MacAddress, NicCounters, NicStatus};
use crate::nic_model::{NicCore, NicHandle, NicModel};

/// Aquantia's vendor ID.
pub const VENDOR: u16 = vm_spec::NicKind::Aqc100.pci_id().0;
/// The AQC100's device ID.
pub const DEVICE: u16 = vm_spec::NicKind::Aqc100.pci_id().1;
/// The MAC address used when none is given: locally administered, stable.
pub const DEFAULT_MAC: [u8; 6] = [0x02, 0x1d, 0x6a, 0x00, 0x00, 0x01];
/// MSI-X vectors.
pub const MSIX_VECTORS: u16 = 32;
const BAR0_SIZE: u64 = 0x1_0000;

/// The AQC100 model.
pub type Aqc100 = NicModel<Nic>;
/// A handle for controlling a running AQC100 from another thread.
pub type Aqc100Handle = NicHandle<Nic>;

impl NicCore for Nic {
    const KIND: vm_spec::NicKind = vm_spec::NicKind::Aqc100;
    const BAR0_SIZE: u64 = BAR0_SIZE;
    const VECTORS: u32 = MSIX_VECTORS as u32;

    fn subsystem() -> (u16, u16, u8) {
        (VENDOR, 0x0001, 0x02)
    }

    fn status(&self) -> NicStatus {
        let stats = self.stats();
        NicStatus {
            link_mbps: self.link_mbps(),
            mac: MacAddress(self.fw.mac()),
            counters: NicCounters {
                rx_frames: stats.rx.frames(),
                rx_bytes: stats.rx.bytes(),
                rx_dropped: stats.rx_dropped,
                rx_filtered: stats.rx_filtered,
                rx_errors: stats.rx_errors,
                tx_frames: stats.tx.frames(),
                tx_bytes: stats.tx.bytes(),
                tx_errors: stats.tx_errors,
            },
        }
    }
}

#[cfg(test)]
mod tests;

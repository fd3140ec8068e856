//! The interfaces where driverlab's VMM, its emulated devices and its passthrough code meet, kept
//! in one small crate (as Cloud Hypervisor keeps `vm-device` apart from its device crates) so each
//! side depends on the contract, not on the other side:
//!
//! - [`bus`]: address-range dispatch of guest accesses to [`bus::BusDevice`]s;
//! - [`interrupt`]: MSI delivery through KVM irqfds, as devices see it ([`interrupt::MsiInterrupts`]);
//! - [`memory_slots`]: host memory mapped into the guest ([`memory_slots::GuestMemorySlots`]);
//! - [`dma`]: the DMA map listener an IOMMU calls for every map and unmap ([`dma::DmaMapListener`]);
//! - [`guest_event`]: how devices end the run (power-off, reset, panic).
//!
//! Every fallible method returns this crate's typed errors, which keep their `#[source]`.

pub mod bus;
pub mod dma;
pub mod guest_event;
pub mod interrupt;
pub mod memory_slots;

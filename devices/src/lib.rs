//! Emulated devices for driverlab's VMM.
//!
//! Devices sit on a [`bus::Bus`] (port I/O or MMIO) and know nothing of KVM: interrupts leave them
//! through EventFds that the VMM wires to irqfds ([`interrupt`]), and guest requests that end the
//! VM (power-off, reset, panic) leave through a [`power::GuestEventSink`].

pub mod bus;
pub mod interrupt;
pub mod models;
pub mod pci;
pub mod power;
pub mod serial;
pub mod virtio;

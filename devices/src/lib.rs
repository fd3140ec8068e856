//! Emulated devices for driverlab's VMM.
//!
//! Devices sit on a [`bus::Bus`] (port I/O or MMIO) and know nothing of KVM: interrupts leave them
//! through an [`EventFd`](vmm_sys_util::eventfd::EventFd) that the VMM wires to an irqfd, and guest
//! requests that end the VM (power-off, reset, panic) leave through a [`power::GuestEventSink`].

pub mod bus;
pub mod power;
pub mod serial;

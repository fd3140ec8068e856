//! Emulated devices for driverlab's VMM.
//!
//! Devices sit on a [`vm_device::bus::Bus`] (port I/O or MMIO) and know nothing of KVM: interrupts
//! leave them through EventFds that the VMM wires to irqfds ([`vm_device::interrupt`]), and guest
//! requests that end the VM (power-off, reset, panic) leave through a
//! [`vm_device::guest_event::GuestEventSink`]. The device models served over vfio-user live in
//! their own crate, `device-models`; PCI (configuration space, MSI, MSI-X, the root complex) is the
//! `pci` crate, shared with passthrough and the models.

pub mod power;
pub mod rtc;
pub mod serial;
pub mod virtio;

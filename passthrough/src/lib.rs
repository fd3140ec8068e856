//! PCI passthrough: handing a device to a guest.
//!
//! - [`backend`]: the [`backend::VfioBackend`] trait, and its two implementations,
//!   [`kernel_vfio`] (a device bound to vfio-pci) and [`vfio_user`] (a device served by another
//!   process).
//! - [`device`]: the passed-through PCI function, one implementation over either backend.
//! - [`dma`]: what the device may DMA to, mirrored from the virtio-iommu or identity.
//! - [`slots`]: mmapped BAR windows as guest memory.
//! - [`sysfs`], [`doctor`]: host inspection and the preflight behind `driverlab doctor`; PCI
//!   addresses ([`Bdf`]) come from the `vm-spec` crate, where the VM spec names devices by them.

pub mod backend;
pub mod device;
pub mod dma;
pub mod doctor;
pub mod kernel_vfio;
pub mod slots;
pub mod sysfs;
pub mod vfio_user;

pub use vm_spec::bdf::{Bdf, BdfError};

//! PCI passthrough: handing a host device to a guest.
//!
//! - [`bdf`]: PCI addresses as users write them (`0000:63:00.0`).
//! - [`sysfs`]: what the host knows about a device: IDs, driver, IOMMU group.
//! - [`doctor`]: the host preflight behind `driverlab doctor`: one check per requirement, each
//!   failure with the exact fix.

pub mod bdf;
pub mod doctor;
pub mod sysfs;

pub use bdf::Bdf;

//! Device models served to a VMM over vfio-user by `driverlab model ...`: the conformance test
//! device and two NICs, the Aquantia AQC100 10G (Linux's `atlantic`) and the Microchip LAN7430 1G
//! (Linux's `lan743x`). They run in their own process, see guest memory only through the DMA maps
//! their client hands them, and are driven like real hardware.
//!
//! They are kept apart from the devices the VMM emulates itself (the `devices` crate), as Cloud
//! Hypervisor keeps its vhost-user backends apart: the VMM never links a model. What the two sides
//! share is the vfio-user protocol and the counters region's layout (`vm_spec::counters`).

pub mod aqc100;
pub mod cli;
pub mod dma;
pub mod lan743x;
pub mod nic_model;
pub mod pcie_link;
pub mod process;
pub mod seccomp;
pub mod server;
#[cfg(test)]
mod test_support;
pub mod testdev;
pub mod wire;

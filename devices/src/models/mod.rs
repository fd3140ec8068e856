//! Device models served to a VMM over vfio-user by `driverlab model ...`: the conformance test
//! device and the AQC100 NIC. They run in their own process, see guest memory only through
//! the DMA maps their client hands them, and are driven like real hardware.

pub mod aqc100;
pub mod counters;
pub mod dma;
pub mod server;
pub mod testdev;

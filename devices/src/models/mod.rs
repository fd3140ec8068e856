//! Device models served to a VMM over vfio-user by `driverlab model ...`: the conformance test
//! device and (later) the AQC100. They run in their own process, see guest memory only through
//! the DMA maps their client hands them, and are driven like real hardware.

pub mod counters;
pub mod dma;
pub mod server;
pub mod testdev;

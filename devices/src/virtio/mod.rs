//! Virtio 1.x devices over the modern PCI transport.

pub mod iommu;
pub mod pci;

#[cfg(test)]
mod tests;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

/// VIRTIO_F_VERSION_1.
pub const F_VERSION_1: u64 = 1 << 32;

/// Device status bits (virtio 1.2, 2.1).
pub mod status {
    /// The guest noticed the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The guest has a driver for it.
    pub const DRIVER: u8 = 2;
    /// The driver is set up and the device is live.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = 8;
    /// The device hit an error it cannot recover from.
    pub const DEVICE_NEEDS_RESET: u8 = 64;
    /// The driver gave up.
    pub const FAILED: u8 = 128;
}

/// A virtio device behind a transport.
pub trait VirtioDevice: Send {
    /// Virtio device ID (23 for the IOMMU).
    fn device_type(&self) -> u16;
    /// Feature bits offered.
    fn features(&self) -> u64;
    /// Maximum size of each virtqueue.
    fn queue_max_sizes(&self) -> &[u16];
    /// Reads device configuration space.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes device configuration space.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The driver accepted `features` (FEATURES_OK).
    fn ack_features(&mut self, features: u64);
    /// Handles what the driver made available on queue `index`; returns true if buffers were used.
    fn process_queue(&mut self, index: usize, queue: &mut Queue, mem: &GuestMemoryMmap) -> bool;
    /// Returns to the reset state (the driver wrote 0 to the status).
    fn reset(&mut self);
    /// Its own state (beside the transport's) as a snapshot keeps it; `None` for a device that
    /// cannot be snapshotted.
    fn snapshot_state(&self) -> Option<serde_json::Value> {
        None
    }
    /// Puts back a state from [`VirtioDevice::snapshot_state`].
    fn restore_state(&mut self, _state: &serde_json::Value) -> Result<(), String> {
        Err("this virtio device cannot be restored from a snapshot".into())
    }
}

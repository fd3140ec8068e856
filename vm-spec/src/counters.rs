//! What the VMM reports counting, in its exit line and on its control socket:
//!
//! - [`IommuCounts`]: the virtio-iommu's maps, unmaps, faults and request latency (`"viommu"`);
//! - [`ModelCounters`]: what a driverlab device model counted (`"devices"[i]."counters"`). A
//!   model publishes them in a driverlab extension to the vfio-user device: region 9, read-only,
//!   little-endian u64s, which the VMM reads while the VM runs and at its end. Clients that do not
//!   know the region (QEMU) ignore it.

use serde::{Deserialize, Serialize};

use crate::pcie_link::{LinkCounts, LinkTraffic, TRAFFIC_WORDS};

/// A snapshot of the virtio-iommu's counters, as it appears under `"viommu"`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IommuCounts {
    /// Successful MAP requests.
    pub maps: u64,
    /// Of `maps`, those that let the device write (`VIRTIO_IOMMU_MAP_F_WRITE`: what a driver
    /// maps `DMA_FROM_DEVICE` or both ways, i.e. RX buffers).
    #[serde(default)]
    pub maps_writable: u64,
    /// Of `maps`, those the device may only read (`DMA_TO_DEVICE`: TX buffers).
    #[serde(default)]
    pub maps_read_only: u64,
    /// Of `maps_writable`, those of guest memory in the guest's swiotlb bounce pool (as the
    /// control socket's `vm.bounce-pool` set it): RX buffers the guest bounced.
    #[serde(default)]
    pub bounced_maps_writable: u64,
    /// Of `maps_read_only`, those in the bounce pool: TX buffers the guest bounced.
    #[serde(default)]
    pub bounced_maps_read_only: u64,
    /// Successful UNMAP requests.
    pub unmaps: u64,
    /// Bytes mapped by them.
    pub map_bytes: u64,
    /// The same in 4 KiB pages.
    pub map_pages: u64,
    /// Bytes unmapped (including mappings dropped with their domain).
    pub unmapped_bytes: u64,
    /// Mappings alive now.
    pub live_mappings: u64,
    /// Most mappings alive at once.
    pub peak_mappings: u64,
    /// DMA accesses refused by translation.
    pub faults: u64,
    /// Requests handled.
    pub requests: u64,
    /// Requests answered with a status other than OK.
    pub failed_requests: u64,
    /// Median time to handle a request in the device, ns.
    pub request_ns_p50: u64,
    /// 99th percentile of the same.
    pub request_ns_p99: u64,
}

/// VFIO region index of the counters (the first device-specific index after VGA).
pub const COUNTERS_REGION: u32 = 9;
/// The u64s of the counters region: the eight counters, then the bus counts (RX, then TX).
const COUNTER_WORDS: usize = 8 + 2 * TRAFFIC_WORDS;
/// Size of the counters region.
pub const COUNTERS_SIZE: u64 = COUNTER_WORDS as u64 * 8;

/// What a model counts. Encoded as little-endian u64s in this order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCounters {
    /// DMA_MAP requests received.
    pub dma_maps: u64,
    /// DMA_UNMAP requests received.
    pub dma_unmaps: u64,
    /// DMA accesses refused because nothing was mapped there.
    pub dma_faults: u64,
    /// Interrupts signalled.
    pub interrupts: u64,
    /// Frames the device wrote into guest memory (a NIC's received frames).
    #[serde(default)]
    pub rx_frames: u64,
    /// Bytes of those frames.
    #[serde(default)]
    pub rx_bytes: u64,
    /// Frames the device read from guest memory and sent.
    #[serde(default)]
    pub tx_frames: u64,
    /// Bytes of those frames.
    #[serde(default)]
    pub tx_bytes: u64,
    /// What the device put on its PCIe link (see [`crate::pcie_link`]); `bus` in JSON.
    #[serde(default, rename = "bus")]
    pub link: LinkCounts,
}

impl ModelCounters {
    /// The region's contents.
    pub fn encode(&self) -> [u8; COUNTERS_SIZE as usize] {
        let mut out = [0u8; COUNTERS_SIZE as usize];
        let values = [
            self.dma_maps,
            self.dma_unmaps,
            self.dma_faults,
            self.interrupts,
            self.rx_frames,
            self.rx_bytes,
            self.tx_frames,
            self.tx_bytes,
        ];
        let bus = self.link.rx.words().into_iter().chain(self.link.tx.words());
        for (i, v) in values.into_iter().chain(bus).enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Decodes the region's contents (a shorter region, from an older model, leaves the later
    /// counters 0).
    pub fn decode(data: &[u8]) -> Option<ModelCounters> {
        let at = |i: usize| Some(u64::from_le_bytes(data.get(i * 8..i * 8 + 8)?.try_into().ok()?));
        let traffic = |first: usize| LinkTraffic::from_words(std::array::from_fn(|i| at(first + i).unwrap_or(0)));
        Some(ModelCounters {
            dma_maps: at(0)?,
            dma_unmaps: at(1)?,
            dma_faults: at(2)?,
            interrupts: at(3)?,
            rx_frames: at(4).unwrap_or(0),
            rx_bytes: at(5).unwrap_or(0),
            tx_frames: at(6).unwrap_or(0),
            tx_bytes: at(7).unwrap_or(0),
            link: LinkCounts { rx: traffic(8), tx: traffic(8 + TRAFFIC_WORDS) },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = ModelCounters {
            dma_maps: 3,
            dma_unmaps: 2,
            dma_faults: 1,
            interrupts: 9,
            rx_frames: 5,
            rx_bytes: 7570,
            tx_frames: 1,
            tx_bytes: 60,
            link: LinkCounts::default(),
        };
        let mut c = c;
        c.link.rx.buffer_writes.bytes = 7570;
        c.link.tx.partial_writes = 3;
        assert_eq!(ModelCounters::decode(&c.encode()), Some(c));
        let before_bus = ModelCounters::decode(&c.encode()[..64]).unwrap();
        assert_eq!((before_bus.tx_bytes, before_bus.link), (60, LinkCounts::default()), "a 64-byte region");
        assert_eq!(ModelCounters::decode(&[0; 8]), None);
        let old = ModelCounters::decode(&c.encode()[..32]).unwrap();
        assert_eq!((old.interrupts, old.rx_frames), (9, 0), "a 32-byte region from an older model");
    }
}

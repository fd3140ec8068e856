//! What the virtio-iommu counts: every map and unmap the guest makes, their sizes, live mappings,
//! faults, and how long requests take to handle.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hdrhistogram::Histogram;
use vm_spec::counters::IommuCounts;

use super::domains::Effect;

/// Counters, updated by the device as it handles requests.
pub struct IommuStats {
    requests: AtomicU64,
    failed_requests: AtomicU64,
    maps: AtomicU64,
    maps_writable: AtomicU64,
    bounced_writable: AtomicU64,
    bounced_read_only: AtomicU64,
    /// The guest's bounce pool, `[start, end)` of guest-physical memory; empty until set.
    bounce_pool: (AtomicU64, AtomicU64),
    unmaps: AtomicU64,
    map_bytes: AtomicU64,
    unmapped_bytes: AtomicU64,
    live_mappings: AtomicU64,
    peak_mappings: AtomicU64,
    faults: AtomicU64,
    latency_ns: Mutex<Histogram<u64>>,
}

impl Default for IommuStats {
    fn default() -> Self {
        IommuStats {
            requests: AtomicU64::new(0),
            failed_requests: AtomicU64::new(0),
            maps: AtomicU64::new(0),
            maps_writable: AtomicU64::new(0),
            bounced_writable: AtomicU64::new(0),
            bounced_read_only: AtomicU64::new(0),
            bounce_pool: (AtomicU64::new(0), AtomicU64::new(0)),
            unmaps: AtomicU64::new(0),
            map_bytes: AtomicU64::new(0),
            unmapped_bytes: AtomicU64::new(0),
            live_mappings: AtomicU64::new(0),
            peak_mappings: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            latency_ns: Mutex::new(Histogram::new(3).expect("3 significant digits is valid")),
        }
    }
}

/// The kind of request, for accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// MAP.
    Map,
    /// UNMAP.
    Unmap,
    /// Anything else.
    Other,
}

impl IommuStats {
    /// Accounts one handled request.
    pub fn record(&self, kind: RequestKind, ok: bool, effect: Effect, elapsed_ns: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed_requests.fetch_add(1, Ordering::Relaxed);
        } else {
            match kind {
                RequestKind::Map => {
                    self.maps.fetch_add(1, Ordering::Relaxed);
                    self.maps_writable.fetch_add(effect.mapped_writable, Ordering::Relaxed);
                    let pool = (self.bounce_pool.0.load(Ordering::Relaxed), self.bounce_pool.1.load(Ordering::Relaxed));
                    if (pool.0..pool.1).contains(&effect.mapped_gpa) {
                        let count =
                            if effect.mapped_writable > 0 { &self.bounced_writable } else { &self.bounced_read_only };
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                RequestKind::Unmap => {
                    self.unmaps.fetch_add(1, Ordering::Relaxed);
                }
                RequestKind::Other => {}
            }
        }
        self.map_bytes.fetch_add(effect.mapped_bytes, Ordering::Relaxed);
        self.unmapped_bytes.fetch_add(effect.unmapped_bytes, Ordering::Relaxed);
        let live = self.live_mappings.load(Ordering::Relaxed) + effect.mapped;
        let live = live.saturating_sub(effect.unmapped);
        self.live_mappings.store(live, Ordering::Relaxed);
        self.peak_mappings.fetch_max(live, Ordering::Relaxed);
        let _ = self.latency_ns.lock().unwrap_or_else(|p| p.into_inner()).record(elapsed_ns.max(1));
    }

    /// Where the guest's swiotlb bounce pool is, `[start, end)` of guest-physical memory: maps
    /// of memory in it count as bounced from now on.
    pub fn set_bounce_pool(&self, start: u64, end: u64) {
        self.bounce_pool.1.store(0, Ordering::Relaxed);
        self.bounce_pool.0.store(start, Ordering::Relaxed);
        self.bounce_pool.1.store(end, Ordering::Relaxed);
    }

    /// Accounts mappings that went away without an UNMAP (device reset).
    pub fn mappings_dropped(&self, count: u64) {
        let live = self.live_mappings.load(Ordering::Relaxed).saturating_sub(count);
        self.live_mappings.store(live, Ordering::Relaxed);
    }

    /// Accounts a refused DMA access.
    pub fn fault(&self) {
        self.faults.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot.
    pub fn counts(&self) -> IommuCounts {
        let latency = self.latency_ns.lock().unwrap_or_else(|p| p.into_inner());
        let map_bytes = self.map_bytes.load(Ordering::Relaxed);
        let (maps, maps_writable) = (self.maps.load(Ordering::Relaxed), self.maps_writable.load(Ordering::Relaxed));
        IommuCounts {
            maps,
            maps_writable,
            maps_read_only: maps.saturating_sub(maps_writable),
            bounced_maps_writable: self.bounced_writable.load(Ordering::Relaxed),
            bounced_maps_read_only: self.bounced_read_only.load(Ordering::Relaxed),
            unmaps: self.unmaps.load(Ordering::Relaxed),
            map_bytes,
            map_pages: map_bytes / 4096,
            unmapped_bytes: self.unmapped_bytes.load(Ordering::Relaxed),
            live_mappings: self.live_mappings.load(Ordering::Relaxed),
            peak_mappings: self.peak_mappings.load(Ordering::Relaxed),
            faults: self.faults.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            failed_requests: self.failed_requests.load(Ordering::Relaxed),
            request_ns_p50: if latency.is_empty() { 0 } else { latency.value_at_quantile(0.5) },
            request_ns_p99: if latency.is_empty() { 0 } else { latency.value_at_quantile(0.99) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_maps_unmaps_and_the_peak() {
        let stats = IommuStats::default();
        let mapped = Effect { mapped: 1, mapped_bytes: 0x20_0000, ..Effect::default() };
        stats.record(RequestKind::Map, true, Effect { mapped_writable: 1, ..mapped }, 1000);
        stats.record(RequestKind::Map, true, mapped, 3000);
        stats.record(RequestKind::Map, false, Effect::default(), 500);
        stats.record(
            RequestKind::Unmap,
            true,
            Effect { unmapped: 2, unmapped_bytes: 0x40_0000, ..Effect::default() },
            2000,
        );
        stats.fault();
        let c = stats.counts();
        assert_eq!((c.maps, c.unmaps, c.failed_requests, c.requests), (2, 1, 1, 4));
        assert_eq!((c.maps_writable, c.maps_read_only), (1, 1), "one RX buffer, one TX buffer");
        assert_eq!((c.map_bytes, c.map_pages, c.unmapped_bytes), (0x40_0000, 1024, 0x40_0000));
        assert_eq!((c.live_mappings, c.peak_mappings, c.faults), (0, 2, 1));
        assert!(c.request_ns_p50 >= 999 && c.request_ns_p50 <= 2002, "{}", c.request_ns_p50);
        assert!(c.request_ns_p99 >= 2999);
    }

    #[test]
    fn maps_of_the_bounce_pool_count_as_bounced_once_the_pool_is_known() {
        let stats = IommuStats::default();
        let map = |gpa: u64, writable: u64| Effect {
            mapped: 1,
            mapped_writable: writable,
            mapped_gpa: gpa,
            ..Effect::default()
        };
        stats.record(RequestKind::Map, true, map(0x1000, 0), 100);
        assert_eq!(stats.counts().bounced_maps_read_only, 0, "no pool yet");
        stats.set_bounce_pool(0x10_0000, 0x20_0000);
        stats.record(RequestKind::Map, true, map(0x10_0000, 0), 100);
        stats.record(RequestKind::Map, true, map(0x1f_f000, 1), 100);
        stats.record(RequestKind::Map, true, map(0x20_0000, 1), 100);
        stats.record(RequestKind::Map, false, map(0x10_0000, 1), 100);
        let c = stats.counts();
        assert_eq!(
            (c.bounced_maps_read_only, c.bounced_maps_writable),
            (1, 1),
            "the end is outside; failures do not count"
        );
        assert_eq!((c.maps, c.maps_writable), (4, 2));
    }
}

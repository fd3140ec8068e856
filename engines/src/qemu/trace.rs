//! QEMU's trace, read as it grows: the virtio-iommu's maps, unmaps and faults (by direction,
//! with the live mappings), and why QEMU was asked to stop.

use std::collections::BTreeMap;

use vm_spec::ExitReason;
use vm_spec::control::BouncePool;
use vm_spec::counters::IommuCounts;

/// The trace events the engine reads.
pub(super) const TRACE_EVENTS: &[&str] =
    &["virtio_iommu_map", "virtio_iommu_unmap", "virtio_iommu_report_fault", "qemu_system_shutdown_request"];

/// `VIRTIO_IOMMU_MAP_F_WRITE`: the device may write the mapping.
const MAP_F_WRITE: u64 = 2;

/// What QEMU's trace said so far, read as it grows.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    counts: IommuCounts,
    /// Live mappings: (domain, first IOVA) -> last IOVA.
    live: BTreeMap<(u64, u64), u64>,
    /// The guest's swiotlb bounce pool, once the agent reported it: maps of its memory count as
    /// bounced.
    bounce_pool: Option<BouncePool>,
    /// A line not yet ended.
    partial: String,
    /// Why QEMU was asked to stop, as QEMU names it.
    pub shutdown: Option<ShutdownCause>,
}

impl Trace {
    /// Reads more of the trace file.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.partial.push_str(&String::from_utf8_lossy(bytes));
        let Some(end) = self.partial.rfind('\n') else { return };
        let text: String = self.partial.drain(..=end).collect();
        for line in text.lines() {
            self.line(line);
        }
    }

    /// Counts the maps of guest memory in `pool` as bounced from now on (as driverlab's VMM does
    /// from its control socket's `vm.bounce-pool`).
    pub fn set_bounce_pool(&mut self, pool: BouncePool) {
        self.bounce_pool = Some(pool);
    }

    /// The virtio-iommu's counts so far, the engine-neutral way the lab records them.
    pub fn counts(&self) -> IommuCounts {
        self.counts.clone()
    }

    fn line(&mut self, line: &str) {
        // With the log backend a line is `EVENT key=value ...`, possibly after a
        // `PID@SECONDS:` prefix when timestamps are on.
        let line = line.rsplit_once(':').filter(|(p, _)| p.contains('@')).map_or(line, |(_, rest)| rest);
        let mut words = line.split_whitespace();
        let Some(event) = words.next() else { return };
        let fields: BTreeMap<&str, u64> = words
            .filter_map(|w| w.split_once('='))
            .filter_map(|(k, v)| {
                let v = match v.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).ok()?,
                    None => v.parse().ok()?,
                };
                Some((k, v))
            })
            .collect();
        let c = &mut self.counts;
        match event {
            "virtio_iommu_map" => {
                let (Some(&domain), Some(&start), Some(&end)) =
                    (fields.get("domain"), fields.get("virt_start"), fields.get("virt_end"))
                else {
                    return;
                };
                let bytes = end.saturating_sub(start) + 1;
                c.maps += 1;
                c.requests += 1;
                let writable = fields.get("flags").is_some_and(|f| f & MAP_F_WRITE != 0);
                let bounced =
                    fields.get("phys_start").is_some_and(|&gpa| self.bounce_pool.is_some_and(|p| p.contains(gpa)));
                match (writable, bounced) {
                    (true, bounced) => {
                        c.maps_writable += 1;
                        c.bounced_maps_writable += u64::from(bounced);
                    }
                    (false, bounced) => {
                        c.maps_read_only += 1;
                        c.bounced_maps_read_only += u64::from(bounced);
                    }
                }
                c.map_bytes += bytes;
                c.map_pages += bytes.div_ceil(4096);
                self.live.insert((domain, start), end);
                c.live_mappings = self.live.len() as u64;
                c.peak_mappings = c.peak_mappings.max(c.live_mappings);
            }
            "virtio_iommu_unmap" => {
                let (Some(&domain), Some(&start), Some(&end)) =
                    (fields.get("domain"), fields.get("virt_start"), fields.get("virt_end"))
                else {
                    return;
                };
                c.unmaps += 1;
                c.requests += 1;
                let gone: Vec<(u64, u64)> = self
                    .live
                    .range((domain, start)..=(domain, end))
                    .filter(|(_, last)| **last <= end)
                    .map(|(k, _)| *k)
                    .collect();
                for key in gone {
                    if let Some(last) = self.live.remove(&key) {
                        c.unmapped_bytes += last - key.1 + 1;
                    }
                }
                c.live_mappings = self.live.len() as u64;
            }
            "virtio_iommu_report_fault" => c.faults += 1,
            "qemu_system_shutdown_request" => {
                self.shutdown = fields.get("reason").and_then(|&r| ShutdownCause::from_number(r));
            }
            _ => {}
        }
    }
}

/// QEMU's `ShutdownCause` (qapi/run-state.json), which its trace gives by number, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownCause {
    /// No cause.
    None,
    /// An error in QEMU.
    HostError,
    /// QMP `quit`.
    HostQmpQuit,
    /// QMP `system_reset`.
    HostQmpSystemReset,
    /// A signal to QEMU (the lab's SIGTERM).
    HostSignal,
    /// QEMU's user interface.
    HostUi,
    /// The guest powered off.
    GuestShutdown,
    /// The guest reset.
    GuestReset,
    /// The guest panicked (pvpanic).
    GuestPanic,
    /// A subsystem reset.
    SubsystemReset,
    /// A snapshot was loaded.
    SnapshotLoad,
}

impl ShutdownCause {
    const ALL: [ShutdownCause; 11] = [
        ShutdownCause::None,
        ShutdownCause::HostError,
        ShutdownCause::HostQmpQuit,
        ShutdownCause::HostQmpSystemReset,
        ShutdownCause::HostSignal,
        ShutdownCause::HostUi,
        ShutdownCause::GuestShutdown,
        ShutdownCause::GuestReset,
        ShutdownCause::GuestPanic,
        ShutdownCause::SubsystemReset,
        ShutdownCause::SnapshotLoad,
    ];

    /// The cause numbered `n` in QEMU's trace.
    fn from_number(n: u64) -> Option<ShutdownCause> {
        ShutdownCause::ALL.get(usize::try_from(n).ok()?).copied()
    }

    /// QEMU's name for it.
    pub fn name(self) -> &'static str {
        match self {
            ShutdownCause::None => "none",
            ShutdownCause::HostError => "host-error",
            ShutdownCause::HostQmpQuit => "host-qmp-quit",
            ShutdownCause::HostQmpSystemReset => "host-qmp-system-reset",
            ShutdownCause::HostSignal => "host-signal",
            ShutdownCause::HostUi => "host-ui",
            ShutdownCause::GuestShutdown => "guest-shutdown",
            ShutdownCause::GuestReset => "guest-reset",
            ShutdownCause::GuestPanic => "guest-panic",
            ShutdownCause::SubsystemReset => "subsystem-reset",
            ShutdownCause::SnapshotLoad => "snapshot-load",
        }
    }

    /// The exit reason driverlab's VMM would give for it: the guest's power-off, reset and
    /// panic, `shutdown` when the lab stopped QEMU, and a VMM error for anything else.
    pub fn exit_reason(self) -> ExitReason {
        match self {
            ShutdownCause::GuestShutdown => ExitReason::Poweroff,
            ShutdownCause::GuestReset => ExitReason::Reset,
            ShutdownCause::GuestPanic => ExitReason::Panic,
            ShutdownCause::HostSignal | ShutdownCause::HostQmpQuit => ExitReason::Shutdown,
            _ => ExitReason::VmmError,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "\
virtio_iommu_map domain=1 virt_start=0x100548000 virt_end=0x100548fff phys_start=0x548000 flags=2
virtio_iommu_map domain=1 virt_start=0x100549000 virt_end=0x100549fff phys_start=0x549000 flags=1
1234@1764612000.123456:virtio_iommu_map domain=1 virt_start=0x10054a000 virt_end=0x100569fff phys_start=0x54a000 flags=3
virtio_iommu_unmap domain=1 virt_start=0x100548000 virt_end=0x100549fff
virtio_iommu_report_fault reason=1 flags=0 endpoint=16 addr=0xdead000
qemu_system_shutdown_request reason=6
";

    #[test]
    fn the_trace_counts_maps_by_direction_live_mappings_and_the_stop() {
        let mut trace = Trace::default();
        // Fed in pieces that split lines, as a growing file is read.
        for chunk in TRACE.as_bytes().chunks(37) {
            trace.feed(chunk);
        }
        let c = trace.counts();
        assert_eq!((c.maps, c.maps_writable, c.maps_read_only), (3, 2, 1), "flags=2 and 3 let the device write");
        assert_eq!((c.unmaps, c.faults, c.requests), (1, 1, 4));
        assert_eq!(c.map_bytes, 0x1000 + 0x1000 + 0x20000);
        assert_eq!((c.map_pages, c.unmapped_bytes), (34, 0x2000), "one unmap covering two mappings");
        assert_eq!((c.live_mappings, c.peak_mappings), (1, 3));
        assert_eq!(trace.shutdown, Some(ShutdownCause::GuestShutdown));
        assert_eq!(trace.shutdown.unwrap().exit_reason(), ExitReason::Poweroff);
        assert_eq!((c.bounced_maps_writable, c.bounced_maps_read_only), (0, 0), "no pool, nothing bounced");
    }

    #[test]
    fn maps_of_the_bounce_pool_count_as_bounced_once_it_is_known() {
        let mut trace = Trace::default();
        trace.feed(b"virtio_iommu_map domain=1 virt_start=0x1000 virt_end=0x1fff phys_start=0x1b000000 flags=1\n");
        trace.set_bounce_pool(BouncePool { start: 0x1b00_0000, end: 0x1eff_ffff });
        for line in [
            "virtio_iommu_map domain=1 virt_start=0x2000 virt_end=0x2fff phys_start=0x1b000800 flags=1",
            "virtio_iommu_map domain=1 virt_start=0x3000 virt_end=0x3fff phys_start=0x1efff000 flags=3",
            "virtio_iommu_map domain=1 virt_start=0x4000 virt_end=0x4fff phys_start=0x1f000000 flags=2",
            "virtio_iommu_map domain=1 virt_start=0x5000 virt_end=0x5fff phys_start=0x548000 flags=1",
        ] {
            trace.feed(format!("{line}\n").as_bytes());
        }
        let c = trace.counts();
        assert_eq!((c.maps, c.maps_writable, c.maps_read_only), (5, 2, 3));
        assert_eq!(c.bounced_maps_read_only, 1, "the first map came before the pool was known, the last lies outside");
        assert_eq!(c.bounced_maps_writable, 1, "the pool's last page, not the byte past it");
    }
}

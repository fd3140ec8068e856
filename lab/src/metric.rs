//! The figures a report summarises and judges: one table that says, for each, its name in the
//! JSON report and the CSV, its unit, which way is better, whether it depends on how fast the
//! engine runs the guest, and how it is read from a [`Record`].

use serde::{Deserialize, Serialize};

use crate::matrix::Workload;
use crate::pcie_link::{LinkFigures, LinkPerPacket};
use crate::record::Record;

/// A figure of a repetition. Declared in the order of its name, which is the order of the
/// report's `metrics` object.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Metric {
    /// From spawning the VMM to the agent's first frame (Linux cells).
    AgentReadyMs,
    /// Modelled PCIe link time per packet, both directions.
    BusNsPerPacket,
    /// The packet rate the modelled link time allows.
    BusPacketsPerS,
    /// RX descriptor reads the model issued per packet.
    BusRxDescriptorReadsPerPacket,
    /// Modelled RX link time per packet.
    BusRxNsPerPacket,
    /// RX writes shorter than a cache line per packet.
    BusRxPartialWritesPerPacket,
    /// RX transaction-layer packets per packet.
    BusRxTlpsPerPacket,
    /// TX descriptor reads the model issued per packet.
    BusTxDescriptorReadsPerPacket,
    /// Modelled TX link time per packet.
    BusTxNsPerPacket,
    /// TX writes shorter than a cache line per packet.
    BusTxPartialWritesPerPacket,
    /// TX transaction-layer packets per packet.
    BusTxTlpsPerPacket,
    /// Goodput: payload Gbit/s as the workload measured it.
    GbitS,
    /// The guest's busy CPU time per packet the workload moved.
    GuestCpuNsPerPacket,
    /// The host's CPU time for the VM (vCPUs, the engine's other threads, the model) per packet.
    HostCpuNsPerPacket,
    /// The mean request/response round trip (the latency workload).
    LatencyMeanUs,
    /// The median round trip.
    LatencyP50Us,
    /// The 99th percentile round trip.
    LatencyP99Us,
    /// IOMMU maps per packet over the workload.
    MapsPerPacket,
    /// The device model's own DMA maps per packet (a cross-check).
    ModelMapsPerPacket,
    /// Packets per second.
    PacketsPerS,
    /// The share of RX refills that reused a page.
    PageReuse,
    /// TCP retransmits.
    Retransmits,
    /// Maps of RX buffers the guest bounced (swiotlb) per packet received.
    RxBouncedMapsPerPacket,
    /// Maps the device may write (RX buffers) per packet received.
    RxMapsPerPacket,
    /// Maps of TX buffers the guest bounced (swiotlb) per packet sent.
    TxBouncedMapsPerPacket,
    /// Maps the device may only read (TX buffers) per packet sent.
    TxMapsPerPacket,
    /// IOMMU unmaps per packet over the workload.
    UnmapsPerPacket,
    /// Requests to the virtio-iommu (round trips through the VMM) per packet.
    ViommuRequestsPerPacket,
    /// From the vCPUs starting to the VM stopping.
    VmRunMs,
    /// From spawning the VMM to `workload-begin` (Linux cells).
    WorkloadStartMs,
    /// Frames per second an XDP program handled (the xdp workload).
    XdpHandledPerS,
}

impl Metric {
    /// Every metric, in the order of its name.
    pub const ALL: &[Metric] = <Metric as strum::VariantArray>::VARIANTS;

    /// The metric a cell's verdict is about when it has it.
    pub const PRIMARY: Metric = Metric::GbitS;

    /// Its name in the JSON report and the CSV.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Its unit, as tables label it.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::AgentReadyMs | Metric::VmRunMs | Metric::WorkloadStartMs => "ms",
            Metric::BusNsPerPacket
            | Metric::BusRxNsPerPacket
            | Metric::BusTxNsPerPacket
            | Metric::GuestCpuNsPerPacket
            | Metric::HostCpuNsPerPacket => "ns/packet",
            Metric::BusPacketsPerS | Metric::PacketsPerS | Metric::XdpHandledPerS => "packets/s",
            Metric::GbitS => "Gbit/s",
            Metric::LatencyMeanUs | Metric::LatencyP50Us | Metric::LatencyP99Us => "µs",
            Metric::PageReuse => "share",
            Metric::Retransmits => "segments",
            _ => "per packet",
        }
    }

    /// Whether more of it is better.
    pub fn higher_is_better(self) -> bool {
        matches!(
            self,
            Metric::GbitS | Metric::PacketsPerS | Metric::PageReuse | Metric::BusPacketsPerS | Metric::XdpHandledPerS
        )
    }

    /// Whether it depends on how fast the engine runs the guest (throughput, time), so that
    /// figures from different engines do not compare; maps per packet and reuse ratios do.
    pub fn engine_bound(self) -> bool {
        matches!(
            self,
            Metric::GbitS
                | Metric::GuestCpuNsPerPacket
                | Metric::HostCpuNsPerPacket
                | Metric::LatencyMeanUs
                | Metric::LatencyP50Us
                | Metric::LatencyP99Us
                | Metric::XdpHandledPerS
                | Metric::PacketsPerS
                | Metric::Retransmits
                | Metric::VmRunMs
                | Metric::AgentReadyMs
                | Metric::WorkloadStartMs
        )
    }

    /// Whether a cell of `workload` can have it: its workload's own figures (throughput,
    /// packet rate, latency, XDP), what every traffic cell counts (maps, CPU, the model's bus),
    /// and the times every cell has. The NIC selftests give verdicts, not figures.
    pub fn produced_by(self, workload: &Workload) -> bool {
        use Workload::{Iperf3, Kselftest, Latency, PacketRate, ProbeRx, Xdp};
        match self {
            Metric::VmRunMs => true,
            Metric::AgentReadyMs | Metric::WorkloadStartMs => !matches!(workload, ProbeRx { .. }),
            Metric::GbitS => matches!(workload, ProbeRx { .. } | Iperf3 { .. } | PacketRate { .. }),
            Metric::Retransmits => matches!(workload, Iperf3 { .. }),
            Metric::LatencyMeanUs | Metric::LatencyP50Us | Metric::LatencyP99Us => matches!(workload, Latency { .. }),
            Metric::XdpHandledPerS => matches!(workload, Xdp { .. }),
            _ => !matches!(workload, Kselftest { .. }),
        }
    }

    /// Its value in `record`, when the record has a finite one.
    pub fn read(self, record: &Record) -> Option<f64> {
        let bus = record.link.as_ref();
        let value = match self {
            Metric::AgentReadyMs => record.timings.agent_ready_ms,
            Metric::VmRunMs => record.timings.vm_run_ms,
            Metric::WorkloadStartMs => record.timings.workload_start_ms,
            Metric::GbitS => record.workload.gbit_s,
            Metric::PacketsPerS => record.workload.packets_per_s,
            Metric::Retransmits => record.workload.retransmits.map(|r| r as f64),
            Metric::MapsPerPacket => record.maps_per_packet,
            Metric::UnmapsPerPacket => record.unmaps_per_packet,
            Metric::ViommuRequestsPerPacket => record.viommu_requests_per_packet,
            Metric::GuestCpuNsPerPacket => record.cpu.and_then(|c| c.guest_ns_per_packet),
            Metric::LatencyMeanUs => record.workload.latency.map(|l| l.mean_us),
            Metric::LatencyP50Us => record.workload.latency.map(|l| l.p50_us),
            Metric::LatencyP99Us => record.workload.latency.map(|l| l.p99_us),
            Metric::XdpHandledPerS => record.workload.xdp.as_ref().map(|x| x.handled_per_s),
            Metric::HostCpuNsPerPacket => record.cpu.and_then(|c| c.host_ns_per_packet),
            Metric::RxMapsPerPacket => record.rx_maps_per_packet,
            Metric::TxMapsPerPacket => record.tx_maps_per_packet,
            Metric::RxBouncedMapsPerPacket => record.rx_bounced_maps_per_packet,
            Metric::TxBouncedMapsPerPacket => record.tx_bounced_maps_per_packet,
            Metric::ModelMapsPerPacket => record.model_maps_per_packet,
            Metric::PageReuse => record.page_reuse,
            Metric::BusNsPerPacket => bus.and_then(|b| b.modelled).map(|c| c.ns_per_packet),
            Metric::BusPacketsPerS => bus.and_then(|b| b.modelled).map(|c| c.packets_per_s),
            Metric::BusRxTlpsPerPacket => rx(bus, |s| Some(s.tlps)),
            Metric::BusTxTlpsPerPacket => tx(bus, |s| Some(s.tlps)),
            Metric::BusRxDescriptorReadsPerPacket => rx(bus, |s| Some(s.descriptor_reads)),
            Metric::BusTxDescriptorReadsPerPacket => tx(bus, |s| Some(s.descriptor_reads)),
            Metric::BusRxPartialWritesPerPacket => rx(bus, |s| Some(s.partial_writes)),
            Metric::BusTxPartialWritesPerPacket => tx(bus, |s| Some(s.partial_writes)),
            Metric::BusRxNsPerPacket => rx(bus, |s| s.modelled.map(|c| c.ns_per_packet)),
            Metric::BusTxNsPerPacket => tx(bus, |s| s.modelled.map(|c| c.ns_per_packet)),
        };
        value.filter(|v| v.is_finite())
    }
}

/// A figure of the RX side of the bus figures.
fn rx(bus: Option<&LinkFigures>, f: fn(&LinkPerPacket) -> Option<f64>) -> Option<f64> {
    bus?.rx.as_ref().and_then(f)
}

/// A figure of the TX side of the bus figures.
fn tx(bus: Option<&LinkFigures>, f: fn(&LinkPerPacket) -> Option<f64>) -> Option<f64> {
    bus?.tx.as_ref().and_then(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_in_order_and_parse_back() {
        let names: Vec<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "the report's metrics object keeps its order");
        for metric in Metric::ALL {
            assert_eq!(metric.name().parse::<Metric>().unwrap(), *metric);
            assert_eq!(serde_json::to_string(metric).unwrap(), format!("\"{}\"", metric.name()));
        }
        assert_eq!(Metric::GbitS.name(), "gbit_s");
        assert_eq!(Metric::BusRxTlpsPerPacket.name(), "bus_rx_tlps_per_packet");
    }
}

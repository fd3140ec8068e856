//! The report's tables as rows of text, shared by markdown and HTML: the cells, the PCIe link
//! figures of the models' cells, and the Linux cells' time to readiness.

use super::{CellReport, Report};
use crate::matrix::Direction;
use crate::metric::Metric;

impl Report {
    /// The table's header: what [`Report::rows`] gives for each cell.
    pub const COLUMNS: [&'static str; 11] = [
        "cell",
        "variant",
        "workload",
        "device",
        "n",
        "status",
        "Gbit/s",
        "change",
        "maps/packet",
        "change",
        "verdict",
    ];

    /// One row per cell, as the markdown and HTML tables show them.
    pub fn rows(&self) -> Vec<[String; 11]> {
        self.cells
            .iter()
            .map(|c| {
                let status: Vec<String> =
                    c.status.iter().filter(|(_, n)| **n > 0).map(|(s, n)| format!("{n} {s}")).collect();
                let (gbit, gbit_change) = cell_metric(c, Metric::GbitS, 3);
                let (maps, maps_change) = cell_metric(c, maps_metric(c), 4);
                let verdict = c.verdict.map_or(String::from("-"), |v| v.to_string());
                [
                    c.cell.clone(),
                    self.label(c),
                    c.workload.clone(),
                    c.device.clone(),
                    c.n.to_string(),
                    status.join(", "),
                    gbit,
                    gbit_change,
                    maps,
                    maps_change,
                    verdict,
                ]
            })
            .collect()
    }

    pub(super) fn rule(&self) -> Option<String> {
        self.baseline.as_ref().map(|b| {
            format!(
                "Against {b}; a change is called real at 5 % or more with Welch's p < 0.05 (and, below 10 samples, non-overlapping ranges)."
            )
        })
    }

    /// The bus table's header: what [`Report::link_rows`] gives for each cell with bus figures.
    pub const LINK_COLUMNS: [&'static str; 11] = [
        "cell",
        "variant",
        "link (modelled)",
        "RX TLPs/packet",
        "RX descriptor reads/packet",
        "TX TLPs/packet",
        "TX descriptor reads/packet",
        "partial writes/packet RX, TX",
        "RX bus ns/packet (modelled)",
        "TX bus ns/packet (modelled)",
        "bus ns/packet, both (modelled)",
    ];

    /// One row per cell that has bus figures: what its model put on the link per packet, and
    /// the bus time the cost model gives (with what bounds it).
    pub fn link_rows(&self) -> Vec<[String; 11]> {
        self.cells
            .iter()
            .filter_map(|c| {
                let link = c.link.clone()?;
                let value = |name: Metric, digits: usize| cell_metric(c, name, digits).0;
                Some([
                    c.cell.clone(),
                    self.label(c),
                    link,
                    value(Metric::BusRxTlpsPerPacket, 2),
                    value(Metric::BusRxDescriptorReadsPerPacket, 3),
                    value(Metric::BusTxTlpsPerPacket, 2),
                    value(Metric::BusTxDescriptorReadsPerPacket, 3),
                    format!(
                        "{}, {}",
                        value(Metric::BusRxPartialWritesPerPacket, 2),
                        value(Metric::BusTxPartialWritesPerPacket, 2)
                    ),
                    value(Metric::BusRxNsPerPacket, 1),
                    value(Metric::BusTxNsPerPacket, 1),
                    value(Metric::BusNsPerPacket, 1),
                ])
            })
            .collect()
    }

    /// The DMA table's header: what [`Report::dma_rows`] gives for each Linux cell.
    pub const DMA_COLUMNS: [&'static str; 8] = [
        "cell",
        "variant",
        "slot",
        "IOMMU domain",
        "untrusted",
        "swiotlb",
        "RX bounced maps/packet",
        "TX bounced maps/packet",
    ];

    /// One row per cell whose guest said how it treated the device's DMA (Linux cells): where
    /// the device sat, the domain and trust the guest gave it, and the maps of bounced buffers
    /// per packet beside the maps per packet of the cells' table.
    pub fn dma_rows(&self) -> Vec<[String; 8]> {
        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
        self.cells
            .iter()
            .filter_map(|c| {
                let dma = c.guest_dma?;
                let domain = serde_json::to_value(dma.domain).ok()?.as_str().unwrap_or("?").to_string();
                Some([
                    c.cell.clone(),
                    self.label(c),
                    dma.slot.to_string(),
                    domain,
                    yes_no(dma.untrusted),
                    yes_no(dma.swiotlb),
                    cell_metric(c, Metric::RxBouncedMapsPerPacket, 4).0,
                    cell_metric(c, Metric::TxBouncedMapsPerPacket, 4).0,
                ])
            })
            .collect()
    }

    /// The CPU table's header: what [`Report::cpu_rows`] gives for each cell with CPU figures.
    pub const CPU_COLUMNS: [&'static str; 8] = [
        "cell",
        "variant",
        "guest CPU ns/packet",
        "change",
        "host CPU ns/packet",
        "change",
        "vIOMMU requests/packet",
        "change",
    ];

    /// One row per cell whose records say what the CPU paid (Linux cells): the guest's busy
    /// time and the host's time for the VM per packet, and the virtio-iommu's round trips per
    /// packet, each with its change against the baseline.
    pub fn cpu_rows(&self) -> Vec<[String; 8]> {
        self.cells
            .iter()
            .filter(|c| {
                [Metric::GuestCpuNsPerPacket, Metric::HostCpuNsPerPacket].iter().any(|m| c.metrics.contains_key(m))
            })
            .map(|c| {
                let (guest, guest_change) = cell_metric(c, Metric::GuestCpuNsPerPacket, 0);
                let (host, host_change) = cell_metric(c, Metric::HostCpuNsPerPacket, 0);
                let (requests, requests_change) = cell_metric(c, Metric::ViommuRequestsPerPacket, 3);
                [c.cell.clone(), self.label(c), guest, guest_change, host, host_change, requests, requests_change]
            })
            .collect()
    }

    /// The latency table's header: what [`Report::latency_rows`] gives for each latency cell.
    pub const LATENCY_COLUMNS: [&'static str; 7] =
        ["cell", "variant", "mean µs", "median µs", "p99 µs", "change", "p99 change"];

    /// One row per cell with round trips (latency cells): the mean, median and 99th percentile,
    /// and the changes of the mean and the 99th percentile against the baseline.
    pub fn latency_rows(&self) -> Vec<[String; 7]> {
        self.cells
            .iter()
            .filter(|c| c.metrics.contains_key(&Metric::LatencyMeanUs))
            .map(|c| {
                let (mean, mean_change) = cell_metric(c, Metric::LatencyMeanUs, 1);
                let (p99, p99_change) = cell_metric(c, Metric::LatencyP99Us, 1);
                [
                    c.cell.clone(),
                    self.label(c),
                    mean,
                    cell_metric(c, Metric::LatencyP50Us, 1).0,
                    p99,
                    mean_change,
                    p99_change,
                ]
            })
            .collect()
    }

    /// The series table's header: what [`Report::series_rows`] gives.
    pub const SERIES_COLUMNS: [&'static str; 9] = [
        "cell",
        "prefix",
        "patch",
        "status",
        "Gbit/s",
        "maps/packet",
        "against the previous",
        "against the base",
        "variant",
    ];

    /// One row per cell of a series' prefix, in the series' order: its figures, its verdict
    /// against the previous prefix and against the base, BUILD-FAIL where it did not build.
    pub fn series_rows(&self) -> Vec<[String; 9]> {
        self.cells
            .iter()
            .filter_map(|c| Some((c, c.step.as_ref()?)))
            .map(|(c, step)| {
                let status: Vec<String> =
                    c.status.iter().filter(|(_, n)| **n > 0).map(|(s, n)| format!("{n} {s}")).collect();
                let maps = cell_metric(c, maps_metric(c), 4).0;
                let (previous, base) = if c.build_failed {
                    (crate::failure::BUILD_FAILED.to_string(), crate::failure::BUILD_FAILED.to_string())
                } else {
                    let previous = c.previous.as_ref().map_or("-".into(), |p| {
                        let pct = p.change.change_pct.map_or("from 0".into(), |pct| format!("{pct:+.1} %"));
                        format!("{} ({} {pct})", p.change.verdict, p.metric)
                    });
                    (previous, c.verdict.map_or("-".into(), |v| v.to_string()))
                };
                [
                    c.cell.clone(),
                    step.position(),
                    step.subject.clone(),
                    status.join(", "),
                    cell_metric(c, Metric::GbitS, 3).0,
                    maps,
                    previous,
                    base,
                    self.label(c),
                ]
            })
            .collect()
    }

    /// The selftests table's header: what [`Report::subtest_rows`] gives.
    pub const SUBTEST_COLUMNS: [&'static str; 5] = ["subtest", "cell", "variant", "results", "against baseline"];

    /// One row per subtest of each kselftest cell, a subtest's cells together: its results over
    /// the repetitions and its verdict against the baseline (`regression`, `fixed`).
    pub fn subtest_rows(&self) -> Vec<[String; 5]> {
        let mut rows: Vec<[String; 5]> = self
            .cells
            .iter()
            .flat_map(|c| c.subtests.iter().map(move |s| (c, s)))
            .map(|(c, s)| {
                let t = s.tally;
                let results: Vec<String> = [(t.pass, "PASS"), (t.fail, "FAIL"), (t.skip, "SKIP"), (t.xfail, "XFAIL")]
                    .iter()
                    .filter(|(n, _)| *n > 0)
                    .map(|(n, word)| format!("{n} {word}"))
                    .collect();
                let verdict = s.verdict.map_or("-".to_string(), |v| v.to_string());
                [s.name.clone(), c.cell.clone(), self.label(c), results.join(", "), verdict]
            })
            .collect();
        rows.sort_by(|a, b| a[0].cmp(&b[0]));
        rows
    }

    /// The readiness table's header: what [`Report::ready_rows`] gives for each Linux cell.
    pub const READY_COLUMNS: [&'static str; 5] =
        ["cell", "variant", "agent up, median ms", "workload start, median ms", "VM run, median ms"];

    /// One row per cell whose repetitions timed the guest's way to its workload (Linux cells):
    /// the medians from spawning the VMM to the agent's first frame and to `workload-begin`,
    /// and of the VM's run.
    pub fn ready_rows(&self) -> Vec<[String; 5]> {
        let median = |c: &CellReport, name: Metric| {
            c.metrics.get(&name).map_or("-".into(), |m| format!("{:.0}", m.moments.median))
        };
        self.cells
            .iter()
            .filter(|c| c.metrics.contains_key(&Metric::WorkloadStartMs))
            .map(|c| {
                [
                    c.cell.clone(),
                    self.label(c),
                    median(c, Metric::AgentReadyMs),
                    median(c, Metric::WorkloadStartMs),
                    median(c, Metric::VmRunMs),
                ]
            })
            .collect()
    }

    /// The cost model's parameters, one sentence per link the cells' models assumed.
    pub fn link_parameters(&self) -> Vec<String> {
        let mut seen: Vec<&vm_spec::pcie_link::LinkProfile> = Vec::new();
        for p in self.cells.iter().filter_map(|c| c.link_profile.as_ref()) {
            if !seen.contains(&p) {
                seen.push(p);
            }
        }
        seen.iter()
            .map(|p| {
                format!(
                    "Modelled {}: {} GT/s x{} at {:.3} payload per bit, {} bytes per TLP beyond its payload, \
                     {}-byte read requests, {}-byte lines, {}-byte descriptor bursts, a {} ns read round trip, \
                     {} reads in flight.",
                    p.link,
                    p.gt_per_s,
                    p.lanes,
                    p.encoding,
                    p.tlp_overhead,
                    p.max_read_request,
                    p.cache_line,
                    p.descriptor_burst,
                    p.read_latency_ns,
                    p.outstanding_reads
                )
            })
            .collect()
    }
}

/// What the link table is.
pub(super) const LINK_NOTE: &str = "What the device model put on its PCIe link per packet, counted as the chip would issue it, \
     and the link time a cost model of that link gives for it (modelled, not measured; docs/lab.md has the rules).";

/// What the DMA table is.
pub(super) const DMA_NOTE: &str = "How the guest treated the device's DMA: where the device sat, the IOMMU domain the guest gave it \
     (DMA: strict, every unmap waits; DMA-FQ: lazy), whether it took the device for an untrusted (Thunderbolt) one and had a \
     swiotlb bounce pool, and the maps of bounced buffers per packet that the engine's virtio-iommu counted (driverlab's, or \
     QEMU's through its trace).";

/// What the CPU table is.
pub(super) const CPU_NOTE: &str = "What the CPU paid per packet the workload moved: the guest's busy time (user, system, irq, \
     softirq, from its /proc/stat), the host's time for the VM (its vCPU threads, the engine's other threads and the device \
     model, from the host's /proc), and the requests the guest sent the virtio-iommu, each a round trip through the VMM. \
     Under an emulating engine (QEMU's TCG, the nested box) the times measure the emulation too: compare them within one \
     engine only.";

/// What the latency table is.
pub(super) const LATENCY_NOTE: &str = "Request/response round trips (sockperf ping-pong, one message in flight), in microseconds; \
     under an emulating engine they measure the emulation too.";

/// What the readiness table is.
pub(super) const SUBTEST_NOTE: &str = "The kernel's NIC selftests (tools/testing/selftests/drivers/net), each subtest's \
     results over the cell's repetitions; a regression passed in every repetition of the baseline and failed here:";
pub(super) const SERIES_NOTE: &str = "The patch series, prefix by prefix (the base has none of its patches): each \
     prefix against the one before it (the change of Gbit/s, or of the first figure both have) and against the base:";
pub(super) const READY_NOTE: &str = "Time to a ready cell (from spawning the VMM):";

/// The maps per packet a cell's tables show: of the side its workload moves, where the cell
/// splits them.
fn maps_metric(c: &CellReport) -> Metric {
    let side = match c.direction {
        Some(Direction::Tx) => Metric::TxMapsPerPacket,
        _ => Metric::RxMapsPerPacket,
    };
    if c.metrics.contains_key(&side) { side } else { Metric::MapsPerPacket }
}

/// `mean ± ci half-width` and `+12.3 %` of a metric, or dashes.
fn cell_metric(c: &CellReport, name: Metric, digits: usize) -> (String, String) {
    let Some(m) = c.metrics.get(&name) else { return ("-".into(), "-".into()) };
    let value = match m.moments.ci95 {
        Some([lo, hi]) => format!("{:.digits$} ± {:.digits$}", m.moments.mean, (hi - lo) / 2.0),
        None => format!("{:.digits$}", m.moments.mean),
    };
    let change = match m.change.and_then(|c| c.change_pct) {
        Some(pct) => format!("{pct:+.1} %"),
        None if m.change.is_some() => "from 0".into(),
        None => "-".into(),
    };
    (value, change)
}

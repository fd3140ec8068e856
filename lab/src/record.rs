//! One result record per repetition: what ran, how it ended, how long each phase took, what the
//! workload measured, and what the virtual IOMMU and the device counted while it did.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vm_spec::counters::{IommuCounts, ModelCounters};
use vm_spec::{ErrorLine, ExitSummary};

pub use engines::crash::{Crash, CrashKind};

use crate::failure::Failure;
use crate::matrix::{Cell, Direction, EngineKind};
use crate::metric::Metric;

/// How a repetition ended, KCIDB's way: a guest or driver failure (FAIL) is kept apart from an
/// infrastructure failure (ERROR).
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
    utoipa::ToSchema,
)]
#[serde(rename_all = "UPPERCASE")]
#[strum(serialize_all = "UPPERCASE")]
pub enum Status {
    /// The workload ran and the guest reported success.
    Pass,
    /// The guest or its driver failed: a failed check, a panic or oops, a hang, a reset.
    Fail,
    /// The lab, the VMM, the device or the host failed; the guest is not to blame.
    Error,
    /// It should have run and did not (the run was cancelled).
    Miss,
    /// It was not run, for the reason given (e.g. the host cannot run the image).
    Skip,
}

impl Status {
    /// All statuses, in report order.
    pub const ALL: &[Status] = <Status as strum::VariantArray>::VARIANTS;

    /// The KCIDB name.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl rusqlite::types::ToSql for Status {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.name().into())
    }
}

impl rusqlite::types::FromSql for Status {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        value.as_str()?.parse().map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
    }
}

/// How a repetition's guest started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum BootKind {
    /// Its kernel booted.
    Booted,
    /// It was restored from a snapshot of its cell's booted guest (`boot = "snapshot"`).
    Restored,
}

/// The default domain type of an IOMMU group, as Linux's sysfs `type` names it
/// (`iommu_group_show_type()` in drivers/iommu/iommu.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum IommuDomain {
    /// Strict translation: every unmap waits for the IOMMU's invalidation.
    #[serde(rename = "DMA")]
    Dma,
    /// Lazy translation: unmaps are flushed in batches (a flush queue).
    #[serde(rename = "DMA-FQ")]
    DmaFq,
    /// No translation.
    #[serde(rename = "identity")]
    Identity,
    /// Anything else the kernel says (`blocked`, `unmanaged`, `unknown`).
    #[serde(other, rename = "other")]
    Other,
}

/// How a Linux guest treated its device's DMA, from the agent's `iommu-group` step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GuestDma {
    /// Where the device sat (the cell's device's slot).
    pub slot: vm_spec::Slot,
    /// Its IOMMU group's domain type.
    pub domain: IommuDomain,
    /// Whether the kernel marked it untrusted (sysfs `removable`).
    pub untrusted: bool,
    /// Whether the kernel has a swiotlb bounce pool.
    pub swiotlb: bool,
}

/// Milliseconds each phase took; `None` where the phase did not happen or cannot be seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Starting the device model (models only).
    pub model_start_ms: Option<f64>,
    /// From spawning the VMM to its control socket answering.
    pub vm_start_ms: Option<f64>,
    /// The VMM's set-up (its exit line's `setup_ms`).
    pub vm_setup_ms: Option<f64>,
    /// From the vCPUs starting to the guest's first serial byte.
    pub first_serial_ms: Option<f64>,
    /// From the kernel starting (a restored guest: from its restore) to the driver's interface
    /// passing the agent's checks (Linux images: the end of its `probe` step, by the guest's
    /// uptime).
    pub driver_probe_ms: Option<f64>,
    /// From the kernel starting (a restored guest: from its restore) to the link coming up
    /// (Linux images: the agent's `link-up` step).
    pub link_up_ms: Option<f64>,
    /// When the NIC was plugged into its Thunderbolt slot (at the agent's first frame), ms
    /// after spawning the VMM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugged_ms: Option<f64>,
    /// When the device was pulled out of its slot (the `surprise-unplug` check) or its slot's
    /// attention button pressed (the `orderly-unplug` check), ms after spawning the VMM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled_ms: Option<f64>,
    /// From spawning the VMM to the lab seeing the agent's first frame (Linux images: the
    /// guest is up).
    #[serde(default)]
    pub agent_ready_ms: Option<f64>,
    /// From spawning the VMM to the lab seeing `workload-begin` (Linux images: the time to a
    /// ready cell).
    #[serde(default)]
    pub workload_start_ms: Option<f64>,
    /// The workload itself, as the guest timed it.
    pub workload_ms: Option<f64>,
    /// From the vCPUs starting to the VM stopping.
    pub vm_run_ms: Option<f64>,
    /// The whole repetition, as the lab saw it.
    pub total_ms: f64,
}

/// What the workload measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadResult {
    /// Its output as the guest gave it (the probe's `nic` section; iperf3's JSON), verbatim.
    pub output: Option<serde_json::Value>,
    /// Packets the guest received.
    pub rx_packets: Option<u64>,
    /// Bytes the guest received.
    pub rx_bytes: Option<u64>,
    /// Packets the guest sent (Linux images).
    pub tx_packets: Option<u64>,
    /// Bytes the guest sent (Linux images).
    pub tx_bytes: Option<u64>,
    /// Goodput in Gbit/s.
    pub gbit_s: Option<f64>,
    /// Packets per second.
    pub packets_per_s: Option<f64>,
    /// TCP retransmits (iperf3).
    pub retransmits: Option<u64>,
    /// The workload's direction as the agent ran it (Linux images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// A `packet-rate` workload's frames: sent, delivered, dropped and where (its
    /// `packets_per_s` is what was delivered to the receiving socket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packet_rate: Option<crate::measure::packet_rate::PacketRate>,
    /// A `latency` workload's round trips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<crate::measure::latency::Latency>,
    /// An `xdp` workload's program and load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp: Option<crate::measure::xdp::XdpFigures>,
    /// A `kselftest` workload's results: each test program's, with its subtests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kselftest: Option<crate::measure::ktap::Ktap>,
}

impl WorkloadResult {
    /// Whether the workload measured what it is for: goodput (iperf3, packet-rate), round
    /// trips (latency), the frames an XDP program handled (xdp) or the selftests' results
    /// (kselftest).
    pub fn measured(&self) -> bool {
        self.gbit_s.is_some() || self.latency.is_some() || self.xdp.is_some() || self.kselftest.is_some()
    }

    /// The packets the workload moved: received for rx (and a probe's), sent for tx, both for
    /// bidir; the count the per-packet figures divide by.
    pub fn packets(&self) -> Option<u64> {
        match self.direction {
            Some(Direction::Tx) => self.tx_packets,
            Some(Direction::Bidir) => self.rx_packets.zip(self.tx_packets).map(|(r, t)| r + t),
            Some(Direction::Rx) | None => self.rx_packets,
        }
    }
}

/// One repetition of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The run.
    pub run: String,
    /// The cell.
    pub cell: Cell,
    /// Which repetition, from 0.
    pub repetition: u32,
    /// What ran it.
    pub engine: EngineKind,
    /// How it ended.
    pub status: Status,
    /// Why, for anything but PASS: [`Record::failure`], rendered.
    pub reason: Option<String>,
    /// Why, for anything but PASS, typed (absent from records of older driverlabs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// Phase timings.
    pub timings: Timings,
    /// What the workload measured.
    pub workload: WorkloadResult,
    /// What the virtio-iommu counted over the whole VM.
    pub iommu: Option<IommuCounts>,
    /// IOMMU maps per received packet over the workload (the VMM's count less the driver's
    /// set-up maps, over the packets the driver received).
    pub maps_per_packet: Option<f64>,
    /// The same for unmaps.
    pub unmaps_per_packet: Option<f64>,
    /// Requests the guest sent the virtio-iommu per packet over the workload: each a round trip
    /// through the VMM (maps, unmaps, and the rest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viommu_requests_per_packet: Option<f64>,
    /// What the CPU paid over the workload, the guest's and the host's, and per packet (Linux
    /// guests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<crate::measure::cpu::CpuCost>,
    /// Maps the device may write (RX buffers) per packet received, over the workload.
    #[serde(default)]
    pub rx_maps_per_packet: Option<f64>,
    /// Maps the device may only read (TX buffers) per packet sent, over the workload.
    #[serde(default)]
    pub tx_maps_per_packet: Option<f64>,
    /// Of `rx_maps_per_packet`, the maps of bounce buffers (the guest's swiotlb pool): RX
    /// buffers the guest bounced because it took the device for an untrusted one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bounced_maps_per_packet: Option<f64>,
    /// Of `tx_maps_per_packet`, the maps of bounce buffers: TX buffers the guest bounced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bounced_maps_per_packet: Option<f64>,
    /// The device model's own DMA map count per packet over the workload (QEMU may split a
    /// guest map into power-of-two pieces, so this is a cross-check, not the figure).
    #[serde(default)]
    pub model_maps_per_packet: Option<f64>,
    /// The share of RX buffer refills that reused a page (atlantic's ethtool counters).
    #[serde(default)]
    pub page_reuse: Option<f64>,
    /// RX descriptors the driver ran with (`ethtool -g` after `driverlab.rxring`, Linux guests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_ring: Option<u64>,
    /// How the guest's kernel treated the device's DMA (Linux guests): its IOMMU domain, whether
    /// it took the device for an untrusted one, whether it had a bounce pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_dma: Option<GuestDma>,
    /// IOMMU mappings still alive when the agent had unloaded the driver (Linux guests): what
    /// the driver's teardown leaked.
    #[serde(default)]
    pub mappings_after_unload: Option<u64>,
    /// What the device model counted.
    pub device_counters: Option<ModelCounters>,
    /// How the device model's process was confined (its jail's steps; docs/model.md), for a
    /// model the lab started or one behind a nested box's peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_confinement: Option<vm_spec::confinement::Confinement>,
    /// What the device put on its PCIe link over the workload, per packet, as its model counted
    /// it, and the bus time the cost model gives for it (models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "bus")]
    pub link: Option<crate::pcie_link::LinkFigures>,
    /// Interrupts the device raised during the workload (the guest's count).
    pub interrupts: Option<u64>,
    /// The VMM's exit line.
    pub exit: Option<ExitSummary>,
    /// The VMM's error line.
    pub error: Option<ErrorLine>,
    /// The serial log, relative to the artifacts folder.
    pub serial_log: Option<String>,
    /// A crash seen in the serial log.
    pub crash: Option<Crash>,
    /// How the guest started: booted, or restored from its cell's snapshot. Absent from records
    /// of older versions (which all booted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootKind>,
    /// Earlier attempts of this repetition that the host spoiled (its virtualization lost the
    /// VM's state): each was run again, and this record is the attempt that counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retried: Vec<Attempt>,
}

/// An attempt of a repetition that was run again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// Why it did not count (its reason, ERROR).
    pub reason: String,
    /// Its artifacts (serial log, VMM log, ...), relative to the artifacts folder.
    pub artifacts: Option<String>,
}

impl Record {
    /// A record of repetition `repetition` of `cell` of `run`, begun now, with nothing
    /// measured or judged yet (ERROR until [`Record::judged`] says otherwise).
    pub fn begun(run: &str, cell: &Cell, repetition: u32) -> Record {
        Record {
            run: run.to_string(),
            cell: cell.clone(),
            repetition,
            engine: EngineKind::Driverlab,
            status: Status::Error,
            reason: None,
            failure: None,
            started_at: now_rfc3339(),
            timings: Timings::default(),
            workload: WorkloadResult::default(),
            iommu: None,
            maps_per_packet: None,
            unmaps_per_packet: None,
            viommu_requests_per_packet: None,
            cpu: None,
            rx_maps_per_packet: None,
            rx_bounced_maps_per_packet: None,
            tx_bounced_maps_per_packet: None,
            tx_maps_per_packet: None,
            model_maps_per_packet: None,
            page_reuse: None,
            rx_ring: None,
            guest_dma: None,
            mappings_after_unload: None,
            device_counters: None,
            model_confinement: None,
            link: None,
            interrupts: None,
            exit: None,
            error: None,
            boot: None,
            serial_log: None,
            crash: None,
            retried: Vec::new(),
        }
    }

    /// A record of a repetition that did not run, for `failure`.
    pub fn not_run(run: &str, cell: &Cell, repetition: u32, engine: EngineKind, failure: Failure) -> Record {
        Record { engine, ..Record::begun(run, cell, repetition) }.judged(Some(failure))
    }

    /// The record with its verdict: PASS without a failure, else the failure's status and
    /// reason.
    pub fn judged(mut self, failure: Option<Failure>) -> Record {
        self.status = failure.as_ref().map_or(Status::Pass, Failure::status);
        self.reason = failure.as_ref().map(Failure::to_string);
        self.failure = failure;
        self
    }

    /// Whether the host spoiled this repetition, so that running it again says something about
    /// the guest where this attempt could not: its virtualization lost the VM's state, or, on a
    /// host whose own CPU QEMU's TCG emulates (`emulated_host`: the nested lab box, whose emulated
    /// SVM has been seen to deliver an interrupt to a guest that had them masked and to hand a
    /// guest its host's state), the guest died ([`Failure::guest_died`]).
    pub fn spoiled_by_host(&self, emulated_host: bool) -> bool {
        match &self.failure {
            Some(Failure::HostLostState { .. }) => true,
            Some(failure) => emulated_host && failure.guest_died(),
            None => false,
        }
    }

    /// The maps per packet a report's table and the progress lines show: the side the workload
    /// moves, where the record splits maps by direction (Linux guests: maps the device may write
    /// per packet received, or for a `tx` workload maps it may only read per packet sent), else
    /// all of the workload's maps per packet (the probe, whose RX test maps only RX buffers).
    pub fn shown_maps(&self) -> Option<f64> {
        let side = match self.workload.direction {
            Some(Direction::Tx) => self.tx_maps_per_packet,
            _ => self.rx_maps_per_packet,
        };
        side.or(self.maps_per_packet)
    }

    /// The figures reports summarise: every [`Metric`] the record has.
    pub fn metrics(&self) -> BTreeMap<Metric, f64> {
        Metric::ALL.iter().filter_map(|&m| Some((m, m.read(self)?))).collect()
    }
}

/// Now, as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// A record of `status` for tests: passed, or failed for a reason of that status (`why`).
#[cfg(test)]
pub(crate) fn test_record(run: &str, cell: &Cell, repetition: u32, status: Status, why: &str) -> Record {
    let why = why.to_string();
    let failure = match status {
        Status::Pass => None,
        Status::Fail => Some(Failure::Workload { problem: why }),
        Status::Error => Some(Failure::Setup { what: why }),
        Status::Miss => Some(Failure::Cancelled { why }),
        Status::Skip => Some(Failure::Unrunnable { why }),
    };
    Record::begun(run, cell, repetition).judged(failure)
}

//! Filling a repetition's record from what its VM left: the engine's counts and exit, the
//! probe's NIC section or the agent's frames over the workload's window, and what the device
//! put on its PCIe link.

use vm_spec::counters::{IommuCounts, ModelCounters};
use vm_spec::{NicKind, Slot};

use super::output::{GuestOutput, Report};
use crate::matrix::{Direction, Protocol, Workload};
use crate::measure::cpu::CpuCost;
use crate::measure::ktap::Ktap;
use crate::measure::latency::Latency;
use crate::measure::packet_rate::PacketRate;
use crate::measure::xdp::XdpFigures;
use crate::record::{GuestDma, Record};
use engines::agent::{FrameKind, Frames, StepStatus};
use engines::probe_report::ProbeReport;
use engines::{Booted, Snapshot, Window};

/// Fills `record` from what the VM left; `nic` is the device's NIC, where the lab knows it
/// (for the bus figures), `workload` the cell's.
pub(super) fn fill(
    record: &mut Record,
    booted: &Booted,
    output: &GuestOutput,
    nic: Option<NicKind>,
    slot: Slot,
    workload: Option<&Workload>,
) {
    record.exit = booted.exit.clone();
    record.error = booted.error.clone();
    record.crash = output.crash();
    record.iommu = booted.iommu.clone();
    record.device_counters = booted.device_counters;
    record.timings.vm_run_ms = booted.run_ms;
    record.timings.vm_start_ms = booted.answered_ms;
    record.timings.agent_ready_ms = booted.window.first_frame_ms;
    record.timings.workload_start_ms = booted.window.begin_ms;
    record.timings.plugged_ms = booted.window.plugged_ms;
    record.timings.pulled_ms = booted.window.pulled_ms;
    if let Some(exit) = &booted.exit {
        record.timings.vm_setup_ms = Some(exit.setup_ms);
        record.timings.first_serial_ms = exit.first_serial_ms;
    }
    // The bus: over the workload's window for Linux, over the whole VM for the probe (its
    // set-up is a few descriptors beside the frames it receives).
    let model_of = |s: &Option<Snapshot>| s.as_ref().and_then(|s| s.model);
    let counts = match &output.report {
        Report::Probe(report) => {
            probe_figures(record, report);
            booted.device_counters.map(|c| (ModelCounters::default(), c))
        }
        Report::Linux(frames) => {
            record.guest_dma = guest_dma(frames, slot);
            agent_figures(record, frames, &booted.window);
            match workload {
                Some(&Workload::PacketRate { frame_bytes, direction, ip, .. }) => {
                    packet_rate_figures(record, frames, frame_bytes, ip, direction);
                }
                Some(&Workload::Latency { protocol, message_bytes, .. }) => {
                    latency_figures(record, frames, protocol, message_bytes);
                }
                Some(&Workload::Xdp { action, frame_bytes, .. }) => {
                    record.workload.xdp = XdpFigures::of(frames, action, frame_bytes);
                    record.workload.packets_per_s = record.workload.xdp.as_ref().map(|x| x.handled_per_s);
                }
                Some(Workload::Kselftest { .. }) => {
                    // The agent's frame, else what reached the console before the guest died.
                    let ktap = frames.first(FrameKind::Kselftest).and_then(|f| f.as_str()).map(Ktap::parse);
                    record.workload.kselftest = ktap.or_else(|| {
                        let from_console = Ktap::parse(&output.serial);
                        from_console.planned.is_some().then_some(from_console)
                    });
                    // The suite's time: its step's, key enrollment included.
                    record.timings.workload_ms = frames.step("kselftest").and_then(|s| s.secs).map(|secs| secs * 1e3);
                }
                _ => {}
            }
            model_of(&booted.window.begin).zip(model_of(&booted.window.end))
        }
    };
    if let (Some(nic), Some((before, after))) = (nic, counts) {
        record.link = crate::pcie_link::figures(nic, &before, &after);
    }
}

/// How the guest treated the device's DMA, from the agent's `iommu-group` step (its facts are
/// there when the step passed, and when it failed for want of a bounce pool).
pub(super) fn guest_dma(frames: &Frames, slot: Slot) -> Option<GuestDma> {
    let facts = &frames.step("iommu-group")?.facts;
    Some(GuestDma {
        slot,
        domain: serde_json::from_value(facts.get("type")?.clone()).ok()?,
        untrusted: facts.get("untrusted")?.as_bool()?,
        swiotlb: !facts.get("swiotlb")?.is_null(),
    })
}

/// Fills the record from the probe's `nic` section: what it received, how fast, and the IOMMU
/// maps per frame.
fn probe_figures(record: &mut Record, report: &ProbeReport) {
    let Some(section) = report.section("nic") else { return };
    record.workload.output = Some(section.clone());
    let Some(nic) = report.nic().filter(|n| n.error.is_none()) else { return };
    record.workload.rx_packets = nic.rx_frames;
    record.workload.rx_bytes = nic.rx_bytes;
    record.interrupts = nic.rx_interrupts;
    if let (Some(frames), Some(bytes), Some(ns)) = (nic.rx_frames, nic.rx_bytes, nic.elapsed_ns.filter(|&ns| ns > 0)) {
        record.timings.workload_ms = Some(ns as f64 / 1e6);
        record.workload.gbit_s = Some(bytes as f64 * 8.0 / ns as f64);
        record.workload.packets_per_s = Some(frames as f64 * 1e9 / ns as f64);
    }
    // What the virtual IOMMU counted, less the driver's set-up maps (rings, TX buffers, the
    // first RX fill), over the frames received.
    if let (Some(iommu), Some(initial), Some(frames)) =
        (&record.iommu, nic.initial_maps, nic.rx_frames.filter(|&f| f > 0))
    {
        record.maps_per_packet = Some(iommu.maps.saturating_sub(initial) as f64 / frames as f64);
    }
}

/// Fills the record from the agent's frames: iperf3's JSON verbatim and its goodput, the packets
/// the guest received (its interface's counters before and after), and the IOMMU maps the
/// virtio-iommu counted between the workload's begin and end frames.
pub(super) fn agent_figures(record: &mut Record, frames: &Frames, window: &Window) {
    // A restored guest's uptime goes on from its snapshot's: its steps count from its restore,
    // the uptime its agent gave in its `ready` frame.
    let restored_at_ms = match record.boot {
        Some(crate::record::BootKind::Restored) => {
            frames.first(FrameKind::Ready).and_then(|r| r.get("at")?.as_f64()).map(|at| at * 1e3)
        }
        _ => None,
    };
    let since_start = |at: Option<f64>| at.map(|at| at - restored_at_ms.unwrap_or(0.0));
    record.timings.driver_probe_ms = since_start(frames.passed_at_ms("probe"));
    record.rx_ring = frames.step("link-up").and_then(|s| s.facts.get("rx_ring")?.as_u64()).filter(|&n| n > 0);
    record.timings.link_up_ms = since_start(frames.passed_at_ms("link-up"));
    if let Some(iperf) = frames.first(FrameKind::Iperf3) {
        record.workload.output = Some(iperf.clone());
        if let Some(figures) = engines::agent::iperf_figures(iperf) {
            record.workload.gbit_s = Some(figures.received_gbit_s);
            record.workload.retransmits = figures.retransmits;
            record.timings.workload_ms = Some(figures.seconds * 1e3);
        }
    }
    let stat = |kind: FrameKind, key: &str| frames.first(kind).and_then(|f| f.get(key)).and_then(|v| v.as_u64());
    let delta =
        |key: &str| Some(stat(FrameKind::NetdevAfter, key)?.saturating_sub(stat(FrameKind::NetdevBefore, key)?));
    let w = &mut record.workload;
    (w.rx_packets, w.rx_bytes, w.tx_packets, w.tx_bytes) =
        (delta("rx_packets"), delta("rx_bytes"), delta("tx_packets"), delta("tx_bytes"));
    // The packets the workload moved: received for rx, sent for tx, both for bidir.
    w.direction = frames.direction();
    let packets = w.packets();
    record.page_reuse = page_reuse(frames);
    let unloaded = frames.step("unload").is_some_and(|s| s.status == StepStatus::Ok);
    if unloaded && let Some(done) = window.done.as_ref().and_then(|s| s.iommu.as_ref()) {
        record.mappings_after_unload = Some(done.live_mappings);
    }
    let host_cpu = |s: &Option<Snapshot>| s.as_ref().and_then(|s| s.host_cpu);
    record.cpu = CpuCost::over(frames, host_cpu(&window.begin).as_ref(), host_cpu(&window.end).as_ref(), packets);
    let Some(packets) = packets.filter(|&p| p > 0) else { return };
    if let Some(ms) = record.timings.workload_ms.filter(|&ms| ms > 0.0) {
        record.workload.packets_per_s = Some(packets as f64 * 1e3 / ms);
    }
    window_maps(record, frames, window, packets);
}

/// Fills the record's IOMMU figures over the workload's window: maps, unmaps and requests per
/// packet (`packets`: the packets the workload moved), maps by direction and those bounced, and
/// the model's own maps.
fn window_maps(record: &mut Record, frames: &Frames, window: &Window, packets: u64) {
    let per = |count: u64, packets: Option<u64>| packets.filter(|&p| p > 0).map(|p| count as f64 / p as f64);
    let iommu = |s: &Option<Snapshot>| s.as_ref().and_then(|s| s.iommu.clone());
    if let (Some(a), Some(b)) = (iommu(&window.begin), iommu(&window.end)) {
        let delta = |f: fn(&IommuCounts) -> u64| f(&b).saturating_sub(f(&a));
        record.maps_per_packet = per(delta(|c| c.maps), Some(packets));
        record.unmaps_per_packet = per(delta(|c| c.unmaps), Some(packets));
        record.viommu_requests_per_packet = per(delta(|c| c.requests), Some(packets));
        // By direction, where the counters split them: maps the device may write (RX buffers)
        // per packet received, maps it only reads (TX buffers) per packet sent.
        if delta(|c| c.maps_writable) + delta(|c| c.maps_read_only) > 0 {
            record.rx_maps_per_packet = per(delta(|c| c.maps_writable), record.workload.rx_packets);
            record.tx_maps_per_packet = per(delta(|c| c.maps_read_only), record.workload.tx_packets);
        }
        // Bounced maps: counted where the VMM knew the guest's bounce pool (its agent reported
        // one); none at all where the agent said the guest has no pool.
        let (rx, tx) = (record.workload.rx_packets, record.workload.tx_packets);
        match (frames.bounce_pool(), record.guest_dma) {
            (Some(_), _) => {
                record.rx_bounced_maps_per_packet = per(delta(|c| c.bounced_maps_writable), rx);
                record.tx_bounced_maps_per_packet = per(delta(|c| c.bounced_maps_read_only), tx);
            }
            (None, Some(GuestDma { swiotlb: false, .. })) => {
                record.rx_bounced_maps_per_packet = per(0, rx);
                record.tx_bounced_maps_per_packet = per(0, tx);
            }
            (None, _) => {}
        }
    }
    let model = |s: &Option<Snapshot>| s.as_ref().and_then(|s| s.model);
    if let (Some(a), Some(b)) = (model(&window.begin), model(&window.end)) {
        record.model_maps_per_packet = per(b.dma_maps.saturating_sub(a.dma_maps), Some(packets));
    }
}

/// A packet-rate workload's figures: frames sent, delivered and dropped; its packets per second
/// are those delivered to the receiving socket.
fn packet_rate_figures(record: &mut Record, frames: &Frames, frame_bytes: u32, ip: u8, direction: Direction) {
    let payload = crate::matrix::udp_payload(frame_bytes, ip).unwrap_or(crate::matrix::MIN_IPERF_PAYLOAD);
    record.workload.packet_rate = PacketRate::of(frames, frame_bytes, payload, direction);
    if let Some(rate) = &record.workload.packet_rate {
        record.workload.packets_per_s = Some(rate.delivered_per_s);
    }
}

/// A latency workload's round trips; its packets per second are the messages' both ways.
fn latency_figures(record: &mut Record, frames: &Frames, protocol: Protocol, message_bytes: u32) {
    let report = frames.first(FrameKind::Sockperf).and_then(|f| f.as_str());
    record.workload.latency = report.and_then(|text| Latency::parse(text, protocol, message_bytes));
    if let Some(latency) = &record.workload.latency
        && latency.seconds > 0.0
    {
        record.workload.output = Some(serde_json::Value::String(report.unwrap_or_default().to_string()));
        record.timings.workload_ms = Some(latency.seconds * 1e3);
        let packets = record.workload.rx_packets.zip(record.workload.tx_packets).map(|(r, t)| r + t);
        record.workload.packets_per_s = packets.map(|p| p as f64 / latency.seconds);
    }
}

/// The share of RX buffer refills that needed no new page (and so no new IOMMU map) over the
/// workload: atlantic's `PageFlips` and `PageReuses` over those and `PageFrees`, summed over its
/// queues, between the `ethtool -S` before and after. `None` for drivers without the counters.
fn page_reuse(frames: &Frames) -> Option<f64> {
    let sums = |kind: FrameKind| -> Option<[u64; 3]> {
        let text = frames.first(kind)?.as_str()?;
        let mut sums = [0u64; 3];
        let mut found = false;
        for line in text.lines() {
            let Some((name, value)) = line.split_once(':') else { continue };
            let Ok(value) = value.trim().parse::<u64>() else { continue };
            let name = name.trim();
            let slot = ["PageFlips", "PageReuses", "PageFrees"].iter().position(|s| name.ends_with(s));
            if let Some(slot) = slot.filter(|_| name.contains("Queue[")) {
                sums[slot] += value;
                found = true;
            }
        }
        found.then_some(sums)
    };
    let (before, after) = (sums(FrameKind::EthtoolSBefore)?, sums(FrameKind::EthtoolSAfter)?);
    let [flips, reuses, frees] = [0, 1, 2].map(|i| after[i].saturating_sub(before[i]));
    let refills = flips + reuses + frees;
    (refills > 0).then(|| (flips + reuses) as f64 / refills as f64)
}

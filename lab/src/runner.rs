//! One repetition of one cell: start the device (a fresh model, or the host device), boot the VM
//! under the image's engine ([`crate::engine`]), collect what it left (counters, the exit, the
//! serial logs, the agent's frames), tear down, and turn it all into a [`Record`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vm_spec::counters::{IommuCounts, ModelCounters};
use vm_spec::{DeviceSpec, ExitReason, IommuSpec, Kernel, NicKind, SerialOutput, SerialSpec, VmSpec};

use crate::agent::{FrameKind, StepStatus};
use crate::crash;
use crate::engine::{self, Booted, Ending, QemuBoot, Snapshot, Watch};
use crate::matrix::{Cell, Device, DeviceSource, Direction, EngineKind, HostPeer, Plan, Workload};
use crate::model_process::ModelProcess;
use crate::peer::Peer;
use crate::probe_report::ProbeReport;
use crate::qemu::Qemu;
use crate::record::{Crash, Record, Status, now_rfc3339};
use guest_images::store::ImageStore;

/// What every repetition of a run shares.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The `driverlab` binary that runs VMs and models.
    pub driverlab: PathBuf,
    /// The run.
    pub run: String,
    /// Where the run's artifacts go.
    pub artifacts: PathBuf,
}

/// The kernel command line of a cell: the image's words, the variant's, its parameters, then
/// what the workload needs.
pub fn cmdline(plan: &Plan, cell: &Cell) -> String {
    let mut words: Vec<String> = Vec::new();
    if let Some(image) = plan.image(&cell.image) {
        words.extend(image.cmdline.split_whitespace().map(String::from));
    }
    if let Some(variant) = plan.variant(&cell.variant) {
        words.extend(variant.cmdline.split_whitespace().map(String::from));
    }
    words.extend(cell.params.iter().map(|(k, v)| format!("{k}={v}")));
    match plan.workload(&cell.workload) {
        Some(Workload::ProbeRx { frames, .. }) => {
            // The probe drives the NICs driverlab knows (the matrix's check refuses a probe-rx
            // workload on any other).
            let nic = plan.device(&cell.device).and_then(Device::nic).unwrap_or(NicKind::Aqc100);
            words.extend(["probe.viommu_ops=0".into(), format!("probe.nic={nic}"), format!("probe.frames={frames}")]);
        }
        Some(Workload::Iperf3 { direction, duration_s, ip, mtu, streams, protocol, bitrate_mbit, .. }) => {
            // The agent's words (guest-images/agent/init): its driver, the workload, the MTU.
            let driver =
                plan.device(&cell.device).map_or_else(|| NicKind::Aqc100.linux_driver().into(), Device::linux_driver);
            words.extend([
                "console=ttyS0".into(),
                "panic=-1".into(),
                format!("driverlab.nic={driver}"),
                format!("driverlab.mtu={mtu}"),
                match bitrate_mbit {
                    0 => format!("driverlab.iperf={direction},{},{ip},{streams},{protocol}", duration_s.ceil() as u64),
                    rate => format!(
                        "driverlab.iperf={direction},{},{ip},{streams},{protocol},{rate}M",
                        duration_s.ceil() as u64
                    ),
                },
            ]);
        }
        None => {}
    }
    words.join(" ")
}

/// The artifacts folder of repetition `repetition` of `cell`.
fn rep_dir(ctx: &RunContext, cell: &Cell, repetition: u32) -> PathBuf {
    ctx.artifacts.join(&cell.id).join(format!("rep{repetition}"))
}

/// Moves the artifacts of an attempt of a repetition that is run again to
/// `CELL/repN.attempt{attempt}`, so that the next attempt starts afresh and the spoiled one stays
/// readable; the new folder relative to the artifacts folder, if the move worked.
pub fn set_attempt_aside(ctx: &RunContext, cell: &Cell, repetition: u32, attempt: usize) -> Option<String> {
    let from = rep_dir(ctx, cell, repetition);
    let to = ctx.artifacts.join(&cell.id).join(format!("rep{repetition}.attempt{attempt}"));
    match std::fs::rename(&from, &to) {
        Ok(()) => to.strip_prefix(&ctx.artifacts).ok().map(|p| p.display().to_string()),
        Err(e) => {
            tracing::warn!("setting {} aside: {e}", from.display());
            None
        }
    }
}

/// Runs repetition `repetition` of `cell`.
pub fn run(ctx: &RunContext, plan: &Plan, cell: &Cell, repetition: u32) -> Record {
    let started_at = now_rfc3339();
    let start = Instant::now();
    let rep_dir = rep_dir(ctx, cell, repetition);
    let mut record = Record::not_run(&ctx.run, cell, repetition, Status::Error, "");
    record.started_at = started_at;
    let fail = |mut record: Record, status: Status, reason: String| {
        record.status = status;
        record.reason = Some(reason);
        record.timings.total_ms = ms(start.elapsed());
        record
    };
    let (Some(image), Some(device)) = (plan.image(&cell.image), plan.device(&cell.device)) else {
        return fail(record, Status::Error, format!("cell {} names what its matrix lacks", cell.id));
    };
    record.engine = image.engine;
    if let Err(e) = std::fs::create_dir_all(&rep_dir) {
        return fail(record, Status::Error, format!("artifacts folder {}: {e}", rep_dir.display()));
    }

    // Linux images: their files, and for a model, the peer its TAP end lives with.
    let linux = !image.is_probe();
    let resolved = if linux {
        let store = ImageStore::new(guest_images::store::default_root());
        match crate::images::resolve(plan, image, &store) {
            Ok(resolved) => Some(resolved),
            Err(e) => return fail(record, Status::Error, e),
        }
    } else {
        None
    };
    let iperf = matches!(plan.workload(&cell.workload), Some(Workload::Iperf3 { .. }));
    let source = match device.source() {
        Ok(source) => source,
        Err((field, message)) => {
            return fail(record, Status::Error, format!("device {:?}{field}: {message}", device.name));
        }
    };
    let host_peer = match &source {
        DeviceSource::Host { peer, .. } => peer.as_ref(),
        DeviceSource::Model { .. } => None,
    };
    let peer = match (iperf, &source, host_peer) {
        (true, DeviceSource::Model { .. }, _) => Some(Peer::namespace()),
        (true, DeviceSource::Host { .. }, Some(host_peer)) => {
            let limit = Duration::from_secs_f64(plan.matrix.timeout_s);
            Some(Peer::remote(&host_peer.destination, host_peer.addresses.clone(), limit))
        }
        _ => None,
    };
    let peer = match peer.transpose() {
        Ok(peer) => peer,
        Err(e) => return fail(record, Status::Error, e.to_string()),
    };
    // A host device that is a model behind its peer (a nested lab box's card): its counters
    // through the peer, for the cross-check against the virtio-iommu's.
    let remote_counters = match host_peer {
        Some(HostPeer { destination, counters: true, .. }) => match crate::peer::RemoteCounters::open(destination) {
            Ok(remote) => {
                record.model_confinement = remote.confinement();
                let remote = std::sync::Mutex::new(remote);
                let source: engine::CounterSource =
                    std::sync::Arc::new(move || remote.lock().unwrap_or_else(|p| p.into_inner()).counters());
                Some(source)
            }
            Err(e) => return fail(record, Status::Error, format!("the model's counters: {e}")),
        },
        _ => None,
    };

    // The device: a fresh model for this VM (its wire the peer's TAP, with a peer), or the
    // host device.
    let mut model = None;
    let device_spec = match &source {
        DeviceSource::Host { bdf, .. } => DeviceSpec::Vfio(*bdf),
        DeviceSource::Model { nic, wire } => {
            let model_start = Instant::now();
            let wire_args = wire.model_args();
            let args: Vec<&str> = match &peer {
                Some(_) => vec!["--tap", crate::peer::TAP],
                None => wire_args.iter().map(String::as_str).collect(),
            };
            // Its log is an artifact of the repetition (`model.log`).
            let log = rep_dir.join("model.log");
            let netns = peer.as_ref().and_then(Peer::netns);
            match ModelProcess::start_logged(&ctx.driverlab, nic.name(), &args, netns, Some(&log)) {
                Ok(m) => {
                    record.timings.model_start_ms = Some(ms(model_start.elapsed()));
                    record.model_confinement = m.confinement();
                    let spec = m.device_spec();
                    model = Some(m);
                    spec
                }
                Err(e) => return fail(record, Status::Error, e.to_string()),
            }
        }
    };

    let serial_log = rep_dir.join("serial.log");
    let agent_log = rep_dir.join("agent.log");
    let mut words = cmdline(plan, cell);
    if let Some(peer) = &peer {
        words.push(' ');
        words.push_str(&peer.cmdline());
    }
    let spec = VmSpec {
        kernel: resolved.as_ref().map_or(Kernel::Probe, |r| Kernel::Path(r.kernel.clone())),
        initrd: resolved.as_ref().and_then(|r| r.initrd.clone()),
        cmdline: words,
        memory_mib: image.memory_mib,
        vcpus: image.vcpus,
        // Linux attaches every endpoint to a DMA domain before its driver probes, so its VMs
        // start with bypass off: nothing is mapped before the guest maps it (an identity map of
        // all guest RAM pins every page through VFIO, seconds behind a nested IOMMU).
        iommu: image.iommu.then_some(IommuSpec { bypass: !linux }),
        devices: vec![device_spec],
        serial: SerialSpec {
            com1: SerialOutput::File(serial_log.clone()),
            com2: linux.then(|| SerialOutput::File(agent_log.clone())),
        },
        timeout_s: Some(plan.matrix.timeout_s),
        ..VmSpec::new(Kernel::Probe)
    };
    let watch =
        Watch { silence: Duration::from_secs_f64(plan.matrix.silence_s), agent_log: linux.then(|| agent_log.clone()) };
    let booted = match image.engine {
        EngineKind::Driverlab => {
            let private = match private_dir() {
                Ok(dir) => dir,
                Err(e) => return fail(record, Status::Error, format!("a folder for the control socket: {e}")),
            };
            let booted = engine::run_driverlab(
                &ctx.driverlab,
                spec,
                &private.join("vm.sock"),
                &watch,
                model,
                remote_counters.clone(),
            );
            let _ = std::fs::remove_dir_all(&private);
            booted
        }
        EngineKind::Qemu => {
            let qemu = match Qemu::find(&crate::qemu::default_root()) {
                Ok(qemu) => qemu,
                Err(e) => return fail(record, Status::Error, e.to_string()),
            };
            let boot = QemuBoot {
                qemu: &qemu,
                accel: image.accel,
                bzimage: resolved.as_ref().and_then(|r| r.bzimage.as_deref()),
                dir: &rep_dir,
            };
            engine::run_qemu(&boot, &spec, &watch, model)
        }
    };
    drop(peer);
    if !booted.vmm_stderr.is_empty() {
        let _ = std::fs::write(rep_dir.join("vmm.log"), &booted.vmm_stderr);
    }

    record.timings.vm_start_ms = booted.answered_ms;
    record.timings.agent_ready_ms = booted.window.first_frame_ms;
    record.timings.workload_start_ms = booted.window.begin_ms;
    record.serial_log = serial_log.strip_prefix(&ctx.artifacts).ok().map(|p| p.display().to_string());
    let serial = std::fs::read_to_string(&serial_log).unwrap_or_default();
    collect(&mut record, &booted, &serial);
    let frames = linux.then(|| crate::agent::parse(&std::fs::read(&agent_log).unwrap_or_default()));
    if let Some(frames) = &frames {
        collect_agent(&mut record, frames, &booted.window);
    }
    // The bus: over the workload's window for Linux, over the whole VM for the probe (its
    // set-up is a few descriptors beside the frames it receives).
    let model_of = |s: &Option<Snapshot>| s.as_ref().and_then(|s| s.model);
    let counts = match linux {
        true => model_of(&booted.window.begin).zip(model_of(&booted.window.end)),
        false => booted.device_counters.map(|c| (ModelCounters::default(), c)),
    };
    if let (Some(nic), Some((before, after))) = (device.nic(), counts) {
        record.bus = crate::bus::figures(nic, &before, &after);
    }
    let (status, reason) = judge(&booted, &serial, &record, plan.matrix.timeout_s, frames.as_ref());
    if status == Status::Fail
        && record.crash.is_none()
        && let Some(silence) = booted.silent_for
    {
        record.crash = Some(hang(silence));
    }
    record.status = status;
    record.reason = reason;
    record.timings.total_ms = ms(start.elapsed());
    record
}

/// Fills the record from what the VM left behind.
fn collect(record: &mut Record, booted: &Booted, serial: &str) {
    record.exit = booted.exit.clone();
    record.error = booted.error.clone();
    record.crash = crash::detect(serial);
    record.iommu = booted.iommu.clone();
    record.device_counters = booted.device_counters;
    record.timings.vm_run_ms = booted.run_ms;
    if let Some(exit) = &booted.exit {
        record.timings.vm_setup_ms = Some(exit.setup_ms);
        record.timings.first_serial_ms = exit.first_serial_ms;
    }
    let report = ProbeReport::parse(serial);
    if let Some(nic) = report.section("nic").filter(|n| n.get("error").is_none()) {
        let get = |key: &str| nic.get(key).and_then(|v| v.as_u64());
        let (frames, bytes, elapsed_ns) = (get("rx_frames"), get("rx_bytes"), get("elapsed_ns"));
        record.workload.output = Some(nic.clone());
        record.workload.rx_packets = frames;
        record.workload.rx_bytes = bytes;
        record.interrupts = get("rx_interrupts");
        if let (Some(frames), Some(bytes), Some(ns)) = (frames, bytes, elapsed_ns.filter(|&ns| ns > 0)) {
            record.timings.workload_ms = Some(ns as f64 / 1e6);
            record.workload.gbit_s = Some(bytes as f64 * 8.0 / ns as f64);
            record.workload.packets_per_s = Some(frames as f64 * 1e9 / ns as f64);
        }
        // What the virtual IOMMU counted, less the driver's set-up maps (rings, TX buffers, the
        // first RX fill), over the frames received.
        if let (Some(iommu), Some(initial), Some(frames)) =
            (&record.iommu, get("initial_maps"), frames.filter(|&f| f > 0))
        {
            record.maps_per_packet = Some(iommu.maps.saturating_sub(initial) as f64 / frames as f64);
        }
    } else if let Some(nic) = report.section("nic") {
        record.workload.output = Some(nic.clone());
    }
}

/// Fills the record from the agent's frames: iperf3's JSON verbatim and its goodput, the packets
/// the guest received (its interface's counters before and after), and the IOMMU maps the
/// virtio-iommu counted between the workload's begin and end frames.
fn collect_agent(record: &mut Record, frames: &crate::agent::Frames, window: &engine::Window) {
    record.timings.driver_probe_ms = frames.passed_at_ms("probe");
    record.rx_ring = frames.step("link-up").and_then(|s| s.facts.get("rx_ring")?.as_u64()).filter(|&n| n > 0);
    record.timings.link_up_ms = frames.passed_at_ms("link-up");
    if let Some(iperf) = frames.first(FrameKind::Iperf3) {
        record.workload.output = Some(iperf.clone());
        if let Some(figures) = crate::agent::iperf_figures(iperf) {
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
    let packets = match w.direction {
        Some(Direction::Tx) => w.tx_packets,
        Some(Direction::Bidir) => w.rx_packets.zip(w.tx_packets).map(|(r, t)| r + t),
        Some(Direction::Rx) | None => w.rx_packets,
    };
    record.page_reuse = page_reuse(frames);
    let unloaded = frames.step("unload").is_some_and(|s| s.status == StepStatus::Ok);
    if unloaded && let Some(done) = window.done.as_ref().and_then(|s| s.iommu.as_ref()) {
        record.mappings_after_unload = Some(done.live_mappings);
    }
    let Some(packets) = packets.filter(|&p| p > 0) else { return };
    if let Some(ms) = record.timings.workload_ms.filter(|&ms| ms > 0.0) {
        record.workload.packets_per_s = Some(packets as f64 * 1e3 / ms);
    }
    let per = |count: u64, packets: Option<u64>| packets.filter(|&p| p > 0).map(|p| count as f64 / p as f64);
    let iommu = |s: &Option<Snapshot>| s.as_ref().and_then(|s| s.iommu.clone());
    if let (Some(a), Some(b)) = (iommu(&window.begin), iommu(&window.end)) {
        let delta = |f: fn(&IommuCounts) -> u64| f(&b).saturating_sub(f(&a));
        record.maps_per_packet = per(delta(|c| c.maps), Some(packets));
        record.unmaps_per_packet = per(delta(|c| c.unmaps), Some(packets));
        // By direction, where the counters split them: maps the device may write (RX buffers)
        // per packet received, maps it only reads (TX buffers) per packet sent.
        if delta(|c| c.maps_writable) + delta(|c| c.maps_read_only) > 0 {
            record.rx_maps_per_packet = per(delta(|c| c.maps_writable), record.workload.rx_packets);
            record.tx_maps_per_packet = per(delta(|c| c.maps_read_only), record.workload.tx_packets);
        }
    }
    let model = |s: &Option<Snapshot>| s.as_ref().and_then(|s| s.model);
    if let (Some(a), Some(b)) = (model(&window.begin), model(&window.end)) {
        record.model_maps_per_packet = per(b.dma_maps.saturating_sub(a.dma_maps), Some(packets));
    }
}

/// The share of RX buffer refills that needed no new page (and so no new IOMMU map) over the
/// workload: atlantic's `PageFlips` and `PageReuses` over those and `PageFrees`, summed over its
/// queues, between the `ethtool -S` before and after. `None` for drivers without the counters.
fn page_reuse(frames: &crate::agent::Frames) -> Option<f64> {
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

/// How the reason of a repetition whose VM's state the host lost begins.
pub const HOST_LOST_STATE: &str = "the host's virtualization lost the VM's state";

/// The status and its reason.
fn judge(
    booted: &Booted,
    serial: &str,
    record: &Record,
    timeout_s: f64,
    frames: Option<&crate::agent::Frames>,
) -> (Status, Option<String>) {
    // The device's model died under the VM: whatever the guest made of it, that is the lab's.
    if let Some(ended) = &booted.model_ended {
        return (Status::Error, Some(ended.clone()));
    }
    let (reason, detail) = match &booted.ending {
        Ending::Refused(why) => return (Status::Error, Some(why.clone())),
        Ending::Killed => return (Status::Error, Some("the VMM did not end at its timeout and was killed".into())),
        Ending::Unexplained(why) => return (Status::Error, Some(why.clone())),
        Ending::Stopped { reason, detail } => (*reason, detail.clone().unwrap_or_default()),
    };
    // A vCPU found in a state no guest reaches: the host lost it, whatever the guest was doing.
    if let Some(lost) = booted.exit.as_ref().and_then(|e| e.vcpu_state_lost.as_ref()) {
        return (Status::Error, Some(format!("{HOST_LOST_STATE}: {lost}")));
    }
    if let Some(silence) = booted.silent_for {
        // Where it stopped: the console's last line, when it printed one.
        let last = serial.lines().rev().map(str::trim).find(|l| !l.is_empty()).map(|l| {
            let l: String = l.chars().filter(|c| !c.is_control()).take(200).collect();
            format!(" after {l:?}")
        });
        // And where its vCPUs were when it was stopped (the VMM's exit detail), for a guest that
        // hung before it printed anything.
        let rips = if detail.is_empty() { String::new() } else { format!("; {detail}") };
        let why =
            format!("hung: no serial output for {:.0} s{}{rips}", silence.as_secs_f64(), last.unwrap_or_default());
        return (Status::Fail, Some(why));
    }
    match reason {
        ExitReason::KvmInternalError | ExitReason::EntryFailure => {
            return (Status::Error, Some(format!("this host's KVM cannot run the guest: {detail}")));
        }
        ExitReason::VmmError | ExitReason::Shutdown => return (Status::Error, Some(format!("{reason}: {detail}"))),
        _ => {}
    }
    if let Some(crash) = &record.crash {
        return (Status::Fail, Some(format!("{}: {}", crash.kind, crash.line)));
    }
    match reason {
        ExitReason::Poweroff => {}
        ExitReason::Timeout => return (Status::Fail, Some(format!("hung: still running after {timeout_s} s"))),
        other => return (Status::Fail, Some(format!("the guest ended with {other}"))),
    }
    if let Some(error) = &booted.device_error {
        return (Status::Error, Some(error.clone()));
    }
    // The cross-check of the two counts: the engine's virtio-iommu saw the guest's maps, the
    // model its DMA maps; a VMM may split a guest map into pieces but never merge two.
    if let (Some(guest), Some(model)) = (record.maps_per_packet, record.model_maps_per_packet)
        && model + 1e-9 < guest
    {
        return (
            Status::Error,
            Some(format!(
                "the model counted fewer DMA maps ({model:.4} per packet) than the virtio-iommu saw the guest make \
                 ({guest:.4}): one of the counts is wrong"
            )),
        );
    }
    if let Some(left) = record.mappings_after_unload.filter(|&n| n > 0) {
        return (Status::Fail, Some(format!("the driver left {left} IOMMU mapping(s) behind after it was unloaded")));
    }
    if let Some(frames) = frames {
        let verdict = crate::agent::verdict(frames, serial);
        return match verdict.problems.first() {
            Some(problem) => (Status::Fail, Some(problem.clone())),
            None if record.workload.gbit_s.is_none() => (Status::Fail, Some("the workload reported nothing".into())),
            None => (Status::Pass, None),
        };
    }
    let report = ProbeReport::parse(serial);
    match report.done() {
        None => (Status::Fail, Some("the probe did not finish its report".into())),
        Some(done) if !done.ok => (Status::Fail, Some(done.failures.join("; "))),
        Some(_) if record.workload.rx_packets.is_none() => (Status::Fail, Some("the workload reported nothing".into())),
        Some(_) => (Status::Pass, None),
    }
}

fn hang(silence: Duration) -> Crash {
    Crash {
        kind: "hang".into(),
        line: format!("no serial output for {:.0} s", silence.as_secs_f64()),
        frames: Vec::new(),
        fingerprint: "hang".into(),
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// A folder of this process's own, short enough for a Unix socket path.
fn private_dir() -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("driverlab-lab-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::encode;

    fn counters(maps: u64) -> Snapshot {
        Snapshot { iommu: Some(IommuCounts { maps, unmaps: maps, ..IommuCounts::default() }), model: None }
    }

    /// A passing record of a Linux cell under `workload`.
    fn passed(workload: &str) -> Record {
        let cell = Cell {
            index: 0,
            id: "c01".into(),
            image: "debian".into(),
            variant: "stock".into(),
            params: Default::default(),
            workload: workload.into(),
            device: "aq".into(),
        };
        Record::not_run("r", &cell, 0, Status::Pass, "")
    }

    #[test]
    fn a_hang_whose_vcpu_state_was_lost_is_the_host_s_error_and_a_plain_hang_the_guest_s_failure() {
        let exit = |lost: Option<&str>| vm_spec::ExitSummary {
            vcpu_state_lost: lost.map(String::from),
            ..serde_json::from_str(
                r#"{"vmm":"exit","reason":"shutdown","exit_code":7,"entry":"pvh","vcpus":1,"memory_mib":512,
                    "setup_ms":1,"run_ms":9,"serial_bytes":0,"exits":{"io":0,"mmio":0,"unclaimed":0}}"#,
            )
            .unwrap()
        };
        let hung = |lost: Option<&str>| Booted {
            ending: Ending::Stopped {
                reason: ExitReason::Shutdown,
                detail: Some("vCPU 0 at rip 0x1 (not mapped)".into()),
            },
            exit: Some(exit(lost)),
            silent_for: Some(Duration::from_secs(150)),
            ..Booted::failed(Ending::Killed)
        };
        let record = passed("iperf-rx");
        let (status, reason) = judge(&hung(None), "[ 1.0] last line\n", &record, 600.0, None);
        assert_eq!(status, Status::Fail);
        assert!(reason.unwrap().starts_with("hung: no serial output for 150 s after \"[ 1.0] last line\"; vCPU 0"));
        let lost = "vCPU 0: it is at kernel address 0xffffffffc0413c60, which its own page tables do not map";
        let (status, reason) = judge(&hung(Some(lost)), "", &record, 600.0, None);
        assert_eq!(status, Status::Error);
        assert_eq!(reason.unwrap(), format!("{HOST_LOST_STATE}: {lost}"));
    }

    #[test]
    fn the_agent_s_frames_fill_the_record_over_the_workload_s_window() {
        let mut port = Vec::new();
        port.extend(encode(0, "step", false, br#"{"step":"probe","status":"ok","secs":0.4,"at":2.25}"#));
        port.extend(encode(1, "step", false, br#"{"step":"link-up","status":"ok","secs":1.5,"at":3.75}"#));
        port.extend(encode(1, "netdev-before", false, br#"{"rx_packets":1000,"rx_bytes":100000}"#));
        port.extend(encode(2, "workload-begin", false, br#"{"workload":"iperf3","direction":"rx"}"#));
        port.extend(encode(3, "workload-end", false, br#"{"workload":"iperf3","direction":"rx","exit":0}"#));
        port.extend(encode(4, "netdev-after", false, br#"{"rx_packets":81000,"rx_bytes":121100000}"#));
        let iperf = br#"{"end":{"sum_sent":{"bits_per_second":9.2e9,"retransmits":3},"sum_received":{"bits_per_second":9.14e9,"seconds":10.0}}}"#;
        port.extend(encode(5, "iperf3", false, iperf));
        let frames = crate::agent::parse(&port);
        let mut record = passed("iperf-rx");
        // Boot and link-up mapped 5000 times; the workload 48000 times more.
        let window = engine::Window { begin: Some(counters(5000)), end: Some(counters(53_000)), ..Default::default() };
        collect_agent(&mut record, &frames, &window);
        assert_eq!(record.workload.gbit_s, Some(9.14));
        assert_eq!((record.timings.driver_probe_ms, record.timings.link_up_ms), (Some(2250.0), Some(3750.0)));
        assert_eq!((record.workload.rx_packets, record.workload.rx_bytes), (Some(80_000), Some(121_000_000)));
        assert_eq!(record.maps_per_packet, Some(0.6), "48000 maps over 80000 packets");
        assert_eq!(record.workload.packets_per_s, Some(8000.0));
        assert_eq!(record.workload.retransmits, Some(3));
        assert!(record.workload.output.as_ref().unwrap()["end"].is_object(), "iperf3's JSON, verbatim");
    }

    /// Counters split by direction, with the model's own count and the live mappings.
    fn split(writable: u64, read_only: u64, model: u64, live: u64) -> Snapshot {
        let iommu = IommuCounts {
            maps: writable + read_only,
            maps_writable: writable,
            maps_read_only: read_only,
            live_mappings: live,
            ..IommuCounts::default()
        };
        Snapshot {
            iommu: Some(iommu),
            model: Some(vm_spec::counters::ModelCounters { dma_maps: model, ..Default::default() }),
        }
    }

    #[test]
    fn maps_split_by_direction_page_reuse_and_the_teardown_are_recorded() {
        let ethtool = |flips: u64, reuses: u64, frees: u64| {
            format!(
                "NIC statistics:\n     InPackets: 9\n     Queue[0] InPackets: 9\n     Queue[0] PageFlips: {flips}\n     \
                 Queue[0] PageReuses: {reuses}\n     Queue[0] PageFrees: {frees}\n     Queue[1] PageFlips: 1\n"
            )
        };
        let mut port = Vec::new();
        port.extend(encode(1, "ethtool-S-before", true, ethtool(100, 50, 10).as_bytes()));
        port.extend(encode(2, "netdev-before", false, br#"{"rx_packets":0,"tx_packets":0}"#));
        port.extend(encode(3, "workload-begin", false, br#"{"workload":"iperf3","direction":"rx"}"#));
        port.extend(encode(4, "workload-end", false, br#"{"workload":"iperf3","direction":"rx","exit":0}"#));
        port.extend(encode(5, "netdev-after", false, br#"{"rx_packets":10000,"tx_packets":5000}"#));
        port.extend(encode(6, "ethtool-S-after", true, ethtool(4100, 2050, 2010).as_bytes()));
        port.extend(encode(7, "step", false, br#"{"step":"unload","status":"ok"}"#));
        let frames = crate::agent::parse(&port);
        let mut record = passed("iperf-rx");
        // 5000 RX buffer maps and 5000 TX maps in the window; the model saw 10100 (some split).
        let window = engine::Window {
            begin: Some(split(1000, 200, 1300, 900)),
            end: Some(split(6000, 5200, 11_400, 950)),
            done: Some(split(6100, 5300, 11_600, 3)),
            ..Default::default()
        };
        collect_agent(&mut record, &frames, &window);
        assert_eq!(record.rx_maps_per_packet, Some(0.5), "5000 writable maps over 10000 packets received");
        assert_eq!(record.tx_maps_per_packet, Some(1.0), "5000 read-only maps over 5000 packets sent");
        assert_eq!(record.maps_per_packet, Some(1.0), "all 10000 maps over the packets received");
        assert_eq!(record.model_maps_per_packet, Some(1.01));
        assert_eq!(record.shown_maps(), Some(0.5), "the table's figure is the RX side");
        // Refills 4000 flips + 2000 reuses + 2000 frees: 6000 of 8000 needed no new page.
        assert_eq!(record.page_reuse, Some(0.75));
        assert_eq!(record.mappings_after_unload, Some(3));
        let booted = Booted {
            ending: Ending::Stopped { reason: ExitReason::Poweroff, detail: None },
            exit: None,
            error: None,
            iommu: None,
            device_counters: None,
            device_error: None,
            window: window.clone(),
            silent_for: None,
            answered_ms: None,
            run_ms: None,
            vmm_stderr: String::new(),
            model_ended: None,
        };
        let (status, reason) = judge(&booted, "", &record, 60.0, Some(&frames));
        assert_eq!(status, Status::Fail);
        assert_eq!(reason.unwrap(), "the driver left 3 IOMMU mapping(s) behind after it was unloaded");
        // The model died under the VM: the lab's error, whatever the guest made of it.
        let died = Booted {
            model_ended: Some("the aqc100 model ended (signal 9) during the repetition".into()),
            ..booted.clone()
        };
        let (status, reason) = judge(&died, "", &record, 60.0, Some(&frames));
        assert_eq!(
            (status, reason.as_deref()),
            (Status::Error, Some("the aqc100 model ended (signal 9) during the repetition"))
        );
        // A model that saw fewer maps than the guest made: one of the counts is wrong.
        record.mappings_after_unload = Some(0);
        record.model_maps_per_packet = Some(0.9);
        let (status, reason) = judge(&booted, "", &record, 60.0, Some(&frames));
        assert_eq!(status, Status::Error);
        assert!(reason.unwrap().contains("fewer DMA maps (0.9000 per packet) than the virtio-iommu saw"));
    }

    #[test]
    fn a_tx_workload_counts_maps_per_packet_sent() {
        let mut port = Vec::new();
        port.extend(encode(1, "netdev-before", false, br#"{"rx_packets":10,"tx_packets":100}"#));
        port.extend(encode(2, "workload-begin", false, br#"{"workload":"iperf3","direction":"tx"}"#));
        port.extend(encode(3, "workload-end", false, br#"{"workload":"iperf3","direction":"tx","exit":0}"#));
        port.extend(encode(4, "netdev-after", false, br#"{"rx_packets":2010,"tx_packets":4100}"#));
        let frames = crate::agent::parse(&port);
        let mut record = passed("iperf-tx");
        let window = engine::Window { begin: Some(counters(100)), end: Some(counters(8100)), ..Default::default() };
        collect_agent(&mut record, &frames, &window);
        assert_eq!((record.workload.rx_packets, record.workload.tx_packets), (Some(2000), Some(4000)));
        assert_eq!(record.maps_per_packet, Some(2.0), "8000 maps over 4000 packets sent, not 2000 ACKs received");
        assert_eq!(record.workload.direction, Some(Direction::Tx));
        assert_eq!(record.shown_maps(), Some(2.0), "no split in these counters: all maps over packets sent");
        assert_eq!(record.workload.rx_bytes, None, "no byte counts in the frames");
    }

    #[test]
    fn linux_cells_get_the_agent_s_words() {
        let text = "name = \"l\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n[[image]]\nname = \"debian\"\nkernel = \"/boot/vmlinux\"\n\
                    cmdline = \"quiet\"\n[[variant]]\nname = \"order3\"\nimage = \"debian\"\nparams = { \"atlantic.rxpageorder\" = 3 }\n\
                    [[workload]]\nname = \"rx\"\nkind = \"iperf3\"\nip = 6\nduration_s = 8\n";
        let plan = Plan::parse(std::path::Path::new("l.toml"), text).unwrap();
        let words = cmdline(&plan, &plan.cells[0]);
        assert_eq!(
            words,
            "quiet atlantic.rxpageorder=3 console=ttyS0 panic=-1 driverlab.nic=atlantic driverlab.mtu=1500 \
             driverlab.iperf=rx,8,6,1,tcp"
        );
    }
}

//! A repetition's verdict, from how its VM ended, what its guest reported and what its record
//! holds: the first thing that went wrong, as a [`Failure`], or none.

use vm_spec::ExitReason;

use super::output::{GuestOutput, Report};
use crate::failure::Failure;
use crate::record::Record;
use engines::{Booted, Ending};

/// The verdict: infrastructure first (the model, the engine, the host), then the guest's end
/// (a hang, a crash, a stop), then the counts, then the workload's own verdict.
pub(super) fn judge(booted: &Booted, output: &GuestOutput, record: &Record, timeout_s: f64) -> Result<(), Failure> {
    // The device's model died under the VM: whatever the guest made of it, that is the lab's.
    if let Some(ended) = &booted.model_ended {
        return Err(Failure::ModelDied { what: ended.clone() });
    }
    let (reason, detail) = match &booted.ending {
        Ending::Refused(why) | Ending::Unexplained(why) => return Err(Failure::Engine { what: why.clone() }),
        Ending::Killed => {
            return Err(Failure::Engine { what: "the VMM did not end at its timeout and was killed".into() });
        }
        Ending::Stopped { reason, detail } => (*reason, detail.clone().unwrap_or_default()),
    };
    // A vCPU found in a state no guest reaches: the host lost it, whatever the guest was doing.
    if let Some(lost) = booted.exit.as_ref().and_then(|e| e.vcpu_state_lost.as_ref()) {
        return Err(Failure::HostLostState { detail: lost.clone() });
    }
    if let Some(cut) = selftests_cut(booted, record, reason) {
        return Err(cut);
    }
    if let Some(silence) = booted.silent_for {
        // Where it stopped: the console's last line, when it printed one; and where its vCPUs
        // were when it was stopped (the VMM's exit detail), for a guest that hung before it
        // printed anything.
        let last_line = output.serial.lines().rev().map(str::trim).find(|l| !l.is_empty());
        return Err(Failure::Hang {
            silent_s: silence.as_secs_f64(),
            last_line: last_line.map(|l| l.chars().filter(|c| !c.is_control()).take(200).collect()),
            vcpus: (!detail.is_empty()).then_some(detail),
        });
    }
    match reason {
        ExitReason::KvmInternalError | ExitReason::EntryFailure => return Err(Failure::KvmRefused { detail }),
        ExitReason::VmmError | ExitReason::Shutdown => return Err(Failure::VmmStopped { reason, detail }),
        _ => {}
    }
    if let Some(crash) = &record.crash {
        return Err(Failure::Crash { crash: crash.kind, line: crash.line.clone() });
    }
    match reason {
        ExitReason::Poweroff => {}
        ExitReason::Timeout => return Err(Failure::Timeout { limit_s: timeout_s }),
        other => return Err(Failure::GuestStop { reason: other }),
    }
    if let Some(error) = &booted.device_error {
        return Err(Failure::DeviceError { what: error.clone() });
    }
    thunderbolt(record)?;
    counts(record)?;
    workload(output, record)
}

/// A kselftest workload whose KTAP stops in the middle, in a guest that died, hung or ran out
/// of time: where it stopped (the test that was running, after its last subtest) and why.
fn selftests_cut(booted: &Booted, record: &Record, reason: ExitReason) -> Option<Failure> {
    let ktap = record.workload.kselftest.as_ref().filter(|k| !k.complete())?;
    let cause = match (&record.crash, booted.silent_for, reason) {
        (Some(crash), _, _) => format!("the kernel logged {}: {}", crash.kind, crash.line),
        (None, Some(silence), _) => format!("the guest went silent for {:.0} s", silence.as_secs_f64()),
        (None, None, ExitReason::Poweroff) => return None,
        (None, None, other) => format!("the guest ended with {other}"),
    };
    let at = ktap.unfinished.clone().unwrap_or_else(|| match ktap.tests.last() {
        Some(last) => format!("the test after {}", last.short_name()),
        None => "the first test".into(),
    });
    Some(Failure::SelftestsCut { at, cause })
}

/// A device in a Thunderbolt slot must have been an untrusted one to the guest (the agent's
/// `iommu-group` step says), or the cell measured a trusted device under a Thunderbolt name.
fn thunderbolt(record: &Record) -> Result<(), Failure> {
    match &record.guest_dma {
        Some(dma) if dma.slot == vm_spec::Slot::Thunderbolt && !dma.untrusted => {
            Err(Failure::SlotNotHonoured { engine: record.engine })
        }
        _ => Ok(()),
    }
}

/// Maps the model may not have received yet when the workload's window closes: the traffic has
/// stopped by then, so those in flight are the last refills' few.
const MAPS_IN_FLIGHT: f64 = 8.0;

/// The counts' own checks: the two counts of maps agree, the driver's teardown unmapped all.
fn counts(record: &Record) -> Result<(), Failure> {
    // The engine's virtio-iommu saw the guest's maps, the model its DMA maps; a VMM may split a
    // guest map into pieces but never merge two. Maps the virtio-iommu counted just before the
    // window closed may still be on their way to the model when it is read (QEMU's vfio-user
    // client does not wait for its DMA_MAPs): a few maps short is the window's edge.
    if let (Some(guest), Some(model), Some(packets)) =
        (record.maps_per_packet, record.model_maps_per_packet, record.workload.packets())
        && (guest - model) * packets as f64 > MAPS_IN_FLIGHT
    {
        return Err(Failure::CountsDisagree { guest, model });
    }
    match record.mappings_after_unload.filter(|&n| n > 0) {
        Some(count) => Err(Failure::MappingsLeft { count }),
        None => Ok(()),
    }
}

/// The workload's verdict: the agent's (its steps, its end, the kernel's faults) or the probe's
/// (its checks), and that it measured something.
fn workload(output: &GuestOutput, record: &Record) -> Result<(), Failure> {
    let problem = |problem: &str| Err(Failure::Workload { problem: problem.into() });
    match &output.report {
        Report::Linux(frames) => {
            // The selftests' own verdict names the subtests (the agent's, the programs).
            if let Some(failed) = record.workload.kselftest.as_ref().map(|k| k.failed()).filter(|f| !f.is_empty()) {
                return Err(Failure::SelftestsFailed { failed });
            }
            let verdict = engines::agent::verdict(frames, &output.serial);
            match verdict.problems.first() {
                Some(first) => problem(first),
                // A device pulled mid-traffic (the surprise-unplug check) may end iperf3 without
                // figures: the check is the agent's steps, not the throughput.
                None if !record.workload.measured() && record.timings.pulled_ms.is_none() => {
                    problem("the workload reported nothing")
                }
                None => Ok(()),
            }
        }
        Report::Probe(report) => match report.done() {
            None => problem("the probe did not finish its report"),
            Some(done) if !done.ok => problem(&done.failures.join("; ")),
            Some(_) if record.workload.rx_packets.is_none() => problem("the workload reported nothing"),
            Some(_) => Ok(()),
        },
    }
}

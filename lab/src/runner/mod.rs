//! One repetition of one cell, in phases: set its folder up, start its device (a fresh model,
//! or the host device) and the device's traffic peer ([`device`]), make the VM's spec
//! ([`spec`]), boot it under the image's engine, read what the guest left once ([`output`]),
//! fill the record from it ([`collect`]) and judge it ([`judge`]).

mod collect;
mod device;
mod judge;
mod output;
mod snapshot;
mod spec;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::env::LabEnv;
use crate::failure::{CrashKind, Failure};
use crate::images::RunPlan;
use crate::matrix::{Cell, DeviceSource, Image, Workload};
use crate::record::{Attempt, BootKind, Crash, Record, Status};
use device::StartedDevice;
use engines::{BootRequest, Booted, Engine, Start, Watch};
use snapshot::CellSnapshot;
pub use snapshot::{PrunedSnapshot, SNAPSHOT_LEFTOVER_AGE, prune_snapshots, snapshots_dir};
use vm_spec::VmSpec;

/// What every repetition of a run shares.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The run.
    pub run: String,
    /// Where the run's artifacts go.
    pub artifacts: PathBuf,
}

impl RunContext {
    /// The artifacts folder of repetition `repetition` of `cell`.
    fn rep_dir(&self, cell: &Cell, repetition: u32) -> PathBuf {
        self.artifacts.join(&cell.id).join(format!("rep{repetition}"))
    }
}

/// Moves the artifacts of an attempt of a repetition that is run again to
/// `CELL/repN.attempt{attempt}`, so that the next attempt starts afresh and the spoiled one stays
/// readable; the new folder relative to the artifacts folder, if the move worked.
pub fn set_attempt_aside(ctx: &RunContext, cell: &Cell, repetition: u32, attempt: usize) -> Option<String> {
    set_aside(ctx, cell, repetition, &format!("attempt{attempt}"))
}

/// Moves the repetition's artifacts to `CELL/repN.{suffix}`; the new folder relative to the
/// artifacts folder, if the move worked.
fn set_aside(ctx: &RunContext, cell: &Cell, repetition: u32, suffix: &str) -> Option<String> {
    let from = ctx.rep_dir(cell, repetition);
    let to = ctx.artifacts.join(&cell.id).join(format!("rep{repetition}.{suffix}"));
    match std::fs::rename(&from, &to) {
        Ok(()) => to.strip_prefix(&ctx.artifacts).ok().map(|p| p.display().to_string()),
        Err(e) => {
            tracing::warn!("setting {} aside: {e}", from.display());
            None
        }
    }
}

/// Runs repetition `repetition` of `cell`. A repetition restored from its cell's snapshot that
/// does not pass is run again booted, once, which tells a snapshot's problem from the
/// variant's: the booted run's record counts, the restored one is among its `retried`.
pub fn run(env: &LabEnv, plan: &RunPlan, ctx: &RunContext, cell: &Cell, repetition: u32) -> Record {
    let start = Instant::now();
    let attempt = |cold: bool| {
        let mut record = Record::begun(&ctx.run, cell, repetition);
        let verdict = Repetition::new(env, plan, ctx, cell, repetition, cold).and_then(|rep| rep.run(&mut record));
        record.judged(verdict.err())
    };
    let mut record = attempt(false);
    if record.boot == Some(BootKind::Restored) && record.status != Status::Pass {
        let reason = format!(
            "restored from its cell's snapshot, it ended {}: {}; run again booted",
            record.status,
            record.reason.clone().unwrap_or_default()
        );
        let artifacts = set_aside(ctx, cell, repetition, "restored");
        record = attempt(true);
        record.retried.push(Attempt { reason, artifacts });
    }
    record.timings.total_ms = ms(start.elapsed());
    record
}

/// One repetition, with what it runs looked up in the plan.
struct Repetition<'a> {
    env: &'a LabEnv,
    plan: &'a RunPlan,
    ctx: &'a RunContext,
    cell: &'a Cell,
    image: &'a Image,
    source: &'a DeviceSource,
    dir: PathBuf,
    /// Boot, whatever the matrix says (the re-run of a restored repetition that failed).
    cold: bool,
}

impl<'a> Repetition<'a> {
    fn new(
        env: &'a LabEnv,
        plan: &'a RunPlan,
        ctx: &'a RunContext,
        cell: &'a Cell,
        repetition: u32,
        cold: bool,
    ) -> Result<Repetition<'a>, Failure> {
        let (Some(image), Some(source)) = (plan.plan.image(&cell.image), plan.plan.source(&cell.device)) else {
            return Err(Failure::Setup { what: format!("cell {} names what its matrix lacks", cell.id) });
        };
        Ok(Repetition { env, plan, ctx, cell, image, source, dir: ctx.rep_dir(cell, repetition), cold })
    }

    /// Whether the image is a Linux kernel (with the guest agent) rather than the probe.
    fn linux(&self) -> bool {
        !self.image.is_probe()
    }

    /// Runs the repetition, filling `record`; its verdict.
    fn run(&self, record: &mut Record) -> Result<(), Failure> {
        record.engine = self.image.engine;
        // A full disk is named as such, not left to fail as a model that did not start.
        crate::disk::check_room(&self.dir).map_err(|e| Failure::Setup { what: e.to_string() })?;
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| Failure::Setup { what: format!("artifacts folder {}: {e}", self.dir.display()) })?;
        let engine = self.env.engine(self.image.engine).map_err(|why| Failure::Setup { what: why.to_string() })?;
        let (device, spec, snapshot) = self.device_and_start(engine, record)?;
        let vm_dir = snapshot.as_deref().map(CellSnapshot::vm_dir);
        // A restored guest's agent takes the cell's own words from COM2 and, when it shares its
        // snapshot with other driver builds, its image's modules from the payload window.
        let line = self.restored_words(&spec);
        let payload = self.split_initrd(&spec).map(|split| split.payload.as_path());
        let start = match &vm_dir {
            Some(dir) => Start::Restore { dir, com2_input: Some(&line), payload },
            None => Start::Boot,
        };
        record.boot = Some(if snapshot.is_some() { BootKind::Restored } else { BootKind::Booted });
        let files = self.plan.files(&self.image.name);
        let unplug = self
            .plan
            .plan
            .workload(&self.cell.workload)
            .and_then(Workload::unplug)
            .map(|(after, kind)| engines::Unplug { after: Duration::from_secs_f64(after), kind });
        let watch = Watch {
            silence: Duration::from_secs_f64(self.plan.plan.matrix.silence_s),
            agent_log: self.linux().then(|| self.dir.join(output::AGENT_LOG)),
            unplug,
        };
        let booted = engine.boot(BootRequest {
            spec,
            watch,
            model: device.model,
            counters: device.counters,
            dir: &self.dir,
            bzimage: files.and_then(|f| f.bzimage.as_deref()),
            accel: self.image.accel,
            start,
        });
        drop(device.peer);
        if let Some(folder) = &snapshot {
            self.prepend_snapshot_logs(folder);
        }
        if !booted.vmm_stderr.is_empty() {
            let _ = std::fs::write(self.dir.join("vmm.log"), &booted.vmm_stderr);
        }
        let output = output::GuestOutput::read(&self.dir, self.linux());
        record.serial_log =
            self.dir.join(output::SERIAL_LOG).strip_prefix(&self.ctx.artifacts).ok().map(|p| p.display().to_string());
        let nic = self.plan.plan.device(&self.cell.device).and_then(|d| d.nic());
        let workload = self.plan.plan.workload(&self.cell.workload);
        collect::fill(record, &booted, &output, nic, self.slot(), workload);
        let verdict = judge::judge(&booted, &output, record, self.plan.plan.matrix.timeout_s);
        mark_hang(record, &booted, verdict.as_ref().err());
        verdict
    }
}

impl Repetition<'_> {
    /// The device, the VM's spec (the cell's, booted or restored) and the snapshot folder it
    /// starts from (`None`: it boots). A snapshot the store lacks is taken first, with a device
    /// of its own (a model serves one VM), and a fresh device is started for the repetition.
    fn device_and_start(
        &self,
        engine: &dyn Engine,
        record: &mut Record,
    ) -> Result<(StartedDevice, VmSpec, Option<PathBuf>), Failure> {
        let device = self.start_device(record)?;
        let booted = self.vm_spec(&device)?;
        if self.cold || !self.starts_from_snapshot(&booted) {
            return Ok((device, booted, None));
        }
        let spec = self.snapshot_spec(booted.clone());
        match self.cell_snapshot(&spec) {
            CellSnapshot::Ready(folder) => Ok((device, booted, Some(folder))),
            CellSnapshot::Failed(why) => {
                tracing::info!("cell {}: boots; its snapshot could not be taken in this run: {why}", self.cell.id);
                Ok((device, booted, None))
            }
            CellSnapshot::Missing(folder, key) => {
                let taken = self.take_snapshot(engine, spec, device, (&folder, &key));
                let device = self.start_device(record)?;
                let booted = self.vm_spec(&device)?;
                Ok((device, booted, taken.ok()))
            }
        }
    }
}

/// A guest that failed by falling silent, with no crash in its log, shows as a hang among the
/// cell's crashes.
fn mark_hang(record: &mut Record, booted: &Booted, failure: Option<&Failure>) {
    if let (Some(failure), Some(silence), None) = (failure, booted.silent_for, &record.crash)
        && failure.status() == crate::record::Status::Fail
    {
        record.crash = Some(Crash {
            kind: CrashKind::Hang,
            line: format!("no serial output for {:.0} s", silence.as_secs_f64()),
            frames: Vec::new(),
            fingerprint: "hang".into(),
        });
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

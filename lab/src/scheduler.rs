//! Running a matrix: which cells this host can run, then one worker per device, in parallel. A
//! worker takes the device's exclusive lease (host devices; a model is a fresh process per VM),
//! checks its health before the first repetition and after any that did not pass, quarantines it
//! when the check fails, and runs the device's repetitions round by round (repetition 1 of every
//! cell, then repetition 2, ...) so slow drift affects every cell alike. Each record is committed
//! as it is made.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::env::{HostFacts, LabEnv};
use crate::failure::Failure;
use crate::images::RunPlan;
use crate::matrix::{Cell, DeviceSource, EngineKind, Plan, Workload};
use crate::record::{Attempt, Record, Status};
use crate::results_db::{ResultsDb, ResultsDbError, RunState};
use crate::runner::{self, RunContext};
use engines::health;
use engines::qemu::Accel;

/// How often a worker asks again for a device another run holds.
const LEASE_POLL: Duration = Duration::from_secs(2);

/// How many times a repetition the host spoiled ([`Record::spoiled_by_host`]) is run again.
const HOST_FAULT_RETRIES: usize = 1;

/// Errors running a matrix.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The database failed.
    #[error(transparent)]
    ResultsDb(#[from] ResultsDbError),
    /// Cells this host cannot run, each with its reason.
    #[error("{} cell(s) cannot run on this host:\n{}\n(--skip-unrunnable records them as SKIP and runs the rest)",
        .0.len(), .0.iter().map(|(c, r)| format!("  {} {}: {r}", c.id, c.key())).collect::<Vec<_>>().join("\n"))]
    Unrunnable(Vec<(Cell, String)>),
}

/// What happens as a run goes.
pub trait Progress: Send + Sync {
    /// A repetition was recorded; `done` of `total` have results.
    fn recorded(&self, record: &Record, done: usize, total: usize);
    /// Something worth a line (a health check, a quarantine, waiting for a lease).
    fn note(&self, line: &str);
}

/// How a run ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Records by status, over the whole run.
    pub counts: std::collections::BTreeMap<Status, usize>,
    /// Whether it was cancelled before every repetition ran.
    pub cancelled: bool,
}

/// Why the cells of `plan` cannot run on the host of `env`, if they cannot.
pub fn refusals(env: &LabEnv, plan: &RunPlan) -> Vec<(Cell, String)> {
    let qemu = env.engine(EngineKind::Qemu).err();
    plan.plan.cells.iter().filter_map(|cell| refusal(&env.host, qemu, plan, cell).map(|r| (cell.clone(), r))).collect()
}

/// Why `cell` cannot run on `host` (where `qemu` says why QEMU cannot, if it cannot).
fn refusal(host: &HostFacts, qemu: Option<&str>, plan: &RunPlan, cell: &Cell) -> Option<String> {
    let (image, device, source) =
        (plan.plan.image(&cell.image)?, plan.plan.device(&cell.device)?, plan.plan.source(&cell.device)?);
    let traffic = plan.plan.workload(&cell.workload).is_some_and(Workload::needs_peer);
    let host_device = matches!(source, DeviceSource::Host { .. });
    let viommu = plan.files(&image.name).and_then(|r| r.manifest.as_ref()).and_then(|m| m.viommu_refusal());
    if let Some(refusal) = viommu.filter(|_| image.iommu) {
        Some(format!("image {:?}: {refusal}", image.name))
    } else if let Some(refusal) = engine_refusal(image, host, qemu) {
        Some(refusal)
    } else if !image.is_probe() && image.engine == EngineKind::Driverlab && !host.virt.boots_linux() {
        Some(format!(
            "image {:?} is a Linux kernel, and driverlab's VMM boots Linux only with hardware virtualization; this host has {}",
            image.name,
            host.virt.describe()
        ))
    } else if traffic && host_device && device.peer.is_none() {
        Some(format!(
            "device {:?}: a workload against a peer (iperf3, packet-rate, latency, xdp, kselftest) on a host device needs its peer on the NIC's wire: \
             set peer = \"user@host\" (SSH with a key, the workload's server installed there: docs/hardware.md) and its addresses (peer_ip, guest_ip)",
            device.name
        ))
    } else if traffic && host_device && !host.ssh {
        Some(format!(
            "device {:?}: its peer is reached over SSH, and there is no {} here (apt-get install openssh-client)",
            device.name,
            engines::peer::ssh_program()
        ))
    } else if traffic && !host_device && !host.root {
        Some(
            "a workload against a peer (iperf3, packet-rate, latency, xdp, kselftest) on a model needs its peer's network namespace, which needs root"
                .into(),
        )
    } else if host_device && !host.vfio {
        Some(
            "the device is a host PCI device and this host has no kernel VFIO (`driverlab doctor --device BDF`)".into(),
        )
    } else {
        None
    }
}

/// Why the image's engine cannot run on `host`, if it cannot.
fn engine_refusal(image: &crate::matrix::Image, host: &HostFacts, qemu: Option<&str>) -> Option<String> {
    if image.engine != EngineKind::Qemu {
        return None;
    }
    if let Some(why) = qemu {
        return Some(format!("image {:?} runs under QEMU: {why}", image.name));
    }
    (image.accel == Accel::Kvm && !host.virt.boots_linux()).then(|| {
        format!(
            "image {:?} asks for QEMU with KVM, and this host's KVM cannot run Linux ({}); use accel = \"tcg\"",
            image.name,
            host.virt.describe()
        )
    })
}

/// Records SKIP for every repetition of the cells `refused` names.
pub fn record_skips(store: &mut ResultsDb, run: &str, plan: &Plan, refused: &[(Cell, String)]) -> Result<(), LabError> {
    let skipped: Vec<(Cell, Failure)> =
        refused.iter().map(|(cell, why)| (cell.clone(), Failure::Unrunnable { why: why.clone() })).collect();
    record_unrun(store, run, plan, &skipped)
}

/// Records every repetition of each cell of `unrun` as not run, for its failure (a SKIP, a
/// prefix's BUILD-FAIL); a repetition with a result keeps it.
pub fn record_unrun(store: &mut ResultsDb, run: &str, plan: &Plan, unrun: &[(Cell, Failure)]) -> Result<(), LabError> {
    let repetitions =
        unrun.iter().flat_map(|(cell, failure)| plan.repetitions_of(cell).map(move |r| (cell, r, failure.clone())));
    record_not_run(store, run, plan, repetitions)
}

/// Records the repetitions past the first of each prefix check's cell (`--every-prefix`) as
/// SKIP: a check runs once.
pub fn record_checks_once(store: &mut ResultsDb, run: &str, plan: &Plan) -> Result<(), LabError> {
    let once = Failure::Unrunnable { why: "a prefix check runs once".into() };
    let checks = plan.cells.iter().filter(|c| plan.workload(&c.workload).is_some_and(Workload::is_prefix_check));
    let once = &once;
    let repetitions =
        checks.flat_map(|cell| plan.repetitions_of(cell).filter(|&r| r > 0).map(move |r| (cell, r, once.clone())));
    record_not_run(store, run, plan, repetitions)
}

/// Records each (cell, repetition, failure) of `unrun` as not run, in one transaction.
fn record_not_run<'a>(
    store: &mut ResultsDb,
    run: &str,
    plan: &Plan,
    unrun: impl IntoIterator<Item = (&'a Cell, u32, Failure)>,
) -> Result<(), LabError> {
    let records: Vec<Record> = unrun
        .into_iter()
        .map(|(cell, repetition, failure)| {
            let engine = plan.image(&cell.image).map(|i| i.engine).unwrap_or_default();
            Record::not_run(run, cell, repetition, engine, failure)
        })
        .collect();
    store.record_all(&records)?;
    Ok(())
}

/// The identity of a device for leases and quarantine (see [`crate::matrix::Device::lease_key`]).
fn lease_key(plan: &Plan, device: &str) -> Option<String> {
    plan.device(device)?.lease_key()
}

/// Runs every repetition of `run` that has no result yet, and marks the run done (or cancelled).
pub fn execute(
    store: Arc<Mutex<ResultsDb>>,
    env: &LabEnv,
    plan: &RunPlan,
    run: &str,
    progress: &dyn Progress,
    cancel: &AtomicBool,
) -> Result<Outcome, LabError> {
    execute_some(&store, env, plan, run, &|_, _| true, progress, cancel)?;
    finish(&store, run, cancel)
}

/// Marks `run` done (or cancelled, when `cancel` is set); its counts.
pub fn finish(store: &Mutex<ResultsDb>, run: &str, cancel: &AtomicBool) -> Result<Outcome, LabError> {
    let cancelled = cancel.load(Ordering::SeqCst);
    let store = lock(store);
    store.finish_run(run, if cancelled { RunState::Cancelled } else { RunState::Done })?;
    Ok(Outcome { counts: store.result_counts(run)?.by_status, cancelled })
}

/// Runs the repetitions of `run` that `wanted` picks (a cell and a repetition) and that have no
/// result yet, each device's in turn on its own worker.
pub fn execute_some(
    store: &Arc<Mutex<ResultsDb>>,
    env: &LabEnv,
    plan: &RunPlan,
    run: &str,
    wanted: &(dyn Fn(&Cell, u32) -> bool + Sync),
    progress: &dyn Progress,
    cancel: &AtomicBool,
) -> Result<(), LabError> {
    let artifacts = lock(store).artifacts(run);
    let done: BTreeSet<(usize, u32)> = lock(store).done(run)?.into_iter().collect();
    let matrix = &plan.plan.matrix;
    let total = plan.plan.results();
    let recorded = Mutex::new(done.len());
    let ctx = RunContext { run: run.to_string(), artifacts };
    let devices: Vec<String> = matrix.devices.iter().map(|d| d.get_ref().name.clone()).collect();
    let errors: Mutex<Vec<LabError>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for device in &devices {
            let pending: Vec<(u32, &Cell)> = (0..matrix.repetitions)
                .flat_map(|rep| plan.plan.cells.iter().filter(|c| c.device == *device).map(move |c| (rep, c)))
                .filter(|(rep, c)| plan.plan.holds(c, *rep) && !done.contains(&(c.index, *rep)) && wanted(c, *rep))
                .collect();
            if pending.is_empty() {
                continue;
            }
            // A series' prefix checks come before everything else (`--every-prefix`).
            let mut pending = pending;
            pending.sort_by_key(|(_, c)| !plan.plan.workload(&c.workload).is_some_and(Workload::is_prefix_check));
            let (store, ctx, recorded, errors) = (&**store, &ctx, &recorded, &errors);
            scope.spawn(move || {
                let worker = Worker { store, env, ctx, plan, device, progress, cancel, recorded, total };
                if let Err(e) = worker.run(pending) {
                    lock(errors).push(e);
                }
            });
        }
    });
    match errors.into_inner().unwrap_or_else(|p| p.into_inner()).pop() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Runs a repetition by `attempt`, and again, up to [`HOST_FAULT_RETRIES`] times, while the host
/// (`emulated_host`: one whose CPU TCG emulates) spoils it ([`Record::spoiled_by_host`]): each
/// spoiled attempt is set aside (`set_aside(n)`
/// keeps the `n`th attempt's artifacts and says where), told (`note`) and listed in the record
/// that counts.
fn with_retries(
    emulated_host: bool,
    mut attempt: impl FnMut() -> Record,
    mut set_aside: impl FnMut(usize) -> Option<String>,
    note: impl Fn(&str),
) -> Record {
    let mut record = attempt();
    let mut retried = Vec::new();
    while record.spoiled_by_host(emulated_host) && retried.len() < HOST_FAULT_RETRIES {
        let reason = record.reason.clone().unwrap_or_default();
        note(&reason);
        retried.push(Attempt { reason, artifacts: set_aside(retried.len() + 1) });
        record = attempt();
    }
    // Host faults first, then whatever the attempt that counts retried itself (a restored
    // attempt run again booted).
    retried.append(&mut record.retried);
    record.retried = retried;
    record
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One device's share of a run.
struct Worker<'a> {
    store: &'a Mutex<ResultsDb>,
    env: &'a LabEnv,
    ctx: &'a RunContext,
    plan: &'a RunPlan,
    device: &'a str,
    progress: &'a dyn Progress,
    cancel: &'a AtomicBool,
    recorded: &'a Mutex<usize>,
    total: usize,
}

impl Worker<'_> {
    fn run(&self, pending: Vec<(u32, &Cell)>) -> Result<(), LabError> {
        let key = lease_key(&self.plan.plan, self.device);
        if let Some(key) = &key {
            if let Some(reason) = lock(self.store).quarantined(key)? {
                let why = format!("device {key} is quarantined: {reason}");
                return self.give_up(&pending, Failure::DeviceUnhealthy { why });
            }
            if !self.lease(key)? {
                let why = "cancelled while waiting for the device".into();
                return self.give_up(&pending, Failure::Cancelled { why });
            }
        }
        let result = self.run_leased(&pending, key.as_deref());
        if let Some(key) = &key {
            lock(self.store).release(key, &self.ctx.run)?;
        }
        result
    }

    /// Waits for the device's lease; false if cancelled first.
    fn lease(&self, key: &str) -> Result<bool, LabError> {
        let mut told = false;
        loop {
            match lock(self.store).acquire(key, &self.ctx.run)? {
                Ok(()) => return Ok(true),
                Err(holder) if !told => {
                    self.progress.note(&format!(
                        "waiting for device {key}, leased by run {} (pid {} on {})",
                        holder.run, holder.pid, holder.host
                    ));
                    told = true;
                }
                Err(_) => {}
            }
            if self.cancel.load(Ordering::SeqCst) {
                return Ok(false);
            }
            std::thread::sleep(LEASE_POLL);
        }
    }

    fn run_leased(&self, pending: &[(u32, &Cell)], key: Option<&str>) -> Result<(), LabError> {
        let mut healthy = false;
        for (i, &(rep, cell)) in pending.iter().enumerate() {
            if self.cancel.load(Ordering::SeqCst) {
                return self.give_up(&pending[i..], Failure::Cancelled { why: "the run was cancelled".into() });
            }
            if !healthy {
                if let Err(reason) = self.health_check() {
                    if let Some(key) = key {
                        lock(self.store).quarantine(key, &reason)?;
                    }
                    self.progress.note(&format!("device {} quarantined: {reason}", self.device));
                    let why = format!("device {} failed its health check: {reason}", self.device);
                    return self.give_up(&pending[i..], Failure::DeviceUnhealthy { why });
                }
            }
            let record = with_retries(
                self.env.host.emulated_by_tcg,
                || runner::run(self.env, self.plan, self.ctx, cell, rep),
                |attempt| runner::set_attempt_aside(self.ctx, cell, rep, attempt),
                |reason| self.progress.note(&format!("{} rep {}: {reason}; running it again", cell.id, rep + 1)),
            );
            // A repetition that did not pass may have left the device broken: check it again
            // before the next one.
            healthy = record.status == Status::Pass;
            self.store_record(&record)?;
        }
        Ok(())
    }

    /// The probe's NIC checks on the device; the reason when they fail. Its serial log is an
    /// artifact of the run (`health/DEVICE`).
    fn health_check(&self) -> Result<(), String> {
        let (Some(device), Some(source)) = (self.plan.plan.device(self.device), self.plan.plan.source(self.device))
        else {
            return Err(format!("the run's matrix has no device {:?}", self.device));
        };
        let engine = self.env.engine(EngineKind::Driverlab).map_err(String::from)?;
        let dir = self.ctx.artifacts.join("health").join(self.device);
        let health = health::check_device(engine, &self.env.programs.model, &dir, source, device.nic())?;
        self.progress.note(&format!("health {}", health.verdict()));
        if health.ok {
            // What the box's device is (its firmware, its link), for the run's box.
            if let Err(e) = lock(self.store).saw_health(&self.ctx.run, self.device, &health) {
                tracing::warn!("run {}: the box's device {} not stored: {e}", self.ctx.run, self.device);
            }
        }
        if health.ok { Ok(()) } else { Err(health.failures.join("; ")) }
    }

    /// Records every repetition of `pending` as not run for `failure` (MISS when cancelled,
    /// ERROR when the device is unhealthy), in one transaction however many there are.
    fn give_up(&self, pending: &[(u32, &Cell)], failure: Failure) -> Result<(), LabError> {
        let records: Vec<Record> = pending
            .iter()
            .map(|&(rep, cell)| {
                let engine = self.plan.plan.image(&cell.image).map(|i| i.engine).unwrap_or_default();
                Record::not_run(&self.ctx.run, cell, rep, engine, failure.clone())
            })
            .collect();
        let fresh = lock(self.store).record_all(&records)?;
        let done = {
            let mut n = lock(self.recorded);
            *n += fresh;
            *n
        };
        if let Some(last) = records.last() {
            self.progress.recorded(last, done, self.total);
        }
        Ok(())
    }

    fn store_record(&self, record: &Record) -> Result<(), LabError> {
        let fresh = lock(self.store).record(record)?;
        let done = {
            let mut n = lock(self.recorded);
            if fresh {
                *n += 1;
            }
            *n
        };
        self.progress.recorded(record, done, self.total);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::failure::CrashKind;
    use crate::record::test_record;
    use vm_spec::host::Virtualization;

    /// A Linux iperf3 matrix on `device` (TOML lines), with a kernel file that exists.
    fn plan(dir: &Path, device: &str) -> RunPlan {
        std::fs::write(dir.join("vmlinux"), b"ELF").unwrap();
        let text = format!(
            "name = \"m\"\n[[device]]\nname = \"nic\"\n{device}\n[[image]]\nname = \"debian\"\nkernel = \"vmlinux\"\n\
             [[variant]]\nname = \"stock\"\nimage = \"debian\"\n[[workload]]\nname = \"rx\"\nkind = \"iperf3\"\n"
        );
        prepared(dir, Plan::parse(&dir.join("m.toml"), &text).unwrap())
    }

    fn prepared(dir: &Path, plan: Plan) -> RunPlan {
        let store = guest_images::store::ImageStore::new(dir.join("images"));
        RunPlan::prepare(plan, &store, &|_| {}).unwrap()
    }

    /// Every cell's refusal on `host` (where `qemu` says why QEMU cannot run, if it cannot).
    fn reasons_with(plan: &RunPlan, host: &HostFacts, qemu: Option<&str>) -> Vec<String> {
        plan.plan.cells.iter().filter_map(|cell| refusal(host, qemu, plan, cell)).collect()
    }

    fn reasons(plan: &RunPlan, host: &HostFacts) -> Vec<String> {
        reasons_with(plan, host, None)
    }

    /// A host with hardware virtualization or PVM, kernel VFIO, root and SSH, or not.
    fn host(hardware: bool, vfio: bool, root: bool, ssh: bool) -> HostFacts {
        let virt = if hardware { Virtualization::Hardware("svm") } else { Virtualization::Pvm };
        HostFacts { virt, vfio, root, ssh, emulated_by_tcg: false }
    }

    #[test]
    fn a_repetition_the_host_spoils_is_run_again_once_and_the_spoiled_attempt_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan(dir.path(), "model = \"aqc100\"");
        let cell = &plan.plan.cells[0];
        let failed = |failure: Failure| Record::begun("r", cell, 0).judged(Some(failure));
        let spoiled = || {
            failed(Failure::HostLostState {
                detail: "vCPU 0: its page tables (cr3 0x123000) are outside guest memory".into(),
            })
        };
        let passed = || test_record("r", cell, 0, Status::Pass, "");
        let notes = std::cell::RefCell::new(Vec::new());
        let note = |n: &str| notes.borrow_mut().push(n.to_string());

        // Spoiled, then passed: the pass counts and lists the spoiled attempt.
        let mut attempts = vec![passed(), spoiled()];
        let record = with_retries(false, || attempts.pop().unwrap(), |n| Some(format!("c01/rep0.attempt{n}")), note);
        assert_eq!(record.status, Status::Pass);
        assert_eq!(record.retried.len(), 1);
        assert_eq!(record.retried[0].artifacts.as_deref(), Some("c01/rep0.attempt1"));
        assert!(record.retried[0].reason.starts_with("the host's virtualization lost"));
        assert_eq!(notes.borrow().len(), 1);

        // Spoiled twice: run again once only, and the second spoiled attempt is the record.
        let mut attempts = vec![spoiled(), spoiled(), passed()];
        let record = with_retries(false, || attempts.remove(0), |_| None, |_| {});
        assert!(record.spoiled_by_host(false) && record.retried.len() == 1);
        assert_eq!(attempts.len(), 1, "the third attempt did not run");

        // A guest that died on its own (no lost state: a hang, a triple fault, a crash in its
        // log) is run again only on a host TCG emulates; a workload's verdict never is.
        let hung = failed(Failure::Hang { silent_s: 150.0, last_line: None, vcpus: None });
        let faulted = failed(Failure::GuestStop { reason: vm_spec::ExitReason::TripleFault });
        let oops = failed(Failure::Crash { crash: CrashKind::Oops, line: "BUG: unable to handle page fault".into() });
        let verdict = failed(Failure::Workload { problem: "iperf3 ended with exit code 1".into() });
        for (failed, emulated, runs_wanted) in [
            (&hung, false, 1),
            (&hung, true, 2),
            (&faulted, false, 1),
            (&faulted, true, 2),
            (&oops, true, 2),
            (&verdict, true, 1),
        ] {
            let mut runs = 0;
            let record = with_retries(
                emulated,
                || {
                    runs += 1;
                    failed.clone()
                },
                |_| None,
                |_| {},
            );
            assert_eq!((runs, record.retried.len()), (runs_wanted, runs_wanted - 1), "{:?} {emulated}", failed.reason);
        }
    }

    #[test]
    fn each_cell_is_refused_for_the_first_thing_this_host_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let model = plan(dir.path(), "model = \"aqc100\"");
        let bare = plan(dir.path(), "bdf = \"0000:63:00.0\"");
        let peered = plan(dir.path(), "bdf = \"0000:63:00.0\"\npeer = \"lab@peer\"");
        let able = host(true, true, true, true);
        assert!(reasons(&model, &able).is_empty() && reasons(&peered, &able).is_empty());

        let first = |plan: &RunPlan, host: &HostFacts| reasons(plan, host).first().cloned().unwrap_or_default();
        assert!(
            first(&model, &host(false, true, true, true)).contains("boots Linux only with hardware virtualization")
        );
        assert!(first(&model, &host(true, true, false, true)).contains("needs root"));
        assert!(reasons(&peered, &host(true, true, false, true)).is_empty(), "a remote peer needs no namespace");
        assert!(first(&bare, &able).contains("set peer = \"user@host\""), "{}", first(&bare, &able));
        assert!(first(&peered, &host(true, true, true, false)).contains("openssh-client"));
        assert!(first(&peered, &host(true, false, true, true)).contains("no kernel VFIO"));

        // Under QEMU with TCG, a Linux image runs without hardware virtualization; it needs QEMU.
        let text = "name = \"m\"\n[[device]]\nname = \"nic\"\nmodel = \"aqc100\"\n[[image]]\nname = \"debian\"\nkernel = \"vmlinux\"\n\
                    engine = \"qemu\"\nACCEL\n[[variant]]\nname = \"stock\"\nimage = \"debian\"\n[[workload]]\nname = \"rx\"\nkind = \"iperf3\"\n";
        let parse = |accel: &str| Plan::parse(&dir.path().join("q.toml"), &text.replace("ACCEL", accel)).unwrap();
        let tcg = prepared(dir.path(), parse(""));
        let kvm = prepared(dir.path(), parse("accel = \"kvm\""));
        let pvm = host(false, false, true, false);
        assert!(reasons(&tcg, &pvm).is_empty(), "{:?}", reasons(&tcg, &pvm));
        assert!(first(&kvm, &pvm).contains("use accel = \"tcg\""), "{}", first(&kvm, &pvm));
        let no_qemu = reasons_with(&tcg, &pvm, Some("no QEMU at /x"));
        assert!(no_qemu[0].contains("runs under QEMU: no QEMU at /x"), "{no_qemu:?}");
    }
}

//! Running a matrix: which cells this host can run, then one worker per device, in parallel. A
//! worker takes the device's exclusive lease (host devices; a model is a fresh process per VM),
//! checks its health before the first repetition and after any that did not pass, quarantines it
//! when the check fails, and runs the device's repetitions round by round (repetition 1 of every
//! cell, then repetition 2, ...) so slow drift affects every cell alike. Each record is committed
//! as it is made.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vm_spec::host::virtualization;

use guest_images::store::ImageStore;

use crate::health;
use crate::matrix::{Cell, DeviceSource, EngineKind, Plan, Workload};
use crate::qemu::Accel;
use crate::record::{Attempt, Record, Status};
use crate::runner::{self, RunContext};
use crate::store::{RunState, Store, StoreError};

/// How often a worker asks again for a device another run holds.
const LEASE_POLL: Duration = Duration::from_secs(2);

/// How many times a repetition the host spoiled ([`Record::spoiled_by_host`]) is run again.
const HOST_FAULT_RETRIES: usize = 1;

/// Errors running a matrix.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Cells this host cannot run, each with its reason.
    #[error("{} cell(s) cannot run on this host:\n{}\n(--skip-unrunnable records them as SKIP and runs the rest)",
        .0.len(), .0.iter().map(|(c, r)| format!("  {} {}: {r}", c.id, c.key())).collect::<Vec<_>>().join("\n"))]
    Unrunnable(Vec<(Cell, String)>),
    /// A file the matrix names is missing.
    #[error("{0}")]
    Missing(String),
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

/// Why the cells of `plan` cannot run here, if they cannot. A Linux image that does not resolve
/// (a missing file, an unknown image ID) is the matrix's mistake, not the host's.
pub fn refusals(plan: &Plan) -> Result<Vec<(Cell, String)>, LabError> {
    let host = Host {
        virt: virtualization(),
        vfio: Path::new("/dev/vfio/vfio").exists(),
        root: crate::peer::can_create(),
        ssh: ssh_found(),
        qemu: crate::qemu::Qemu::find(&crate::qemu::default_root()).err().map(|e| e.to_string()),
    };
    refusals_on(plan, &host)
}

/// What decides whether a cell can run on a host.
struct Host {
    virt: vm_spec::host::Virtualization,
    vfio: bool,
    root: bool,
    ssh: bool,
    /// Why QEMU cannot run here, when it cannot.
    qemu: Option<String>,
}

fn refusals_on(plan: &Plan, host: &Host) -> Result<Vec<(Cell, String)>, LabError> {
    let (virt, vfio) = (&host.virt, host.vfio);
    let store = ImageStore::new(guest_images::store::default_root());
    let mut refused = Vec::new();
    for cell in &plan.cells {
        let image = plan.image(&cell.image).expect("checked");
        let device = plan.device(&cell.device).expect("checked");
        let resolved = if image.is_probe() {
            None
        } else {
            Some(crate::images::resolve(plan, image, &store).map_err(LabError::Missing)?)
        };
        let iperf = matches!(plan.workload(&cell.workload), Some(Workload::Iperf3 { .. }));
        let host_device = matches!(device.source(), Ok(DeviceSource::Host { .. }));
        let reason = if let Some(refusal) =
            resolved.as_ref().and_then(|r| r.manifest.as_ref()).and_then(|m| m.viommu_refusal()).filter(|_| image.iommu)
        {
            Some(format!("image {:?}: {refusal}", image.name))
        } else if let Some(refusal) = engine_refusal(image, host) {
            Some(refusal)
        } else if !image.is_probe() && image.engine == EngineKind::Driverlab && !virt.boots_linux() {
            Some(format!(
                "image {:?} is a Linux kernel, and driverlab's VMM boots Linux only with hardware virtualization; this host has {}",
                image.name,
                virt.describe()
            ))
        } else if iperf && host_device && device.peer.is_none() {
            Some(format!(
                "device {:?}: an iperf3 workload on a host device needs its peer on the NIC's wire: set peer = \"user@host\" \
                 (SSH with a key, iperf3 installed there) and its addresses (peer_ip, guest_ip)",
                device.name
            ))
        } else if iperf && host_device && !host.ssh {
            Some(format!(
                "device {:?}: its peer is reached over SSH, and there is no {} here (apt-get install openssh-client)",
                device.name,
                crate::peer::ssh_program()
            ))
        } else if iperf && !host_device && !host.root {
            Some("an iperf3 workload on a model needs its peer's network namespace, which needs root".into())
        } else if host_device && !vfio {
            Some(
                "the device is a host PCI device and this host has no kernel VFIO (`driverlab doctor --device BDF`)"
                    .into(),
            )
        } else {
            None
        };
        if let Some(reason) = reason {
            refused.push((cell.clone(), reason));
        }
    }
    Ok(refused)
}

/// Why the image's engine cannot run here, if it cannot.
fn engine_refusal(image: &crate::matrix::Image, host: &Host) -> Option<String> {
    if image.engine != EngineKind::Qemu {
        return None;
    }
    if let Some(why) = &host.qemu {
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

/// Whether the SSH client runs.
fn ssh_found() -> bool {
    std::process::Command::new(crate::peer::ssh_program())
        .arg("-V")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

/// Records SKIP for every repetition of the cells `refused` names.
pub fn record_skips(store: &Store, run: &str, plan: &Plan, refused: &[(Cell, String)]) -> Result<(), LabError> {
    for (cell, reason) in refused {
        for repetition in 0..plan.matrix.repetitions {
            let mut record = Record::not_run(run, cell, repetition, Status::Skip, reason.clone());
            if let Some(image) = plan.image(&cell.image) {
                record.engine = image.engine;
            }
            store.record(&record)?;
        }
    }
    Ok(())
}

/// The identity of a device for leases and quarantine (see [`crate::matrix::Device::lease_key`]).
fn lease_key(plan: &Plan, device: &str) -> Option<String> {
    plan.device(device)?.lease_key()
}

/// Runs every repetition of `run` that has no result yet, and marks the run done (or cancelled).
pub fn execute(
    store: Arc<Mutex<Store>>,
    driverlab: &Path,
    plan: &Plan,
    run: &str,
    progress: &dyn Progress,
    cancel: &AtomicBool,
) -> Result<Outcome, LabError> {
    let artifacts = lock(&store).artifacts(run);
    let done: BTreeSet<(usize, u32)> = lock(&store).done(run)?.into_iter().collect();
    let total = plan.cells.len() * plan.matrix.repetitions as usize;
    let recorded = Mutex::new(done.len());
    let ctx = RunContext { driverlab: driverlab.to_path_buf(), run: run.to_string(), artifacts };
    let devices: Vec<String> = plan.matrix.devices.iter().map(|d| d.get_ref().name.clone()).collect();
    let errors: Mutex<Vec<LabError>> = Mutex::new(Vec::new());
    let emulated_host = vm_spec::host::emulated_by_tcg();
    std::thread::scope(|scope| {
        for device in &devices {
            let pending: Vec<(u32, &Cell)> = (0..plan.matrix.repetitions)
                .flat_map(|rep| plan.cells.iter().filter(|c| c.device == *device).map(move |c| (rep, c)))
                .filter(|(rep, c)| !done.contains(&(c.index, *rep)))
                .collect();
            if pending.is_empty() {
                continue;
            }
            let (store, ctx, recorded, errors) = (&store, &ctx, &recorded, &errors);
            scope.spawn(move || {
                let worker = Worker { store, ctx, plan, device, progress, cancel, recorded, total, emulated_host };
                if let Err(e) = worker.run(pending) {
                    lock(errors).push(e);
                }
            });
        }
    });
    if let Some(e) = errors.into_inner().unwrap_or_else(|p| p.into_inner()).pop() {
        return Err(e);
    }
    let cancelled = cancel.load(Ordering::SeqCst);
    let store = lock(&store);
    let records = store.records(run)?;
    store.finish_run(run, if cancelled { RunState::Cancelled } else { RunState::Done })?;
    Ok(Outcome { counts: crate::store::status_counts(&records), cancelled })
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
    record.retried = retried;
    record
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One device's share of a run.
struct Worker<'a> {
    store: &'a Mutex<Store>,
    ctx: &'a RunContext,
    plan: &'a Plan,
    device: &'a str,
    progress: &'a dyn Progress,
    cancel: &'a AtomicBool,
    recorded: &'a Mutex<usize>,
    total: usize,
    /// Whether this host's CPU is emulated by TCG ([`vm_spec::host::emulated_by_tcg`]).
    emulated_host: bool,
}

impl Worker<'_> {
    fn run(&self, pending: Vec<(u32, &Cell)>) -> Result<(), LabError> {
        let key = lease_key(self.plan, self.device);
        if let Some(key) = &key {
            if let Some(reason) = lock(self.store).quarantined(key)? {
                return self.give_up(&pending, Status::Error, &format!("device {key} is quarantined: {reason}"));
            }
            if !self.lease(key)? {
                return self.give_up(&pending, Status::Miss, "cancelled while waiting for the device");
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
                return self.give_up(&pending[i..], Status::Miss, "the run was cancelled");
            }
            if !healthy {
                if let Err(reason) = self.health_check() {
                    if let Some(key) = key {
                        lock(self.store).quarantine(key, &reason)?;
                    }
                    self.progress.note(&format!("device {} quarantined: {reason}", self.device));
                    let why = format!("device {} failed its health check: {reason}", self.device);
                    return self.give_up(&pending[i..], Status::Error, &why);
                }
            }
            let record = with_retries(
                self.emulated_host,
                || runner::run(self.ctx, self.plan, cell, rep),
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

    /// The probe's NIC checks on the device; the reason when they fail.
    fn health_check(&self) -> Result<(), String> {
        let device = self.plan.device(self.device).expect("checked");
        let health = health::check_device(&self.ctx.driverlab, device)?;
        self.progress.note(&format!("health {}", health.verdict()));
        if health.ok { Ok(()) } else { Err(health.failures.join("; ")) }
    }

    /// Records every repetition of `pending` as `status` (MISS when cancelled, ERROR when the
    /// device is gone), in one transaction however many there are.
    fn give_up(&self, pending: &[(u32, &Cell)], status: Status, reason: &str) -> Result<(), LabError> {
        let records: Vec<Record> = pending
            .iter()
            .map(|&(rep, cell)| {
                let mut record = Record::not_run(&self.ctx.run, cell, rep, status, reason);
                if let Some(image) = self.plan.image(&cell.image) {
                    record.engine = image.engine;
                }
                record
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
    use super::*;
    use vm_spec::host::Virtualization;

    /// A Linux iperf3 matrix on `device` (TOML lines), with a kernel file that exists.
    fn plan(dir: &Path, device: &str) -> Plan {
        std::fs::write(dir.join("vmlinux"), b"ELF").unwrap();
        let text = format!(
            "name = \"m\"\n[[device]]\nname = \"nic\"\n{device}\n[[image]]\nname = \"debian\"\nkernel = \"vmlinux\"\n\
             [[variant]]\nname = \"stock\"\nimage = \"debian\"\n[[workload]]\nname = \"rx\"\nkind = \"iperf3\"\n"
        );
        Plan::parse(&dir.join("m.toml"), &text).unwrap()
    }

    fn reasons(plan: &Plan, host: &Host) -> Vec<String> {
        refusals_on(plan, host).unwrap().into_iter().map(|(_, reason)| reason).collect()
    }

    /// A host with hardware virtualization or PVM, kernel VFIO, root and SSH, or not.
    fn host(hardware: bool, vfio: bool, root: bool, ssh: bool) -> Host {
        let virt = if hardware { Virtualization::Hardware("svm") } else { Virtualization::Pvm };
        Host { virt, vfio, root, ssh, qemu: None }
    }

    #[test]
    fn a_repetition_the_host_spoils_is_run_again_once_and_the_spoiled_attempt_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan(dir.path(), "model = \"aqc100\"");
        let cell = &plan.cells[0];
        let spoiled = || {
            let mut r = Record::not_run("r", cell, 0, Status::Error, "the host's virtualization lost ...");
            let line = r#"{"vmm":"exit","reason":"shutdown","exit_code":7,"entry":"pvh","vcpus":1,"memory_mib":512,
                "setup_ms":1,"run_ms":9,"serial_bytes":0,"exits":{"io":0,"mmio":0,"unclaimed":0},
                "vcpu_state_lost":"vCPU 0: its page tables (cr3 0x123000) are outside guest memory"}"#;
            r.exit = Some(serde_json::from_str(&line.replace('\n', "")).unwrap());
            r
        };
        let passed = || Record::not_run("r", cell, 0, Status::Pass, "");
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
        let mut hung = Record::not_run("r", cell, 0, Status::Fail, "hung: no serial output for 150 s");
        hung.exit = spoiled().exit.map(|e| vm_spec::ExitSummary { vcpu_state_lost: None, ..e });
        let faulted = Record::not_run("r", cell, 0, Status::Fail, "the guest ended with triple-fault");
        let mut oops = Record::not_run("r", cell, 0, Status::Fail, "oops: BUG: unable to handle page fault");
        oops.crash = Some(crate::record::Crash {
            kind: "oops".into(),
            line: "BUG: unable to handle page fault".into(),
            frames: Vec::new(),
            fingerprint: "0123456789abcdef".into(),
        });
        let verdict = Record::not_run("r", cell, 0, Status::Fail, "iperf3 ended with exit code 1");
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

        let first = |plan: &Plan, host: &Host| reasons(plan, host).first().cloned().unwrap_or_default();
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
        let tcg = Plan::parse(&dir.path().join("q.toml"), &text.replace("ACCEL", "")).unwrap();
        let kvm = Plan::parse(&dir.path().join("q.toml"), &text.replace("ACCEL", "accel = \"kvm\"")).unwrap();
        let pvm = host(false, false, true, false);
        assert!(reasons(&tcg, &pvm).is_empty(), "{:?}", reasons(&tcg, &pvm));
        assert!(first(&kvm, &pvm).contains("use accel = \"tcg\""), "{}", first(&kvm, &pvm));
        let no_qemu = Host { qemu: Some("no QEMU at /x".into()), ..host(false, false, true, false) };
        assert!(first(&tcg, &no_qemu).contains("runs under QEMU: no QEMU at /x"));
    }
}

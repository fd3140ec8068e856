//! The daemon's run queue: submitted matrices wait and run one at a time (measurements on one
//! box should not disturb each other), on one worker thread that outlives every VMM it starts.
//! Each live run has a broadcast channel its event streams subscribe to.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use lab::bisect::Step;
use lab::bisect::run::{BisectProgress, BisectRun};
use lab::env::LabEnv;
use lab::images::RunPlan;
use lab::matrix::SeriesStep;
use lab::record::Record;
use lab::results_db::{ResultsDb, RunState};
use lab::scheduler::Progress;
use tokio::sync::broadcast;

use crate::problem::Problem;
use crate::types::{RunEvent, RunPhase, RunStatus};

/// Most runs that may wait at once.
pub const MAX_QUEUED: usize = 16;
/// Most results the runs queued and running may have together.
pub const MAX_QUEUED_RESULTS: usize = 200_000;

/// Runs waiting and running.
pub struct RunQueue {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    db: PathBuf,
    env: Arc<LabEnv>,
    /// Ended runs to keep (`serve --keep-runs`); older ones go as runs end.
    keep_runs: Option<usize>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<String>,
    live: HashMap<String, Live>,
    /// Places taken by requests that are creating or claiming their run.
    reserved: usize,
    /// The results those requests hold against [`MAX_QUEUED_RESULTS`].
    reserved_results: usize,
}

impl Queue {
    /// The results of the live runs and of the places held for runs about to be queued.
    fn results_taken(&self) -> usize {
        self.live.values().map(|l| results_of(l.work.plan())).sum::<usize>() + self.reserved_results
    }
}

/// What a queued run executes: a matrix's repetitions, or a bisection of its series.
#[derive(Clone)]
pub(crate) enum Work {
    /// Every repetition without a result.
    Run(RunPlan),
    /// The repetitions the bisection asks for.
    Bisect(BisectRun),
}

impl Work {
    /// The plan its run executes.
    fn plan(&self) -> &RunPlan {
        match self {
            Work::Run(plan) => plan,
            Work::Bisect(bisect) => &bisect.plan,
        }
    }
}

/// The results a run plan asks for.
fn results_of(plan: &RunPlan) -> usize {
    plan.plan.results()
}

/// A place in the queue and the results its run will have, taken before the run is created or
/// claimed, so that a run exists (or is claimed) only once it is sure to be queued; given back
/// when dropped unused.
pub(crate) struct Reservation<'a> {
    shared: &'a Shared,
    results: usize,
    used: bool,
}

impl Reservation<'_> {
    /// Holds `wanted` results (a plan's [`lab::matrix::Plan::results`]) against
    /// [`MAX_QUEUED_RESULTS`], or says 429: before the run is created or claimed, so that a
    /// refusal leaves nothing behind.
    pub(crate) fn hold_results(&mut self, wanted: usize) -> Result<(), Problem> {
        let mut queue = lock(&self.shared.queue);
        queue.reserved_results -= self.results;
        self.results = 0;
        let taken = queue.results_taken();
        if taken + wanted > MAX_QUEUED_RESULTS {
            return Err(Problem::busy(format!(
                "{taken} results are queued or running and this run has {wanted}; the daemon takes {MAX_QUEUED_RESULTS} at once"
            )));
        }
        queue.reserved_results += wanted;
        self.results = wanted;
        Ok(())
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut queue = lock(&self.shared.queue);
        queue.reserved_results -= self.results;
        if !self.used {
            queue.reserved -= 1;
        }
    }
}

struct Live {
    work: Work,
    running: bool,
    cancel: Arc<AtomicBool>,
    events: broadcast::Sender<RunEvent>,
    started: Option<Instant>,
    recorded_here: usize,
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RunQueue {
    /// The queue, with its worker thread.
    pub fn start(db: PathBuf, env: Arc<LabEnv>, keep_runs: Option<usize>) -> RunQueue {
        let shared = Arc::new(Shared { queue: Mutex::default(), wake: Condvar::new(), db, env, keep_runs });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("run-worker".into())
            .spawn(move || worker.work())
            .expect("the run worker thread starts");
        RunQueue { shared }
    }

    /// A place in the queue, or 429 when it is full.
    pub(crate) fn reserve(&self) -> Result<Reservation<'_>, Problem> {
        let mut queue = lock(&self.shared.queue);
        if queue.waiting.len() + queue.reserved >= MAX_QUEUED {
            return Err(Problem::busy(format!("{MAX_QUEUED} runs are waiting already; try again when one has run")));
        }
        queue.reserved += 1;
        Ok(Reservation { shared: &self.shared, results: 0, used: false })
    }

    /// Queues `run` (created, or claimed for a resume) to execute `work`, in the place
    /// `reservation` holds with the plan's results ([`Reservation::hold_results`], which this
    /// takes for a caller that did not); 409 if the run is live already (two resumes at once).
    pub(crate) fn enqueue(&self, mut reservation: Reservation<'_>, run: &str, work: Work) -> Result<(), Problem> {
        let results = results_of(work.plan());
        if reservation.results != results {
            reservation.hold_results(results)?;
        }
        let mut queue = lock(&self.shared.queue);
        if queue.live.contains_key(run) {
            return Err(Problem::conflict(format!("run {run} is queued or running here already")));
        }
        // The place and the held results become the live run's.
        reservation.used = true;
        queue.reserved -= 1;
        queue.reserved_results -= std::mem::take(&mut reservation.results);
        let (events, _) = broadcast::channel(256);
        let live = Live {
            work,
            running: false,
            cancel: Arc::new(AtomicBool::new(false)),
            events,
            started: None,
            recorded_here: 0,
        };
        queue.live.insert(run.to_string(), live);
        queue.waiting.push_back(run.to_string());
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Queues again the runs an earlier daemon on this database queued and never started (they
    /// read as interrupted since it went away), oldest first, each with a note in its events;
    /// a run that cannot be is left interrupted and logged. Returns the runs queued.
    pub fn requeue_orphans(&self) -> Vec<String> {
        let Ok(mut store) = ResultsDb::open(&self.shared.db) else { return Vec::new() };
        let orphans = store.orphaned_queued_runs().unwrap_or_else(|e| {
            tracing::warn!("looking for runs an earlier daemon queued: {e}");
            Vec::new()
        });
        let mut queued = Vec::new();
        for run in orphans {
            let requeued = self.reserve().and_then(|mut place| {
                let plan = lab::run::resumable(&store, &self.shared.env, &run, &|line| tracing::info!("{line}"))?;
                place.hold_results(plan.plan.results())?;
                lab::run::claim(&mut store, &run, &plan)?;
                store.set_queued(&run, true)?;
                self.enqueue(place, &run, Work::Run(plan))
            });
            match requeued {
                Ok(()) => {
                    tracing::info!("run {run}: queued again (the daemon that queued it went away before it started)");
                    self.shared.send(
                        &run,
                        RunEvent::Note {
                            line: "queued again: the daemon that queued it went away before it started".into(),
                        },
                        false,
                    );
                    queued.push(run);
                }
                Err(p) => {
                    tracing::warn!("run {run}: not queued again: {}; `driverlab lab resume {run}` runs it", p.message)
                }
            }
        }
        queued
    }

    /// Cancels a live run: a running one stops after its running repetitions, a waiting one
    /// leaves the queue and its repetitions are MISS. False if it is not live.
    pub(crate) fn cancel(&self, run: &str) -> bool {
        let mut queue = lock(&self.shared.queue);
        let Some(live) = queue.live.get_mut(run) else { return false };
        live.cancel.store(true, Ordering::SeqCst);
        if !live.running {
            // Out of the queue, and finished at once on a thread of its own: nothing runs.
            // Marked running first, so that a second cancel meanwhile starts nothing.
            live.running = true;
            queue.waiting.retain(|r| r != run);
            drop(queue);
            let shared = self.shared.clone();
            let run = run.to_string();
            std::thread::spawn(move || shared.execute(&run));
        }
        true
    }

    /// The live part of a run's status: whether it is queued, and its ETA.
    pub(crate) fn live_state(&self, run: &str, results: usize, total: usize) -> Option<(RunPhase, Option<f64>)> {
        let queue = lock(&self.shared.queue);
        let live = queue.live.get(run)?;
        if !live.running {
            return Some((RunPhase::Queued, None));
        }
        let eta = live.started.filter(|_| live.recorded_here > 0).map(|started| {
            started.elapsed().as_secs_f64() / live.recorded_here as f64 * total.saturating_sub(results) as f64
        });
        Some((RunPhase::Running, eta))
    }

    /// A receiver of the run's events, if it is live.
    pub(crate) fn subscribe(&self, run: &str) -> Option<broadcast::Receiver<RunEvent>> {
        lock(&self.shared.queue).live.get(run).map(|l| l.events.subscribe())
    }
}

impl Shared {
    fn work(self: Arc<Shared>) {
        loop {
            let run = {
                let mut queue = lock(&self.queue);
                loop {
                    if let Some(run) = queue.waiting.pop_front() {
                        break run;
                    }
                    queue = self.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
                }
            };
            self.execute(&run);
        }
    }

    /// Executes a live run to its end, then retires it.
    fn execute(self: &Arc<Shared>, run: &str) {
        let (work, cancel) = {
            let mut queue = lock(&self.queue);
            let Some(live) = queue.live.get_mut(run) else { return };
            live.running = true;
            live.started = Some(Instant::now());
            (live.work.clone(), live.cancel.clone())
        };
        let progress = Events { shared: self.clone(), run: run.to_string() };
        let outcome = ResultsDb::open(&self.db).map_err(|e| e.to_string()).and_then(|store| {
            // Started: a daemon that dies from here leaves it interrupted, not queued.
            store.set_queued(run, false).map_err(|e| e.to_string())?;
            let store = Arc::new(Mutex::new(store));
            match &work {
                Work::Run(plan) => lab::run::execute(store, &self.env, plan, run, &progress, &cancel)
                    .map(drop)
                    .map_err(|e| e.to_string()),
                Work::Bisect(bisect) => {
                    bisect.execute(store, &self.env, &progress, &cancel).map(drop).map_err(|e| e.to_string())
                }
            }
        });
        if let Err(e) = outcome {
            tracing::error!("run {run}: {e}");
            progress.note(&format!("the run stopped: {e}"));
            // Resumable, rather than read as running while the daemon lives.
            if let Ok(store) = ResultsDb::open(&self.db) {
                let _ = store.finish_run(run, RunState::Interrupted);
            }
        }
        let live = lock(&self.queue).live.remove(run);
        if let (Some(live), Ok(status)) = (live, status_from_db(&self.db, run)) {
            let _ = live.events.send(RunEvent::State { status });
        }
        if let Some(keep) = self.keep_runs {
            prune(&self.db, keep);
        }
    }

    fn send(&self, run: &str, event: RunEvent, recorded: bool) {
        let mut queue = lock(&self.queue);
        if let Some(live) = queue.live.get_mut(run) {
            live.recorded_here += usize::from(recorded);
            let _ = live.events.send(event);
        }
    }
}

/// A run's progress as events.
struct Events {
    shared: Arc<Shared>,
    run: String,
}

impl Progress for Events {
    fn recorded(&self, record: &Record, done: usize, total: usize) {
        let event = RunEvent::Recorded {
            cell: record.cell.id.clone(),
            label: record.cell.label(),
            repetition: record.repetition,
            status: record.status,
            reason: record.reason.clone().unwrap_or_default(),
            gbit_s: record.workload.gbit_s,
            maps_per_packet: record.shown_maps(),
            done,
            total,
        };
        self.shared.send(&self.run, event, true);
    }

    fn note(&self, line: &str) {
        self.shared.send(&self.run, RunEvent::Note { line: line.into() }, false);
    }
}

impl BisectProgress for Events {
    fn step(&self, step: &Step, at: &SeriesStep) {
        self.shared.send(&self.run, RunEvent::Step { at: at.clone(), step: step.clone() }, false);
    }
}

/// Deletes the ended runs of the database at `db` past the newest `keep` (`serve --keep-runs`),
/// saying what went in the daemon's log.
pub fn prune(db: &std::path::Path, keep: usize) {
    match ResultsDb::open(db).and_then(|mut store| store.prune(keep)) {
        Ok(pruned) if pruned.runs.is_empty() => {}
        Ok(pruned) => tracing::info!(
            "kept the newest {keep} ended runs: deleted {} older ones ({} results, {} MiB of artifacts): {}",
            pruned.runs.len(),
            pruned.results,
            pruned.artifact_bytes >> 20,
            pruned.runs.join(" ")
        ),
        Err(e) => tracing::warn!("pruning the database to {keep} runs: {e}"),
    }
}

/// A run's status from the database alone.
pub(crate) fn status_from_db(db: &std::path::Path, run: &str) -> Result<RunStatus, Problem> {
    Ok(lab::run::status(&ResultsDb::open(db)?, run)?)
}

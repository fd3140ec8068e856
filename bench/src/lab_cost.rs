//! The lab's own cost per cell beyond the VM's run: expanding the matrix, starting the model and
//! the VMM, watching and collecting, writing the database, measured on a real probe matrix and
//! printed next to the VM's own run time.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lab::env::LabEnv;
use lab::matrix::Plan;
use lab::record::{Record, Status};
use lab::results_db::ResultsDb;
use lab::run::{self, RunError};
use lab::scheduler::Progress;

/// What one cell cost.
#[derive(Debug, Clone, Copy)]
pub struct CellCost {
    /// The repetition as the lab saw it, model start to record.
    pub total: Duration,
    /// The VM's own run (vCPUs started to poweroff).
    pub vm_run: Duration,
    /// Starting the model.
    pub model_start: Duration,
    /// Spawning the VMM to its control socket answering.
    pub vm_start: Duration,
}

impl CellCost {
    /// Everything but the VM's run.
    pub fn lab(&self) -> Duration {
        self.total.saturating_sub(self.vm_run)
    }
}

/// What the benchmark measured.
#[derive(Debug)]
pub struct LabCost {
    /// Per cell.
    pub cells: Vec<CellCost>,
    /// Checking, expanding and storing the matrix before the first cell.
    pub plan: Duration,
    /// The whole run, health check included.
    pub run: Duration,
}

struct Quiet;

impl Progress for Quiet {
    fn recorded(&self, _: &Record, _: usize, _: usize) {}
    fn note(&self, _: &str) {}
}

/// Runs `cells` probe cells of `frames` frames each (the pool strategy: the least VM time, so the
/// lab's share shows) in a scratch database under `dir`.
pub fn lab_cost(env: &LabEnv, dir: &Path, cells: usize, frames: u32) -> Result<LabCost, RunError> {
    let values: Vec<String> = (0..cells).map(|i| i.to_string()).collect();
    let text = format!(
        "name = \"lab-cost\"\nrepetitions = 1\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n\
         [[image]]\nname = \"probe\"\nkernel = \"probe\"\n\
         [[variant]]\nname = \"pool\"\nimage = \"probe\"\nparams = {{ \"probe.rx\" = \"pool\", \"probe.echo\" = [{}] }}\n\
         [[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\nframes = {frames}\n",
        // The cells differ in a harmless parameter only.
        values.iter().map(|_| "0").collect::<Vec<_>>().join(", ")
    );
    let start = Instant::now();
    let plan = Plan::parse(&dir.join("lab-cost.toml"), &text)?;
    let mut store = ResultsDb::open(&dir.join("lab.db"))?;
    let (id, plan) = run::create(&mut store, env, plan, false, &|_| {})?;
    let planned = start.elapsed();
    let store = Arc::new(Mutex::new(store));
    run::execute(store.clone(), env, &plan, &id, &Quiet, &AtomicBool::new(false))?;
    let ran = start.elapsed();
    let records = store.lock().unwrap_or_else(|p| p.into_inner()).records(&id)?;
    let ms = |v: Option<f64>| Duration::from_secs_f64(v.unwrap_or(0.0) / 1e3);
    let cells = records
        .iter()
        .filter(|r| r.status == Status::Pass)
        .map(|r| CellCost {
            total: ms(Some(r.timings.total_ms)),
            vm_run: ms(r.timings.vm_run_ms),
            model_start: ms(r.timings.model_start_ms),
            vm_start: ms(r.timings.vm_start_ms),
        })
        .collect();
    Ok(LabCost { cells, plan: planned, run: ran })
}

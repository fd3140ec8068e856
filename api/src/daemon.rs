//! What the handlers share: where the database is, the lab (the `driverlab` binary that runs VMs
//! and models, the image store, the engines), the run queue and the VMs the daemon started.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use lab::env::LabEnv;
use lab::results_db::ResultsDb;

use crate::problem::Problem;
use crate::run_queue::RunQueue;
use crate::vm_table::VmTable;

/// The daemon's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The results database.
    pub db: PathBuf,
    /// Where VMs' logs go.
    pub vm_dir: PathBuf,
}

/// The daemon.
pub struct Daemon {
    /// Its configuration.
    pub config: Config,
    /// The lab it runs: the binary, the image store, the engines, the host's facts.
    pub env: Arc<LabEnv>,
    /// Runs waiting and running.
    pub runs: RunQueue,
    /// VMs started through `POST /v1/vms`.
    pub vms: VmTable,
    /// One image build at a time: builds are heavy and share the store's scratch space.
    pub builds: Mutex<()>,
    /// One device health check at a time: each is a VM.
    pub checks: Mutex<()>,
    /// One benchmark at a time: its figures are worth little beside another.
    pub benches: Mutex<()>,
    /// Event and serial streams open now.
    streams: Arc<AtomicUsize>,
}

/// Most event and serial streams open at once: they are the responses that last.
pub const MAX_STREAMS: usize = 64;

/// An open stream's place; dropping it (the stream ended or its client went) frees it.
pub struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Daemon {
    /// A daemon with `config` that runs the lab of `env`; its run worker starts here.
    pub fn new(config: Config, env: LabEnv) -> Arc<Daemon> {
        let env = Arc::new(env);
        let runs = RunQueue::start(config.db.clone(), env.clone());
        let vms = VmTable::new(config.vm_dir.clone());
        Arc::new(Daemon {
            config,
            env,
            runs,
            vms,
            builds: Mutex::new(()),
            checks: Mutex::new(()),
            benches: Mutex::new(()),
            streams: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// A place for one more long-lived stream, if there is room.
    pub fn open_stream(&self) -> Result<StreamSlot, Problem> {
        let open = self.streams.fetch_add(1, Ordering::SeqCst);
        let slot = StreamSlot(self.streams.clone());
        if open >= MAX_STREAMS {
            return Err(Problem::busy(format!("{MAX_STREAMS} streams are open; close one")));
        }
        Ok(slot)
    }

    /// A connection to the database.
    pub fn store(&self) -> Result<ResultsDb, Problem> {
        Ok(ResultsDb::open(&self.config.db)?)
    }

    /// The image store.
    pub fn images(&self) -> &guest_images::store::ImageStore {
        &self.env.images
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lived_streams_are_counted_and_their_slots_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let env = LabEnv::detect(
            engines::Programs::of(std::path::Path::new("/nonexistent/driverlab")),
            guest_images::store::ImageStore::new(dir.path().join("images")),
            &dir.path().join("qemu"),
        );
        let daemon = Daemon::new(Config { db: dir.path().join("lab.db"), vm_dir: dir.path().join("vms") }, env);
        let slots: Vec<StreamSlot> = (0..MAX_STREAMS).map(|_| daemon.open_stream().unwrap()).collect();
        let refused = daemon.open_stream().err().unwrap();
        assert_eq!(refused.code, "busy");
        drop(slots);
        assert!(daemon.open_stream().is_ok(), "every slot came back");
    }
}

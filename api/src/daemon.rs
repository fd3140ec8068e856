//! What the handlers share: where the database and the images are, the `driverlab` binary that
//! runs VMs and models, the run queue and the VMs the daemon started.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use lab::store::Store;

use crate::problem::Problem;
use crate::runs::RunQueue;
use crate::vms::VmTable;

/// The daemon's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The results database.
    pub db: PathBuf,
    /// The image store.
    pub images: PathBuf,
    /// The `driverlab` binary (`driverlab vm run`, `driverlab model`).
    pub driverlab: PathBuf,
    /// Where VMs' logs go.
    pub vm_dir: PathBuf,
}

/// The daemon.
pub struct Daemon {
    /// Its configuration.
    pub config: Config,
    /// Runs waiting and running.
    pub runs: RunQueue,
    /// VMs started through `POST /v1/vms`.
    pub vms: VmTable,
    /// One image build at a time: builds are heavy and share the store's scratch space.
    pub builds: Mutex<()>,
    /// One device health check at a time: each is a VM.
    pub checks: Mutex<()>,
}

impl Daemon {
    /// A daemon with `config`; its run worker starts here.
    pub fn new(config: Config) -> Arc<Daemon> {
        let runs = RunQueue::start(config.db.clone(), config.driverlab.clone());
        let vms = VmTable::new(config.vm_dir.clone());
        Arc::new(Daemon { config, runs, vms, builds: Mutex::new(()), checks: Mutex::new(()) })
    }

    /// A connection to the database.
    pub fn store(&self) -> Result<Store, Problem> {
        Ok(Store::open(&self.config.db)?)
    }

    /// The image store.
    pub fn images(&self) -> guest_images::store::ImageStore {
        guest_images::store::ImageStore::new(&self.config.images)
    }
}

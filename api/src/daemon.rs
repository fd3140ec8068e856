//! What the handlers share: where the database is, the lab (the `driverlab` binary that runs VMs
//! and models, the image store, the engines), the run queue and the VMs the daemon started.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use lab::env::LabEnv;
use lab::results_db::ResultsDb;

use crate::auth::Transport;
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
    /// Keep this many ended runs, deleting older ones (and their artifacts) as runs end.
    pub keep_runs: Option<usize>,
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
    /// Reads that walk a whole run or the database (reports, exports, the database's copy).
    heavy_reads: Arc<tokio::sync::Semaphore>,
    /// The database file the daemon started with (device and inode): one moved or deleted under
    /// it is not replaced by an empty one.
    db_identity: Option<(u64, u64)>,
}

/// The device and inode of the file at `path`.
fn identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Most reads that walk a whole run or the database at once; each holds at most a run's cells'
/// samples or a few chunks of its answer, and more would only share the disk.
pub const MAX_HEAVY_READS: usize = 4;

/// Most event and serial streams open at once: they are the responses that last.
pub const MAX_STREAMS: usize = 64;
/// Of those, the ones kept for the Unix socket: TCP clients cannot take them all.
pub const OWNER_STREAMS: usize = 16;

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
        let runs = RunQueue::start(config.db.clone(), env.clone(), config.keep_runs);
        let vms = VmTable::new(config.vm_dir.clone());
        // Made now if it is new, so that it is the file the daemon keeps to.
        if let Err(e) = ResultsDb::open(&config.db) {
            tracing::error!("the results database: {e}");
        }
        let db_identity = identity(&config.db);
        Arc::new(Daemon {
            config,
            env,
            runs,
            vms,
            builds: Mutex::new(()),
            checks: Mutex::new(()),
            benches: Mutex::new(()),
            streams: Arc::new(AtomicUsize::new(0)),
            heavy_reads: Arc::new(tokio::sync::Semaphore::new(MAX_HEAVY_READS)),
            db_identity,
        })
    }

    /// A place for one more heavy read (a report, an export, the database's copy), or 429 with
    /// `Retry-After`; the place is given back when the permit is dropped (the answer sent).
    pub fn heavy_read(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Problem> {
        self.heavy_reads.clone().try_acquire_owned().map_err(|_| {
            Problem::busy(format!("{MAX_HEAVY_READS} reports, exports or copies are being made; try again shortly"))
                .retry_after(2)
        })
    }

    /// A place for one more long-lived stream, if there is room: TCP clients share all but
    /// [`OWNER_STREAMS`] of them, which only the Unix socket (the daemon's owner, whose own
    /// `lab run` follows its run's events) may take.
    pub fn open_stream(&self, transport: Transport) -> Result<StreamSlot, Problem> {
        let cap = match transport {
            Transport::Unix => MAX_STREAMS,
            Transport::Tcp => MAX_STREAMS - OWNER_STREAMS,
        };
        let open = self.streams.fetch_add(1, Ordering::SeqCst);
        let slot = StreamSlot(self.streams.clone());
        if open >= cap {
            return Err(Problem::busy(format!("{cap} streams are open to this listener's clients; close one")));
        }
        Ok(slot)
    }

    /// A connection to the database; refused when its file is no longer the one the daemon
    /// started with (moved, deleted or replaced under it), rather than a new empty one made.
    pub fn store(&self) -> Result<ResultsDb, Problem> {
        if self.db_identity.is_some() && identity(&self.config.db) != self.db_identity {
            let why = format!(
                "the results database {} was moved, deleted or replaced under the daemon: it takes no more work; \
                 put the file back, or restart the daemon on the database to use",
                self.config.db.display()
            );
            tracing::error!("{why}");
            return Err(Problem::internal(why));
        }
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
        let daemon =
            Daemon::new(Config { db: dir.path().join("lab.db"), vm_dir: dir.path().join("vms"), keep_runs: None }, env);
        let remote: Vec<StreamSlot> =
            (0..MAX_STREAMS - OWNER_STREAMS).map(|_| daemon.open_stream(Transport::Tcp).unwrap()).collect();
        assert_eq!(daemon.open_stream(Transport::Tcp).err().unwrap().code, "busy", "TCP's share is taken");
        let owner: Vec<StreamSlot> = (0..OWNER_STREAMS).map(|_| daemon.open_stream(Transport::Unix).unwrap()).collect();
        assert_eq!(daemon.open_stream(Transport::Unix).err().unwrap().code, "busy", "all are taken");
        drop((remote, owner));
        assert!(daemon.open_stream(Transport::Tcp).is_ok(), "every slot came back");
    }
}

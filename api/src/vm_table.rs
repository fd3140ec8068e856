//! The VMs the daemon started through `POST /v1/vms`: each one's folder and where it is, how
//! many may run at once, how many ended ones are kept.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::problem::Problem;
use crate::types::{VmState, VmStatus};

/// Most VMs that may run at once.
pub const MAX_LIVE: usize = 4;
/// Finished VMs kept (with their serial logs) before the oldest are forgotten.
pub(crate) const KEEP_FINISHED: usize = 64;
/// The VMs the daemon started.
pub struct VmTable {
    dir: PathBuf,
    next: AtomicU64,
    vms: Mutex<Vec<Arc<Vm>>>,
}

/// One VM the daemon started: its ID, its folder, where it is.
pub(crate) struct Vm {
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    phase: Mutex<Phase>,
}

/// Where a VM is.
#[derive(Clone)]
pub(crate) enum Phase {
    /// Its device and VMM are starting.
    Starting,
    /// The guest runs.
    Running,
    /// The VMM exited: its code and last line.
    Exited { code: Option<i32>, exit: Option<serde_json::Value>, error: Option<serde_json::Value> },
    /// The VMM could not start: why.
    Failed(String),
}

impl Vm {
    /// Where it is.
    pub(crate) fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its serial log.
    pub(crate) fn serial(&self) -> PathBuf {
        self.dir.join("serial.log")
    }

    /// Its control socket.
    pub(crate) fn control(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    /// Whether it has ended.
    pub(crate) fn finished(&self) -> bool {
        matches!(*self.phase(), Phase::Exited { .. } | Phase::Failed(_))
    }

    /// Its status, as the API gives it.
    pub(crate) fn status(&self) -> VmStatus {
        let serial_bytes = std::fs::metadata(self.serial()).map_or(0, |m| m.len());
        let (state, exit_code, exit, error) = match self.phase().clone() {
            Phase::Starting => (VmState::Starting, None, None, None),
            Phase::Running => (VmState::Running, None, None, None),
            Phase::Exited { code, exit, error } => (VmState::Exited, code, exit, error),
            Phase::Failed(message) => (VmState::Failed, None, None, Some(serde_json::json!({ "message": message }))),
        };
        VmStatus { id: self.id.clone(), state, exit_code, exit, error, serial_bytes }
    }
}

impl VmTable {
    /// A table whose VMs keep their files under `dir`.
    pub fn new(dir: PathBuf) -> VmTable {
        VmTable { dir, next: AtomicU64::new(1), vms: Mutex::new(Vec::new()) }
    }

    /// Every VM.
    pub(crate) fn all(&self) -> MutexGuard<'_, Vec<Arc<Vm>>> {
        self.vms.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The VM `id`, or 404.
    pub(crate) fn get(&self, id: &str) -> Result<Arc<Vm>, Problem> {
        self.all()
            .iter()
            .find(|vm| vm.id == id)
            .cloned()
            .ok_or_else(|| Problem::not_found(format!("no VM {id:?} (GET /v1/vms)")))
    }

    /// A new VM's entry and folder, if there is room.
    pub(crate) fn admit(&self) -> Result<Arc<Vm>, Problem> {
        let mut vms = self.all();
        if vms.iter().filter(|vm| !vm.finished()).count() >= MAX_LIVE {
            return Err(Problem::busy(format!("{MAX_LIVE} VMs are running; try again when one has ended")));
        }
        // Forget the oldest finished VMs beyond what is kept.
        while vms.iter().filter(|vm| vm.finished()).count() >= KEEP_FINISHED {
            let oldest = vms.iter().position(|vm| vm.finished()).expect("counted");
            let vm = vms.remove(oldest);
            let _ = std::fs::remove_dir_all(&vm.dir);
        }
        let id = format!("vm{}", self.next.fetch_add(1, Ordering::Relaxed));
        let dir = self.dir.join(format!("{}-{id}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Problem::internal(format!("a folder for the VM: {e}")))?;
        let vm = Arc::new(Vm { id, dir, phase: Mutex::new(Phase::Starting) });
        vms.push(vm.clone());
        Ok(vm)
    }
}

impl Drop for VmTable {
    fn drop(&mut self) {
        for vm in self.all().iter() {
            let _ = std::fs::remove_dir_all(&vm.dir);
        }
    }
}

/// The VMs' files: kept while the daemon runs.
pub fn default_dir() -> PathBuf {
    std::env::temp_dir().join(format!("driverlab-vms-{}", std::process::id()))
}

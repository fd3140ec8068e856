//! A whole VM's snapshot: a directory with two files, `state` (the checked file of
//! [`file`](super::file): the spec, the vCPUs', the VM's and the devices' state, and what the RAM
//! file holds) and `ram` (guest RAM, sparse). The directory and both files are created when the
//! VM starts (`vm run --snapshot-to DIR`), before the process is jailed, and written once when
//! `vm.snapshot` stops the VM; `vm run --restore DIR` reads them back.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use devices::rtc::RtcState;
use devices::serial::SerialPortState;
use pci::{PciRootState, PciStateError};
use serde::{Deserialize, Serialize};
use vm_spec::{ErrorKind, VmSpec};

use super::file::{SnapshotFileError, read_snapshot, write_snapshot_into};
use super::ram::{self, RamError, RamImage};
use super::vcpu_state::{KvmStateError, VcpuState};
use super::vm_state::VmState;

/// The state file's name in a snapshot's directory.
pub const STATE_FILE: &str = "state";
/// The RAM file's name in a snapshot's directory.
pub const RAM_FILE: &str = "ram";

/// Everything of a VM but its RAM's bytes.
#[derive(Debug, Serialize, Deserialize)]
pub struct VmSnapshot {
    /// The spec the VM ran with (a restored VM takes its shape from it).
    pub spec: VmSpec,
    /// The boot protocol it was started with ("pvh", "linux64").
    pub entry: String,
    /// What the RAM file holds.
    pub ram: RamImage,
    /// The irqchips and the clock.
    pub vm: VmState,
    /// Each vCPU, by ID.
    pub vcpus: Vec<VcpuState>,
    /// The emulated devices.
    pub platform: PlatformState,
}

/// The emulated devices' state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlatformState {
    /// COM1.
    pub com1: SerialPortState,
    /// COM2, when the VM has one.
    pub com2: Option<SerialPortState>,
    /// The CMOS RTC.
    pub rtc: RtcState,
    /// Bus 0's PCI functions.
    pub pci: PciRootState,
}

/// Errors taking or restoring a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The snapshot's directory cannot be made or read.
    #[error("snapshot directory {}: {source}{hint}", path.display())]
    Directory {
        /// The directory or file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// A directory whose VM ended before a snapshot was written into it.
    #[error("snapshot {}: empty: no snapshot was written (the VM ended before `vm.snapshot`)", path.display())]
    Empty {
        /// The state file.
        path: PathBuf,
    },
    /// The state file is refused.
    #[error(transparent)]
    File(#[from] SnapshotFileError),
    /// The RAM file is refused or cannot be written.
    #[error(transparent)]
    Ram(#[from] RamError),
    /// KVM refused to give or take a state.
    #[error(transparent)]
    Kvm(#[from] KvmStateError),
    /// A PCI function cannot be saved or put back.
    #[error("PCI: {0}")]
    Pci(#[from] PciStateError),
    /// What this VM has that a snapshot cannot hold.
    #[error("this VM cannot be snapshotted: {0}")]
    NotSaveable(String),
    /// A vCPU's state is missing.
    #[error("vCPU {id}: {why}")]
    Vcpu {
        /// The vCPU.
        id: u32,
        /// What happened to its state.
        why: String,
    },
    /// A device refused its saved state.
    #[error("restoring {what}: {why}")]
    Device {
        /// The device.
        what: &'static str,
        /// Why.
        why: String,
    },
}

impl SnapshotError {
    /// What kind of failure it is: a directory or snapshot that cannot be used is the user's
    /// to fix (a snapshot is to a restore what a kernel image is to a boot).
    pub fn kind(&self) -> ErrorKind {
        match self {
            SnapshotError::Directory { .. } | SnapshotError::NotSaveable(_) => ErrorKind::Spec,
            SnapshotError::Empty { .. } | SnapshotError::Pci(_) | SnapshotError::Device { .. } => ErrorKind::Image,
            SnapshotError::File(SnapshotFileError::Io { .. }) | SnapshotError::Ram(RamError::Io { .. }) => {
                ErrorKind::Host
            }
            SnapshotError::File(_) | SnapshotError::Ram(_) => ErrorKind::Image,
            SnapshotError::Kvm(_) => ErrorKind::Kvm,
            SnapshotError::Vcpu { .. } => ErrorKind::Host,
        }
    }
}

/// The directory a running VM's snapshot goes to, with its two files, made before the jail
/// (which leaves the process no filesystem) and written once when the VM stops for it.
#[derive(Debug)]
pub struct SnapshotTarget {
    /// The directory, as given.
    pub dir: PathBuf,
    state: File,
    ram: File,
}

impl SnapshotTarget {
    /// Makes `dir` (0700; it must not exist: a snapshot is never written over another) and its
    /// two empty files (0600).
    pub fn create(dir: &Path) -> Result<SnapshotTarget, SnapshotError> {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(directory_error(dir, " (give a directory that does not exist yet, in one that does)"))?;
        let new_file = |name: &str| {
            let path = dir.join(name);
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(directory_error(&path, ""))
        };
        Ok(SnapshotTarget { dir: dir.to_path_buf(), state: new_file(STATE_FILE)?, ram: new_file(RAM_FILE)? })
    }

    /// Writes guest RAM (its memory file, `size` bytes) into the RAM file.
    pub fn write_ram(&self, memory: &File, size: u64) -> Result<RamImage, SnapshotError> {
        Ok(ram::save_into(memory, size, &self.ram, &self.dir.join(RAM_FILE))?)
    }

    /// Writes the state file; its bytes.
    pub fn write_state(&self, snapshot: &VmSnapshot) -> Result<u64, SnapshotError> {
        Ok(write_snapshot_into(&self.state, &self.dir.join(STATE_FILE), snapshot)?)
    }
}

fn directory_error(path: &Path, hint: &'static str) -> impl FnOnce(std::io::Error) -> SnapshotError + use<> {
    let path = path.to_path_buf();
    move |source| SnapshotError::Directory { path, source, hint }
}

/// Reads the state of the snapshot in `dir`, refusing an empty one, one of another version and
/// a changed one.
pub fn load(dir: &Path) -> Result<VmSnapshot, SnapshotError> {
    let path = dir.join(STATE_FILE);
    let metadata = std::fs::metadata(&path).map_err(|source| SnapshotError::Directory {
        path: path.clone(),
        source,
        hint: " (is it a directory `vm run --snapshot-to` made?)",
    })?;
    if metadata.len() == 0 {
        return Err(SnapshotError::Empty { path });
    }
    Ok(read_snapshot(&path)?)
}

/// Has `into` read the extents of the RAM file of the snapshot in `dir` (opened as `file`) into
/// new RAM of its size, with up to `copiers` threads (unchecked: [`check_ram`]).
pub fn load_ram(
    dir: &Path,
    image: &RamImage,
    file: &File,
    copiers: usize,
    into: ram::RamReader,
) -> Result<(), SnapshotError> {
    Ok(ram::load(image, file, &dir.join(RAM_FILE), copiers, into)?)
}

/// Opens the RAM file of the snapshot in `dir`, to be read or mapped (it is checked while the
/// VM runs, [`check_ram`]).
pub fn open_ram(dir: &Path, image: &RamImage) -> Result<File, SnapshotError> {
    Ok(ram::open(image, &dir.join(RAM_FILE))?)
}

/// Checks the snapshot's RAM file `file` (of the snapshot in `dir`) against its checksum.
pub fn check_ram(dir: &Path, image: &RamImage, file: &File) -> Result<(), SnapshotError> {
    Ok(ram::check(image, file, &dir.join(RAM_FILE))?)
}

/// Where the vCPU threads leave their state when the VM stops for a snapshot.
#[derive(Debug)]
pub struct VcpuSaves {
    /// The MSRs to save ([`VcpuState::saveable_msrs`]).
    pub msr_indices: Vec<u32>,
    states: Mutex<Vec<Option<Result<VcpuState, String>>>>,
}

impl VcpuSaves {
    /// Room for `count` vCPUs' states.
    pub fn new(msr_indices: Vec<u32>, count: u32) -> VcpuSaves {
        VcpuSaves { msr_indices, states: Mutex::new((0..count).map(|_| None).collect()) }
    }

    /// vCPU `id`'s state, or why it could not be read.
    pub fn put(&self, id: u32, state: Result<VcpuState, KvmStateError>) {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = states.get_mut(id as usize) {
            *slot = Some(state.map_err(|e| e.to_string()));
        }
    }

    /// Whether every vCPU left its state (or why it could not).
    pub fn all_put(&self) -> bool {
        self.states.lock().unwrap_or_else(|p| p.into_inner()).iter().all(Option::is_some)
    }

    /// Every vCPU's state, in ID order; the first one missing is an error.
    pub fn take(&self) -> Result<Vec<VcpuState>, SnapshotError> {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let mut all = Vec::with_capacity(states.len());
        for (id, state) in states.iter_mut().enumerate() {
            let id = id as u32;
            match state.take() {
                Some(Ok(state)) => all.push(state),
                Some(Err(why)) => return Err(SnapshotError::Vcpu { id, why }),
                None => {
                    return Err(SnapshotError::Vcpu { id, why: "its thread did not stop in time to save it".into() });
                }
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_made_once_and_an_unwritten_one_is_refused_as_empty() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("snap");
        let target = SnapshotTarget::create(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(dir.join(RAM_FILE)).unwrap().permissions().mode() & 0o777, 0o600);
        let again = SnapshotTarget::create(&dir).unwrap_err().to_string();
        assert!(again.contains("File exists") && again.contains("does not exist yet"), "{again}");
        drop(target);
        let empty = load(&dir).unwrap_err().to_string();
        assert!(empty.contains("no snapshot was written"), "{empty}");
        let missing = load(&parent.path().join("nothing")).unwrap_err().to_string();
        assert!(missing.contains("--snapshot-to"), "{missing}");
    }

    #[test]
    fn a_vcpu_that_left_no_state_is_named() {
        let saves = VcpuSaves::new(Vec::new(), 2);
        saves.put(1, Err(KvmStateError::Msrs(3)));
        let refused = saves.take().unwrap_err().to_string();
        assert!(refused.starts_with("vCPU 0: its thread did not stop"), "{refused}");
    }
}

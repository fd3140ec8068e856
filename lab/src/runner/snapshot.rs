//! Cells that start from a snapshot (`boot = "snapshot"`): the cell's guest is booted once up to
//! its agent's `ready` frame (the kernel up, the virtio-iommu loaded, the NIC's Thunderbolt slot
//! empty, the driver not yet loaded) and snapshotted into the image store; every repetition then
//! starts from it, with a fresh device plugged into the restored guest's slot and the cell's own
//! words sent on COM2 (the agent loads the driver with their parameters).
//!
//! Snapshots are kept in the image store (`.snapshots/`), or where `$DRIVERLAB_SNAPSHOTS` says
//! (the nested box's store is read-only). A snapshot is kept per key: the driverlab version, the
//! kernel and initrd files, the command line less the words the guest agent and the NIC's driver
//! read (each restored guest is sent its cell's on COM2), memory, vCPUs, the IOMMU and the
//! devices' slots: the cells of one image share it. A snapshot whose `key.json` is not its key
//! is not used. Its folder in the store (`.snapshots/KEY/`) holds the VMM's snapshot (`vm/`)
//! and what the guest said before it (`console.log`, `agent.log`), which go in front of each
//! restored repetition's own logs, so that its record reads as a booted one's. A snapshot that
//! cannot be taken leaves a note (`KEY.failed`, naming the run) and the run's repetitions boot.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use engines::{BootRequest, Ending, Engine, Start, Watch};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use vm_spec::{ExitReason, IommuSpec, SerialOutput, VmSpec};

use super::Repetition;
use super::output::{AGENT_LOG, SERIAL_LOG};
use crate::images::SplitInitrd;
use crate::matrix::{BootMode, EngineKind};

/// The snapshots' folder in the image store.
const SNAPSHOTS: &str = ".snapshots";
/// Names another folder for the snapshots (a store that is read-only, as the nested box's is).
pub(super) const SNAPSHOTS_ENV: &str = "DRIVERLAB_SNAPSHOTS";
/// The VMM's snapshot in a snapshot's folder.
const VM: &str = "vm";
/// The key's file in a snapshot's folder.
const KEY: &str = "key.json";
/// The payload window of a snapshot's VM, in MiB: room for a driver variant's modules.
pub(super) const PAYLOAD_WINDOW_MIB: u32 = 16;

/// A file as the key names it: its path, size and modification time (the image store's files
/// are never changed in place).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileId {
    path: PathBuf,
    len: u64,
    modified_ns: i128,
}

impl FileId {
    fn of(path: &Path) -> Result<FileId, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let modified_ns = meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128;
        Ok(FileId { path: path.to_path_buf(), len: meta.len(), modified_ns })
    }
}

/// What a snapshot is a snapshot of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotKey {
    driverlab: String,
    /// The VMM's snapshot format, which changes between builds of one version.
    format: u32,
    kernel: Option<FileId>,
    initrd: Option<FileId>,
    /// For a snapshot booted from an initramfs's base ([`SplitInitrd`]): the base's SHA-256
    /// (in place of `initrd`, so that the images that share the base share the snapshot).
    #[serde(default)]
    initrd_base: Option<String>,
    /// The payload window's size.
    #[serde(default)]
    payload_window_mib: u32,
    cmdline: String,
    memory_mib: u64,
    vcpus: u32,
    iommu: Option<IommuSpec>,
    /// Each device's slot and whether it starts plugged (not its backend: each repetition has
    /// its own).
    slots: Vec<String>,
}

impl SnapshotKey {
    /// The key of a snapshot of `spec`'s VM, whose initrd is `split`'s base when given.
    fn of(spec: &VmSpec, split: Option<&SplitInitrd>) -> Result<SnapshotKey, String> {
        let kernel = match &spec.kernel {
            vm_spec::Kernel::Path(path) => Some(FileId::of(path)?),
            vm_spec::Kernel::Probe => None,
        };
        let initrd = match split {
            Some(_) => None,
            None => spec.initrd.as_deref().map(FileId::of).transpose()?,
        };
        Ok(SnapshotKey {
            driverlab: env!("CARGO_PKG_VERSION").into(),
            format: vm_spec::SNAPSHOT_FORMAT,
            kernel,
            initrd,
            initrd_base: split.map(|s| s.base_sha256.clone()),
            payload_window_mib: spec.payload_window_mib,
            cmdline: spec.cmdline.clone(),
            memory_mib: spec.memory_mib,
            vcpus: spec.vcpus,
            iommu: spec.iommu,
            slots: spec.devices.iter().map(|d| format!("slot={},plugged={}", d.slot, d.plugged)).collect(),
        })
    }

    /// Its name in the store: a hash of it.
    fn name(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        Sha256::digest(&json).iter().take(12).map(|b| format!("{b:02x}")).collect()
    }
}

/// A cell's snapshot, found in the store or to be taken.
pub(super) enum CellSnapshot {
    /// In the store: its folder.
    Ready(PathBuf),
    /// Not yet: where it goes, and its key.
    Missing(PathBuf, String),
    /// It could not be taken in this run: boot.
    Failed(String),
}

impl CellSnapshot {
    /// The VMM's snapshot in a ready snapshot's folder.
    pub(super) fn vm_dir(folder: &Path) -> PathBuf {
        folder.join(VM)
    }
}

impl Repetition<'_> {
    /// Whether this repetition starts from its cell's snapshot: a Linux cell on driverlab's
    /// engine, in a matrix that asks for it, whose devices all wait in empty Thunderbolt slots
    /// (a device on the root bus is in the guest from its start, and its state is the
    /// hardware's).
    pub(super) fn starts_from_snapshot(&self, spec: &VmSpec) -> bool {
        self.plan.plan.matrix.boot == BootMode::Snapshot
            && self.linux()
            && self.image.engine == EngineKind::Driverlab
            && !spec.devices.is_empty()
            && spec.devices.iter().all(|d| !d.plugged)
    }

    /// The VM a cell's snapshot is taken of: the cell's, its command line without the words
    /// the guest agent and the NIC's driver read (`driverlab.*`, `DRIVER.*`: they reach each
    /// restored guest on COM2, so that cells that differ only in them share one snapshot), and
    /// `driverlab.snapshot=1`, which stops the agent at its ready point; for an image whose
    /// initramfs has its parts for snapshots, the base in place of the whole and a payload
    /// window (each restored guest gets the image's payload there, so that the driver variants
    /// of one kernel share one snapshot too).
    pub(super) fn snapshot_spec(&self, mut spec: VmSpec) -> VmSpec {
        let (mut booted, _) = self.split_cmdline(&spec.cmdline);
        booted.push("driverlab.snapshot=1");
        spec.cmdline = booted.join(" ");
        if let Some(split) = self.split_initrd(&spec) {
            spec.initrd = Some(split.base.clone());
            spec.payload_window_mib = PAYLOAD_WINDOW_MIB;
        }
        spec
    }

    /// The image's initramfs in parts for snapshots, when it has them and its payload fits the
    /// window `spec`'s VM can have.
    pub(super) fn split_initrd(&self, spec: &VmSpec) -> Option<&SplitInitrd> {
        let split = self.plan.files(&self.image.name)?.split.as_ref()?;
        let fits = split.payload_bytes <= u64::from(PAYLOAD_WINDOW_MIB) << 20
            && vm_spec::payload_window_fits(PAYLOAD_WINDOW_MIB, spec.memory_mib);
        fits.then_some(split)
    }

    /// What the restored guest's agent is sent on COM2: the words of the cell's command line
    /// that its snapshot's line lacks, and the payload's size and SHA-256 when it gets one.
    pub(super) fn restored_words(&self, spec: &VmSpec) -> String {
        let mut words = self.split_cmdline(&spec.cmdline).1.join(" ");
        if let Some(split) = self.split_initrd(spec) {
            words.push_str(&format!(" driverlab.payload={}:{}", split.payload_bytes, split.payload_sha256));
        }
        words
    }

    /// A cell's command line as the words read at boot and those read after a restore.
    fn split_cmdline<'c>(&self, cmdline: &'c str) -> (Vec<&'c str>, Vec<&'c str>) {
        let driver = self.plan.plan.linux_driver(self.cell);
        cmdline.split_whitespace().partition(|w| !read_after_restore(w, &driver))
    }

    /// The snapshot `spec`'s VM (a [`Repetition::snapshot_spec`]) starts from, as the store
    /// has it.
    pub(super) fn cell_snapshot(&self, spec: &VmSpec) -> CellSnapshot {
        let split = self.split_initrd(spec).filter(|_| spec.payload_window_mib > 0);
        let key = match SnapshotKey::of(spec, split) {
            Ok(key) => key,
            Err(why) => return CellSnapshot::Failed(format!("its key: {why}")),
        };
        let store = snapshots_dir(self.env.images.root());
        let folder = store.join(key.name());
        let failed = store.join(format!("{}.failed", key.name()));
        if let Ok(note) = std::fs::read_to_string(&failed)
            && let Some((run, why)) = note.split_once('\n')
            && run == self.ctx.run
        {
            return CellSnapshot::Failed(why.to_string());
        }
        let saved: Option<SnapshotKey> =
            std::fs::read(folder.join(KEY)).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
        match saved {
            Some(saved) if saved == key => CellSnapshot::Ready(folder),
            Some(_) => {
                tracing::warn!("snapshot {}: its key is not its name's; taken again", folder.display());
                let _ = std::fs::remove_dir_all(&folder);
                CellSnapshot::Missing(folder, serde_json::to_string(&key).unwrap_or_default())
            }
            None => CellSnapshot::Missing(folder, serde_json::to_string(&key).unwrap_or_default()),
        }
    }

    /// Boots `spec` (its device's backend started for it) up to the agent's ready point and
    /// snapshots it into `folder`; the folder, or why not (noted for the rest of the run).
    pub(super) fn take_snapshot(
        &self,
        engine: &dyn Engine,
        spec: VmSpec,
        device: super::device::StartedDevice,
        (folder, key): (&Path, &str),
    ) -> Result<PathBuf, String> {
        let taken = self.boot_into_snapshot(engine, spec, device, folder, key);
        if let Err(why) = &taken {
            tracing::warn!("cell {}: its snapshot could not be taken: {why}", self.cell.id);
            let failed = folder.with_extension("failed");
            let _ = std::fs::write(failed, format!("{}\n{why}", self.ctx.run));
        }
        taken
    }

    fn boot_into_snapshot(
        &self,
        engine: &dyn Engine,
        mut spec: VmSpec,
        device: super::device::StartedDevice,
        folder: &Path,
        key: &str,
    ) -> Result<PathBuf, String> {
        let parent = folder.parent().ok_or("no store")?;
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        let scratch = tempfile::Builder::new()
            .prefix(".take-")
            .tempdir_in(parent)
            .map_err(|e| format!("a scratch folder in {}: {e}", parent.display()))?;
        let (console, agent) = (scratch.path().join(SERIAL_LOG), scratch.path().join(AGENT_LOG));
        spec.serial.com1 = SerialOutput::File(console);
        spec.serial.com2 = Some(SerialOutput::File(agent.clone()));
        let watch = Watch {
            silence: std::time::Duration::from_secs_f64(self.plan.plan.matrix.silence_s),
            agent_log: Some(agent),
            unplug: None,
        };
        let vm_dir = CellSnapshot::vm_dir(scratch.path());
        let files = self.plan.files(&self.image.name);
        let booted = engine.boot(BootRequest {
            spec,
            watch,
            model: device.model,
            counters: device.counters,
            dir: scratch.path(),
            bzimage: files.and_then(|f| f.bzimage.as_deref()),
            accel: self.image.accel,
            start: Start::Snapshot { dir: &vm_dir },
        });
        drop(device.peer);
        match &booted.ending {
            Ending::Stopped { reason: ExitReason::Snapshot, .. } if vm_dir.join("state").exists() => {}
            ending => {
                let said = booted.device_error.clone().or_else(|| booted.error.as_ref().map(|e| e.message.clone()));
                return Err(format!(
                    "the guest did not reach its ready point ({ending:?}){}",
                    said.map(|s| format!(": {s}")).unwrap_or_default()
                ));
            }
        }
        std::fs::write(scratch.path().join(KEY), key).map_err(|e| format!("its key: {e}"))?;
        let scratch = scratch.keep();
        match std::fs::rename(&scratch, folder) {
            Ok(()) => Ok(folder.to_path_buf()),
            // Another repetition stored the same snapshot first: use that one.
            Err(_) if folder.join(KEY).exists() => {
                let _ = std::fs::remove_dir_all(&scratch);
                Ok(folder.to_path_buf())
            }
            Err(e) => Err(format!("storing it at {}: {e}", folder.display())),
        }
    }

    /// Puts what the snapshot's guest said before its ready point in front of what the
    /// restored guest said, in the repetition's console and agent logs.
    pub(super) fn prepend_snapshot_logs(&self, folder: &Path) {
        for name in [SERIAL_LOG, AGENT_LOG] {
            let (before, after) = (folder.join(name), self.dir.join(name));
            let mut joined = std::fs::read(&before).unwrap_or_default();
            joined.extend(std::fs::read(&after).unwrap_or_default());
            if let Err(e) = std::fs::write(&after, joined) {
                tracing::warn!("{}: {e}", after.display());
            }
        }
    }
}

/// The snapshots' folder for the image store at `images_root`: `$DRIVERLAB_SNAPSHOTS`, else the
/// store's `.snapshots`.
pub fn snapshots_dir(images_root: &Path) -> PathBuf {
    match std::env::var_os(SNAPSHOTS_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => images_root.join(SNAPSHOTS),
    }
}

/// What `lab prune` deleted from the snapshots' folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedSnapshot {
    /// Its name in the folder.
    pub name: String,
    /// Why no run can use it.
    pub why: String,
    /// The disk space it held.
    pub bytes: u64,
}

/// How long a scratch folder (`.take-*`) or a failed snapshot's note (`KEY.failed`) may be left
/// before `lab prune` deletes it: longer than any run that could still be using it.
pub const SNAPSHOT_LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Deletes from the snapshots' folder `dir` what no run can use again: snapshots of another
/// driverlab version or snapshot format, or whose kernel or initrd changed or is gone, or
/// without a readable key; and, older than `leftover_age`, the scratch folders of runs that
/// were killed while taking one and the notes of snapshots that could not be taken.
pub fn prune_snapshots(dir: &Path, leftover_age: std::time::Duration) -> Vec<PrunedSnapshot> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut pruned = Vec::new();
    for entry in entries.flatten() {
        let (path, name) = (entry.path(), entry.file_name().to_string_lossy().into_owned());
        let old =
            entry.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok()) >= Some(leftover_age);
        let why = if name.starts_with(".take-") {
            old.then(|| "a scratch folder of a run killed while taking a snapshot".to_string())
        } else if name.ends_with(".failed") {
            old.then(|| "the note of a snapshot that could not be taken".to_string())
        } else {
            unusable(&path)
        };
        let Some(why) = why else { continue };
        let bytes = disk_bytes(&path);
        let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        match removed {
            Ok(()) => pruned.push(PrunedSnapshot { name, why, bytes }),
            Err(e) => tracing::warn!("{}: {e}", path.display()),
        }
    }
    pruned.sort_by(|a, b| a.name.cmp(&b.name));
    pruned
}

/// Why the snapshot in `folder` can never be used again, if so.
fn unusable(folder: &Path) -> Option<String> {
    let key: SnapshotKey = match std::fs::read(folder.join(KEY)).map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(key)) => key,
        _ => return Some("no readable key".into()),
    };
    if key.driverlab != env!("CARGO_PKG_VERSION") || key.format != vm_spec::SNAPSHOT_FORMAT {
        return Some(format!("taken by driverlab {} (snapshot format {})", key.driverlab, key.format));
    }
    for (what, file) in [("kernel", &key.kernel), ("initrd", &key.initrd)] {
        if let Some(file) = file
            && FileId::of(&file.path).ok().as_ref() != Some(file)
        {
            return Some(format!("its {what} {} changed or is gone", file.path.display()));
        }
    }
    None
}

/// The disk space of a file or a folder's files (sparse files count what they hold).
fn disk_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    if !meta.is_dir() {
        return meta.blocks() * 512;
    }
    std::fs::read_dir(path).map_or(0, |entries| entries.flatten().map(|e| disk_bytes(&e.path())).sum())
}

/// Whether a command line word is one a restored guest reads from the line it is sent: the
/// guest agent's (`driverlab.NAME=`) or a parameter of the NIC's driver (`DRIVER.NAME=`, which
/// the agent gives the driver as it loads it). Every other word (the kernel's, a built-in
/// module's) is read at boot and stays in the snapshot's line, its key.
fn read_after_restore(word: &str, driver: &str) -> bool {
    let module = word.split_once('=').and_then(|(name, _)| name.split_once('.')).map(|(module, _)| module);
    module.is_some_and(|m| m == "driverlab" || m.replace('-', "_") == driver.replace('-', "_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot folder in `dir` named `name` with `key`, and 4 KiB of RAM.
    fn stored(dir: &Path, name: &str, key: &SnapshotKey) {
        std::fs::create_dir_all(dir.join(name).join(VM)).unwrap();
        std::fs::write(dir.join(name).join(KEY), serde_json::to_vec(key).unwrap()).unwrap();
        std::fs::write(dir.join(name).join(VM).join("ram"), [1u8; 4096]).unwrap();
    }

    #[test]
    fn prune_deletes_what_no_run_can_use_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("vmlinux");
        std::fs::write(&kernel, "a kernel").unwrap();
        let key = SnapshotKey {
            driverlab: env!("CARGO_PKG_VERSION").into(),
            format: vm_spec::SNAPSHOT_FORMAT,
            kernel: Some(FileId::of(&kernel).unwrap()),
            initrd: None,
            initrd_base: None,
            payload_window_mib: 0,
            cmdline: "console=ttyS0 driverlab.snapshot=1".into(),
            memory_mib: 512,
            vcpus: 1,
            iommu: None,
            slots: vec!["slot=thunderbolt,plugged=false".into()],
        };
        let store = dir.path().join("snapshots");
        stored(&store, "current", &key);
        stored(&store, "older", &SnapshotKey { driverlab: "0.0.1".into(), ..key.clone() });
        let gone =
            SnapshotKey { kernel: Some(FileId { path: dir.path().join("gone"), len: 1, modified_ns: 1 }), ..key };
        stored(&store, "gone", &gone);
        std::fs::create_dir_all(store.join("nokey")).unwrap();
        std::fs::create_dir_all(store.join(".take-abc")).unwrap();
        std::fs::write(store.join("current.failed"), "r\nwhy").unwrap();

        // Young leftovers stay: a run may be using them.
        let pruned = prune_snapshots(&store, SNAPSHOT_LEFTOVER_AGE);
        let names: Vec<&str> = pruned.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["gone", "nokey", "older"]);
        assert!(pruned[2].why.contains("driverlab 0.0.1") && pruned[2].bytes >= 4096, "{:?}", pruned[2]);
        assert!(pruned[0].why.contains("changed or is gone"), "{:?}", pruned[0]);
        assert!(store.join("current").join(KEY).exists() && store.join(".take-abc").exists());
        // Old ones go (an age of zero makes every leftover old).
        let pruned = prune_snapshots(&store, std::time::Duration::ZERO);
        let names: Vec<&str> = pruned.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, [".take-abc", "current.failed"]);
        assert!(store.join("current").exists(), "a usable snapshot is never pruned");
        assert!(prune_snapshots(&dir.path().join("none"), std::time::Duration::ZERO).is_empty());
    }

    #[test]
    fn the_agent_s_and_the_driver_s_words_are_read_after_a_restore() {
        for word in ["driverlab.iperf=rx,10,6,1,tcp", "atlantic.rxpageorder=3", "driverlab.nic=atlantic"] {
            assert!(read_after_restore(word, "atlantic"), "{word}");
        }
        assert!(read_after_restore("lan743x.x=1", "lan743x"));
        for word in ["iommu.strict=1", "console=ttyS0", "loglevel=5", "atlantic", "swiotlb=65536", "macsec.x=1"] {
            assert!(!read_after_restore(word, "atlantic"), "{word}");
        }
    }
}

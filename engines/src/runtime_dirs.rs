//! The lab's private folders under the temporary directory: `driverlab-lab-PID-N` (a VM's
//! control socket), `driverlab-model-PID-N` (a model's sockets) and `driverlab-vms-PID` (the
//! daemon's VMs). Each is removed by the process that made it; a process killed with -9 leaves
//! its folders behind, and [`remove_stale`] removes those of processes that are gone.

use std::path::{Path, PathBuf};

/// The prefixes of the folders, each followed by `PID` or `PID-N`.
const PREFIXES: [&str; 3] = ["driverlab-lab-", "driverlab-model-", "driverlab-vms-"];

/// The PID a folder name of the lab's carries, if it is one.
fn owner(name: &str) -> Option<u32> {
    let rest = PREFIXES.iter().find_map(|p| name.strip_prefix(p))?;
    let (pid, n) = rest.split_once('-').unwrap_or((rest, "0"));
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok().filter(|&pid| pid > 0)
}

fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Removes the lab's folders in `tmp` whose process is gone and that this user owns; returns
/// them.
pub fn remove_stale_in(tmp: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let Ok(entries) = std::fs::read_dir(tmp) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(owner) else { continue };
        let Ok(meta) = entry.path().symlink_metadata() else { continue };
        if !meta.is_dir() || meta.uid() != me || alive(pid) || pid == std::process::id() {
            continue;
        }
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

/// [`remove_stale_in`] the temporary directory.
pub fn remove_stale() -> Vec<PathBuf> {
    remove_stale_in(&std::env::temp_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_strictly() {
        assert_eq!(owner("driverlab-lab-123-4"), Some(123));
        assert_eq!(owner("driverlab-vms-77"), Some(77));
        assert_eq!(owner("driverlab-model-9-10"), Some(9));
        for other in [
            "driverlab-lab-",
            "driverlab-lab-x-1",
            "driverlab-lab-12-",
            "driverlab-lab-12-a",
            "other-12",
            "driverlab-lab-0",
        ] {
            assert_eq!(owner(other), None, "{other}");
        }
    }

    #[test]
    fn only_folders_of_dead_processes_go() {
        let tmp = tempfile::tempdir().unwrap();
        // A PID above the kernel's limit is never alive.
        let dead = tmp.path().join("driverlab-model-4194305-0");
        let live = tmp.path().join(format!("driverlab-lab-{}-0", std::process::id()));
        let file = tmp.path().join("driverlab-vms-4194306");
        let unrelated = tmp.path().join("driverlab-cache");
        std::fs::create_dir_all(dead.join("inner")).unwrap();
        std::fs::create_dir(&live).unwrap();
        std::fs::write(&file, "not a folder").unwrap();
        std::fs::create_dir(&unrelated).unwrap();
        assert_eq!(remove_stale_in(tmp.path()), vec![dead.clone()]);
        assert!(!dead.exists() && live.exists() && file.exists() && unrelated.exists());
    }
}

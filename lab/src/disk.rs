//! Room on the disk: a repetition writes its artifacts and a record, a run its results; on a full
//! disk each would fail with a misleading symptom (a model that "did not start serving", a run
//! that ends interrupted), so the lab looks first and names the cause.

use std::path::{Path, PathBuf};

/// The least free space the lab starts a repetition or takes a run with.
pub const MIN_FREE_BYTES: u64 = 64 << 20;

/// Why there is not room enough.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no space left on the disk of {} ({} MiB free, at least {} MiB needed; ENOSPC): free some, \
     or delete old runs (`driverlab lab prune --keep N`)",
    path.display(), free >> 20, MIN_FREE_BYTES >> 20
)]
pub struct NoSpace {
    /// The folder looked at.
    pub path: PathBuf,
    /// Bytes free for an unprivileged writer there.
    pub free: u64,
}

/// Bytes free to an unprivileged writer on the filesystem of `path` (or of its nearest
/// ancestor that exists); none when it cannot be told.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let stat = rustix::fs::statvfs(existing).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// That the disk of `path` has [`MIN_FREE_BYTES`] free (or that it cannot be told).
pub fn check_room(path: &Path) -> Result<(), NoSpace> {
    match free_bytes(path) {
        Some(free) if free < MIN_FREE_BYTES => Err(NoSpace { path: path.to_path_buf(), free }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_is_read_from_the_nearest_folder_that_exists_and_a_full_disk_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(&dir.path().join("not/yet/made")).unwrap();
        assert_eq!(Some(free), free_bytes(dir.path()), "the same filesystem");
        let full = NoSpace { path: "/var/lib/driverlab/artifacts".into(), free: 3 << 20 }.to_string();
        assert!(full.contains("3 MiB free") && full.contains("ENOSPC") && full.contains("lab prune"), "{full}");
    }
}

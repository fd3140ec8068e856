//! A snapshot's file: one line of header (JSON: a magic word, the format's version, the VMM's
//! version, the body's length and SHA-256), then the body (JSON of the state). A file is
//! written once (created, never replaced) and read back only by the VMM version that wrote it,
//! whole and unchanged: anything else is refused with what differs.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The first field of every snapshot's header.
pub const MAGIC: &str = "driverlab-snapshot";
/// The snapshot's format ([`vm_spec::SNAPSHOT_FORMAT`]): the file's layout and the state's types.
pub const FORMAT: u32 = vm_spec::SNAPSHOT_FORMAT;
/// Most bytes of a header line.
const MAX_HEADER: u64 = 4096;
/// Most bytes of a body (the state, not guest RAM).
pub const MAX_BODY: u64 = 64 << 20;

/// Errors of a snapshot's file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    /// The file cannot be written or read.
    #[error("snapshot {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// Not a snapshot's file.
    #[error("{}: not a driverlab snapshot ({why})", path.display())]
    NotASnapshot {
        /// The file.
        path: PathBuf,
        /// What gave it away.
        why: String,
    },
    /// Written by another VMM version (or file format).
    #[error("snapshot {}: written by driverlab {found} (format {found_format}), this is {this} (format {FORMAT}): take a new snapshot with this version", path.display())]
    OtherVersion {
        /// The file.
        path: PathBuf,
        /// The version that wrote it.
        found: String,
        /// Its format.
        found_format: u32,
        /// This version.
        this: String,
    },
    /// The body is not what was written.
    #[error("snapshot {}: its body does not match its checksum (changed or cut after it was written): {why}", path.display())]
    Checksum {
        /// The file.
        path: PathBuf,
        /// What differs.
        why: String,
    },
    /// The body does not parse as the state asked for.
    #[error("snapshot {}: its state does not parse: {why}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// The header line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Header {
    magic: String,
    format: u32,
    vmm_version: String,
    body_len: u64,
    body_sha256: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `state` as a new snapshot file at `path` (0600; an existing file is an error, never
/// replaced).
pub fn write_snapshot<T: Serialize>(path: &Path, state: &T) -> Result<u64, SnapshotFileError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| SnapshotFileError::Io { path: path.to_path_buf(), source })?;
    write_snapshot_into(&file, path, state)
}

/// Writes `state` into `file`, a new empty file made for it at `path` (a jailed VMM creates its
/// snapshot's files before it is jailed); the bytes written.
pub fn write_snapshot_into<T: Serialize>(mut file: &File, path: &Path, state: &T) -> Result<u64, SnapshotFileError> {
    let io = |source| SnapshotFileError::Io { path: path.to_path_buf(), source };
    let body = serde_json::to_vec(state).map_err(|e| io(std::io::Error::other(e)))?;
    let header = Header {
        magic: MAGIC.into(),
        format: FORMAT,
        vmm_version: env!("CARGO_PKG_VERSION").into(),
        body_len: body.len() as u64,
        body_sha256: hex(&Sha256::digest(&body)),
    };
    let line = serde_json::to_string(&header).map_err(|e| io(std::io::Error::other(e)))?;
    file.write_all(line.as_bytes()).map_err(io)?;
    file.write_all(b"\n").map_err(io)?;
    file.write_all(&body).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok((line.len() + 1 + body.len()) as u64)
}

/// Reads the snapshot at `path` as a `T`, refusing one of another version, changed or cut.
pub fn read_snapshot<T: DeserializeOwned>(path: &Path) -> Result<T, SnapshotFileError> {
    let io = |source| SnapshotFileError::Io { path: path.to_path_buf(), source };
    let not_one = |why: String| SnapshotFileError::NotASnapshot { path: path.to_path_buf(), why };
    let mut reader = BufReader::new(std::fs::File::open(path).map_err(io)?);
    let mut line = Vec::new();
    (&mut reader).take(MAX_HEADER).read_until(b'\n', &mut line).map_err(io)?;
    if line.last() != Some(&b'\n') {
        return Err(not_one(format!("no header line in its first {MAX_HEADER} bytes")));
    }
    let header: Header = serde_json::from_slice(&line).map_err(|e| not_one(format!("its header: {e}")))?;
    if header.magic != MAGIC {
        return Err(not_one(format!("its header's magic is {:?}", header.magic)));
    }
    let this = env!("CARGO_PKG_VERSION");
    if header.vmm_version != this || header.format != FORMAT {
        return Err(SnapshotFileError::OtherVersion {
            path: path.to_path_buf(),
            found: header.vmm_version,
            found_format: header.format,
            this: this.into(),
        });
    }
    let mut body = Vec::new();
    reader.take(MAX_BODY + 1).read_to_end(&mut body).map_err(io)?;
    let checksum = |why: String| SnapshotFileError::Checksum { path: path.to_path_buf(), why };
    if body.len() as u64 != header.body_len {
        return Err(checksum(format!("{} bytes of body, the header says {}", body.len(), header.body_len)));
    }
    let found = hex(&Sha256::digest(&body));
    if found != header.body_sha256 {
        return Err(checksum(format!("SHA-256 {found}, the header says {}", header.body_sha256)));
    }
    serde_json::from_slice(&body)
        .map_err(|e| SnapshotFileError::Corrupt { path: path.to_path_buf(), why: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct State {
        rip: u64,
        name: String,
    }

    #[test]
    fn a_snapshot_reads_back_and_anything_else_is_refused_with_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.snap");
        let state = State { rip: 0x1000, name: "probe".into() };
        write_snapshot(&path, &state).unwrap();
        assert_eq!(read_snapshot::<State>(&path).unwrap(), state);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // Written once: never replaced.
        assert!(matches!(write_snapshot(&path, &state), Err(SnapshotFileError::Io { .. })));
        let text = std::fs::read_to_string(&path).unwrap();
        let (header, body) = text.split_once('\n').unwrap();
        let variant = |name: &str, content: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, content).unwrap();
            p
        };
        // A changed body, a cut one.
        let changed = variant("changed", format!("{header}\n{}", body.replace("4096", "4097")));
        let refused = read_snapshot::<State>(&changed).unwrap_err();
        assert!(matches!(refused, SnapshotFileError::Checksum { .. }), "{refused}");
        let cut = variant("cut", format!("{header}\n{}", &body[..body.len() - 2]));
        assert!(read_snapshot::<State>(&cut).unwrap_err().to_string().contains("bytes of body"));
        // Another version.
        let older = variant("older", format!("{}\n{body}", header.replace(env!("CARGO_PKG_VERSION"), "0.0.1")));
        let refused = read_snapshot::<State>(&older).unwrap_err().to_string();
        assert!(refused.contains("written by driverlab 0.0.1") && refused.contains("take a new snapshot"), "{refused}");
        // Not a snapshot at all.
        let kernel = variant("vmlinux", "\x7fELF".repeat(2000));
        assert!(matches!(read_snapshot::<State>(&kernel), Err(SnapshotFileError::NotASnapshot { .. })));
        let other = variant("other", format!("{}\n{body}", header.replace(MAGIC, "firecracker")));
        assert!(read_snapshot::<State>(&other).unwrap_err().to_string().contains("magic"));
    }
}

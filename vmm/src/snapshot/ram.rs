//! Guest RAM in a snapshot: the memory file's data extents (a booted guest has touched a part of
//! its RAM; the rest is a hole, read as zeros) written into a sparse file of the same size, with
//! the extents and their XXH3-128 kept in the snapshot's state; and read back into a new memory
//! file, checked. (Mapping the file `MAP_PRIVATE` instead, which costs nothing up front, suits a
//! VM whose devices are kernel VFIO; a device model on vfio-user must share the guest's RAM,
//! which a private mapping cannot: that choice belongs to the restore, not done yet.)

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::SeekFrom;
use serde::{Deserialize, Serialize};
use twox_hash::xxhash3_128::Hasher;

/// Bytes copied at a time.
const CHUNK: usize = 4 << 20;

/// Errors saving or restoring guest RAM.
#[derive(Debug, thiserror::Error)]
pub enum RamError {
    /// A file operation failed.
    #[error("guest RAM {}: {what}: {source}", path.display())]
    Io {
        /// The RAM file (or the memory file, `memfd`).
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the RAM that was saved.
    #[error("guest RAM {}: {why}: the snapshot's RAM was changed after it was written", path.display())]
    Mismatch {
        /// The RAM file.
        path: PathBuf,
        /// What differs.
        why: String,
    },
}

/// What a snapshot keeps of its RAM file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RamImage {
    /// The memory file's size.
    pub size: u64,
    /// `(offset, length)` of each extent with data, ascending.
    pub extents: Vec<(u64, u64)>,
    /// XXH3-128 of the extents' bytes, in order: a check that the file is the one written (the
    /// snapshot's folder is the lab's own, 0700), fast enough to run on every restore (SHA-256
    /// of a Linux guest's 170 MB took seconds in the nested box, where TCG runs the VMM).
    pub xxh3_128: String,
}

impl RamImage {
    /// Bytes of RAM with data.
    pub fn data_bytes(&self) -> u64 {
        self.extents.iter().map(|e| e.1).sum()
    }
}

fn io(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> RamError + use<> {
    let path = path.to_path_buf();
    move |source| RamError::Io { path, what, source }
}

/// The data extents of `file` (of `size` bytes): `SEEK_DATA` and `SEEK_HOLE`.
fn data_extents(file: &File, size: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let mut extents = Vec::new();
    let mut at = 0;
    while at < size {
        let start = match rustix::fs::seek(file, SeekFrom::Data(at)) {
            Ok(start) => start,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(file, SeekFrom::Hole(start))?.min(size);
        extents.push((start, end - start));
        at = end;
    }
    Ok(extents)
}

/// Where restored RAM goes: the bytes for each offset of the memory file.
pub type RamSink<'a> = &'a mut dyn FnMut(u64, &[u8]) -> std::io::Result<()>;

/// Reads `len` bytes at `offset` of `from` into `hash`, giving them to `to`.
fn copy(from: &File, to: RamSink, offset: u64, len: u64, hash: &mut Hasher) -> std::io::Result<()> {
    let mut buffer = vec![0u8; CHUNK.min(len as usize)];
    let mut done = 0;
    while done < len {
        let n = buffer.len().min((len - done) as usize);
        from.read_exact_at(&mut buffer[..n], offset + done)?;
        hash.write(&buffer[..n]);
        to(offset + done, &buffer[..n])?;
        done += n as u64;
    }
    Ok(())
}

/// Writes the RAM in `memory` (its memory file, `size` bytes) into a new sparse file at `to`.
pub fn save(memory: &File, size: u64, to: &Path) -> Result<RamImage, RamError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to).map_err(io(to, "creating"))?;
    save_into(memory, size, &file, to)
}

/// Writes the RAM in `memory` into `file`, a new empty file made for it at `to` (a jailed VMM
/// creates its snapshot's files before it is jailed).
pub fn save_into(memory: &File, size: u64, file: &File, to: &Path) -> Result<RamImage, RamError> {
    let memfd = Path::new("memfd");
    let extents = data_extents(memory, size).map_err(io(memfd, "finding its data"))?;
    file.set_len(size).map_err(io(to, "sizing"))?;
    let mut hash = Hasher::new();
    let mut write = |offset: u64, bytes: &[u8]| file.write_all_at(bytes, offset);
    for &(offset, len) in &extents {
        copy(memory, &mut write, offset, len, &mut hash).map_err(io(to, "writing"))?;
    }
    file.sync_all().map_err(io(to, "syncing"))?;
    Ok(RamImage { size, extents, xxh3_128: format!("{:032x}", hash.finish_128()) })
}

/// Reads the RAM file at `from` (saved as `image`) into `into` (new RAM of the image's size,
/// zeros where the image has holes), refusing a file that is not the RAM that was saved.
pub fn restore(image: &RamImage, from: &Path, into: RamSink) -> Result<(), RamError> {
    let file = open(image, from)?;
    hash_extents(image, &file, from, into)
}

/// Opens the RAM file at `from` (saved as `image`), refusing one of another size.
pub fn open(image: &RamImage, from: &Path) -> Result<File, RamError> {
    let file = File::open(from).map_err(io(from, "opening"))?;
    let size = file.metadata().map_err(io(from, "reading its size"))?.len();
    if size != image.size {
        return Err(RamError::Mismatch {
            path: from.to_path_buf(),
            why: format!("{size} bytes, saved as {}", image.size),
        });
    }
    Ok(file)
}

/// Checks the RAM file `file` (at `from`, saved as `image`) against its checksum.
pub fn check(image: &RamImage, file: &File, from: &Path) -> Result<(), RamError> {
    hash_extents(image, file, from, &mut |_, _| Ok(()))
}

fn hash_extents(image: &RamImage, file: &File, from: &Path, into: RamSink) -> Result<(), RamError> {
    let mut hash = Hasher::new();
    for &(offset, len) in &image.extents {
        copy(file, &mut *into, offset, len, &mut hash).map_err(io(from, "reading"))?;
    }
    let found = format!("{:032x}", hash.finish_128());
    if found != image.xxh3_128 {
        return Err(RamError::Mismatch {
            path: from.to_path_buf(),
            why: format!("XXH3-128 {found}, saved as {}", image.xxh3_128),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(size: u64) -> File {
        let memfd = memfd::MemfdOptions::default().create("ram").unwrap().into_file();
        memfd.set_len(size).unwrap();
        memfd
    }

    #[test]
    fn touched_ram_is_saved_sparse_and_restored_into_a_new_memory_file() {
        const MIB: u64 = 1 << 20;
        let size = 64 * MIB;
        let guest = memory(size);
        // What a guest touched: its first page, a stretch in the middle, its last page.
        guest.write_all_at(b"\xeb\xfe boot code", 0).unwrap();
        guest.write_all_at(&vec![0x5a; 3 * MIB as usize], 20 * MIB).unwrap();
        guest.write_all_at(b"top of RAM", size - 4096).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        let image = save(&guest, size, &path).unwrap();
        let stored: u64 = image.extents.iter().map(|e| e.1).sum();
        assert!(stored < 4 * MIB, "only the touched pages: {:?}", image.extents);
        use std::os::unix::fs::MetadataExt;
        assert!(std::fs::metadata(&path).unwrap().blocks() * 512 < 8 * MIB, "the file is sparse");

        let restored = memory(size);
        restore(&image, &path, &mut |offset, bytes| restored.write_all_at(bytes, offset)).unwrap();
        for (offset, len) in [(0, 4096), (20 * MIB - 4096, 3 * MIB + 8192), (size - 4096, 4096), (40 * MIB, 4096)] {
            let (mut a, mut b) = (vec![0u8; len as usize], vec![0u8; len as usize]);
            guest.read_exact_at(&mut a, offset).unwrap();
            restored.read_exact_at(&mut b, offset).unwrap();
            assert!(a == b, "the bytes at {offset:#x}");
        }
        // A changed RAM file is refused.
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(b"\x90", 21 * MIB).unwrap();
        let other = memory(size);
        let refused = restore(&image, &path, &mut |offset, bytes| other.write_all_at(bytes, offset)).unwrap_err();
        assert!(matches!(refused, RamError::Mismatch { .. }), "{refused}");
        let opened = open(&image, &path).unwrap();
        assert!(matches!(check(&image, &opened, &path), Err(RamError::Mismatch { .. })), "checked without a copy too");
        assert!(matches!(save(&guest, size, &path), Err(RamError::Io { .. })), "written once");
    }
}

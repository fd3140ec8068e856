//! Guest RAM in a snapshot: the memory file's data extents (a booted guest has touched a part of
//! its RAM; the rest is a hole, read as zeros) less their pages of zeros, written into a sparse
//! file of the same size, with the extents and their XXH3-128 kept in the snapshot's state; and
//! read back into a new memory file, checked. (A Debian guest zeroes each page it allocates,
//! `init_on_alloc`: half of a booted 512 MiB guest's 162 MiB of touched RAM was zeros, in about
//! 220 runs between pages with data, 2026-12-07 in the nested box.) Copied by threads that
//! share the extents, or mapped `MAP_PRIVATE` instead: the restore chooses (`vm::restored_ram`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::SeekFrom;
use serde::{Deserialize, Serialize};
use twox_hash::xxhash3_128::Hasher;

/// Bytes copied at a time.
const CHUNK: usize = 4 << 20;

/// The grain at which a snapshot leaves zeros out: a page.
const PAGE: usize = 4096;

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

/// What reads restored RAM: given a handle on the RAM file (each copier has its own, with its own
/// file position), an extent's offset and length, it reads them into the new memory file at the
/// same offset.
pub type RamReader<'a> = &'a (dyn Fn(&File, u64, u64) -> std::io::Result<()> + Sync);

/// The grain at which copiers share the extents: a huge page, each faulted in by one copier.
const SHARE_GRAIN: u64 = 2 << 20;

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
    let mut saved = SavedExtents::default();
    let mut buffer = vec![0u8; CHUNK];
    for &extent in &extents {
        for_each_chunk(memory, memfd, extent, &mut buffer, |at, chunk| {
            for (page, bytes) in pages_with_data(chunk) {
                file.write_all_at(bytes, at + page).map_err(io(to, "writing"))?;
                saved.push(at + page, bytes);
            }
            Ok(())
        })?;
    }
    file.sync_all().map_err(io(to, "syncing"))?;
    Ok(RamImage { size, extents: saved.extents, xxh3_128: format!("{:032x}", saved.hash.finish_128()) })
}

/// Reads `len` bytes at `offset` of `file` (at `path`) a buffer at a time, giving `each` every
/// piece's offset in the file and its bytes.
fn for_each_chunk(
    file: &File,
    path: &Path,
    (offset, len): (u64, u64),
    buffer: &mut [u8],
    mut each: impl FnMut(u64, &[u8]) -> Result<(), RamError>,
) -> Result<(), RamError> {
    let mut done = 0;
    while done < len {
        let n = buffer.len().min((len - done) as usize);
        file.read_exact_at(&mut buffer[..n], offset + done).map_err(io(path, "reading"))?;
        each(offset + done, &buffer[..n])?;
        done += n as u64;
    }
    Ok(())
}

/// The extents a save has written so far, adjacent ones as one, and the hash of their bytes.
#[derive(Default)]
struct SavedExtents {
    extents: Vec<(u64, u64)>,
    hash: Hasher,
}

impl SavedExtents {
    fn push(&mut self, offset: u64, bytes: &[u8]) {
        self.hash.write(bytes);
        let len = bytes.len() as u64;
        match self.extents.last_mut() {
            Some(last) if last.0 + last.1 == offset => last.1 += len,
            _ => self.extents.push((offset, len)),
        }
    }
}

/// The runs of pages of `bytes` (from a page boundary) that are not all zeros: their offsets in
/// `bytes` and their bytes.
fn pages_with_data(bytes: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    let zero = |page: &[u8]| page.chunks(64).all(|c| c.iter().fold(0, |a, &b| a | b) == 0);
    let pages = bytes.len().div_ceil(PAGE);
    let mut page = 0;
    std::iter::from_fn(move || {
        while page < pages && zero(&bytes[page * PAGE..bytes.len().min((page + 1) * PAGE)]) {
            page += 1;
        }
        let start = page;
        while page < pages && !zero(&bytes[page * PAGE..bytes.len().min((page + 1) * PAGE)]) {
            page += 1;
        }
        (start < page).then(|| ((start * PAGE) as u64, &bytes[start * PAGE..bytes.len().min(page * PAGE)]))
    })
}

/// Has `into` read the image's extents from `file` (the RAM file at `from`) into new RAM of the
/// image's size (zeros where the image has holes), with up to `copiers` threads, each about the
/// same share of the bytes: the copy into a new memory file is the restore's cost (zeroing and
/// filling its huge pages), which threads share where the host has cores for them. Each copier
/// past the first opens `from` again, refused if that is not the file `file` is (the checksum
/// is taken through `file`). Unchecked: see [`check`].
pub fn load(image: &RamImage, file: &File, from: &Path, copiers: usize, into: RamReader) -> Result<(), RamError> {
    let expected = identity(file).map_err(io(from, "reading its metadata"))?;
    let shares = shares(&image.extents, copiers.max(1));
    let (first, rest) = shares.split_first().map_or((&[][..], &[][..]), |(f, r)| (f.as_slice(), r));
    std::thread::scope(|scope| {
        let copiers: Vec<_> =
            rest.iter().map(|share| scope.spawn(move || copy_own_share(share, from, expected, into))).collect();
        let done = copy_share(first, file, from, into);
        copiers.into_iter().map(|c| c.join().unwrap_or_else(|_| Err(copier_panicked(from)))).fold(done, Result::and)
    })
}

/// A file's device and inode.
fn identity(file: &File) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

/// One copier's share, read through a handle of its own on `from`, which must be the file
/// whose device and inode are `expected`.
fn copy_own_share(share: &[(u64, u64)], from: &Path, expected: (u64, u64), into: RamReader) -> Result<(), RamError> {
    let own = File::open(from).map_err(io(from, "opening"))?;
    if identity(&own).map_err(io(from, "reading its metadata"))? != expected {
        return Err(RamError::Mismatch { path: from.to_path_buf(), why: "replaced while it was read".into() });
    }
    copy_share(share, &own, from, into)
}

fn copier_panicked(from: &Path) -> RamError {
    RamError::Io { path: from.to_path_buf(), what: "copying", source: std::io::Error::other("a copier panicked") }
}

/// Reads one copier's share of the extents through `file`.
fn copy_share(share: &[(u64, u64)], file: &File, from: &Path, into: RamReader) -> Result<(), RamError> {
    for &(offset, len) in share {
        into(file, offset, len).map_err(io(from, "reading"))?;
    }
    Ok(())
}

/// `extents` cut into `n` runs of about equal bytes, at multiples of [`SHARE_GRAIN`] (an extent
/// may be cut in two); fewer runs where there is less to copy.
fn shares(extents: &[(u64, u64)], n: usize) -> Vec<Vec<(u64, u64)>> {
    let total: u64 = extents.iter().map(|e| e.1).sum();
    let per = total.div_ceil(n as u64).div_ceil(SHARE_GRAIN).max(1) * SHARE_GRAIN;
    let mut shares = vec![Vec::new()];
    let mut room = per;
    for &(mut offset, mut len) in extents {
        while len > 0 {
            if room == 0 {
                shares.push(Vec::new());
                room = per;
            }
            let take = len.min(room);
            shares.last_mut().expect("one share at least").push((offset, take));
            (offset, len, room) = (offset + take, len - take, room - take);
        }
    }
    shares
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

/// Checks the RAM file `file` (at `from`, saved as `image`) against its checksum, and that it
/// holds nothing outside its extents.
pub fn check(image: &RamImage, file: &File, from: &Path) -> Result<(), RamError> {
    let mut hash = Hasher::new();
    let mut buffer = vec![0u8; CHUNK];
    for &extent in &image.extents {
        for_each_chunk(file, from, extent, &mut buffer, |_, chunk| {
            hash.write(chunk);
            Ok(())
        })?;
    }
    let found = format!("{:032x}", hash.finish_128());
    if found != image.xxh3_128 {
        return Err(RamError::Mismatch {
            path: from.to_path_buf(),
            why: format!("XXH3-128 {found}, saved as {}", image.xxh3_128),
        });
    }
    check_holes(image, file, from, &mut buffer)
}

/// Refuses a RAM file with anything but zeros outside its saved extents: a byte written into
/// one of its holes would reach a guest whose RAM is mapped from the file. (A file system that
/// allocates in blocks larger than a page may hold saved zeros there.)
fn check_holes(image: &RamImage, file: &File, from: &Path, buffer: &mut [u8]) -> Result<(), RamError> {
    for (start, len) in data_extents(file, image.size).map_err(io(from, "finding its data"))? {
        for part in uncovered(&image.extents, start, len) {
            for_each_chunk(file, from, part, buffer, |at, chunk| match pages_with_data(chunk).next() {
                Some((page, _)) => Err(RamError::Mismatch {
                    path: from.to_path_buf(),
                    why: format!("data at {:#x}, outside what was saved", at + page),
                }),
                None => Ok(()),
            })?;
        }
    }
    Ok(())
}

/// The parts of `len` bytes at `start` that none of `extents` (ascending, disjoint) covers.
fn uncovered(extents: &[(u64, u64)], start: u64, len: u64) -> Vec<(u64, u64)> {
    let end = start + len;
    let mut at = start;
    let mut parts = Vec::new();
    for &(offset, len) in &extents[extents.partition_point(|e| e.0 + e.1 <= start)..] {
        if offset >= end {
            break;
        }
        if offset > at {
            parts.push((at, offset - at));
        }
        at = at.max(offset + len);
    }
    if at < end {
        parts.push((at, end - at));
    }
    parts
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
        // Touched but zeros (a guest zeroes what it allocates): a page inside the stretch, and
        // a whole MiB elsewhere.
        guest.write_all_at(&[0; PAGE], 21 * MIB).unwrap();
        guest.write_all_at(&vec![0; MIB as usize], 30 * MIB).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        let image = save(&guest, size, &path).unwrap();
        let page = PAGE as u64;
        let stretch = [(20 * MIB, MIB), (21 * MIB + page, 2 * MIB - page)];
        assert_eq!(image.extents, [&[(0, page)][..], &stretch, &[(size - page, page)]].concat(), "zeros left out");
        assert_eq!(image.data_bytes(), 3 * MIB + page);
        use std::os::unix::fs::MetadataExt;
        assert!(std::fs::metadata(&path).unwrap().blocks() * 512 < 8 * MIB, "the file is sparse");

        // One copier, or three (the stretch cut between them).
        for copiers in [1, 3] {
            let restored = memory(size);
            let saved = open(&image, &path).unwrap();
            let copy = |file: &File, offset: u64, len: u64| {
                let mut bytes = vec![0; len as usize];
                file.read_exact_at(&mut bytes, offset)?;
                restored.write_all_at(&bytes, offset)
            };
            load(&image, &saved, &path, copiers, &copy).unwrap();
            for (offset, len) in [(0, 4096), (20 * MIB - 4096, 3 * MIB + 8192), (size - 4096, 4096), (30 * MIB, MIB)] {
                let (mut a, mut b) = (vec![0u8; len as usize], vec![0u8; len as usize]);
                guest.read_exact_at(&mut a, offset).unwrap();
                restored.read_exact_at(&mut b, offset).unwrap();
                assert!(a == b, "the bytes at {offset:#x}, {copiers} copiers");
            }
        }
        // A copier refuses a file put in the RAM file's place after the restore opened it.
        let opened = open(&image, &path).unwrap();
        let other = dir.path().join("other");
        std::fs::copy(&path, &other).unwrap();
        std::fs::rename(&other, &path).unwrap();
        let refused = load(&image, &opened, &path, 2, &|_: &File, _, _| Ok(())).unwrap_err();
        assert!(matches!(&refused, RamError::Mismatch { why, .. } if why.contains("replaced")), "{refused}");
        let opened = open(&image, &path).unwrap();
        check(&image, &opened, &path).unwrap();
        // A changed RAM file is refused: a byte changed in what was saved, or written into a
        // hole (the page of zeros left out).
        assert!(matches!(save(&guest, size, &path), Err(RamError::Io { .. })), "written once");
        for (at, what) in [(20 * MIB + 7, "XXH3-128"), (21 * MIB + 5, "outside what was saved")] {
            let changed = dir.path().join("changed");
            std::fs::copy(&path, &changed).unwrap();
            let file = std::fs::OpenOptions::new().write(true).open(&changed).unwrap();
            file.write_all_at(b"\x90", at).unwrap();
            let opened = open(&image, &changed).unwrap();
            let refused = check(&image, &opened, &changed).unwrap_err();
            assert!(matches!(&refused, RamError::Mismatch { why, .. } if why.contains(what)), "{refused}");
        }
    }

    #[test]
    fn copiers_share_the_extents_evenly_at_huge_page_bounds() {
        const MIB: u64 = 1 << 20;
        let extents = [(0, 4096), (10 * MIB, 9 * MIB), (40 * MIB, 2 * MIB)];
        let two = shares(&extents, 2);
        // 11 MiB and a page: shares of 6 MiB (rounded up to 2 MiB), the second extent cut.
        assert_eq!(
            two,
            [vec![(0, 4096), (10 * MIB, 6 * MIB - 4096)], vec![(16 * MIB - 4096, 3 * MIB + 4096), (40 * MIB, 2 * MIB)]]
        );
        for n in [1, 2, 3, 4, 16] {
            let cut = shares(&extents, n);
            assert!(cut.len() <= n, "{n}: {cut:?}");
            let mut joined: Vec<(u64, u64)> = Vec::new();
            for &(offset, len) in cut.iter().flatten() {
                match joined.last_mut() {
                    Some(last) if last.0 + last.1 == offset => last.1 += len,
                    _ => joined.push((offset, len)),
                }
            }
            assert_eq!(joined, extents, "{n} shares cover the extents exactly");
        }
        assert_eq!(shares(&[], 4), [Vec::<(u64, u64)>::new()]);
    }

    #[test]
    fn the_parts_no_extent_covers() {
        let extents = [(10, 10), (30, 5)];
        assert_eq!(uncovered(&extents, 0, 40), [(0, 10), (20, 10), (35, 5)]);
        assert_eq!(uncovered(&extents, 12, 20), [(20, 10)]);
        assert_eq!(uncovered(&extents, 10, 10), []);
        assert_eq!(uncovered(&[], 4, 4), [(4, 4)]);
    }
}

//! A model's view of guest memory: only what the client mapped with DMA_MAP (with a virtual
//! IOMMU in front, exactly what the guest driver mapped). An access outside is refused and
//! counted as a fault, as a real IOMMU would refuse it.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

/// Why a DMA access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DMA of {len} bytes at IOVA {iova:#x} is not mapped{}", if *.read_only { " writable" } else { "" })]
pub struct DmaFault {
    /// Where.
    pub iova: u64,
    /// How much.
    pub len: usize,
    /// The mapping exists but does not allow writes.
    pub read_only: bool,
}

struct Mapping {
    size: u64,
    host: *mut u8,
    writable: bool,
}

// SAFETY: the pointer is to a shared mapping owned by this structure; access goes through
// volatile copies under the mutex.
unsafe impl Send for Mapping {}

// SAFETY: `Inner` only lives inside the `DmaSpace` mutex; its cached pointer is one of its own
// mappings' and is dropped whenever they change.
unsafe impl Send for Inner {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping `map` created.
        unsafe { libc::munmap(self.host.cast(), self.size as usize) };
    }
}

/// The DMA space, held for a run of accesses.
pub struct DmaAccess<'a> {
    inner: std::sync::MutexGuard<'a, Inner>,
}

impl DmaAccess<'_> {
    fn access(&mut self, iova: u64, len: usize, write: bool, copy: impl FnOnce(*mut u8)) -> Result<(), DmaFault> {
        let inner = &mut *self.inner;
        let fault = |read_only| DmaFault { iova, len, read_only };
        match inner.lookup(iova, len) {
            Some((_, _, false)) if write => {
                inner.counters.dma_faults += 1;
                Err(fault(true))
            }
            Some((host, offset, _)) => {
                // SAFETY: `offset + len` lies inside the mapping (checked above).
                copy(unsafe { host.add(offset as usize) });
                Ok(())
            }
            None => {
                inner.counters.dma_faults += 1;
                tracing::warn!("refused DMA of {len} bytes at IOVA {iova:#x}: not mapped");
                Err(fault(false))
            }
        }
    }

    /// Reads guest memory at `iova` into `buf`.
    pub fn read(&mut self, iova: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let len = buf.len();
        let dst = buf.as_mut_ptr();
        self.access(iova, len, false, |src| {
            // SAFETY: `src..src+len` is mapped guest memory; `dst` is our buffer. The guest may
            // change the memory concurrently, so this is a plain byte copy of whatever is there.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
        })
    }

    /// Writes `buf` to guest memory at `iova`.
    pub fn write(&mut self, iova: u64, buf: &[u8]) -> Result<(), DmaFault> {
        let len = buf.len();
        let src = buf.as_ptr();
        self.access(iova, len, true, |dst| {
            // SAFETY: `dst..dst+len` is mapped, writable guest memory.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
        })
    }
}

#[derive(Default)]
struct Inner {
    maps: BTreeMap<u64, Mapping>,
    /// The mapping the last access hit: (start, size, host, writable). A device streams
    /// through a few mappings, so most lookups end here. Cleared whenever the maps change.
    last: Option<(u64, u64, *mut u8, bool)>,
    counters: super::counters::ModelCounters,
}

impl Inner {
    fn lookup(&mut self, iova: u64, len: usize) -> Option<(*mut u8, u64, bool)> {
        let end = iova.checked_add(len as u64)?;
        if let Some((start, size, host, writable)) = self.last
            && iova >= start
            && end <= start + size
        {
            return Some((host, iova - start, writable));
        }
        let (&start, m) = self.maps.range(..=iova).next_back()?;
        if end > start + m.size {
            return None;
        }
        self.last = Some((start, m.size, m.host, m.writable));
        Some((m.host, iova - start, m.writable))
    }
}

/// The DMA maps a model holds, and its counters.
#[derive(Default)]
pub struct DmaSpace {
    inner: Mutex<Inner>,
}

impl DmaSpace {
    /// An empty DMA space.
    pub fn new() -> Self {
        Self::default()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// DMA_MAP: `[iova, iova + size)` is `size` bytes at `offset` of `file`.
    pub fn map(&self, iova: u64, size: u64, file: &File, offset: u64, writable: bool) -> std::io::Result<()> {
        if size == 0 || iova.checked_add(size).is_none() || size > 1 << 40 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut inner = self.inner();
        inner.counters.dma_maps += 1;
        if let Some((&start, m)) = inner.maps.range(..iova + size).next_back()
            && start + m.size > iova
        {
            return Err(std::io::Error::from_raw_os_error(libc::EEXIST));
        }
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a fresh shared mapping of the client's memory file, checked below and
        // unmapped when the mapping is dropped.
        let host = unsafe {
            libc::mmap(std::ptr::null_mut(), size as usize, prot, libc::MAP_SHARED, file.as_raw_fd(), offset as i64)
        };
        if host == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        inner.maps.insert(iova, Mapping { size, host: host.cast(), writable });
        inner.last = None;
        Ok(())
    }

    /// DMA_UNMAP of every mapping inside `[iova, iova + size)`.
    pub fn unmap(&self, iova: u64, size: u64) {
        let mut inner = self.inner();
        inner.counters.dma_unmaps += 1;
        let end = iova.saturating_add(size);
        let doomed: Vec<u64> =
            inner.maps.range(iova..end).filter(|(start, m)| **start + m.size <= end).map(|(start, _)| *start).collect();
        for start in doomed {
            inner.maps.remove(&start);
        }
        inner.last = None;
    }

    /// Drops every mapping (the client went away or reset the device).
    pub fn clear(&self) {
        let mut inner = self.inner();
        inner.maps.clear();
        inner.last = None;
    }

    /// Holds the DMA space for several accesses in a row (one lock for a whole frame).
    pub fn lock(&self) -> DmaAccess<'_> {
        DmaAccess { inner: self.inner() }
    }

    /// Reads guest memory at `iova` into `buf`.
    pub fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        self.lock().read(iova, buf)
    }

    /// Writes `buf` to guest memory at `iova`.
    pub fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaFault> {
        self.lock().write(iova, buf)
    }

    /// Counts an interrupt the model signalled.
    pub fn count_interrupt(&self) {
        self.inner().counters.interrupts += 1;
    }

    /// The counters.
    pub fn counters(&self) -> super::counters::ModelCounters {
        self.inner().counters
    }

    /// Number of live mappings.
    pub fn mappings(&self) -> usize {
        self.inner().maps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd(size: u64) -> File {
        // SAFETY: memfd_create with a valid name; checked.
        let fd = unsafe { libc::memfd_create(c"dma-test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size).unwrap();
        file
    }

    #[test]
    fn only_mapped_memory_is_reachable() {
        let space = DmaSpace::new();
        let ram = memfd(0x4000);
        space.map(0x10_0000, 0x2000, &ram, 0x1000, true).unwrap();
        space.map(0x20_0000, 0x1000, &ram, 0, false).unwrap();
        assert!(space.map(0x10_1000, 0x1000, &ram, 0, true).is_err(), "overlap");
        space.write(0x10_0ff0, &[1, 2, 3, 4]).unwrap();
        let mut back = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&ram, &mut back, 0x1ff0).unwrap();
        assert_eq!(back, [1, 2, 3, 4], "landed in the client's memory at the mapped offset");
        space.read(0x10_0ff0, &mut back).unwrap();
        assert_eq!(space.read(0x30_0000, &mut back), Err(DmaFault { iova: 0x30_0000, len: 4, read_only: false }));
        assert!(space.write(0x10_1ffe, &[0; 4]).is_err(), "runs off the end");
        assert!(space.write(0x20_0000, &[0; 4]).unwrap_err().read_only);
        space.read(0x20_0000, &mut back).unwrap();
        space.unmap(0x10_0000, 0x2000);
        assert!(space.read(0x10_0000, &mut back).is_err());
        let c = space.counters();
        assert_eq!((c.dma_maps, c.dma_unmaps, c.dma_faults), (3, 1, 4));
        assert_eq!(space.mappings(), 1);
    }
}

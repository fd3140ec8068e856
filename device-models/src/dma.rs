//! A model's view of guest memory: only what the client mapped with DMA_MAP (with a virtual
//! IOMMU in front, exactly what the guest driver mapped). An access outside is refused and
//! counted as a fault, as a real IOMMU would refuse it.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use crate::pcie_link::LinkLedger;
use vm_spec::pcie_link::LinkProfile;

/// Why a DMA access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DMA of {len} bytes at IOVA {iova:#x} is not mapped{}", if *.read_only { " writable" } else { "" })]
pub struct DmaFault {
    /// The IOVA: the address the device sees.
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
    fn access(
        &mut self,
        iova: u64,
        len: usize,
        write: bool,
        mut copy: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), DmaFault> {
        let inner = &mut *self.inner;
        let fault = |read_only| DmaFault { iova, len, read_only };
        match inner.pieces(iova, len) {
            Some(pieces) if write && pieces.items[..pieces.count].iter().any(|p| !p.2) => {
                inner.counters.dma_faults += 1;
                Err(fault(true))
            }
            Some(pieces) => {
                let mut done = 0;
                for &(host, n, _) in &pieces.items[..pieces.count] {
                    copy(host, done, n);
                    done += n;
                }
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
        let dst = buf.as_mut_ptr();
        self.access(iova, buf.len(), false, |src, done, n| {
            // SAFETY: `src..src+n` is mapped guest memory (one piece of the access) and
            // `done + n` is within `buf`. The guest may change the memory concurrently, so this
            // is a plain byte copy of whatever is there.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.add(done), n) }
        })
    }

    /// Counts in the bus ledger what the chip puts on its link (nothing for a model without one).
    pub fn link(&mut self, count: impl FnOnce(&mut LinkLedger)) {
        if let Some(ledger) = self.inner.link.as_mut() {
            count(ledger);
        }
    }

    /// Writes `buf` to guest memory at `iova`.
    pub fn write(&mut self, iova: u64, buf: &[u8]) -> Result<(), DmaFault> {
        let src = buf.as_ptr();
        self.access(iova, buf.len(), true, |dst, done, n| {
            // SAFETY: `dst..dst+n` is mapped, writable guest memory and `done + n` is within
            // `buf`.
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst, n) }
        })
    }
}

#[derive(Default)]
struct Inner {
    maps: BTreeMap<u64, Mapping>,
    /// The mapping the last access hit: (start, size, host, writable). A device streams
    /// through a few mappings, so most lookups end here. Cleared whenever the maps change.
    last: Option<(u64, u64, *mut u8, bool)>,
    counters: vm_spec::counters::ModelCounters,
    /// What the chip put on its link, for models that count it.
    link: Option<LinkLedger>,
}

impl Inner {
    /// The mapping holding `iova` and the bytes it has from there, with the cache.
    fn segment(&mut self, iova: u64) -> Option<(*mut u8, u64, bool)> {
        if let Some((start, size, host, writable)) = self.last
            && iova >= start
            && iova < start + size
        {
            return Some((host.wrapping_add((iova - start) as usize), start + size - iova, writable));
        }
        let (&start, m) = self.maps.range(..=iova).next_back()?;
        if iova >= start + m.size {
            return None;
        }
        self.last = Some((start, m.size, m.host, m.writable));
        Some((m.host.wrapping_add((iova - start) as usize), start + m.size - iova, m.writable))
    }

    /// The pieces of host memory behind `[iova, iova + len)`: one per mapping it crosses. A
    /// client may split one guest mapping into several adjacent DMA maps (QEMU maps in
    /// power-of-two chunks), so an access may span them. `None` if any byte is unmapped.
    fn pieces(&mut self, iova: u64, len: usize) -> Option<Pieces> {
        iova.checked_add(len as u64)?;
        let mut pieces = Pieces::default();
        let (mut at, mut left) = (iova, len as u64);
        while left > 0 {
            let (host, available, writable) = self.segment(at)?;
            let take = available.min(left);
            if pieces.count == pieces.items.len() {
                return None;
            }
            pieces.items[pieces.count] = (host, take as usize, writable);
            pieces.count += 1;
            at += take;
            left -= take;
        }
        Some(pieces)
    }
}

/// Up to eight pieces of host memory (an access crossing more mappings than that is refused).
struct Pieces {
    items: [(*mut u8, usize, bool); 8],
    count: usize,
}

impl Default for Pieces {
    fn default() -> Self {
        Pieces { items: [(std::ptr::null_mut(), 0, false); 8], count: 0 }
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

    /// An empty DMA space whose accesses the model also counts as `profile`'s chip would put
    /// them on its link ([`DmaSpace::bus`]).
    pub fn with_link(profile: LinkProfile) -> Self {
        let space = Self::default();
        space.inner().link = Some(LinkLedger::new(profile));
        space
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

    /// DMA_MAP of memory the client could not pass a file for (ROM, for instance): counted, but
    /// the model cannot reach it, so accesses there fault.
    pub fn map_unbacked(&self, iova: u64, size: u64) {
        self.inner().counters.dma_maps += 1;
        tracing::debug!("DMA map of {size:#x} bytes at IOVA {iova:#x} without a file: not reachable");
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

    /// Drops every mapping (the client went away or reset the device), and the chip's fetched
    /// descriptors with them.
    pub fn clear(&self) {
        let mut inner = self.inner();
        inner.maps.clear();
        inner.last = None;
        if let Some(ledger) = inner.link.as_mut() {
            ledger.forget_fetched();
        }
    }

    /// Counts in the bus ledger (see [`DmaAccess::bus`]).
    pub fn link(&self, count: impl FnOnce(&mut LinkLedger)) {
        self.lock().link(count)
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

    /// The counters, with the bus ledger's counts.
    pub fn counters(&self) -> vm_spec::counters::ModelCounters {
        let inner = self.inner();
        let bus = inner.link.as_ref().map(LinkLedger::counts).unwrap_or_default();
        vm_spec::counters::ModelCounters { link: bus, ..inner.counters }
    }

    /// Number of live mappings.
    pub fn mappings(&self) -> usize {
        self.inner().maps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::memfd;

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

    #[test]
    fn accesses_span_adjacent_mappings_but_not_gaps() {
        let space = DmaSpace::new();
        let ram = memfd(0x4000);
        // One guest buffer that the client mapped as two pieces (QEMU maps in power-of-two
        // chunks), backed by distant parts of the file.
        space.map(0x40_0000, 0x1000, &ram, 0x3000, true).unwrap();
        space.map(0x40_1000, 0x1000, &ram, 0, true).unwrap();
        space.write(0x40_0ffc, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let mut back = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&ram, &mut back, 0x3ffc).unwrap();
        assert_eq!(back, [1, 2, 3, 4]);
        std::os::unix::fs::FileExt::read_exact_at(&ram, &mut back, 0).unwrap();
        assert_eq!(back, [5, 6, 7, 8]);
        let mut both = [0u8; 8];
        space.read(0x40_0ffc, &mut both).unwrap();
        assert_eq!(both, [1, 2, 3, 4, 5, 6, 7, 8]);
        space.map(0x40_3000, 0x1000, &ram, 0x1000, true).unwrap();
        assert!(space.read(0x40_1ffc, &mut both).is_err(), "a gap at 0x40_2000");
        space.map_unbacked(0x50_0000, 0x1000);
        assert!(space.read(0x50_0000, &mut back).is_err(), "unbacked memory is not reachable");
        assert_eq!(space.counters().dma_maps, 4);
    }
}

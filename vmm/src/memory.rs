//! Guest RAM: one memfd (so another process, e.g. a vfio-user server, can map it), split around
//! the 32-bit MMIO hole, and the E820 map that describes it.

use std::fs::File;

use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::layout::{EBDA_START, FOUR_GIB, HIGH_MEMORY_START, MMIO_HOLE_START, PCI_ECAM_BASE, PCI_ECAM_SIZE};

/// One MiB.
pub const MIB: u64 = 1 << 20;
/// What [`RamLayout::with_ram_above_4gib`] moves above 4 GiB: one huge page.
pub const RAM_ABOVE_4GIB: u64 = 2 * MIB;

/// Errors creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// memfd_create or ftruncate failed.
    #[error("cannot create the guest memory file: {0}")]
    Memfd(#[source] std::io::Error),
    /// Mapping the memory failed.
    #[error("cannot map guest memory: {0}")]
    Mmap(String),
}

/// E820 memory types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum E820Type {
    /// Usable RAM.
    Ram = 1,
    /// Reserved: zero.
    Reserved = 2,
    /// ACPI tables, reclaimable.
    Acpi = 3,
}

/// One entry of the memory map handed to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    /// First address.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// Kind of memory.
    pub kind: E820Type,
}

/// Where RAM lives in the guest-physical address space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamLayout {
    /// `(guest address, length)` of each RAM range, ascending.
    pub ranges: Vec<(u64, u64)>,
    /// `(guest address, length)` of the payload window: guest RAM the E820 map reserves
    /// ([`RamLayout::with_payload_window`]).
    pub payload_window: Option<(u64, u64)>,
}

/// RAM the E820 map leaves usable above a payload window, so that the window lies below the
/// end of the guest's RAM (`high_memory`), where `/dev/mem` serves it.
pub const RAM_ABOVE_PAYLOAD_WINDOW: u64 = 2 * MIB;

impl RamLayout {
    /// RAM of `size` bytes: below the MMIO hole first, the rest from 4 GiB.
    pub fn new(size: u64) -> RamLayout {
        let low = size.min(MMIO_HOLE_START);
        let mut ranges = vec![(0, low)];
        if size > low {
            ranges.push((FOUR_GIB, size - low));
        }
        RamLayout { ranges, payload_window: None }
    }

    /// RAM of `size` bytes with some of it above 4 GiB however small the guest: the last
    /// [`RAM_ABOVE_4GIB`] bytes move to 4 GiB when all of it would fit below the hole. An x86
    /// guest sets up its swiotlb bounce pool only when it has RAM above 4 GiB
    /// (`pci_swiotlb_detect()` in arch/x86/kernel/pci-dma.c), and an untrusted device's
    /// unaligned DMA mappings fail without one ("DMA bounce buffers are inactive",
    /// `iommu_dma_map_page()` in drivers/iommu/dma-iommu.c). The guest's RAM stays the size asked.
    pub fn with_ram_above_4gib(size: u64) -> RamLayout {
        if size > MMIO_HOLE_START || size <= 2 * RAM_ABOVE_4GIB {
            return RamLayout::new(size);
        }
        RamLayout { ranges: vec![(0, size - RAM_ABOVE_4GIB), (FOUR_GIB, RAM_ABOVE_4GIB)], payload_window: None }
    }

    /// This layout with `size` bytes (whole MiB) of its low RAM set aside as a payload window,
    /// just below the last [`RAM_ABOVE_PAYLOAD_WINDOW`] bytes of low RAM: the E820 map reserves
    /// it (no driver claims it, so Linux's `/dev/mem` reads it: `devmem_is_allowed()` in
    /// arch/x86/mm/init.c, `do_mark_busy()` in arch/x86/kernel/e820.c) and the initrd goes below
    /// it. Unchanged when `size` is 0 or more than half of low RAM's room (a spec's checks keep
    /// it to a quarter of the VM's memory and 1 GiB: `VmSpec::validate`).
    pub fn with_payload_window(mut self, size: u64) -> RamLayout {
        let low_end = self.low_end();
        let room = low_end.saturating_sub(HIGH_MEMORY_START + RAM_ABOVE_PAYLOAD_WINDOW);
        if size == 0 || size % MIB != 0 || size > room / 2 {
            return self;
        }
        self.payload_window = Some((low_end - RAM_ABOVE_PAYLOAD_WINDOW - size, size));
        self
    }

    /// Where RAM for the initrd ends: the payload window's start, or the end of low RAM.
    pub fn initrd_top(&self) -> u64 {
        self.payload_window.map_or(self.low_end(), |(addr, _)| addr)
    }

    /// End of RAM below the hole.
    pub fn low_end(&self) -> u64 {
        self.ranges[0].1
    }

    /// End of the highest RAM range.
    pub fn end(&self) -> u64 {
        self.ranges.last().map_or(0, |&(addr, size)| addr + size)
    }

    /// Total RAM.
    pub fn size(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }

    /// True if `[addr, addr + len)` lies in one RAM range.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.ranges.iter().any(|&(base, size)| addr >= base && end <= base + size)
    }

    /// The E820 map: low RAM up to the EBDA, the EBDA and BIOS area (with the ACPI tables)
    /// reserved, RAM from 1 MiB (less the payload window, reserved), the PCI ECAM window
    /// reserved, RAM above 4 GiB.
    pub fn e820(&self) -> Vec<E820Entry> {
        let low_end = self.low_end();
        let mut map = vec![
            E820Entry { addr: 0, size: EBDA_START, kind: E820Type::Ram },
            E820Entry { addr: EBDA_START, size: HIGH_MEMORY_START - EBDA_START, kind: E820Type::Reserved },
        ];
        match self.payload_window {
            Some((addr, size)) => map.extend([
                E820Entry { addr: HIGH_MEMORY_START, size: addr - HIGH_MEMORY_START, kind: E820Type::Ram },
                E820Entry { addr, size, kind: E820Type::Reserved },
                E820Entry { addr: addr + size, size: low_end - addr - size, kind: E820Type::Ram },
            ]),
            None if low_end > HIGH_MEMORY_START => {
                map.push(E820Entry { addr: HIGH_MEMORY_START, size: low_end - HIGH_MEMORY_START, kind: E820Type::Ram });
            }
            None => {}
        }
        map.push(E820Entry { addr: PCI_ECAM_BASE, size: PCI_ECAM_SIZE, kind: E820Type::Reserved });
        map.extend(self.ranges[1..].iter().map(|&(addr, size)| E820Entry { addr, size, kind: E820Type::Ram }));
        map
    }
}

/// Guest RAM and the file behind it.
pub struct GuestRam {
    /// The mapped memory.
    pub memory: GuestMemoryMmap,
    /// Its layout.
    pub layout: RamLayout,
    /// The file backing all ranges, in layout order (range `i` at the file offset that is the sum
    /// of the lengths before it): a memfd, shared with the devices; or, for a VM restored with
    /// its RAM mapped from its snapshot ([`GuestRam::mapped_from`]), the snapshot's RAM file,
    /// mapped private (the VM's writes are its own).
    pub file: File,
    /// Whether the ranges map `file` private (a snapshot's RAM) rather than shared: then `file`
    /// lacks what the VM wrote, so no device model may map it and no snapshot may be written
    /// from it.
    pub private: bool,
    /// Whether the host took the advice to back guest RAM with transparent huge pages.
    pub huge_pages: bool,
}

/// Asks the host to back `len` bytes at `addr` with transparent huge pages, as QEMU and Cloud
/// Hypervisor do for guest RAM: one 2 MiB page where 512 small ones each cost the guest a
/// nested-paging fault on first touch (a Debian 6.12 boot takes about 16,000 of them in 4 KiB
/// pages). For guest RAM in a memfd the host honours it when
/// `/sys/kernel/mm/transparent_hugepage/shmem_enabled` is `advise` (or `within_size`, `always`);
/// Debian's default `never` keeps small pages, and nothing else changes. Whether it was taken.
fn advise_huge_pages(addr: *mut u8, len: usize) -> bool {
    // SAFETY: madvise on a mapping this process owns; MADV_HUGEPAGE changes how it is backed,
    // never its contents.
    let done = unsafe { libc::madvise(addr.cast(), len, libc::MADV_HUGEPAGE) } == 0;
    done && vm_spec::host::shmem_huge_pages().is_some_and(|s| vm_spec::host::shmem_huge_pages_on_request(&s))
}

impl GuestRam {
    /// Creates memfd-backed RAM for `layout`. Pages are only allocated when touched.
    pub fn new(layout: RamLayout) -> Result<GuestRam, MemoryError> {
        let file = memfd::MemfdOptions::default()
            .close_on_exec(true)
            .create("driverlab-guest-ram")
            .map_err(|e| MemoryError::Memfd(std::io::Error::other(e)))?
            .into_file();
        file.set_len(layout.size()).map_err(MemoryError::Memfd)?;
        let mut offset = 0;
        let mut regions = Vec::new();
        for &(addr, size) in &layout.ranges {
            let clone = file.try_clone().map_err(MemoryError::Memfd)?;
            regions.push((GuestAddress(addr), size as usize, Some(FileOffset::new(clone, offset))));
            offset += size;
        }
        let memory = GuestMemoryMmap::from_ranges_with_files(regions).map_err(|e| MemoryError::Mmap(e.to_string()))?;
        let huge_pages = memory.iter().all(|region| advise_huge_pages(region.as_ptr(), region.len() as usize));
        Ok(GuestRam { memory, layout, file, huge_pages, private: false })
    }

    /// RAM for `layout` mapped private from `file`, a snapshot's RAM file of the layout's size:
    /// nothing is copied up front; the guest's pages come from the file (the page cache) as it
    /// touches them, and what it writes goes to pages of its own (copy on write), never to the
    /// file. No device model can share it (a vfio-user model maps the memfd); kernel VFIO pins
    /// the guest's pages where they are, for writing (vfio-ioctls maps DMA read and write), which
    /// breaks the copy on write at the pin: the device and the guest share the VM's own page.
    pub fn mapped_from(layout: RamLayout, file: File) -> Result<GuestRam, MemoryError> {
        use vm_memory::mmap::{GuestRegionMmap, MmapRegionBuilder};
        let mut offset = 0;
        let mut regions = Vec::new();
        for &(addr, size) in &layout.ranges {
            let clone = file.try_clone().map_err(MemoryError::Memfd)?;
            let region = MmapRegionBuilder::new(size as usize)
                .with_file_offset(FileOffset::new(clone, offset))
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
                .build()
                .map_err(|e| MemoryError::Mmap(e.to_string()))?;
            let region = GuestRegionMmap::new(region, GuestAddress(addr))
                .ok_or_else(|| MemoryError::Mmap(format!("a range at {addr:#x} overflows")))?;
            regions.push(region);
            offset += size;
        }
        let memory = GuestMemoryMmap::from_regions(regions).map_err(|e| MemoryError::Mmap(e.to_string()))?;
        Ok(GuestRam { memory, layout, file, huge_pages: false, private: true })
    }
}

impl GuestRam {
    /// Reads `len` bytes at `offset` of `file` into RAM at the same offset of the memory file,
    /// straight through this process's mapping of it: no copy through a buffer, and the host
    /// backs the pages as it backs the guest's own touches (in transparent huge pages where it
    /// gives them; a write to the memfd itself would take small ones).
    pub fn read_at_file_offset(&self, file: &File, offset: u64, len: u64) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        use vm_memory::{Bytes, MemoryRegionAddress};
        let end = offset + len;
        let mut read = 0;
        let mut reader = file;
        for region in self.memory.iter() {
            let Some(start) = region.file_offset().map(FileOffset::start) else { continue };
            let (from, to) = (offset.max(start), end.min(start + region.len()));
            if from < to {
                reader.seek(SeekFrom::Start(from))?;
                region
                    .read_exact_volatile_from(MemoryRegionAddress(from - start), &mut reader, (to - from) as usize)
                    .map_err(std::io::Error::other)?;
                read += to - from;
            }
        }
        if read < len {
            return Err(std::io::Error::other(format!("{len} bytes at {offset:#x} run past guest RAM")));
        }
        Ok(())
    }

    /// Guest RAM as a passthrough backend needs it to map DMA: guest ranges, where this process
    /// has them, and where they are in the memfd.
    pub fn dma_view(&self) -> passthrough::backend::GuestRamMap {
        use std::os::fd::AsRawFd;
        let mut offset = 0;
        let ranges = self
            .memory
            .iter()
            .map(|region| {
                let range = passthrough::backend::RamRange {
                    gpa: region.start_addr().0,
                    size: region.len(),
                    host_addr: region.as_ptr() as u64,
                    fd: self.file.as_raw_fd(),
                    fd_offset: offset,
                };
                offset += region.len();
                range
            })
            .collect();
        passthrough::backend::GuestRamMap::new(ranges)
    }
}

/// The host's total RAM in bytes, from /proc/meminfo.
pub fn host_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend};

    #[test]
    fn small_guest_is_one_range_and_e820_accounts_for_legacy_hole() {
        let layout = RamLayout::new(256 * MIB);
        assert_eq!(layout.ranges, vec![(0, 256 * MIB)]);
        let e820 = layout.e820();
        let ram: u64 = e820.iter().filter(|e| e.kind == E820Type::Ram).map(|e| e.size).sum();
        assert_eq!(ram, 256 * MIB - (HIGH_MEMORY_START - EBDA_START));
        assert!(e820.windows(2).all(|w| w[0].addr + w[0].size <= w[1].addr), "sorted, disjoint");
    }

    #[test]
    fn large_guest_skips_the_mmio_hole() {
        let layout = RamLayout::new(5 << 30);
        assert_eq!(layout.ranges, vec![(0, 3 << 30), (4 << 30, 2 << 30)]);
        assert!(!layout.contains(MMIO_HOLE_START, 1));
        assert!(layout.contains(FOUR_GIB, 2 << 30));
        assert!(!layout.contains(FOUR_GIB, (2 << 30) + 1));
        let ram: u64 = layout.e820().iter().filter(|e| e.kind == E820Type::Ram).map(|e| e.size).sum();
        assert_eq!(ram, (5 << 30) - (HIGH_MEMORY_START - EBDA_START));
    }

    #[test]
    fn a_guest_with_an_untrusted_device_has_ram_above_4gib_and_the_same_amount() {
        let layout = RamLayout::with_ram_above_4gib(512 * MIB);
        assert_eq!(layout.ranges, vec![(0, 510 * MIB), (FOUR_GIB, 2 * MIB)]);
        assert_eq!(layout.size(), 512 * MIB);
        assert_eq!(layout.end(), FOUR_GIB + 2 * MIB);
        let e820 = layout.e820();
        assert_eq!(e820.last().map(|e| (e.addr, e.kind)), Some((FOUR_GIB, E820Type::Ram)));
        assert!(e820.windows(2).all(|w| w[0].addr + w[0].size <= w[1].addr), "sorted, disjoint");
        assert_eq!(RamLayout::with_ram_above_4gib(5 << 30), RamLayout::new(5 << 30), "already above");
        assert_eq!(RamLayout::with_ram_above_4gib(4 * MIB), RamLayout::new(4 * MIB), "too small to split");
        let ram = GuestRam::new(RamLayout::with_ram_above_4gib(8 * MIB)).unwrap();
        ram.memory.write_obj(7u8, GuestAddress(FOUR_GIB + MIB)).unwrap();
        let mut byte = [0u8];
        std::os::unix::fs::FileExt::read_exact_at(&ram.file, &mut byte, 7 * MIB).unwrap();
        assert_eq!(byte, [7], "the high range follows the low one in the file");
    }

    #[test]
    fn a_payload_window_is_reserved_ram_below_the_last_usable_ram_and_tops_the_initrd() {
        for layout in [RamLayout::new(512 * MIB), RamLayout::with_ram_above_4gib(512 * MIB)] {
            let low_end = layout.low_end();
            let windowed = layout.clone().with_payload_window(16 * MIB);
            let start = low_end - RAM_ABOVE_PAYLOAD_WINDOW - 16 * MIB;
            assert_eq!(windowed.payload_window, Some((start, 16 * MIB)));
            assert_eq!((windowed.size(), windowed.initrd_top()), (layout.size(), start), "RAM kept, initrd below");
            let e820 = windowed.e820();
            assert!(e820.windows(2).all(|w| w[0].addr + w[0].size <= w[1].addr), "sorted, disjoint");
            let at = |addr: u64| e820.iter().find(|e| e.addr <= addr && addr < e.addr + e.size).map(|e| e.kind);
            assert_eq!(at(start), Some(E820Type::Reserved));
            assert_eq!(at(start + 16 * MIB - 1), Some(E820Type::Reserved));
            assert_eq!((at(start - 1), at(start + 16 * MIB)), (Some(E820Type::Ram), Some(E820Type::Ram)));
            assert_eq!(at(low_end - 1), Some(E820Type::Ram), "usable RAM above it");
            let ram: u64 = e820.iter().filter(|e| e.kind == E820Type::Ram).map(|e| e.size).sum();
            assert_eq!(ram, layout.size() - (HIGH_MEMORY_START - EBDA_START) - 16 * MIB);
        }
        let small = RamLayout::new(8 * MIB);
        assert_eq!(small.clone().with_payload_window(4 * MIB), small, "no room: unchanged");
        assert_eq!(small.clone().with_payload_window(0), small);
    }

    #[test]
    fn ram_is_backed_by_one_shared_file() {
        let ram = GuestRam::new(RamLayout::new(8 * MIB)).unwrap();
        ram.memory.write_obj(0xdead_beef_u32, GuestAddress(0x1000)).unwrap();
        let mut buf = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&ram.file, &mut buf, 0x1000).unwrap();
        assert_eq!(u32::from_le_bytes(buf), 0xdead_beef);
        assert_eq!(ram.memory.num_regions(), 1);
        // Huge pages asked for; granted exactly when the host's setting grants them.
        let granted = vm_spec::host::shmem_huge_pages().is_some_and(|s| vm_spec::host::shmem_huge_pages_on_request(&s));
        assert_eq!(ram.huge_pages, granted);
    }

    #[test]
    fn bytes_of_a_file_land_where_their_offset_is_in_the_memory_file() {
        // 510 MiB below 4 GiB, 2 MiB above: file offset 510 MiB is guest address 4 GiB.
        let ram = GuestRam::new(RamLayout::with_ram_above_4gib(512 * MIB)).unwrap();
        let bytes: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        let mut snapshot = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut snapshot, &[vec![0; 510 * MIB as usize - 4096], bytes.clone()].concat())
            .unwrap();
        ram.read_at_file_offset(&snapshot, 510 * MIB - 4096, 8192).unwrap();
        let (mut low, mut high) = ([0u8; 4096], [0u8; 4096]);
        ram.memory.read_slice(&mut low, GuestAddress(510 * MIB - 4096)).unwrap();
        ram.memory.read_slice(&mut high, GuestAddress(FOUR_GIB)).unwrap();
        assert!(low[..] == bytes[..4096] && high[..] == bytes[4096..], "split across the two ranges");
        let mut file = [0u8; 8192];
        std::os::unix::fs::FileExt::read_exact_at(&ram.file, &mut file, 510 * MIB - 4096).unwrap();
        assert!(file[..] == bytes[..], "and in the memory file at the offset");
        assert!(ram.read_at_file_offset(&snapshot, 512 * MIB - 4096, 8192).is_err(), "past the end");
    }
}

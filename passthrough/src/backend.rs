//! What a passthrough device needs from whatever gives it access to the device: kernel VFIO or a
//! vfio-user server. Both speak VFIO's model: numbered regions (BARs, ROM, configuration space),
//! interrupt indices with eventfds, DMA mappings of guest memory, reset.

use std::fs::File;
use std::os::fd::RawFd;

use vmm_sys_util::eventfd::EventFd;

/// VFIO PCI region indices.
pub mod region {
    /// BAR 0; BARs 1-5 follow.
    pub const BAR0: u32 = 0;
    /// Expansion ROM.
    pub const ROM: u32 = 6;
    /// Configuration space.
    pub const CONFIG: u32 = 7;
    /// Region flag: readable.
    pub const FLAG_READ: u32 = 1 << 0;
    /// Region flag: writable.
    pub const FLAG_WRITE: u32 = 1 << 1;
    /// Region flag: can be mmapped.
    pub const FLAG_MMAP: u32 = 1 << 2;
}

/// VFIO PCI interrupt indices.
pub mod irq {
    /// INTx.
    pub const INTX: u32 = 0;
    /// MSI.
    pub const MSI: u32 = 1;
    /// MSI-X.
    pub const MSIX: u32 = 2;
}

/// Errors from a backend. After `Broken`, the device is unusable.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The device (or its server) refused the request.
    #[error("{what}: refused with errno {errno}")]
    Refused {
        /// The request.
        what: &'static str,
        /// The errno the device reported.
        errno: i32,
    },
    /// The connection or file descriptor failed, or the peer broke the protocol; the device
    /// cannot be used any more.
    #[error("{0}")]
    Broken(String),
    /// The request itself was out of range (a bad region index, offset or size).
    #[error("{0}")]
    Invalid(String),
    /// The host cannot do this (no VFIO, permissions).
    #[error("{0}")]
    Host(String),
    /// The device named does not exist: no such PCI address, no socket at the path.
    #[error("{0}")]
    NotFound(String),
}

/// One region of the device.
#[derive(Debug)]
pub struct RegionInfo {
    /// VFIO region index.
    pub index: u32,
    /// `region::FLAG_*`.
    pub flags: u32,
    /// Size in bytes.
    pub size: u64,
    /// A file to mmap the region from, and the offset of the region in it.
    pub mmap: Option<(File, u64)>,
    /// Parts that may be mmapped, as (offset, size); empty with `FLAG_MMAP` means all of it.
    pub sparse: Vec<(u64, u64)>,
}

impl RegionInfo {
    /// Whether (part of) the region can be mmapped.
    pub fn mappable(&self) -> bool {
        self.flags & region::FLAG_MMAP != 0 && self.mmap.is_some()
    }
}

/// A range of guest RAM as a backend needs it to map DMA.
#[derive(Debug, Clone, Copy)]
pub struct RamRange {
    /// Guest-physical address.
    pub gpa: u64,
    /// Its length in bytes.
    pub size: u64,
    /// Where the VMM has it mapped.
    pub host_addr: u64,
    /// The memfd behind it.
    pub fd: RawFd,
    /// Offset of `gpa` in that file.
    pub fd_offset: u64,
}

/// Guest RAM, for translating DMA targets.
#[derive(Debug, Clone, Default)]
pub struct GuestRamMap {
    ranges: Vec<RamRange>,
}

impl GuestRamMap {
    /// The map of `ranges`.
    pub fn new(ranges: Vec<RamRange>) -> Self {
        GuestRamMap { ranges }
    }

    /// The ranges.
    pub fn ranges(&self) -> &[RamRange] {
        &self.ranges
    }

    /// The range holding `[gpa, gpa + size)`, if one holds all of it.
    pub fn find(&self, gpa: u64, size: u64) -> Option<&RamRange> {
        let end = gpa.checked_add(size)?;
        self.ranges.iter().find(|r| gpa >= r.gpa && end <= r.gpa + r.size)
    }
}

/// Access to one PCI device through VFIO's model.
pub trait VfioBackend: Send {
    /// A name for messages (the BDF or the socket path).
    fn name(&self) -> &str;
    /// Information about region `index`.
    fn region(&self, index: u32) -> Option<&RegionInfo>;
    /// Number of interrupts of interrupt index `index`.
    fn irq_count(&mut self, index: u32) -> Result<u32, BackendError>;
    /// Reads `data.len()` bytes at `offset` of region `index`.
    fn read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), BackendError>;
    /// Writes `data` at `offset` of region `index`.
    fn write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), BackendError>;
    /// Signals `fds[i]` for vector `i` of interrupt index `index` (`irq::MSI` or `irq::MSIX`).
    fn enable_irqs(&mut self, index: u32, fds: &[&EventFd]) -> Result<(), BackendError>;
    /// Stops interrupt index `index`.
    fn disable_irqs(&mut self, index: u32) -> Result<(), BackendError>;
    /// Lets the device DMA to `[iova, iova + size)`, which is guest RAM at `gpa`.
    fn dma_map(&mut self, iova: u64, size: u64, gpa: u64, write: bool) -> Result<(), BackendError>;
    /// Takes the mapping at `[iova, iova + size)` away.
    fn dma_unmap(&mut self, iova: u64, size: u64) -> Result<(), BackendError>;
    /// Resets the device.
    fn reset(&mut self) -> Result<(), BackendError>;
    /// Whether the device is still as a reset at its opening left it (vfio-pci resets a device
    /// whose reset works when it is first opened, `vfio_pci_core_enable()`), so that the check
    /// before its first use need not reset it again: true at most once, and only before anything
    /// used it.
    fn fresh_from_reset(&mut self) -> bool {
        false
    }
}

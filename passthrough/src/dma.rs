//! Guest memory for a passed-through device's DMA: all of RAM at IOVA = GPA without an IOMMU (or
//! while the endpoint is in bypass), and, behind the virtio-iommu, exactly what the guest maps.

use std::collections::BTreeMap;
use std::sync::Mutex;

use vm_device::dma::{DmaMapError, DmaMapListener};

use crate::backend::{BackendError, GuestRamMap};
use crate::device::{SharedBackend, lock};

/// Mirrors a device's view of guest memory into its backend.
pub struct DmaMirror {
    backend: SharedBackend,
    ram: GuestRamMap,
    identity: Mutex<bool>,
    /// What the guest has mapped through the virtio-iommu: IOVA to size.
    mapped: Mutex<BTreeMap<u64, u64>>,
}

impl DmaMirror {
    /// A mirror for `backend` over guest RAM `ram`.
    pub fn new(backend: SharedBackend, ram: GuestRamMap) -> Self {
        DmaMirror { backend, ram, identity: Mutex::new(false), mapped: Mutex::new(BTreeMap::new()) }
    }

    /// Takes every mapping down, the guest's and the identity one: a device that left the guest
    /// (unplugged) keeps nothing of its memory, whatever the guest had left mapped. Returns how
    /// many of the guest's mappings were still there.
    pub fn unmap_all(&self) -> Result<usize, BackendError> {
        let mapped = std::mem::take(&mut *self.mapped.lock().unwrap_or_else(|p| p.into_inner()));
        let mut backend = lock(&self.backend);
        for (&iova, &size) in &mapped {
            backend.dma_unmap(iova, size)?;
        }
        drop(backend);
        self.unmap_identity()?;
        Ok(mapped.len())
    }

    /// Maps all guest RAM at IOVA = GPA.
    pub fn map_identity(&self) -> Result<(), BackendError> {
        let mut identity = self.identity.lock().unwrap_or_else(|p| p.into_inner());
        if *identity {
            return Ok(());
        }
        let mut backend = lock(&self.backend);
        for (i, range) in self.ram.ranges().iter().enumerate() {
            if let Err(e) = backend.dma_map(range.gpa, range.size, range.gpa, true) {
                for done in &self.ram.ranges()[..i] {
                    let _ = backend.dma_unmap(done.gpa, done.size);
                }
                return Err(e);
            }
        }
        *identity = true;
        Ok(())
    }

    /// Removes the identity mapping.
    pub fn unmap_identity(&self) -> Result<(), BackendError> {
        let mut identity = self.identity.lock().unwrap_or_else(|p| p.into_inner());
        if !*identity {
            return Ok(());
        }
        let mut backend = lock(&self.backend);
        for range in self.ram.ranges() {
            backend.dma_unmap(range.gpa, range.size)?;
        }
        *identity = false;
        Ok(())
    }
}

impl DmaMapListener for DmaMirror {
    fn map(&self, iova: u64, gpa: u64, size: u64, write: bool) -> Result<(), DmaMapError> {
        lock(&self.backend)
            .dma_map(iova, size, gpa, write)
            .map_err(|e| DmaMapError::new(format!("DMA map {iova:#x}+{size:#x}"), e))?;
        self.mapped.lock().unwrap_or_else(|p| p.into_inner()).insert(iova, size);
        Ok(())
    }

    fn unmap(&self, iova: u64, size: u64) -> Result<(), DmaMapError> {
        self.mapped.lock().unwrap_or_else(|p| p.into_inner()).remove(&iova);
        lock(&self.backend)
            .dma_unmap(iova, size)
            .map_err(|e| DmaMapError::new(format!("DMA unmap {iova:#x}+{size:#x}"), e))
    }

    fn bypass(&self, enabled: bool) -> Result<(), DmaMapError> {
        let what = if enabled { "mapping guest RAM for bypass" } else { "unmapping guest RAM after bypass" };
        if enabled { self.map_identity() } else { self.unmap_identity() }.map_err(|e| DmaMapError::new(what, e))
    }
}

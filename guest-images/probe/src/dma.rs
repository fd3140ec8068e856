//! DMA mappings for a device, the way a kernel's DMA API hands them out: behind the virtio-iommu
//! every mapping is a MAP request (and its release an UNMAP), counted; without one the device
//! sees guest-physical addresses and nothing is mapped.

use crate::viommu::Viommu;

/// Behind the IOMMU, IOVAs are guest-physical addresses moved up by this much, so a device that
/// ignored the translation would miss.
const IOVA_OFFSET: u64 = 1 << 32;

/// A device's view of memory.
pub struct DeviceDma<'a> {
    iommu: Option<(&'a mut Viommu, u32)>,
    /// MAP requests made.
    pub maps: u64,
    /// UNMAP requests made.
    pub unmaps: u64,
}

impl<'a> DeviceDma<'a> {
    /// Identity DMA (no IOMMU in front of the device).
    pub fn identity() -> DeviceDma<'a> {
        DeviceDma { iommu: None, maps: 0, unmaps: 0 }
    }

    /// DMA through `viommu`, with the device (requester ID `rid`) attached to `domain`.
    pub fn translated(viommu: &'a mut Viommu, domain: u32, rid: u16) -> Result<DeviceDma<'a>, &'static str> {
        viommu.attach(domain, rid as u32)?;
        Ok(DeviceDma { iommu: Some((viommu, domain)), maps: 0, unmaps: 0 })
    }

    /// The DMA view of the function with requester ID `rid`: through `viommu` in its own domain
    /// (`viommu`'s first plus `domain_offset`) when the VIOT puts it behind it, identity otherwise.
    pub fn for_function(
        viommu: Option<&'a mut Viommu>,
        rid: u16,
        domain_offset: u32,
    ) -> Result<DeviceDma<'a>, &'static str> {
        match viommu {
            Some(v) if v.translates(rid) => {
                let domain = v.first_domain + domain_offset;
                DeviceDma::translated(v, domain, rid)
            }
            _ => Ok(DeviceDma::identity()),
        }
    }

    /// Whether an IOMMU translates.
    pub fn translated_by_iommu(&self) -> bool {
        self.iommu.is_some()
    }

    /// Maps `[gpa, gpa + size)` for the device; returns the address the device uses.
    pub fn map(&mut self, gpa: u64, size: u64) -> Result<u64, &'static str> {
        match &mut self.iommu {
            Some((viommu, domain)) => {
                viommu.map(*domain, gpa + IOVA_OFFSET, size, gpa)?;
                self.maps += 1;
                Ok(gpa + IOVA_OFFSET)
            }
            None => Ok(gpa),
        }
    }

    /// Releases a mapping made by `map`.
    pub fn unmap(&mut self, iova: u64, size: u64) -> Result<(), &'static str> {
        if let Some((viommu, domain)) = &mut self.iommu {
            viommu.unmap(*domain, iova, size)?;
            self.unmaps += 1;
        }
        Ok(())
    }
}

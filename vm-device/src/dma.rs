//! The DMA map listener: an IOMMU tells it every map and unmap that affects one endpoint, and a
//! passed-through device mirrors them into what the device may reach (the host IOMMU for kernel
//! VFIO, DMA_MAP messages for vfio-user).

/// Why a listener could not mirror a change; the IOMMU answers the guest's request with an error
/// and rolls back what it had changed.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct DmaMapError {
    /// What could not be done, e.g. "DMA_MAP 0x1000+0x1000".
    pub what: String,
    /// The backend's error.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl DmaMapError {
    /// An error for `what`, caused by `source`.
    pub fn new(what: impl Into<String>, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        DmaMapError { what: what.into(), source: source.into() }
    }
}

/// Receives every map and unmap that affects one endpoint.
pub trait DmaMapListener: Send + Sync {
    /// `[iova, iova + size)` now translates to guest-physical `gpa`; `write` says whether the
    /// device may write there.
    fn map(&self, iova: u64, gpa: u64, size: u64, write: bool) -> Result<(), DmaMapError>;
    /// `[iova, iova + size)` no longer translates.
    fn unmap(&self, iova: u64, size: u64) -> Result<(), DmaMapError>;
    /// The endpoint enters (`true`) or leaves bypass mode: all guest memory at IOVA = GPA.
    fn bypass(&self, _enabled: bool) -> Result<(), DmaMapError> {
        Ok(())
    }
}

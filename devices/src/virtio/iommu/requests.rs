//! The virtio-iommu's wire layouts (virtio 1.2, section 5.13.6), as zerocopy structs: every field
//! little-endian and unaligned, so a request is read straight from the bytes of its descriptor
//! chain and a reply written as the bytes of a struct.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct virtio_iommu_req_head`.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RequestHead {
    /// The request type (`T_ATTACH`, ...).
    pub kind: u8,
    /// Reserved: zero.
    pub reserved: [u8; 3],
}

/// ATTACH after its head.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Attach {
    /// The domain.
    pub domain: U32,
    /// The endpoint.
    pub endpoint: U32,
    /// `ATTACH_F_*`.
    pub flags: U32,
    /// Must be zero.
    pub reserved: [u8; 4],
}

/// DETACH after its head.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Detach {
    /// The domain.
    pub domain: U32,
    /// The endpoint.
    pub endpoint: U32,
    /// Reserved: zero.
    pub reserved: [u8; 8],
}

/// MAP after its head.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Map {
    /// The domain.
    pub domain: U32,
    /// First IOVA.
    pub virt_start: U64,
    /// Last IOVA (inclusive).
    pub virt_end: U64,
    /// Guest-physical address of `virt_start`.
    pub phys_start: U64,
    /// `MAP_F_*`.
    pub flags: U32,
}

/// UNMAP after its head.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Unmap {
    /// The domain.
    pub domain: U32,
    /// First IOVA.
    pub virt_start: U64,
    /// Last IOVA (inclusive).
    pub virt_end: U64,
    /// Must be zero.
    pub reserved: [u8; 4],
}

/// PROBE after its head.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Probe {
    /// The endpoint.
    pub endpoint: U32,
    /// Reserved: zero.
    pub reserved: [u8; 64],
}

/// `struct virtio_iommu_req_tail`.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RequestTail {
    /// `Status`.
    pub status: u8,
    /// Reserved: zero.
    pub reserved: [u8; 3],
}

/// A PROBE property: a reserved memory region (`struct virtio_iommu_probe_resv_mem`).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ProbeResvMem {
    /// `PROBE_T_RESV_MEM`.
    pub kind: U16,
    /// Bytes after this header field pair: 20.
    pub length: U16,
    /// `RESV_MEM_T_*`.
    pub subtype: u8,
    /// Reserved: zero.
    pub reserved: [u8; 3],
    /// First address.
    pub start: U64,
    /// Last address (inclusive).
    pub end: U64,
}

/// `struct virtio_iommu_config`.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Config {
    /// Page sizes the IOMMU supports.
    pub page_size_mask: U64,
    /// First IOVA.
    pub input_start: U64,
    /// Last IOVA.
    pub input_end: U64,
    /// First domain ID.
    pub domain_start: U32,
    /// Last domain ID.
    pub domain_end: U32,
    /// Bytes of properties a PROBE request carries.
    pub probe_size: U32,
    /// Whether unattached endpoints bypass translation.
    pub bypass: u8,
    /// Reserved: zero.
    pub reserved: [u8; 3],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_specification() {
        assert_eq!(
            [
                size_of::<RequestHead>(),
                size_of::<Attach>(),
                size_of::<Detach>(),
                size_of::<Map>(),
                size_of::<Unmap>(),
                size_of::<Probe>(),
                size_of::<RequestTail>(),
                size_of::<ProbeResvMem>(),
                size_of::<Config>(),
            ],
            [4, 16, 16, 32, 24, 68, 4, 24, 40]
        );
    }
}

//! The kernel VFIO backend (vfio-ioctls, type-1 container): a real device bound to vfio-pci.
//!
//! Kept thin: region access, MSI-X eventfds, DMA mapping and reset go straight to the VFIO
//! ioctls; everything above (configuration shadowing, BAR handling, MSI-X emulation, DMA policy)
//! is the backend-independent code that the vfio-user backend exercises too. It needs a host with
//! an IOMMU and the device bound to vfio-pci: `driverlab doctor --device BDF` checks both.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use vfio_bindings::bindings::vfio::{VFIO_DEVICE_FLAGS_RESET, vfio_device_info};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioOps, VfioRegionInfoCap};
use vmm_sys_util::eventfd::EventFd;

use crate::Bdf;
use crate::backend::{BackendError, GuestRamMap, RegionInfo, VfioBackend, region};

/// A device bound to vfio-pci, in its own container: an [`OpenedVfio`] given the guest RAM.
pub struct KernelVfio {
    opened: OpenedVfio,
    ram: GuestRamMap,
}

/// A device opened through VFIO (its container, its file descriptor, its regions) that has no
/// guest RAM to map DMA into yet: opening needs none, and is slow (vfio-pci resets the device
/// as it is opened, `vfio_pci_core_enable()` calling `pci_try_reset_function()`, 100 ms or more
/// for a function-level reset), so a VMM opens it while it loads the guest's RAM.
pub struct OpenedVfio {
    name: String,
    device: VfioDevice,
    container: Arc<VfioContainer>,
    regions: Vec<RegionInfo>,
    /// Whether vfio-pci reset the device as it opened it, until the device's first check.
    reset_at_open: bool,
}

fn host(what: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::Host(format!("{what}: {e} (run `driverlab doctor --device BDF`)"))
}

impl OpenedVfio {
    /// Opens `bdf` through VFIO, in a container of its own.
    pub fn open(bdf: Bdf) -> Result<Self, BackendError> {
        let name = format!("vfio {bdf}");
        let sysfs = PathBuf::from(format!("/sys/bus/pci/devices/{bdf}"));
        if !sysfs.exists() {
            return Err(BackendError::NotFound(format!("{name}: no such PCI device (lspci -D lists them)")));
        }
        let container = Arc::new(VfioContainer::new(None).map_err(|e| host(&name, e))?);
        let ops: Arc<dyn VfioOps> = container.clone();
        let device = VfioDevice::new(&sysfs, ops, false).map_err(|e| host(&name, e))?;
        let file = || -> Result<File, BackendError> {
            // The device's own file descriptor backs every mmap-able region.
            // SAFETY: dup of a descriptor we own; the duplicate is owned by the returned File.
            let fd = unsafe { libc::dup(device.as_raw_fd()) };
            if fd < 0 {
                return Err(host(&name, std::io::Error::last_os_error()));
            }
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        };
        let mut regions = Vec::new();
        for index in 0..=region::CONFIG {
            let flags = device.get_region_flags(index);
            let sparse = device
                .get_region_caps(index)
                .into_iter()
                .filter_map(|cap| match cap {
                    VfioRegionInfoCap::SparseMmap(sparse) => Some(sparse.areas.into_iter().map(|a| (a.offset, a.size))),
                    _ => None,
                })
                .flatten()
                .collect();
            let mmap =
                if flags & region::FLAG_MMAP != 0 { Some((file()?, device.get_region_offset(index))) } else { None };
            regions.push(RegionInfo { index, flags, size: device.get_region_size(index), mmap, sparse });
        }
        let reset_at_open = device_flags(&device).map_err(|e| host(&name, e))? & VFIO_DEVICE_FLAGS_RESET != 0;
        Ok(OpenedVfio { name, device, container, regions, reset_at_open })
    }

    /// The backend, its DMA maps referring to `ram`.
    pub fn with_ram(self, ram: GuestRamMap) -> KernelVfio {
        KernelVfio { opened: self, ram }
    }
}

mod ioctls {
    use vfio_bindings::bindings::vfio::{VFIO_BASE, VFIO_TYPE};
    // include/uapi/linux/vfio.h; vfio-ioctls keeps its own to itself.
    vmm_sys_util::ioctl_io_nr!(VFIO_DEVICE_GET_INFO, VFIO_TYPE as u32, VFIO_BASE + 7);
}

/// The device's flags (`VFIO_DEVICE_GET_INFO`; vfio-ioctls keeps them to itself). For vfio-pci,
/// `VFIO_DEVICE_FLAGS_RESET` says the reset it tried as it opened the device worked
/// (`vdev->reset_works`, `vfio_pci_core_enable()` and `vfio_pci_ioctl_get_info()`,
/// drivers/vfio/pci/vfio_pci_core.c).
fn device_flags(device: &VfioDevice) -> std::io::Result<u32> {
    let mut info = vfio_device_info { argsz: std::mem::size_of::<vfio_device_info>() as u32, ..Default::default() };
    // SAFETY: VFIO_DEVICE_GET_INFO writes at most `argsz` bytes into the live struct it is given,
    // on the device's own descriptor.
    let ret = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(device, ioctls::VFIO_DEVICE_GET_INFO(), &mut info) };
    if ret < 0 { Err(std::io::Error::last_os_error()) } else { Ok(info.flags) }
}

impl VfioBackend for KernelVfio {
    fn name(&self) -> &str {
        &self.opened.name
    }

    fn region(&self, index: u32) -> Option<&RegionInfo> {
        self.opened.regions.get(index as usize)
    }

    fn irq_count(&mut self, index: u32) -> Result<u32, BackendError> {
        Ok(self.opened.device.get_irq_info(index).map_or(0, |info| info.count))
    }

    fn read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), BackendError> {
        let size = self.region(index).map_or(0, |r| r.size);
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > size) {
            return Err(BackendError::Invalid(format!("region {index}: {} bytes at {offset:#x}", data.len())));
        }
        self.opened.device.region_read(index, data, offset);
        Ok(())
    }

    fn write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        let size = self.region(index).map_or(0, |r| r.size);
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > size) {
            return Err(BackendError::Invalid(format!("region {index}: {} bytes at {offset:#x}", data.len())));
        }
        self.opened.device.region_write(index, data, offset);
        Ok(())
    }

    fn enable_irqs(&mut self, index: u32, fds: &[&EventFd]) -> Result<(), BackendError> {
        self.opened.device.enable_irq(index, fds.to_vec()).map_err(|e| host(&self.opened.name, e))
    }

    fn disable_irqs(&mut self, index: u32) -> Result<(), BackendError> {
        self.opened.device.disable_irq(index).map_err(|e| host(&self.opened.name, e))
    }

    fn dma_map(&mut self, iova: u64, size: u64, gpa: u64, _write: bool) -> Result<(), BackendError> {
        let range = self
            .ram
            .find(gpa, size)
            .ok_or_else(|| BackendError::Invalid(format!("DMA map of {size:#x} bytes at {gpa:#x} is not guest RAM")))?;
        let host_addr = range.host_addr + (gpa - range.gpa);
        // SAFETY: the range is guest RAM that the VMM keeps mapped for the VM's lifetime and
        // only touches through volatile guest-memory accessors; the mapping is removed before the
        // memory is unmapped (teardown unmaps all DMA first).
        unsafe { self.opened.container.vfio_dma_map(iova, size as usize, host_addr as *mut u8) }
            .map_err(|e| host(&self.opened.name, e))
    }

    fn dma_unmap(&mut self, iova: u64, size: u64) -> Result<(), BackendError> {
        self.opened.container.vfio_dma_unmap(iova, size as usize).map_err(|e| host(&self.opened.name, e))
    }

    fn reset(&mut self) -> Result<(), BackendError> {
        self.opened.device.reset();
        Ok(())
    }

    fn fresh_from_reset(&mut self) -> bool {
        std::mem::take(&mut self.opened.reset_at_open)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_device_info_ioctl_is_the_kernel_s() {
        // _IO(';', 100 + 7): no size or direction bits (include/uapi/linux/vfio.h).
        assert_eq!(super::ioctls::VFIO_DEVICE_GET_INFO(), 0x3b6b);
    }
}

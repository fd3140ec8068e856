//! What the host kernel knows about PCI devices, read from sysfs.

use std::path::{Path, PathBuf};

use crate::Bdf;

/// Errors reading a device's sysfs entries.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// No such PCI device.
    #[error("no PCI device {0} on this host (lspci -D lists them)")]
    NoDevice(Bdf),
    /// An attribute could not be read or parsed.
    #[error("{path}: {reason}", path = path.display())]
    Attribute {
        /// The attribute file.
        path: PathBuf,
        /// What went wrong, in words.
        reason: String,
    },
}

/// A sysfs tree: `/` on a real host, a fake one in tests.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

/// One PCI device as the host sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDevice {
    /// Its address.
    pub bdf: Bdf,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// The bound driver, if any (`vfio-pci` for passthrough).
    pub driver: Option<String>,
    /// Its IOMMU group, if the IOMMU is on.
    pub iommu_group: Option<u32>,
    /// How the kernel can reset the function (`reset_method`: e.g. `flr`, `pm`, `bus`), in the
    /// order it tries them; empty when it cannot.
    pub reset_methods: Vec<String>,
    /// Whether the kernel takes it for a removable (Thunderbolt-attached) device; `None` when it
    /// does not say.
    pub removable: Option<bool>,
}

impl Sysfs {
    /// The host's sysfs.
    pub fn host() -> Sysfs {
        Sysfs { root: PathBuf::from("/") }
    }

    /// A sysfs tree rooted at `root` (which contains `sys/`).
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// `path` (absolute, e.g. `/sys/bus/pci`) inside this tree.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    fn device_dir(&self, bdf: Bdf) -> PathBuf {
        self.path(&format!("/sys/bus/pci/devices/{bdf}"))
    }

    /// Reads the device at `bdf`.
    pub fn device(&self, bdf: Bdf) -> Result<HostDevice, SysfsError> {
        let dir = self.device_dir(bdf);
        if !dir.exists() {
            return Err(SysfsError::NoDevice(bdf));
        }
        Ok(HostDevice {
            bdf,
            vendor: read_hex(&dir.join("vendor"))? as u16,
            device: read_hex(&dir.join("device"))? as u16,
            driver: link_name(&dir.join("driver")),
            iommu_group: link_name(&dir.join("iommu_group")).and_then(|g| g.parse().ok()),
            // The kernel has no `reset_method` file for a function it cannot reset.
            reset_methods: std::fs::read_to_string(dir.join("reset_method"))
                .map(|text| text.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
            removable: vm_spec::host::pci_removable(&self.root, bdf),
        })
    }

    /// The IOMMU groups the host has.
    pub fn iommu_groups(&self) -> Vec<u32> {
        let mut groups: Vec<u32> =
            list(&self.path("/sys/kernel/iommu_groups")).iter().filter_map(|n| n.parse().ok()).collect();
        groups.sort_unstable();
        groups
    }

    /// The devices in IOMMU group `group`.
    pub fn group_members(&self, group: u32) -> Vec<Bdf> {
        let mut members: Vec<Bdf> = list(&self.path(&format!("/sys/kernel/iommu_groups/{group}/devices")))
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect();
        members.sort();
        members
    }

    /// Thunderbolt devices whose `authorized` attribute is 0, by name.
    pub fn unauthorized_thunderbolt(&self) -> Vec<String> {
        let dir = self.path("/sys/bus/thunderbolt/devices");
        let mut names: Vec<String> = list(&dir)
            .into_iter()
            .filter(|name| std::fs::read_to_string(dir.join(name).join("authorized")).is_ok_and(|v| v.trim() == "0"))
            .collect();
        names.sort();
        names
    }
}

fn read_hex(path: &Path) -> Result<u32, SysfsError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| SysfsError::Attribute { path: path.to_path_buf(), reason: e.to_string() })?;
    u32::from_str_radix(text.trim().trim_start_matches("0x"), 16)
        .map_err(|e| SysfsError::Attribute { path: path.to_path_buf(), reason: e.to_string() })
}

/// The file name a symlink points at (`driver` -> `.../drivers/vfio-pci` gives `vfio-pci`).
fn link_name(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

fn list(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// Builds fake sysfs trees for tests.
#[cfg(test)]
pub(crate) mod fake {
    use std::os::unix::fs::symlink;
    use std::path::Path;

    /// Adds PCI device `bdf` with IDs, an optional driver and an optional IOMMU group.
    pub fn add_device(root: &Path, bdf: &str, vendor: u16, device: u16, driver: Option<&str>, group: Option<u32>) {
        let dir = root.join("sys/bus/pci/devices").join(bdf);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
        std::fs::write(dir.join("device"), format!("0x{device:04x}\n")).unwrap();
        if let Some(driver) = driver {
            let drv = root.join("sys/bus/pci/drivers").join(driver);
            std::fs::create_dir_all(&drv).unwrap();
            symlink(&drv, dir.join("driver")).unwrap();
        }
        if let Some(group) = group {
            let g = root.join("sys/kernel/iommu_groups").join(group.to_string());
            std::fs::create_dir_all(g.join("devices")).unwrap();
            symlink(&g, dir.join("iommu_group")).unwrap();
            symlink(&dir, g.join("devices").join(bdf)).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ids_driver_and_group() {
        let root = tempfile::tempdir().unwrap();
        fake::add_device(root.path(), "0000:63:00.0", 0x1d6a, 0x00b1, Some("vfio-pci"), Some(14));
        fake::add_device(root.path(), "0000:63:00.1", 0x1d6a, 0x00b2, None, Some(14));
        let sysfs = Sysfs::at(root.path());
        let dev = sysfs.device("0000:63:00.0".parse().unwrap()).unwrap();
        assert_eq!(
            (dev.vendor, dev.device, dev.driver.as_deref(), dev.iommu_group),
            (0x1d6a, 0xb1, Some("vfio-pci"), Some(14))
        );
        assert_eq!(sysfs.iommu_groups(), vec![14]);
        assert_eq!(dev.removable, None, "the kernel did not say");
        std::fs::write(root.path().join("sys/bus/pci/devices/0000:63:00.1/removable"), "removable\n").unwrap();
        let behind_a_port = sysfs.device("0000:63:00.1".parse().unwrap()).unwrap();
        assert_eq!(behind_a_port.removable, Some(true));
        assert_eq!(sysfs.group_members(14).len(), 2);
        let missing = sysfs.device("0000:01:00.0".parse().unwrap()).unwrap_err();
        assert!(missing.to_string().contains("lspci -D"));
    }
}

//! Which box a run ran on, as the box sees itself: its host name, CPU, kernel, firmware and
//! IOMMU set-up, driverlab's version, and each device of the run (where it sits and its link as
//! the host sees them, its firmware as its health check read it, its peer). Collected once per
//! run (again when a run is resumed) and stored with it, so that a fleet's report can tell boxes
//! apart and a box that differs can be explained.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::matrix::{DeviceSource, Plan, Wire};

/// A box, as a run saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BoxIdentity {
    /// Its host name.
    pub host: String,
    /// Its CPU's model name (`/proc/cpuinfo`).
    pub cpu: String,
    /// Its kernel's release.
    pub kernel: String,
    /// Its firmware: BIOS vendor, version and date (`/sys/class/dmi/id`), when it has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios: Option<String>,
    /// Its IOMMU as the host kernel set it up.
    pub iommu: IommuMode,
    /// driverlab's version.
    pub driverlab: String,
    /// The run's devices on this box.
    #[serde(default)]
    pub devices: Vec<DeviceIdentity>,
}

/// The host's IOMMU: how many groups it made, its default domain's type, and what the kernel's
/// command line asked of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct IommuMode {
    /// IOMMU groups (0: no IOMMU, or it is off).
    pub groups: usize,
    /// The default domain's type of the first group (`DMA`, `DMA-FQ`, `identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// The command line's IOMMU options (`amd_iommu=...`, `iommu.strict=1`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmdline: Vec<String>,
}

/// One device of a run on a box.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeviceIdentity {
    /// Its name in the matrix.
    pub name: String,
    /// Where it is: the host PCI address, or `model aqc100`.
    pub pci: String,
    /// Its PCIe link as the host sees it (`8.0 GT/s PCIe x2`), for a host device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// Its firmware's version, as its health check read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// Its MAC address, as its health check read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Its Ethernet link's speed, as its health check read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_mbps: Option<u64>,
    /// What is at the other end of its wire: the SSH peer, the model's generator or TAP.
    pub peer: String,
}

impl BoxIdentity {
    /// This box, with the devices of `plan`.
    pub fn collect(plan: &Plan) -> BoxIdentity {
        BoxIdentity::read(Path::new("/"), plan)
    }

    /// The box whose `/proc` and `/sys` are under `root` (tests give a folder).
    fn read(root: &Path, plan: &Plan) -> BoxIdentity {
        let text = |path: &str| std::fs::read_to_string(root.join(path)).ok().map(|s| s.trim().to_string());
        let cpu = text("proc/cpuinfo")
            .and_then(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_string()))
            })
            .unwrap_or_default();
        let bios: Vec<String> = ["bios_vendor", "bios_version", "bios_date"]
            .iter()
            .filter_map(|f| text(&format!("sys/class/dmi/id/{f}")))
            .collect();
        let devices = plan
            .matrix
            .devices
            .iter()
            .filter_map(|d| plan.source(&d.get_ref().name).map(|s| DeviceIdentity::of(root, &d.get_ref().name, s)))
            .collect();
        BoxIdentity {
            host: text("proc/sys/kernel/hostname").unwrap_or_default(),
            cpu,
            kernel: text("proc/sys/kernel/osrelease").unwrap_or_default(),
            bios: (!bios.is_empty()).then(|| bios.join(" ")),
            iommu: IommuMode::read(root),
            driverlab: env!("CARGO_PKG_VERSION").to_string(),
            devices,
        }
    }

    /// Takes in what device `name`'s health check read (its firmware, MAC and link speed).
    pub fn saw_health(&mut self, name: &str, health: &engines::health::Health) {
        if let Some(device) = self.devices.iter_mut().find(|d| d.name == name) {
            device.firmware = health.fw.clone().or(device.firmware.take());
            device.mac = health.mac.clone().or(device.mac.take());
            device.link_mbps = health.link_mbps.or(device.link_mbps);
        }
    }

    /// One line for tables: host, CPU, kernel, and each device's firmware and link.
    pub fn summary(&self) -> String {
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|d| {
                let mut parts = vec![format!("{} at {}", d.name, d.pci)];
                parts.extend(d.firmware.as_ref().map(|f| format!("fw {f}")));
                parts.extend(d.link.clone());
                parts.push(format!("peer {}", d.peer));
                parts.join(", ")
            })
            .collect();
        format!("{} ({}, Linux {}); {}", self.host, self.cpu, self.kernel, devices.join("; "))
    }
}

impl IommuMode {
    fn read(root: &Path) -> IommuMode {
        let groups_dir = root.join("sys/kernel/iommu_groups");
        let groups = std::fs::read_dir(&groups_dir).map(|d| d.count()).unwrap_or(0);
        let domain = std::fs::read_to_string(groups_dir.join("0/type")).ok().map(|s| s.trim().to_string());
        let cmdline = std::fs::read_to_string(root.join("proc/cmdline"))
            .unwrap_or_default()
            .split_whitespace()
            .filter(|arg| ["iommu", "amd_iommu", "intel_iommu", "iommu."].iter().any(|p| arg.starts_with(p)))
            .map(String::from)
            .collect();
        IommuMode { groups, domain, cmdline }
    }
}

impl DeviceIdentity {
    fn of(root: &Path, name: &str, source: &DeviceSource) -> DeviceIdentity {
        match source {
            DeviceSource::Model { nic, wire } => DeviceIdentity {
                name: name.to_string(),
                pci: format!("model {nic}"),
                peer: match wire {
                    Wire::Generator(config) => format!("the model's generator ({})", config.as_option()),
                    Wire::Tap(tap) => format!("TAP {tap}"),
                },
                ..DeviceIdentity::default()
            },
            DeviceSource::Host { bdf, peer } => {
                let sysfs = root.join("sys/bus/pci/devices").join(bdf.to_string());
                let read = |f: &str| std::fs::read_to_string(sysfs.join(f)).ok().map(|s| s.trim().to_string());
                let link = match (read("current_link_speed"), read("current_link_width")) {
                    (Some(speed), Some(width)) => Some(format!("{speed} x{width}")),
                    _ => None,
                };
                DeviceIdentity {
                    name: name.to_string(),
                    pci: bdf.to_string(),
                    link,
                    peer: peer.as_ref().map_or_else(|| "none".to_string(), |p| p.destination.clone()),
                    ..DeviceIdentity::default()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_reads_from_its_proc_and_sys() {
        let root = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let file = root.path().join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        };
        write("proc/cpuinfo", "processor\t: 0\nmodel name\t: AMD RYZEN AI MAX+ 395\n");
        write("proc/sys/kernel/hostname", "strix-1\n");
        write("proc/sys/kernel/osrelease", "6.12.48+deb13-amd64\n");
        write("proc/cmdline", "root=/dev/nvme0n1p2 amd_iommu=on iommu.strict=1 quiet\n");
        write("sys/class/dmi/id/bios_vendor", "AMI\n");
        write("sys/class/dmi/id/bios_version", "1.07\n");
        write("sys/kernel/iommu_groups/0/type", "DMA\n");
        write("sys/kernel/iommu_groups/1/type", "DMA\n");
        write("sys/bus/pci/devices/0000:63:00.0/current_link_speed", "8.0 GT/s PCIe\n");
        write("sys/bus/pci/devices/0000:63:00.0/current_link_width", "2\n");
        let text = "name = \"m\"\n[[device]]\nname = \"tb\"\nbdf = \"0000:63:00.0\"\npeer = \"lab@peer-1\"\n\
                    [[device]]\nname = \"model\"\nmodel = \"aqc100\"\ngenerate = \"size=1514\"\n\
                    [[image]]\nname = \"probe\"\nkernel = \"probe\"\n[[variant]]\nname = \"v\"\nimage = \"probe\"\n\
                    [[workload]]\nname = \"w\"\nkind = \"probe-rx\"\n";
        let plan = Plan::parse(&root.path().join("m.toml"), text).unwrap();
        let mut identity = BoxIdentity::read(root.path(), &plan);
        assert_eq!(identity.host, "strix-1");
        assert_eq!(identity.cpu, "AMD RYZEN AI MAX+ 395");
        assert_eq!(identity.kernel, "6.12.48+deb13-amd64");
        assert_eq!(identity.bios.as_deref(), Some("AMI 1.07"));
        assert_eq!(identity.iommu.groups, 2);
        assert_eq!(identity.iommu.domain.as_deref(), Some("DMA"));
        assert_eq!(identity.iommu.cmdline, ["amd_iommu=on", "iommu.strict=1"]);
        assert_eq!(identity.devices.len(), 2);
        assert_eq!(identity.devices[0].pci, "0000:63:00.0");
        assert_eq!(identity.devices[0].link.as_deref(), Some("8.0 GT/s PCIe x2"));
        assert_eq!(identity.devices[0].peer, "lab@peer-1");
        assert_eq!(identity.devices[1].pci, "model aqc100");
        assert!(identity.devices[1].peer.contains("size=1514"), "{}", identity.devices[1].peer);
        let health = engines::health::Health {
            device: "tb".into(),
            fw: Some("3.1.121".into()),
            ok: true,
            mac: None,
            link_mbps: Some(10000),
            iommu: None,
            rx_frames: None,
            msix: None,
            tx_frames: None,
            reset_ok: None,
            failures: Vec::new(),
            ms: 1.0,
        };
        identity.saw_health("tb", &health);
        assert_eq!(identity.devices[0].firmware.as_deref(), Some("3.1.121"));
        assert!(identity.summary().contains("tb at 0000:63:00.0, fw 3.1.121"), "{}", identity.summary());
        // An empty root: nothing known, nothing fails.
        let empty = tempfile::tempdir().unwrap();
        let identity = BoxIdentity::read(empty.path(), &plan);
        assert_eq!((identity.host.as_str(), identity.iommu.groups), ("", 0));
    }
}

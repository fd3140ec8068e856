//! Host preflight for passthrough: one check per requirement, each failure with its exact fix.

use serde::Serialize;

use crate::Bdf;
use crate::sysfs::{HostDevice, Sysfs};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Pass,
    /// Works, with a caveat.
    Warn,
    /// Passthrough cannot work until this is fixed.
    Fail,
}

/// One check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short name (`iommu`, `vfio`, ...).
    pub name: &'static str,
    /// Whether it passed.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it, for warnings and failures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// A passing check.
    pub fn pass(name: &'static str, detail: impl Into<String>) -> Check {
        Check { name, status: Status::Pass, detail: detail.into(), fix: None }
    }

    /// A warning with its remedy.
    pub fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, status: Status::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }

    /// A failure with its fix.
    pub fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
}

/// What the preflight looks at besides sysfs.
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// The kernel command line (`/proc/cmdline`).
    pub cmdline: String,
    /// Whether `/dev/vfio/vfio` (type1 container) exists.
    pub vfio_container: bool,
    /// Whether `/dev/iommu` (iommufd) exists.
    pub iommufd: bool,
    /// RLIMIT_MEMLOCK (soft) in bytes; `None` when unlimited.
    pub memlock_limit: Option<u64>,
    /// Whether the process has CAP_IPC_LOCK (which lifts the memlock limit for VFIO).
    pub cap_ipc_lock: bool,
    /// How the host backs shared memory (the VMM's guest RAM) with transparent huge pages
    /// (`shmem_enabled`), if it has them.
    pub shmem_huge_pages: Option<String>,
}

impl HostFacts {
    /// Reads the facts of this host and process.
    pub fn read() -> HostFacts {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let cap_eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        HostFacts {
            cmdline: std::fs::read_to_string("/proc/cmdline").unwrap_or_default().trim().to_string(),
            vfio_container: std::path::Path::new("/dev/vfio/vfio").exists(),
            iommufd: std::path::Path::new("/dev/iommu").exists(),
            memlock_limit: memlock_limit(),
            cap_ipc_lock: cap_eff & (1 << CAP_IPC_LOCK) != 0,
            shmem_huge_pages: vm_spec::host::shmem_huge_pages(),
        }
    }
}

/// The capability number of CAP_IPC_LOCK (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

fn memlock_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
    (ok && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Runs the passthrough checks for `device` (if given) and a guest of `guest_memory` bytes.
pub fn check(sysfs: &Sysfs, facts: &HostFacts, device: Option<Bdf>, guest_memory: u64) -> Vec<Check> {
    let mut checks = vec![iommu(sysfs, facts), vfio(facts), memlock(facts, guest_memory), hugepages(facts)];
    if let Some(bdf) = device {
        checks.extend(device_checks(sysfs, bdf));
    }
    checks.push(thunderbolt(sysfs));
    checks
}

fn iommu(sysfs: &Sysfs, facts: &HostFacts) -> Check {
    let groups = sysfs.iommu_groups();
    if !groups.is_empty() {
        return Check::pass("iommu", format!("{} IOMMU groups", groups.len()));
    }
    let params: Vec<&str> = facts.cmdline.split_whitespace().filter(|w| w.contains("iommu")).collect();
    Check::fail(
        "iommu",
        format!(
            "no IOMMU groups in /sys/kernel/iommu_groups (IOMMU parameters on the kernel command line: {})",
            if params.is_empty() { "none".to_string() } else { params.join(" ") }
        ),
        "enable VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the firmware set-up, then boot with \
         intel_iommu=on iommu=pt (Intel) or iommu=pt (AMD, where the IOMMU is on by default)",
    )
}

fn vfio(facts: &HostFacts) -> Check {
    match (facts.vfio_container, facts.iommufd) {
        (true, true) => Check::pass("vfio", "/dev/vfio/vfio and /dev/iommu (iommufd) present"),
        (true, false) => Check::pass("vfio", "/dev/vfio/vfio present"),
        (false, true) => Check::pass("vfio", "/dev/iommu (iommufd) present"),
        (false, false) => Check::fail(
            "vfio",
            "neither /dev/vfio/vfio nor /dev/iommu exists: this kernel has no VFIO loaded (or none built: CONFIG_VFIO)",
            "sudo modprobe vfio-pci; if the module does not exist, boot a kernel built with CONFIG_VFIO=m and CONFIG_VFIO_PCI=m \
             (Debian's kernels have them). Without VFIO, passthrough can still be exercised with vfio-user (driverlab model ...)",
        ),
    }
}

fn memlock(facts: &HostFacts, guest_memory: u64) -> Check {
    let mib = |b: u64| b >> 20;
    if facts.cap_ipc_lock {
        return Check::pass("memlock", "CAP_IPC_LOCK held: VFIO may pin any amount of guest memory");
    }
    match facts.memlock_limit {
        None => Check::pass("memlock", "RLIMIT_MEMLOCK is unlimited"),
        Some(limit) if limit >= guest_memory => Check::pass(
            "memlock",
            format!("RLIMIT_MEMLOCK {} MiB covers {} MiB of guest memory", mib(limit), mib(guest_memory)),
        ),
        Some(limit) => Check::fail(
            "memlock",
            format!("RLIMIT_MEMLOCK is {} KiB; VFIO pins all {} MiB of guest memory", limit >> 10, mib(guest_memory)),
            "run `ulimit -l unlimited` in the shell that starts driverlab, or add `<user> - memlock unlimited` to \
             /etc/security/limits.conf (LimitMEMLOCK=infinity for a systemd service)",
        ),
    }
}

/// Guest RAM is a memfd for which the VMM asks transparent huge pages: the host's
/// `shmem_enabled` decides.
fn hugepages(facts: &HostFacts) -> Check {
    match facts.shmem_huge_pages.as_deref() {
        Some(setting) if vm_spec::host::shmem_huge_pages_on_request(setting) => {
            Check::pass("hugepages", format!("guest RAM in 2 MiB transparent huge pages (shmem_enabled: {setting})"))
        }
        setting => Check::warn(
            "hugepages",
            format!(
                "guest RAM in 4 KiB pages (shmem_enabled: {}; optional: 2 MiB pages cut the guest's \
                 nested-paging faults and TLB work, and Linux boots faster)",
                setting.unwrap_or("absent")
            ),
            format!("echo advise | sudo tee {}", vm_spec::host::SHMEM_THP),
        ),
    }
}

fn bind_commands(bdf: Bdf) -> String {
    format!(
        "sudo modprobe vfio-pci; echo {bdf} | sudo tee /sys/bus/pci/devices/{bdf}/driver/unbind; \
         echo vfio-pci | sudo tee /sys/bus/pci/devices/{bdf}/driver_override; \
         echo {bdf} | sudo tee /sys/bus/pci/drivers_probe"
    )
}

fn device_checks(sysfs: &Sysfs, bdf: Bdf) -> Vec<Check> {
    let device = match sysfs.device(bdf) {
        Ok(device) => device,
        Err(e) => {
            return vec![Check::fail("device", e.to_string(), "check the address with `lspci -D`")];
        }
    };
    let mut checks = vec![Check::pass("device", format!("{bdf} is {:04x}:{:04x}", device.vendor, device.device))];
    checks.push(match device.driver.as_deref() {
        Some("vfio-pci") => Check::pass("driver", format!("{bdf} is bound to vfio-pci")),
        other => {
            Check::fail("driver", format!("{bdf} is bound to {}", other.unwrap_or("no driver")), bind_commands(bdf))
        }
    });
    checks.push(reset(&device));
    checks.push(slot(&device));
    let Some(group) = device.iommu_group else {
        checks.push(Check::fail(
            "group",
            format!("{bdf} is in no IOMMU group"),
            "turn the IOMMU on (see the iommu check)",
        ));
        return checks;
    };
    let unbound: Vec<String> = sysfs
        .group_members(group)
        .into_iter()
        .filter(|&member| member != bdf)
        .filter_map(|member| {
            let driver = sysfs.device(member).ok()?.driver;
            // Bridges (pcieport) may stay; endpoints must be on vfio-pci or unbound.
            match driver.as_deref() {
                None | Some("vfio-pci") | Some("pcieport") => None,
                Some(other) => Some(format!("{member} ({other})")),
            }
        })
        .collect();
    checks.push(if unbound.is_empty() {
        Check::pass("group", format!("IOMMU group {group}: every endpoint is on vfio-pci or unbound"))
    } else {
        Check::fail(
            "group",
            format!("IOMMU group {group} also holds {}, which must be bound to vfio-pci too", unbound.join(", ")),
            "bind each of them to vfio-pci the same way as the device (see the driver check)",
        )
    });
    let node = format!("/dev/vfio/{group}");
    checks.push(match std::fs::OpenOptions::new().read(true).write(true).open(&node) {
        Ok(_) => Check::pass("group-node", format!("{node} is readable and writable")),
        Err(e) => Check::fail(
            "group-node",
            format!("{node}: {e}"),
            format!("it appears once the device is bound to vfio-pci; then `sudo chown $USER {node}` (or a udev rule)"),
        ),
    });
    checks
}

/// Whether vfio-pci can reset the function when a VM takes or gives it back: without a reset,
/// DMA one VM left running (its rings still pointing into its memory) reaches the next VM's.
fn reset(device: &HostDevice) -> Check {
    let bdf = device.bdf;
    if device.reset_methods.is_empty() {
        Check::warn(
            "reset",
            format!("{bdf} has no reset method: DMA a VM leaves running reaches the next VM's memory"),
            "give each VM a freshly powered card, or put the card alone behind a PCIe port so its bus can be reset",
        )
    } else {
        Check::pass("reset", format!("vfio-pci resets {bdf} by {}", device.reset_methods.join(", then ")))
    }
}

/// Where the guest will see the device when a matrix does not say: as the host sees it. A
/// device the host takes for removable (behind an external-facing port: Thunderbolt) goes into a
/// Thunderbolt slot, untrusted as on the host; any other on the root bus.
fn slot(device: &HostDevice) -> Check {
    let bdf = device.bdf;
    match device.removable {
        Some(true) => Check::pass(
            "slot",
            format!(
                "the host takes {bdf} for a removable device (behind an external-facing port): Linux cells put it in a \
                 thunderbolt slot (untrusted, strict IOMMU, bounced DMA) unless the matrix says slot = \"root\""
            ),
        ),
        Some(false) => Check::pass(
            "slot",
            format!(
                "the host takes {bdf} for a fixed device: cells put it on the root bus unless the matrix says otherwise"
            ),
        ),
        None => Check::pass(
            "slot",
            format!(
                "the host does not say whether {bdf} is removable: cells put it on the root bus unless the matrix says otherwise"
            ),
        ),
    }
}

fn thunderbolt(sysfs: &Sysfs) -> Check {
    let unauthorized = sysfs.unauthorized_thunderbolt();
    if unauthorized.is_empty() {
        Check::pass("thunderbolt", "no unauthorized Thunderbolt devices")
    } else {
        let commands: Vec<String> = unauthorized
            .iter()
            .map(|d| format!("echo 1 | sudo tee /sys/bus/thunderbolt/devices/{d}/authorized"))
            .collect();
        Check::fail(
            "thunderbolt",
            format!("Thunderbolt devices not authorized: {} (their PCIe tunnels are down)", unauthorized.join(", ")),
            format!("{} (or `boltctl enroll --policy auto UUID`)", commands.join("; ")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake;

    fn facts() -> HostFacts {
        HostFacts {
            cmdline: "quiet".into(),
            vfio_container: false,
            iommufd: false,
            memlock_limit: Some(8 << 20),
            cap_ipc_lock: false,
            shmem_huge_pages: Some("never".into()),
        }
    }

    fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no {name} check"))
    }

    #[test]
    fn a_host_without_iommu_or_vfio_fails_with_fixes() {
        let root = tempfile::tempdir().unwrap();
        let checks = check(&Sysfs::at(root.path()), &facts(), None, 256 << 20);
        for name in ["iommu", "vfio", "memlock"] {
            let c = find(&checks, name);
            assert_eq!(c.status, Status::Fail, "{c:?}");
            assert!(c.fix.as_deref().is_some_and(|f| !f.is_empty()));
        }
        assert!(find(&checks, "iommu").fix.as_deref().unwrap().contains("intel_iommu=on"));
        assert!(find(&checks, "vfio").fix.as_deref().unwrap().contains("modprobe vfio-pci"));
        let huge = find(&checks, "hugepages");
        assert_eq!(huge.status, Status::Warn);
        assert!(
            huge.detail.contains("4 KiB pages (shmem_enabled: never")
                && huge.fix.as_deref().unwrap().contains("echo advise")
        );
        let advised = HostFacts { shmem_huge_pages: Some("advise".into()), ..facts() };
        let checks = check(&Sysfs::at(root.path()), &advised, None, 256 << 20);
        assert_eq!(find(&checks, "hugepages").status, Status::Pass);
    }

    #[test]
    fn a_device_on_the_wrong_driver_gets_bind_commands() {
        let root = tempfile::tempdir().unwrap();
        fake::add_device(root.path(), "0000:63:00.0", 0x1d6a, 0x00b1, Some("atlantic"), Some(7));
        fake::add_device(root.path(), "0000:63:00.1", 0x1d6a, 0x00b1, Some("snd_hda_intel"), Some(7));
        fake::add_device(root.path(), "0000:62:00.0", 0x8086, 0x1234, Some("pcieport"), Some(7));
        let facts = HostFacts { vfio_container: true, memlock_limit: None, ..facts() };
        let checks = check(&Sysfs::at(root.path()), &facts, Some("0000:63:00.0".parse().unwrap()), 256 << 20);
        assert_eq!(find(&checks, "iommu").status, Status::Pass);
        assert_eq!(find(&checks, "vfio").status, Status::Pass);
        assert_eq!(find(&checks, "memlock").status, Status::Pass);
        assert!(find(&checks, "slot").detail.contains("does not say whether 0000:63:00.0 is removable"));
        std::fs::write(root.path().join("sys/bus/pci/devices/0000:63:00.0/removable"), "removable\n").unwrap();
        let again = check(&Sysfs::at(root.path()), &facts, Some("0000:63:00.0".parse().unwrap()), 256 << 20);
        let slot = find(&again, "slot");
        assert!(
            slot.detail.contains("removable device") && slot.detail.contains("thunderbolt slot"),
            "{}",
            slot.detail
        );
        let driver = find(&checks, "driver");
        assert_eq!(driver.status, Status::Fail);
        assert!(driver.detail.contains("atlantic"));
        assert!(driver.fix.as_deref().unwrap().contains("/sys/bus/pci/devices/0000:63:00.0/driver_override"));
        let group = find(&checks, "group");
        assert_eq!(group.status, Status::Fail);
        assert!(
            group.detail.contains("0000:63:00.1 (snd_hda_intel)") && !group.detail.contains("62:00.0"),
            "{}",
            group.detail
        );
        assert_eq!(find(&checks, "group-node").status, Status::Fail);
        let reset = find(&checks, "reset");
        assert_eq!(reset.status, Status::Warn, "no reset_method file: the kernel cannot reset it");
        assert!(reset.detail.contains("no reset method"), "{}", reset.detail);
    }

    #[test]
    fn a_device_that_can_be_reset_says_how() {
        let root = tempfile::tempdir().unwrap();
        fake::add_device(root.path(), "0000:63:00.0", 0x1d6a, 0x00b1, Some("vfio-pci"), Some(7));
        let dir = root.path().join("sys/bus/pci/devices/0000:63:00.0");
        std::fs::write(dir.join("reset_method"), "flr bus\n").unwrap();
        let checks = check(&Sysfs::at(root.path()), &facts(), Some("0000:63:00.0".parse().unwrap()), 0);
        let reset = find(&checks, "reset");
        assert_eq!(reset.status, Status::Pass);
        assert!(reset.detail.ends_with("by flr, then bus"), "{}", reset.detail);
    }

    #[test]
    fn unauthorized_thunderbolt_devices_are_named() {
        let root = tempfile::tempdir().unwrap();
        for (name, authorized) in [("0-1", "0"), ("0-0", "1")] {
            let dir = root.path().join("sys/bus/thunderbolt/devices").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("authorized"), authorized).unwrap();
        }
        let checks = check(&Sysfs::at(root.path()), &facts(), None, 0);
        let tb = find(&checks, "thunderbolt");
        assert_eq!(tb.status, Status::Fail);
        assert!(tb.fix.as_deref().unwrap().contains("/sys/bus/thunderbolt/devices/0-1/authorized"));
        assert!(!tb.detail.contains("0-0"));
    }

    #[test]
    fn a_missing_device_is_one_failure() {
        let root = tempfile::tempdir().unwrap();
        let checks = check(&Sysfs::at(root.path()), &facts(), Some("0000:99:00.0".parse().unwrap()), 0);
        assert_eq!(find(&checks, "device").status, Status::Fail);
        assert!(checks.iter().all(|c| c.name != "driver"));
    }
}

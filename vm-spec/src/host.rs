//! What the host's KVM can run, and how it backs guest memory.

use std::path::Path;

/// The kind of virtualization behind /dev/kvm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Virtualization {
    /// VT-x or AMD-V: guests run natively; Linux boots.
    Hardware(&'static str),
    /// PVM (kvm_pvm): guest CPL3 runs natively, guest CPL0 is emulated instruction by
    /// instruction; small guests such as the probe run, unmodified Linux does not boot.
    Pvm,
    /// /dev/kvm works, but neither of the above was recognised.
    Unknown,
    /// /dev/kvm cannot be opened.
    Unavailable(String),
}

impl Virtualization {
    /// True if unmodified Linux guests can boot under KVM here.
    pub fn boots_linux(&self) -> bool {
        matches!(self, Virtualization::Hardware(_))
    }

    /// A one-line description.
    pub fn describe(&self) -> String {
        match self {
            Virtualization::Hardware(flag) => format!("hardware virtualization ({flag})"),
            Virtualization::Pvm => "PVM: guest ring 0 is emulated, so unmodified Linux does not boot".into(),
            Virtualization::Unknown => "KVM without recognised hardware virtualization".into(),
            Virtualization::Unavailable(why) => format!("no usable /dev/kvm ({why})"),
        }
    }
}

/// Detects what /dev/kvm offers on this host.
pub fn virtualization() -> Virtualization {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        return Virtualization::Unavailable(e.to_string());
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    classify(&cpuinfo, Path::new("/sys/module/kvm_pvm").exists())
}

/// The hypervisor this host runs under, by the vendor ID of CPUID leaf 0x40000000
/// (`KVMKVMKVM`, `TCGTCGTCGTCG`, `Microsoft Hv`, ...), when the CPU says it runs under one.
pub fn hypervisor_vendor() -> Option<String> {
    // CPUID is safe to call on x86-64 (the intrinsic is safe in this edition).
    let leaf1 = std::arch::x86_64::__cpuid(1);
    if leaf1.ecx & (1 << 31) == 0 {
        return None;
    }
    // The hypervisor range exists when the hypervisor bit is set.
    let leaf = std::arch::x86_64::__cpuid(0x4000_0000);
    Some(vendor_name(leaf.ebx, leaf.ecx, leaf.edx))
}

/// The vendor ID in EBX, ECX, EDX (twelve bytes, NULs trimmed).
fn vendor_name(ebx: u32, ecx: u32, edx: u32) -> String {
    let bytes: Vec<u8> = [ebx, ecx, edx].iter().flat_map(|r| r.to_le_bytes()).collect();
    String::from_utf8_lossy(&bytes).trim_end_matches('\0').to_string()
}

/// Whether this host's CPU is emulated by QEMU's TCG (the nested lab box): its KVM is then
/// nested virtualization that TCG emulates, which has been seen to lose or corrupt a guest's
/// state (docs/nested-box.md), so the lab runs a hung repetition once more here.
pub fn emulated_by_tcg() -> bool {
    hypervisor_vendor().as_deref() == Some(TCG_VENDOR)
}

/// Where Linux says how it backs shared memory (a memfd, so driverlab's guest RAM) with
/// transparent huge pages.
pub const SHMEM_THP: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

/// Whether the host kernel takes PCI device `bdf` for a removable one (sysfs `removable` under
/// the sysfs tree at `root`, `/` on a real host): `Some(true)` below an external-facing root
/// port, as a Thunderbolt-attached NIC is (Linux decides it with the same test by which it marks
/// the device untrusted: `pci_set_removable()` in drivers/pci/probe.c), `Some(false)` when it is
/// fixed, `None` when the kernel does not say.
pub fn pci_removable(root: &Path, bdf: crate::Bdf) -> Option<bool> {
    let path = root.join(format!("sys/bus/pci/devices/{bdf}/removable"));
    match std::fs::read_to_string(path).ok()?.trim() {
        "removable" => Some(true),
        "fixed" => Some(false),
        _ => None,
    }
}

/// The host's setting for huge pages in shared memory (`never`, `advise`, `within_size`,
/// `always`, `deny`, `force`), `None` where the kernel has no transparent huge pages.
pub fn shmem_huge_pages() -> Option<String> {
    chosen_setting(&std::fs::read_to_string(SHMEM_THP).ok()?)
}

/// Whether a VMM that asks for huge pages (`MADV_HUGEPAGE`) on shared memory gets them under
/// `setting`.
pub fn shmem_huge_pages_on_request(setting: &str) -> bool {
    matches!(setting, "advise" | "within_size" | "always" | "force")
}

/// The bracketed word of a sysfs choice line (`always within_size [advise] never`).
fn chosen_setting(line: &str) -> Option<String> {
    let word = line.split_whitespace().find(|w| w.starts_with('[') && w.ends_with(']'))?;
    Some(word.trim_matches(|c| c == '[' || c == ']').to_string())
}

/// QEMU's TCG's hypervisor vendor ID.
pub const TCG_VENDOR: &str = "TCGTCGTCGTCG";

fn classify(cpuinfo: &str, pvm_loaded: bool) -> Virtualization {
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap_or_default();
    let has = |flag: &str| flags.split_whitespace().any(|f| f == flag);
    if has("vmx") {
        Virtualization::Hardware("vmx")
    } else if has("svm") {
        Virtualization::Hardware("svm")
    } else if pvm_loaded {
        Virtualization::Pvm
    } else {
        Virtualization::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_cpu_flags_then_module() {
        assert_eq!(classify("flags\t: fpu vmx sse\n", false), Virtualization::Hardware("vmx"));
        assert_eq!(classify("flags\t: fpu svm\n", true), Virtualization::Hardware("svm"));
        assert_eq!(classify("flags\t: fpu hypervisor vmxnet\n", true), Virtualization::Pvm);
        assert_eq!(classify("flags\t: fpu\n", false), Virtualization::Unknown);
        assert!(!Virtualization::Pvm.boots_linux());
    }

    #[test]
    fn the_chosen_shmem_huge_page_setting_is_the_bracketed_one() {
        assert_eq!(chosen_setting("always within_size [advise] never deny force\n").as_deref(), Some("advise"));
        assert_eq!(chosen_setting("always within_size advise [never] deny force").as_deref(), Some("never"));
        assert_eq!(chosen_setting("always never"), None);
        assert!(shmem_huge_pages_on_request("advise") && shmem_huge_pages_on_request("always"));
        assert!(!shmem_huge_pages_on_request("never") && !shmem_huge_pages_on_request("deny"));
    }

    #[test]
    fn hypervisor_vendors_read_from_their_registers() {
        // "TCGT" "CGTC" "GTCG" and "KVMK" "VMKV" "M\0\0\0", as CPUID gives them.
        let tcg = vendor_name(u32::from_le_bytes(*b"TCGT"), u32::from_le_bytes(*b"CGTC"), u32::from_le_bytes(*b"GTCG"));
        assert_eq!(tcg, TCG_VENDOR);
        let kvm =
            vendor_name(u32::from_le_bytes(*b"KVMK"), u32::from_le_bytes(*b"VMKV"), u32::from_le_bytes(*b"M\0\0\0"));
        assert_eq!(kvm, "KVMKVMKVM");
        // This host (a PVM guest or bare metal) is not TCG's.
        assert!(!emulated_by_tcg() || hypervisor_vendor().as_deref() == Some(TCG_VENDOR));
    }
}

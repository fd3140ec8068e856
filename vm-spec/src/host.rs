//! What the host's KVM can run.

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
}

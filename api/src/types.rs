//! Request and response bodies.

use serde::{Deserialize, Serialize};

/// `POST /v1/vms`: one VM, run to its end.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmRequest {
    /// `probe` for the embedded probe guest, or a kernel path on the server's host.
    pub kernel: String,
    /// Kernel command line.
    #[serde(default)]
    pub cmdline: String,
    /// An initrd path on the server's host.
    #[serde(default)]
    pub initrd: Option<String>,
    /// Guest memory in MiB.
    #[serde(default = "default_memory")]
    pub memory_mib: u64,
    /// vCPUs.
    #[serde(default = "default_vcpus")]
    pub vcpus: u32,
    /// Seconds before the VM is stopped.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
}

fn default_memory() -> u64 {
    256
}

fn default_vcpus() -> u32 {
    1
}

fn default_timeout() -> f64 {
    60.0
}

/// How a VM run ended and what its guest reported.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmResult {
    /// The VMM process's exit code (see docs/vmm.md), if it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the VMM process, if one did (31 = SIGSYS: seccomp).
    pub signal: Option<i32>,
    /// The VMM's exit line.
    pub exit: Option<vmm::ExitSummary>,
    /// The probe guest's report sections, in order (empty for other guests).
    pub probe: Vec<serde_json::Value>,
    /// The guest's serial output.
    pub serial: String,
    /// Wall time of the VMM process, in milliseconds.
    pub wall_ms: f64,
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, and what to do.
    pub error: String,
}

/// `GET /v1/host`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostInfo {
    /// What /dev/kvm offers here.
    pub virtualization: String,
    /// Whether unmodified Linux guests boot under driverlab's VMM here.
    pub boots_linux: bool,
}

/// `GET /v1/version`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Version {
    /// "driverlab".
    pub name: String,
    /// The version.
    pub version: String,
}

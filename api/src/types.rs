//! Request and response bodies. `POST /v1/vms` takes a `vm_spec::VmSpec`.

use serde::{Deserialize, Serialize};

/// How a VM run ended and what its guest reported.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmResult {
    /// The VMM process's exit code (see docs/vmm.md), if it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the VMM process, if one did (31 = SIGSYS: seccomp).
    pub signal: Option<i32>,
    /// The VMM's exit line, if the VM ran.
    pub exit: Option<vm_spec::ExitSummary>,
    /// The VMM's error line, if it could not run the VM.
    pub error: Option<vm_spec::ErrorLine>,
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

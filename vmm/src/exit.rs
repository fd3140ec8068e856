//! How a VM run ends: the reason, the process exit code for it, and the one-line JSON summary the
//! VMM prints to stderr.
//!
//! | code | reason                                                        |
//! |------|---------------------------------------------------------------|
//! | 0    | `poweroff`: the guest powered off (ACPI S5)                    |
//! | 1    | `vmm-error`: the VMM failed (KVM unavailable, an ioctl failed) |
//! | 2    | bad input: kernel, initrd, command line or options (no VM ran) |
//! | 3    | `reset` (i8042 or ACPI reset) or `triple-fault`                |
//! | 4    | `kvm-internal-error` (e.g. emulation failure) or `entry-failure` |
//! | 5    | `panic`: the guest reported a panic through pvpanic           |
//! | 6    | `timeout`: `--timeout` expired                                 |
//!
//! A process killed by seccomp dies of SIGSYS (a shell shows 159) and prints no summary.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use devices::power::{GuestEvent, GuestEventSink};
pub use devices::virtio::iommu::stats::IommuCounts;
use serde::{Deserialize, Serialize};

/// Process exit codes, one per way a run can end.
pub mod code {
    /// The guest powered off.
    pub const POWEROFF: i32 = 0;
    /// The VMM itself failed.
    pub const VMM_ERROR: i32 = 1;
    /// The input was invalid; no VM ran.
    pub const BAD_INPUT: i32 = 2;
    /// The guest reset or triple-faulted.
    pub const RESET: i32 = 3;
    /// KVM could not run the guest (internal error, entry failure).
    pub const KVM_ERROR: i32 = 4;
    /// The guest panicked.
    pub const GUEST_PANIC: i32 = 5;
    /// The timeout expired.
    pub const TIMEOUT: i32 = 6;
}

/// Why a VM stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitReason {
    /// ACPI S5 from the guest.
    PowerOff,
    /// A reset request (i8042, ACPI reset register).
    Reset,
    /// KVM_EXIT_SHUTDOWN: a triple fault.
    TripleFault,
    /// The guest announced a panic.
    Panic,
    /// `--timeout` expired.
    Timeout,
    /// KVM_EXIT_INTERNAL_ERROR.
    InternalError {
        /// KVM's suberror (1 = emulation failure).
        suberror: u32,
        /// Where and what.
        detail: String,
    },
    /// KVM_EXIT_FAIL_ENTRY.
    EntryFailure {
        /// Hardware entry failure reason.
        hardware_reason: u64,
    },
    /// The VMM failed while the VM ran.
    VmmError(String),
}

impl ExitReason {
    /// The name used in the exit line.
    pub fn name(&self) -> &'static str {
        match self {
            ExitReason::PowerOff => "poweroff",
            ExitReason::Reset => "reset",
            ExitReason::TripleFault => "triple-fault",
            ExitReason::Panic => "panic",
            ExitReason::Timeout => "timeout",
            ExitReason::InternalError { .. } => "kvm-internal-error",
            ExitReason::EntryFailure { .. } => "entry-failure",
            ExitReason::VmmError(_) => "vmm-error",
        }
    }

    /// The process exit code.
    pub fn exit_code(&self) -> i32 {
        match self {
            ExitReason::PowerOff => code::POWEROFF,
            ExitReason::Reset | ExitReason::TripleFault => code::RESET,
            ExitReason::Panic => code::GUEST_PANIC,
            ExitReason::Timeout => code::TIMEOUT,
            ExitReason::InternalError { .. } | ExitReason::EntryFailure { .. } => code::KVM_ERROR,
            ExitReason::VmmError(_) => code::VMM_ERROR,
        }
    }

    /// Details worth printing, if any.
    pub fn detail(&self) -> Option<String> {
        match self {
            ExitReason::InternalError { suberror, detail } => Some(format!("suberror {suberror}: {detail}")),
            ExitReason::EntryFailure { hardware_reason } => {
                Some(format!("hardware entry failure reason {hardware_reason:#x}"))
            }
            ExitReason::VmmError(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// Where vCPUs and devices ask for the VM to stop, and where the main thread waits for it.
/// The first reason wins.
#[derive(Default)]
pub struct VmStop {
    reason: Mutex<Option<ExitReason>>,
    changed: Condvar,
    stopping: AtomicBool,
}

impl VmStop {
    /// A stop signal that nobody has raised yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the VM to stop for `reason`; ignored if a reason is already set.
    pub fn request(&self, reason: ExitReason) {
        let mut current = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if current.is_none() {
            tracing::debug!("stopping: {}", reason.name());
            *current = Some(reason);
            self.stopping.store(true, Ordering::SeqCst);
            self.changed.notify_all();
        }
    }

    /// True once a stop was requested.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Waits for a stop request; `None` if `timeout` passed first.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<ExitReason> {
        let guard = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        let guard = match timeout {
            Some(t) => self.changed.wait_timeout_while(guard, t, |r| r.is_none()).unwrap_or_else(|p| p.into_inner()).0,
            None => self.changed.wait_while(guard, |r| r.is_none()).unwrap_or_else(|p| p.into_inner()),
        };
        guard.clone()
    }
}

impl GuestEventSink for VmStop {
    fn guest_event(&self, event: GuestEvent) {
        self.request(match event {
            GuestEvent::PowerOff => ExitReason::PowerOff,
            GuestEvent::Reset => ExitReason::Reset,
            GuestEvent::Panic => ExitReason::Panic,
        });
    }
}

/// VM exits that reached the VMM, counted over all vCPUs.
#[derive(Debug, Default)]
pub struct ExitCounters {
    /// Port I/O exits.
    pub io: AtomicU64,
    /// MMIO exits.
    pub mmio: AtomicU64,
    /// Accesses no device claimed.
    pub unclaimed: AtomicU64,
}

/// Counter values in the exit line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitCounts {
    /// Port I/O exits.
    pub io: u64,
    /// MMIO exits.
    pub mmio: u64,
    /// Accesses no device claimed.
    pub unclaimed: u64,
}

impl ExitCounters {
    /// A snapshot.
    pub fn counts(&self) -> ExitCounts {
        ExitCounts {
            io: self.io.load(Ordering::Relaxed),
            mmio: self.mmio.load(Ordering::Relaxed),
            unclaimed: self.unclaimed.load(Ordering::Relaxed),
        }
    }
}

/// The exit line: `{"vmm":"exit","reason":...,"exit_code":N,...}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExitSummary {
    /// Always "exit": marks the line.
    pub vmm: String,
    /// [`ExitReason::name`].
    pub reason: String,
    /// The process exit code.
    pub exit_code: i32,
    /// Details for errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The boot protocol used ("pvh", "linux64").
    pub entry: String,
    /// vCPUs.
    pub vcpus: u32,
    /// Guest memory in MiB.
    pub memory_mib: u64,
    /// From process start of the VMM's work to the first vCPU entering the guest.
    pub setup_ms: f64,
    /// From the vCPUs starting to the VM stopping.
    pub run_ms: f64,
    /// From the vCPUs starting to the guest's first serial byte.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_serial_ms: Option<f64>,
    /// Bytes the guest wrote to the serial port.
    pub serial_bytes: u64,
    /// Exits handled by the VMM.
    pub exits: ExitCounts,
    /// What the virtio-iommu counted, with `--iommu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viommu: Option<IommuCounts>,
    /// Passed-through devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceSummary>,
}

/// A passed-through device in the exit line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceSummary {
    /// How it was given (`vfio=...`, `vfio-user=...`).
    pub device: String,
    /// Where the guest saw it.
    pub bdf: String,
    /// Why it stopped being used, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What a driverlab model counted (vfio-user models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<devices::models::counters::ModelCounters>,
    /// Whether the reset at teardown left the device healthy.
    pub reset_ok: bool,
}

impl ExitSummary {
    /// The exit line as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"vmm\":\"exit\",\"error\":\"{e}\"}}"))
    }

    /// Finds and parses the exit line in a VMM's stderr.
    pub fn find_in(stderr: &str) -> Option<ExitSummary> {
        stderr.lines().rev().filter(|l| l.starts_with("{\"vmm\":\"exit\"")).find_map(|l| serde_json::from_str(l).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_reason_has_its_own_code_and_name() {
        let reasons = [
            ExitReason::PowerOff,
            ExitReason::VmmError("x".into()),
            ExitReason::Reset,
            ExitReason::InternalError { suberror: 1, detail: "x".into() },
            ExitReason::Panic,
            ExitReason::Timeout,
        ];
        let codes: Vec<i32> = reasons.iter().map(ExitReason::exit_code).collect();
        assert_eq!(codes, vec![0, 1, 3, 4, 5, 6]);
        assert!(!codes.contains(&code::BAD_INPUT));
        assert_eq!(ExitReason::TripleFault.exit_code(), code::RESET);
        assert_ne!(ExitReason::TripleFault.name(), ExitReason::Reset.name());
    }

    #[test]
    fn exit_line_round_trips() {
        let summary = ExitSummary {
            vmm: "exit".into(),
            reason: "poweroff".into(),
            exit_code: 0,
            detail: None,
            entry: "pvh".into(),
            vcpus: 2,
            memory_mib: 256,
            setup_ms: 1.5,
            run_ms: 20.0,
            first_serial_ms: Some(1.0),
            serial_bytes: 10,
            exits: ExitCounts { io: 11, mmio: 0, unclaimed: 0 },
            viommu: None,
            devices: Vec::new(),
        };
        let line = summary.to_json();
        assert!(line.starts_with(r#"{"vmm":"exit","reason":"poweroff","exit_code":0,"#), "{line}");
        let stderr = format!("a log line\n{line}\n");
        let back = ExitSummary::find_in(&stderr).unwrap();
        assert_eq!((back.reason.as_str(), back.vcpus, back.exits.io), ("poweroff", 2, 11));
        assert!(ExitSummary::find_in("error: nothing ran").is_none());
    }

    #[test]
    fn first_stop_reason_wins_and_wakes_the_waiter() {
        let stop = Arc::new(VmStop::new());
        assert_eq!(stop.wait(Some(Duration::from_millis(1))), None);
        let s = stop.clone();
        let t = std::thread::spawn(move || s.wait(None));
        stop.guest_event(GuestEvent::PowerOff);
        stop.request(ExitReason::Timeout);
        assert_eq!(t.join().unwrap(), Some(ExitReason::PowerOff));
        assert!(stop.is_stopping());
    }
}

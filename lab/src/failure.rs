//! Why a repetition did not pass: what the lab concluded, as a typed value. A record's status
//! follows from it and its `reason` is it, rendered; the scheduler decides whether to run a
//! repetition again from it, never from the reason's text.

use serde::{Deserialize, Serialize};
use vm_spec::ExitReason;

pub use engines::crash::CrashKind;

use crate::record::Status;

/// How the reason of a repetition whose VM's state the host lost begins.
pub const HOST_LOST_STATE: &str = "the host's virtualization lost the VM's state";

/// Why a repetition did not pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Failure {
    /// The guest stayed silent on its serial ports and was stopped (FAIL).
    Hang {
        /// How long it was silent, in seconds.
        silent_s: f64,
        /// The console's last line, when it printed one.
        last_line: Option<String>,
        /// Where its vCPUs were when it was stopped (the VMM's exit detail).
        vcpus: Option<String>,
    },
    /// The guest was still running at the repetition's timeout (FAIL).
    Timeout {
        /// The timeout, in seconds.
        limit_s: f64,
    },
    /// The guest ended the VM otherwise than by powering off: a reset, a triple fault, a
    /// panic it announced (FAIL).
    GuestStop {
        /// How.
        reason: ExitReason,
    },
    /// The guest's log shows a crash (FAIL).
    Crash {
        /// What kind.
        crash: CrashKind,
        /// The line that gave it away.
        line: String,
    },
    /// The workload's own verdict: a failed step, an unfinished agent, a kernel fault, the
    /// probe's checks, nothing reported (FAIL).
    Workload {
        /// What went wrong.
        problem: String,
    },
    /// Subtests of the kernel's selftests failed (FAIL).
    SelftestsFailed {
        /// Which, as `PROGRAM: SUBTEST` (or the program, when it failed without a subtest
        /// failing: an error, a timeout).
        failed: Vec<String>,
    },
    /// The kernel's selftests did not finish: the guest died or hung in the middle (ERROR: the
    /// subtests after it have no result).
    SelftestsCut {
        /// The test that was running, or the last one that ended.
        at: String,
        /// How the guest ended.
        cause: String,
    },
    /// A prefix of a patch series did not build: a patch that does not apply, a compiler's
    /// error, a module the kernel would not load (FAIL: the series is at fault; the report
    /// says BUILD-FAIL).
    BuildFailed {
        /// The first error (the compiler's first `error:` line, or the build's own words).
        first_error: String,
        /// What the build said.
        detail: String,
    },
    /// The driver left IOMMU mappings behind when it was unloaded (FAIL).
    MappingsLeft {
        /// How many.
        count: u64,
    },
    /// The lab could not set the repetition up: its folder, its image, its model or peer (ERROR).
    Setup {
        /// What failed.
        what: String,
    },
    /// The engine could not run the VM, the VMM ended without its exit line, or it was
    /// killed past its deadline (ERROR).
    Engine {
        /// What happened.
        what: String,
    },
    /// The host's virtualization lost the VM's state (ERROR).
    HostLostState {
        /// Which vCPU, and how that shows.
        detail: String,
    },
    /// The host's KVM cannot run the guest (ERROR).
    KvmRefused {
        /// KVM's complaint.
        detail: String,
    },
    /// The VMM stopped the VM: its own error, or a shutdown forced through its control
    /// socket (ERROR).
    VmmStopped {
        /// How the exit line says it stopped.
        reason: ExitReason,
        /// Its detail.
        detail: String,
    },
    /// The device's model process died under the VM (ERROR).
    ModelDied {
        /// How it ended.
        what: String,
    },
    /// A passed-through device reported an error (ERROR).
    DeviceError {
        /// The device and its error.
        what: String,
    },
    /// The model counted fewer DMA maps than the virtio-iommu saw the guest make (ERROR).
    CountsDisagree {
        /// The virtio-iommu's maps per packet.
        guest: f64,
        /// The model's maps per packet.
        model: f64,
    },
    /// The device sat in a Thunderbolt slot but the guest did not take it for an untrusted,
    /// removable device: the cell did not measure what it says (ERROR).
    SlotNotHonoured {
        /// The engine the cell ran on.
        engine: crate::matrix::EngineKind,
    },
    /// The device failed its health check or is quarantined (ERROR).
    DeviceUnhealthy {
        /// What went wrong, in words.
        why: String,
    },
    /// Not run: the host cannot run the cell (SKIP).
    Unrunnable {
        /// What went wrong, in words.
        why: String,
    },
    /// Not run: the run was cancelled (MISS).
    Cancelled {
        /// When.
        why: String,
    },
}

/// What reports call a prefix of a series that did not build.
pub const BUILD_FAILED: &str = "BUILD-FAIL";

impl Failure {
    /// A build that failed with `detail`: its first error is the first line that says
    /// `error:` (a compiler's, `patch`'s), else the detail's first line.
    pub fn build_failed(detail: String) -> Failure {
        let first = detail
            .lines()
            .find(|l| l.contains("error:") || l.contains("FAILED") || l.contains("does not apply"))
            .or_else(|| detail.lines().next())
            .unwrap_or_default();
        Failure::BuildFailed { first_error: first.trim().to_string(), detail }
    }

    /// The status a repetition that failed so gets.
    pub fn status(&self) -> Status {
        match self {
            Failure::Hang { .. }
            | Failure::Timeout { .. }
            | Failure::GuestStop { .. }
            | Failure::Crash { .. }
            | Failure::Workload { .. }
            | Failure::SelftestsFailed { .. }
            | Failure::BuildFailed { .. }
            | Failure::MappingsLeft { .. } => Status::Fail,
            Failure::Unrunnable { .. } => Status::Skip,
            Failure::Cancelled { .. } => Status::Miss,
            _ => Status::Error,
        }
    }

    /// Whether the guest died rather than ran to a verdict: it hung, reset or triple-faulted,
    /// or its log shows a crash (panic, oops, BUG, WARNING).
    pub fn guest_died(&self) -> bool {
        matches!(
            self,
            Failure::Hang { .. } | Failure::Timeout { .. } | Failure::GuestStop { .. } | Failure::Crash { .. }
        )
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Hang { silent_s, last_line, vcpus } => {
                write!(f, "hung: no serial output for {silent_s:.0} s")?;
                if let Some(line) = last_line {
                    write!(f, " after {line:?}")?;
                }
                match vcpus {
                    Some(vcpus) => write!(f, "; {vcpus}"),
                    None => Ok(()),
                }
            }
            Failure::Timeout { limit_s } => write!(f, "hung: still running after {limit_s} s"),
            Failure::GuestStop { reason } => write!(f, "the guest ended with {reason}"),
            Failure::Crash { crash, line } => write!(f, "{crash}: {line}"),
            Failure::SelftestsFailed { failed } => {
                let shown: Vec<&str> = failed.iter().take(10).map(String::as_str).collect();
                write!(f, "selftests failed: {}", shown.join(", "))?;
                match failed.len().saturating_sub(shown.len()) {
                    0 => Ok(()),
                    more => write!(f, " and {more} more"),
                }
            }
            Failure::SelftestsCut { at, cause } => {
                write!(f, "the selftests did not finish: {at} was running when {cause}")
            }
            Failure::BuildFailed { first_error, .. } => write!(f, "{BUILD_FAILED}: {first_error}"),
            Failure::MappingsLeft { count } => {
                write!(f, "the driver left {count} IOMMU mapping(s) behind after it was unloaded")
            }
            Failure::HostLostState { detail } => write!(f, "{HOST_LOST_STATE}: {detail}"),
            Failure::KvmRefused { detail } => write!(f, "this host's KVM cannot run the guest: {detail}"),
            Failure::VmmStopped { reason, detail } => write!(f, "{reason}: {detail}"),
            Failure::CountsDisagree { guest, model } => write!(
                f,
                "the model counted fewer DMA maps ({model:.4} per packet) than the virtio-iommu saw the guest make \
                 ({guest:.4}): one of the counts is wrong"
            ),
            Failure::SlotNotHonoured { engine } => write!(
                f,
                "the device sat in a thunderbolt slot but the guest did not take it for untrusted \
                 (its sysfs `removable` was not set; engine {engine}): the cell measured a trusted device"
            ),
            Failure::Workload { problem: text }
            | Failure::Setup { what: text }
            | Failure::Engine { what: text }
            | Failure::ModelDied { what: text }
            | Failure::DeviceError { what: text }
            | Failure::DeviceUnhealthy { why: text }
            | Failure::Unrunnable { why: text }
            | Failure::Cancelled { why: text } => f.write_str(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_has_its_status_and_says_why() {
        let hang = Failure::Hang {
            silent_s: 150.2,
            last_line: Some("[ 1.0] last line".into()),
            vcpus: Some("vCPU 0 at rip 0x1".into()),
        };
        assert_eq!(hang.to_string(), "hung: no serial output for 150 s after \"[ 1.0] last line\"; vCPU 0 at rip 0x1");
        assert_eq!((hang.status(), hang.guest_died()), (Status::Fail, true));
        let stop = Failure::GuestStop { reason: ExitReason::TripleFault };
        assert_eq!(stop.to_string(), "the guest ended with triple-fault");
        let lost = Failure::HostLostState { detail: "vCPU 0".into() };
        assert_eq!((lost.status(), lost.guest_died()), (Status::Error, false));
        assert!(lost.to_string().starts_with(HOST_LOST_STATE));
        let workload = Failure::Workload { problem: "iperf3 ended with exit code 1".into() };
        assert_eq!((workload.status(), workload.guest_died()), (Status::Fail, false));
        assert_eq!(Failure::Unrunnable { why: "x".into() }.status(), Status::Skip);
        assert_eq!(Failure::Cancelled { why: "x".into() }.status(), Status::Miss);
        let build = Failure::build_failed(
            "image \"a@2\": building atlantic\n  CC aq_nic.o\naq_nic.c:9:1: error: expected ';'\nmake: *** Error 2"
                .into(),
        );
        assert_eq!(
            (build.status(), build.to_string().as_str()),
            (Status::Fail, "BUILD-FAIL: aq_nic.c:9:1: error: expected ';'")
        );
        let crash = Failure::Crash { crash: CrashKind::Oops, line: "Oops: 0000".into() };
        assert_eq!(crash.to_string(), "oops: Oops: 0000");
        // The record's JSON names the kind and its fields.
        let json = serde_json::to_value(&stop).unwrap();
        assert_eq!(json, serde_json::json!({"kind": "guest-stop", "reason": "triple-fault"}));
        assert_eq!(serde_json::from_value::<Failure>(json).unwrap(), stop);
    }
}

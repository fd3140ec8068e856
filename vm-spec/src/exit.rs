//! How a `driverlab vm run` process ends, as its parent reads it: the exit code, and one JSON line
//! on stderr, either the exit line of a VM that ran or the error line of one that could not.
//!
//! | code | reason                                                            |
//! |------|-------------------------------------------------------------------|
//! | 0    | `poweroff`: the guest powered off (ACPI S5)                        |
//! | 1    | the VMM or the host failed: KVM unavailable, an ioctl, a vfio-user peer that hung up (`vmm-error` if the VM had started) |
//! | 2    | bad input: the spec, the kernel, initrd or command line (no VM ran) |
//! | 3    | `reset` (i8042 or ACPI reset) or `triple-fault`                    |
//! | 4    | `kvm-internal-error` (e.g. emulation failure) or `entry-failure`   |
//! | 5    | `panic`: the guest reported a panic through pvpanic               |
//! | 6    | `timeout`: the spec's timeout expired                              |
//! | 7    | `shutdown`: stopped through the control socket                    |
//!
//! A process killed by seccomp dies of SIGSYS (a shell shows 159) and prints no line.

use serde::{Deserialize, Serialize};

use crate::counters::{IommuCounts, ModelCounters};

/// Process exit codes, one per way a run can end.
pub mod code {
    /// The guest powered off.
    pub const POWEROFF: i32 = 0;
    /// The VMM, the host or a device peer failed.
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
    /// Stopped through the control socket (`vm.shutdown`) after the guest ignored the power
    /// button.
    pub const SHUTDOWN: i32 = 7;
    /// The VM stopped after its snapshot was written (`vm.snapshot` on the control socket).
    pub const SNAPSHOT: i32 = 0;
}

/// Why a VM stopped, as the exit line names it (`reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExitReason {
    /// The guest powered off (ACPI S5).
    #[serde(rename = "poweroff")]
    Poweroff,
    /// A reset request (i8042, ACPI reset register).
    Reset,
    /// A triple fault (KVM_EXIT_SHUTDOWN).
    TripleFault,
    /// The guest reported a panic through pvpanic.
    Panic,
    /// The spec's timeout expired.
    Timeout,
    /// Stopped through the control socket after the guest ignored the power button.
    Shutdown,
    /// KVM could not go on (KVM_EXIT_INTERNAL_ERROR, e.g. an emulation failure).
    KvmInternalError,
    /// The hardware refused to enter the guest (KVM_EXIT_FAIL_ENTRY).
    EntryFailure,
    /// The VMM failed while the VM ran.
    VmmError,
    /// Stopped after a snapshot of it was written (`vm.snapshot`): the exit line's `snapshot`
    /// says where and how big.
    Snapshot,
}

impl ExitReason {
    /// The process exit code.
    pub fn exit_code(self) -> i32 {
        match self {
            ExitReason::Poweroff => code::POWEROFF,
            ExitReason::Reset | ExitReason::TripleFault => code::RESET,
            ExitReason::Panic => code::GUEST_PANIC,
            ExitReason::Timeout => code::TIMEOUT,
            ExitReason::Shutdown => code::SHUTDOWN,
            ExitReason::KvmInternalError | ExitReason::EntryFailure => code::KVM_ERROR,
            ExitReason::VmmError => code::VMM_ERROR,
            ExitReason::Snapshot => code::SNAPSHOT,
        }
    }

    /// Whether the guest itself ended the VM (powered off, reset, triple-faulted, panicked),
    /// rather than a limit, the lab, KVM or the VMM.
    pub fn by_guest(self) -> bool {
        matches!(self, ExitReason::Poweroff | ExitReason::Reset | ExitReason::TripleFault | ExitReason::Panic)
    }

    /// Its name in the exit line.
    pub fn name(self) -> &'static str {
        match self {
            ExitReason::Poweroff => "poweroff",
            ExitReason::Reset => "reset",
            ExitReason::TripleFault => "triple-fault",
            ExitReason::Panic => "panic",
            ExitReason::Timeout => "timeout",
            ExitReason::Shutdown => "shutdown",
            ExitReason::KvmInternalError => "kvm-internal-error",
            ExitReason::EntryFailure => "entry-failure",
            ExitReason::VmmError => "vmm-error",
            ExitReason::Snapshot => "snapshot",
        }
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Exit counters: totals, the exits by kind, and the census of the addresses that exited most.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitCounts {
    /// Port I/O exits.
    pub io: u64,
    /// MMIO exits.
    pub mmio: u64,
    /// Accesses no device claimed.
    pub unclaimed: u64,
    /// Exits by kind: `io_in`, `io_out`, `mmio_read`, `mmio_write` (a string port access that
    /// moves several items is one exit).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub by_kind: std::collections::BTreeMap<String, u64>,
    /// The ports that exited most, busiest first (at most [`CENSUS_TOP`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_ports: Vec<AddressCount>,
    /// The MMIO addresses that exited most, busiest first (at most [`CENSUS_TOP`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_mmio: Vec<AddressCount>,
}

/// How many addresses of each space the census lists.
pub const CENSUS_TOP: usize = 8;

/// One address of the exit census: how often guest accesses there reached the VMM.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AddressCount {
    /// The port or guest-physical address, in hex (`0x3fd`).
    pub addr: String,
    /// Accesses a device answered.
    pub claimed: u64,
    /// Accesses no device claimed (reads answered all ones, writes dropped).
    pub unclaimed: u64,
}

/// A passed-through device and what it counted so far.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceCounters {
    /// How it was given (`vfio=...`, `vfio-user=...`).
    pub device: String,
    /// Where the guest saw it.
    pub bdf: String,
    /// Why it stopped being used, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What a driverlab model counted (vfio-user models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<ModelCounters>,
}

/// A passed-through device in the exit line: its counters and how its reset at teardown went.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceSummary {
    /// The device and its final counters.
    #[serde(flatten)]
    pub device: DeviceCounters,
    /// Whether the reset at teardown left the device healthy.
    pub reset_ok: bool,
}

/// The exit line: `{"vmm":"exit","reason":...,"exit_code":N,...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExitSummary {
    /// Always "exit": marks the line.
    pub vmm: String,
    /// Why the VM stopped.
    pub reason: ExitReason,
    /// The process exit code.
    pub exit_code: i32,
    /// Details for errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The boot protocol used ("pvh", "linux64").
    pub entry: String,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Guest memory in MiB.
    pub memory_mib: u64,
    /// Whether the host backs guest RAM with transparent huge pages (the VMM asks for them; a
    /// host whose `shmem_enabled` is `never` keeps small pages). Absent from older lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub huge_pages: Option<bool>,
    /// From process start of the VMM's work to the first vCPU entering the guest.
    pub setup_ms: f64,
    /// Where `setup_ms` went, phase by phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<SetupPhases>,
    /// From the vCPUs starting to the VM stopping.
    pub run_ms: f64,
    /// From the vCPUs starting to the guest's first byte on COM1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_serial_ms: Option<f64>,
    /// Bytes the guest wrote to COM1.
    pub serial_bytes: u64,
    /// Bytes the guest wrote to COM2, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub com2_bytes: Option<u64>,
    /// Exits handled by the VMM.
    pub exits: ExitCounts,
    /// What the virtio-iommu counted, with an IOMMU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viommu: Option<IommuCounts>,
    /// Passed-through devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceSummary>,
    /// How the VMM process was confined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confinement: Option<crate::confinement::Confinement>,
    /// For a VM stopped from outside (timeout, shutdown): why the state a vCPU was found in is
    /// one no guest can reach, when it is ("vCPU 0: its page tables (cr3 0x...) are outside
    /// guest memory"). The host's virtualization lost that vCPU's state: an infrastructure
    /// fault, not the guest's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu_state_lost: Option<String>,
    /// The snapshot written when the VM stopped for one (reason `snapshot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotWritten>,
    /// How the VM was restored from a snapshot (`vm run --restore`); absent for a VM that booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<Restored>,
}

/// The exit line's `snapshot`: what was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotWritten {
    /// Milliseconds from the vCPUs' stop to both files written and synced.
    pub ms: f64,
    /// Bytes of the state file (header and JSON body).
    pub state_bytes: u64,
    /// Bytes of guest RAM with data (the RAM file is sparse: its size is the guest's RAM).
    pub ram_data_bytes: u64,
}

/// The exit line's `restored`: how the VM got its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restored {
    /// Milliseconds to read and check the snapshot, copy its RAM into guest memory and write
    /// the vCPUs', the VM's and the devices' state (part of `setup_ms`, in place of loading a
    /// kernel).
    pub ms: f64,
    /// Bytes of guest RAM with data in the snapshot.
    pub ram_data_bytes: u64,
    /// How guest RAM came back.
    pub ram: RestoredRam,
}

/// How a restored VM's RAM came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestoredRam {
    /// Mapped private from the snapshot's RAM file (no copy; the file checked against its
    /// checksum while the VM ran): a VM without device models, on a host that gives guest RAM
    /// no huge pages.
    Mapped,
    /// Copied into the VM's memory file, and checked, before it ran: a VM whose device models
    /// share its RAM, one that may be snapshotted again, or one on a host that gives guest RAM
    /// huge pages (copied into them).
    Copied,
}

/// The VMM's set-up, phase by phase, in milliseconds (they add up to `setup_ms`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct SetupPhases {
    /// Checking the spec and the host, binding the control socket, opening the kernel image and
    /// reading its headers.
    pub image_ms: f64,
    /// Creating guest RAM and loading the kernel (its segments read from the file straight into
    /// guest memory), initrd and boot tables into it.
    pub load_ms: f64,
    /// The KVM VM: memory slots, the in-kernel irqchip.
    pub kvm_ms: f64,
    /// The platform: legacy devices, PCI, the virtio-iommu, each passed-through device opened,
    /// its BARs mapped and its DMA set up; the ACPI tables.
    pub platform_ms: f64,
    /// The vCPUs: CPUID, MSRs, registers.
    pub vcpus_ms: f64,
    /// The jail: cgroup, limits, the empty root, the uid, Landlock.
    #[serde(default)]
    pub jail_ms: f64,
}

impl ExitSummary {
    /// The exit line as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an ExitSummary always serializes")
    }

    /// Finds and parses the last exit line in a VMM's stderr.
    pub fn find_in(stderr: &str) -> Option<ExitSummary> {
        find_line(stderr, "{\"vmm\":\"exit\"")
    }
}

/// What kind of failure kept a VM from running (or ended the VMM while it ran).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The command line could not be parsed.
    Usage,
    /// The VM spec is invalid (a field out of range, an unknown field, bad JSON).
    Spec,
    /// The kernel or initrd cannot be read or booted.
    Image,
    /// A device named in the spec does not exist or cannot be used as given.
    Device,
    /// A vfio-user peer refused, hung up or broke the protocol.
    Peer,
    /// KVM is missing or refused an operation.
    Kvm,
    /// Another host resource failed (memory, files, threads).
    Host,
}

impl ErrorKind {
    /// The exit code for this kind: 2 for the user's mistakes, 1 for host and peer failures.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::Usage | ErrorKind::Spec | ErrorKind::Image | ErrorKind::Device => code::BAD_INPUT,
            ErrorKind::Peer | ErrorKind::Kvm | ErrorKind::Host => code::VMM_ERROR,
        }
    }
}

/// The error line: `{"vmm":"error","kind":...,"message":...,"exit_code":N}`, the last line on
/// stderr of a VMM that could not run its VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorLine {
    /// Always "error": marks the line.
    pub vmm: String,
    /// What failed.
    pub kind: ErrorKind,
    /// What went wrong and what to do.
    pub message: String,
    /// The process exit code ([`ErrorKind::exit_code`]).
    pub exit_code: i32,
}

impl ErrorLine {
    /// The line for a failure of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ErrorLine { vmm: "error".into(), kind, message: message.into(), exit_code: kind.exit_code() }
    }

    /// The line as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an ErrorLine always serializes")
    }

    /// Finds and parses the last error line in a VMM's stderr.
    pub fn find_in(stderr: &str) -> Option<ErrorLine> {
        find_line(stderr, "{\"vmm\":\"error\"")
    }
}

fn find_line<T: serde::de::DeserializeOwned>(stderr: &str, prefix: &str) -> Option<T> {
    stderr.lines().rev().filter(|l| l.starts_with(prefix)).find_map(|l| serde_json::from_str(l).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_line_round_trips_with_flat_device_keys() {
        let summary = ExitSummary {
            vmm: "exit".into(),
            reason: ExitReason::Poweroff,
            exit_code: 0,
            detail: None,
            entry: "pvh".into(),
            vcpus: 2,
            memory_mib: 256,
            huge_pages: Some(true),
            setup_ms: 1.5,
            setup: None,
            run_ms: 20.0,
            first_serial_ms: Some(1.0),
            serial_bytes: 10,
            com2_bytes: None,
            exits: ExitCounts { io: 11, mmio: 0, unclaimed: 0, ..ExitCounts::default() },
            viommu: None,
            devices: vec![DeviceSummary {
                device: DeviceCounters {
                    device: "vfio-user=/tmp/a.sock".into(),
                    bdf: "00:02.0".into(),
                    error: None,
                    counters: Some(ModelCounters { dma_maps: 3, ..ModelCounters::default() }),
                },
                reset_ok: true,
            }],
            confinement: None,
            vcpu_state_lost: None,
            snapshot: None,
            restored: None,
        };
        let line = summary.to_json();
        assert!(line.starts_with(r#"{"vmm":"exit","reason":"poweroff","exit_code":0,"#), "{line}");
        assert!(
            line.contains(r#""devices":[{"device":"vfio-user=/tmp/a.sock","bdf":"00:02.0","counters":{"dma_maps":3"#)
        );
        let stderr = format!("a log line\n{line}\n");
        let back = ExitSummary::find_in(&stderr).unwrap();
        assert_eq!((back.reason, back.vcpus, back.exits.io), (ExitReason::Poweroff, 2, 11));
        assert_eq!(back.devices, summary.devices);
        assert!(ExitSummary::find_in("error: nothing ran").is_none());
    }

    #[test]
    fn every_reason_has_its_name_on_the_wire_and_its_code() {
        let all = [
            ExitReason::Poweroff,
            ExitReason::Reset,
            ExitReason::TripleFault,
            ExitReason::Panic,
            ExitReason::Timeout,
            ExitReason::Shutdown,
            ExitReason::KvmInternalError,
            ExitReason::EntryFailure,
            ExitReason::VmmError,
        ];
        for reason in all {
            let wire = serde_json::to_string(&reason).unwrap();
            assert_eq!(wire, format!("\"{reason}\""));
            assert_eq!(serde_json::from_str::<ExitReason>(&wire).unwrap(), reason);
        }
        let codes: std::collections::BTreeSet<i32> = all.iter().map(|r| r.exit_code()).collect();
        assert_eq!(codes.len(), 7, "reset and triple-fault share 3, the two KVM failures 4");
        assert!(serde_json::from_str::<ExitReason>("\"power-off\"").is_err());
    }

    #[test]
    fn error_lines_carry_their_exit_code() {
        let line = ErrorLine::new(ErrorKind::Peer, "vfio-user=/tmp/a.sock: the peer hung up");
        assert_eq!(line.exit_code, code::VMM_ERROR);
        let json = line.to_json();
        assert_eq!(
            json,
            r#"{"vmm":"error","kind":"peer","message":"vfio-user=/tmp/a.sock: the peer hung up","exit_code":1}"#
        );
        assert_eq!(ErrorLine::find_in(&format!("noise\n{json}\n")), Some(line));
        for kind in [ErrorKind::Usage, ErrorKind::Spec, ErrorKind::Image, ErrorKind::Device] {
            assert_eq!(kind.exit_code(), code::BAD_INPUT);
        }
        for kind in [ErrorKind::Peer, ErrorKind::Kvm, ErrorKind::Host] {
            assert_eq!(kind.exit_code(), code::VMM_ERROR);
        }
    }
}

//! [`VmSpec`]: one VM, as `driverlab vm run --config FILE|-` reads it and `--print-spec` prints it.
//!
//! ```json
//! {"kernel":"probe","initrd":null,"cmdline":"probe.nic=aqc100","memory_mib":256,"vcpus":1,
//!  "entry":"auto","iommu":{"bypass":true},"devices":[{"vfio-user":"/tmp/aq.sock"}],
//!  "serial":{"com1":"stdout","com2":{"file":"/tmp/agent.log"}},"timeout_s":60.0,"seccomp":true}
//! ```
//!
//! Every field but `kernel` has a default. Unknown fields are refused, so a misspelt option is an
//! error and never silently ignored.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use crate::device::{DeviceBackend, DeviceSpec, DeviceSpecError, Slot};

/// Least guest memory, in MiB.
pub const MIN_MEMORY_MIB: u64 = 4;
/// Default guest memory, in MiB.
pub const DEFAULT_MEMORY_MIB: u64 = 256;
/// Most vCPUs: xAPIC IDs are 8 bits and 0xff is the broadcast ID.
pub const MAX_VCPUS: u32 = 254;
/// The longest kernel command line any boot protocol takes (a bzImage may take less: its
/// `cmdline_size`).
pub const MAX_CMDLINE: usize = 4096;
/// Most guest memory a spec may ask for (the host's own memory bounds it further).
pub const MAX_MEMORY_MIB: u64 = 1 << 20;
/// Most guest memory one VM of a lab may have: a box shared by several VMs (the daemon's
/// `/v1/vms`, every matrix's images).
pub const LAB_MAX_MEMORY_MIB: u64 = 16 * 1024;
/// Most passed-through devices: bus 0 has 32 slots, the host bridge and the virtio-iommu take two.
pub const MAX_DEVICES: usize = 30;
/// Largest payload window, in MiB (a quarter of the VM's memory at most, too).
pub const MAX_PAYLOAD_WINDOW_MIB: u64 = 1024;
/// Whether a VM of `memory_mib` may have a payload window of `window_mib`: at most a quarter of
/// its memory (of at least 16 MiB) and [`MAX_PAYLOAD_WINDOW_MIB`].
pub fn payload_window_fits(window_mib: u32, memory_mib: u64) -> bool {
    let window = u64::from(window_mib);
    memory_mib >= 16 && window * 4 <= memory_mib && window <= MAX_PAYLOAD_WINDOW_MIB
}

/// Longest timeout, in seconds (a week).
pub const MAX_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;

/// One VM run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// What to boot.
    pub kernel: Kernel,
    /// An initial ramdisk.
    #[serde(default)]
    pub initrd: Option<PathBuf>,
    /// The kernel command line.
    #[serde(default)]
    pub cmdline: String,
    /// Guest memory in MiB.
    #[serde(default = "default_memory")]
    pub memory_mib: u64,
    /// Virtual CPUs.
    #[serde(default = "default_vcpus")]
    pub vcpus: u32,
    /// Which boot entry to use.
    #[serde(default)]
    pub entry: Entry,
    /// A virtio-iommu in front of every PCI endpoint; none without it (DMA is identity-mapped).
    #[serde(default)]
    pub iommu: Option<IommuSpec>,
    /// Devices to pass through, in bus order (00:02.0, 00:03.0, ...).
    #[serde(default)]
    pub devices: Vec<DeviceSpec>,
    /// Where the serial ports' output goes.
    #[serde(default)]
    pub serial: SerialSpec,
    /// Stop the VM after this many seconds (exit code 6); none: run until the guest stops.
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Install the seccomp filters (default); off only for debugging.
    #[serde(default = "yes")]
    pub seccomp: bool,
    /// Jail the VMM process (default): namespaces, an empty root, its own uid and cgroup,
    /// Landlock (docs/vmm.md); off only with `--no-jail`.
    #[serde(default = "yes")]
    pub jail: bool,
    /// MiB of guest RAM set aside as a payload window (0: none): reserved in the guest's E820
    /// map, inside its RAM, so that the guest reads it through `/dev/mem`; a VM restored from
    /// a snapshot of this VM gets a file written there (`vm run --restore DIR --payload FILE`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub payload_window_mib: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn default_memory() -> u64 {
    DEFAULT_MEMORY_MIB
}

fn default_vcpus() -> u32 {
    1
}

fn yes() -> bool {
    true
}

impl VmSpec {
    /// A spec that boots `kernel` with every default.
    pub fn new(kernel: Kernel) -> Self {
        VmSpec {
            kernel,
            initrd: None,
            cmdline: String::new(),
            memory_mib: DEFAULT_MEMORY_MIB,
            vcpus: 1,
            entry: Entry::Auto,
            iommu: None,
            devices: Vec::new(),
            serial: SerialSpec::default(),
            timeout_s: None,
            seccomp: true,
            jail: true,
            payload_window_mib: 0,
        }
    }

    /// Parses and checks a spec from JSON; the error names the field, line and column.
    pub fn from_json(json: &str) -> Result<Self, SpecError> {
        let spec = VmSpec::parse(json)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses a spec from JSON without [`VmSpec::validate`] (for callers that change it first).
    pub fn parse(json: &str) -> Result<Self, SpecError> {
        let mut deserializer = serde_json::Deserializer::from_str(json);
        let spec: VmSpec = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            SpecError::Json(if path == "." { inner.to_string() } else { format!("{path}: {inner}") })
        })?;
        deserializer.end().map_err(|e| SpecError::Json(e.to_string()))?;
        Ok(spec)
    }

    /// The spec as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a VmSpec always serializes")
    }

    /// Checks what can be checked without the host: ranges, counts, empty paths. The VMM checks
    /// the rest (files, host memory, devices) when it starts.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_within(&VmLimits::VMM)
    }

    /// [`VmSpec::validate`] within `limits`.
    pub fn validate_within(&self, limits: &VmLimits) -> Result<(), SpecError> {
        if let Kernel::Path(path) = &self.kernel
            && path.as_os_str().is_empty()
        {
            return Err(SpecError::EmptyPath("kernel"));
        }
        if self.initrd.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(SpecError::EmptyPath("initrd"));
        }
        if self.memory_mib < MIN_MEMORY_MIB {
            return Err(SpecError::MemoryTooSmall(self.memory_mib));
        }
        if self.memory_mib > limits.max_memory_mib {
            return Err(SpecError::MemoryTooLarge { mib: self.memory_mib, max: limits.max_memory_mib });
        }
        if self.cmdline.contains('\0') {
            return Err(SpecError::Cmdline("it holds a NUL byte".into()));
        }
        if self.cmdline.len() > MAX_CMDLINE {
            return Err(SpecError::Cmdline(format!("{} bytes; at most {MAX_CMDLINE}", self.cmdline.len())));
        }
        if self.payload_window_mib > 0 && !payload_window_fits(self.payload_window_mib, self.memory_mib) {
            return Err(SpecError::PayloadWindow { mib: self.payload_window_mib, memory_mib: self.memory_mib });
        }
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(SpecError::Vcpus(self.vcpus));
        }
        if let Some(t) = self.timeout_s
            && !(t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_S)
        {
            return Err(SpecError::Timeout(t));
        }
        if self.devices.len() > MAX_DEVICES {
            return Err(SpecError::TooManyDevices(self.devices.len()));
        }
        for (i, device) in self.devices.iter().enumerate() {
            if self.devices[..i].iter().any(|d| d.backend == device.backend) {
                return Err(SpecError::DuplicateDevice(device.to_string()));
            }
        }
        for output in [Some(&self.serial.com1), self.serial.com2.as_ref()].into_iter().flatten() {
            if let SerialOutput::File(p) | SerialOutput::Unix(p) = output
                && p.as_os_str().is_empty()
            {
                return Err(SpecError::EmptyPath("serial"));
            }
        }
        Ok(())
    }
}

/// The bounds a spec is checked within: the VMM's own, or a lab's (tighter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmLimits {
    /// Most guest memory, MiB.
    pub max_memory_mib: u64,
}

impl VmLimits {
    /// The VMM's: what one VM on a host of its own may ask for.
    pub const VMM: VmLimits = VmLimits { max_memory_mib: MAX_MEMORY_MIB };
    /// A lab's: its daemon's `/v1/vms` and every matrix, on a box several VMs share.
    pub const LAB: VmLimits = VmLimits { max_memory_mib: LAB_MAX_MEMORY_MIB };
}

/// A spec the VMM refuses before it creates anything (exit code 2).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// The JSON does not parse or has an unknown or mistyped field.
    #[error("the VM spec is not valid: {0}")]
    Json(String),
    /// A path that is empty.
    #[error("{0}: the path is empty")]
    EmptyPath(&'static str),
    /// Less memory than any guest needs.
    #[error("memory_mib (--memory) {0}: at least {MIN_MEMORY_MIB} MiB is needed")]
    MemoryTooSmall(u64),
    /// More memory than a spec may ask for.
    #[error("memory_mib (--memory) {mib}: at most {max} MiB")]
    MemoryTooLarge {
        /// What was asked.
        mib: u64,
        /// The limit.
        max: u64,
    },
    /// A kernel command line the boot protocols cannot carry.
    #[error("cmdline (--cmdline): {0}")]
    Cmdline(String),
    /// A payload window too large for the VM's memory.
    #[error(
        "payload_window_mib (--payload-window) {mib}: at most a quarter of the memory ({memory_mib} MiB; 16 at least), and at most {MAX_PAYLOAD_WINDOW_MIB}"
    )]
    PayloadWindow {
        /// The window asked for.
        mib: u32,
        /// The VM's memory.
        memory_mib: u64,
    },
    /// A vCPU count out of range.
    #[error("vcpus (--vcpus) {0}: must be between 1 and {MAX_VCPUS}")]
    Vcpus(u32),
    /// A timeout that is not a positive number of seconds.
    #[error("timeout_s (--timeout) {0}: must be more than 0 and at most {MAX_TIMEOUT_S} seconds")]
    Timeout(f64),
    /// More devices than bus 0 has slots for.
    #[error("devices (--device): {0} given, at most {MAX_DEVICES} fit on the bus")]
    TooManyDevices(usize),
    /// The same device twice.
    #[error("devices (--device): {0} is given twice")]
    DuplicateDevice(String),
}

/// What to boot: the embedded probe guest, or a kernel image on the VMM's host (an ELF vmlinux
/// with a PVH note or the 64-bit entry, or a bzImage). Written `"probe"` or as a path; a file
/// named `probe` in the current folder is `./probe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Kernel {
    /// The probe guest built into driverlab.
    Probe,
    /// A kernel image file.
    Path(PathBuf),
}

impl Kernel {
    /// The name used in messages.
    pub fn name(&self) -> String {
        String::from(self.clone())
    }
}

impl TryFrom<String> for Kernel {
    type Error = SpecError;

    fn try_from(s: String) -> Result<Self, SpecError> {
        match s.as_str() {
            "" => Err(SpecError::EmptyPath("kernel")),
            "probe" => Ok(Kernel::Probe),
            _ => Ok(Kernel::Path(PathBuf::from(s))),
        }
    }
}

impl From<Kernel> for String {
    fn from(kernel: Kernel) -> String {
        match kernel {
            Kernel::Probe => "probe".into(),
            Kernel::Path(path) => path.to_string_lossy().into_owned(),
        }
    }
}

impl FromStr for Kernel {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        Kernel::try_from(s.to_string())
    }
}

/// The boot entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Entry {
    /// PVH if the ELF has a PVH note, else the 64-bit Linux entry.
    #[default]
    Auto,
    /// PVH (the ELF must have a PVH note).
    Pvh,
    /// The 64-bit Linux boot protocol entry (ELF `e_entry`, or bzImage + 0x200).
    Linux64,
}

/// virtio-iommu options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IommuSpec {
    /// Whether endpoints the guest has not attached to a domain bypass translation (the
    /// `bypass` config field at reset).
    #[serde(default = "yes")]
    pub bypass: bool,
}

impl Default for IommuSpec {
    fn default() -> Self {
        IommuSpec { bypass: true }
    }
}

/// Where the serial ports' output goes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialSpec {
    /// COM1 (0x3f8, IRQ 4): the console.
    #[serde(default)]
    pub com1: SerialOutput,
    /// COM2 (0x2f8, IRQ 3), for a guest agent's framed results, kept apart from the console; the
    /// port exists only when it is given.
    #[serde(default)]
    pub com2: Option<SerialOutput>,
}

/// One serial port's output: `"stdout"`, `"discard"`, `{"file": PATH}` (created or truncated) or
/// `{"unix": PATH}` (a listening Unix stream socket the VMM connects to at start). On the command
/// line: `stdout`, `discard`, `unix:PATH`, or a file path.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SerialOutput {
    /// The VMM's standard output.
    #[default]
    Stdout,
    /// A file.
    File(PathBuf),
    /// A Unix stream socket someone listens on.
    Unix(PathBuf),
    /// Nowhere (the bytes are still counted).
    Discard,
}

impl FromStr for SerialOutput {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        Ok(match s {
            "" => return Err(SpecError::EmptyPath("serial")),
            "stdout" => SerialOutput::Stdout,
            "discard" => SerialOutput::Discard,
            _ => match s.strip_prefix("unix:") {
                Some("") => return Err(SpecError::EmptyPath("serial")),
                Some(path) => SerialOutput::Unix(PathBuf::from(path)),
                None => SerialOutput::File(PathBuf::from(s)),
            },
        })
    }
}

impl std::fmt::Display for SerialOutput {
    /// The command-line form, which parses back into the same output (a file whose path is
    /// `stdout`, `discard` or starts with `unix:` is written with a `./` in front).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SerialOutput::Stdout => f.write_str("stdout"),
            SerialOutput::Discard => f.write_str("discard"),
            SerialOutput::Unix(path) => write!(f, "unix:{}", path.display()),
            SerialOutput::File(path) => {
                let text = path.display().to_string();
                let ambiguous = matches!(text.as_str(), "stdout" | "discard") || text.starts_with("unix:");
                if ambiguous { write!(f, "./{text}") } else { f.write_str(&text) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_outputs_print_as_they_parse() {
        for text in ["stdout", "discard", "unix:/run/a.sock", "/tmp/com1.log", "./stdout", "./unix:x"] {
            let output: SerialOutput = text.parse().unwrap();
            assert_eq!(output.to_string(), text);
            assert_eq!(output.to_string().parse::<SerialOutput>().unwrap(), output);
        }
        assert_eq!(
            SerialOutput::File("stdout".into()).to_string().parse::<SerialOutput>().unwrap(),
            SerialOutput::File("./stdout".into())
        );
    }

    #[test]
    fn defaults_fill_everything_but_the_kernel() {
        let spec = VmSpec::from_json(r#"{"kernel":"probe"}"#).unwrap();
        assert_eq!(spec, VmSpec::new(Kernel::Probe));
        assert_eq!((spec.memory_mib, spec.vcpus, spec.seccomp), (256, 1, true));
        let err = VmSpec::from_json("{}").unwrap_err().to_string();
        assert!(err.contains("missing field `kernel`"), "{err}");
    }

    #[test]
    fn a_payload_window_is_at_most_a_quarter_of_the_memory_and_absent_when_zero() {
        let spec = VmSpec::from_json(r#"{"kernel":"probe","memory_mib":64,"payload_window_mib":16}"#).unwrap();
        assert_eq!(spec.payload_window_mib, 16);
        assert!(spec.to_json().contains(r#""payload_window_mib":16"#));
        assert!(!VmSpec::new(Kernel::Probe).to_json().contains("payload_window"), "absent when none");
        for (memory, window) in [(64, 17), (8, 2), (8192, 1025)] {
            let json = format!(r#"{{"kernel":"probe","memory_mib":{memory},"payload_window_mib":{window}}}"#);
            let err = VmSpec::from_json(&json).unwrap_err();
            assert!(matches!(err, SpecError::PayloadWindow { .. }), "{memory} MiB, window {window}: {err}");
        }
    }

    #[test]
    fn a_full_spec_round_trips() {
        let json = r#"{"kernel":"/boot/vmlinux","initrd":"/tmp/i.cpio","cmdline":"console=ttyS0","memory_mib":512,
            "vcpus":2,"entry":"pvh","iommu":{"bypass":false},"devices":[{"vfio":"0000:63:00.0"},{"vfio-user":"/tmp/a.sock"}],
            "serial":{"com1":{"file":"/tmp/c.log"},"com2":{"unix":"/tmp/agent.sock"}},"timeout_s":30.5,"seccomp":false}"#;
        let spec = VmSpec::from_json(json).unwrap();
        assert_eq!(spec.kernel, Kernel::Path("/boot/vmlinux".into()));
        assert_eq!(spec.iommu, Some(IommuSpec { bypass: false }));
        assert_eq!(spec.devices[0].to_string(), "vfio=0000:63:00.0");
        assert_eq!(spec.devices[1], DeviceSpec::vfio_user("/tmp/a.sock"));
        assert_eq!(spec.serial.com2, Some(SerialOutput::Unix("/tmp/agent.sock".into())));
        assert_eq!(VmSpec::from_json(&spec.to_json()).unwrap(), spec);
    }

    #[test]
    fn mistakes_name_the_field() {
        let cases = [
            (r#"{"kernel":"probe","memory":256}"#, "unknown field `memory`"),
            (r#"{"kernel":"probe","vcpus":"two"}"#, "vcpus: invalid type"),
            (r#"{"kernel":"probe","devices":[{"vfio-user":"/a"},{"vfio":5}]}"#, "devices[1].vfio: invalid type"),
            (r#"{"kernel":"probe"} trailing"#, "trailing characters"),
            (r#"{"kernel":""}"#, "kernel: the path is empty"),
            (r#"{"kernel":"probe","memory_mib":1}"#, "memory_mib (--memory) 1"),
            (r#"{"kernel":"probe","vcpus":0}"#, "vcpus (--vcpus) 0"),
            (r#"{"kernel":"probe","timeout_s":0}"#, "timeout_s (--timeout) 0"),
            (r#"{"kernel":"probe","timeout_s":-1}"#, "timeout_s"),
            (r#"{"kernel":"probe","devices":[{"usb":"1"}]}"#, "unknown field `usb`"),
            (r#"{"kernel":"probe","devices":[{"vfio":"63:00"}]}"#, "not a PCI address"),
            (r#"{"kernel":"probe","devices":[{"vfio-user":"/a"},{"vfio-user":"/a"}]}"#, "given twice"),
            (
                r#"{"kernel":"probe","devices":[{"vfio-user":"/a"},{"vfio-user":"/a","slot":"thunderbolt"}]}"#,
                "given twice",
            ),
            (r#"{"kernel":"probe","serial":{"com3":"stdout"}}"#, "unknown field `com3`"),
            (r#"{"kernel":"probe","iommu":{"bypas":true}}"#, "unknown field `bypas`"),
            (r#"{"kernel":"probe","cmdline":"a\u0000b"}"#, "cmdline (--cmdline): it holds a NUL byte"),
            (r#"{"kernel":"probe","memory_mib":1048577}"#, "at most 1048576 MiB"),
            ("[1,2", "the VM spec is not valid"),
        ];
        for (json, expected) in cases {
            let err = VmSpec::from_json(json).unwrap_err().to_string();
            assert!(err.contains(expected), "{json}: {err}");
        }
        let long = format!(r#"{{"kernel":"probe","cmdline":"{}"}}"#, "x".repeat(MAX_CMDLINE + 1));
        assert!(VmSpec::from_json(&long).unwrap_err().to_string().contains("4097 bytes; at most 4096"));
        let json_error = VmSpec::from_json("{\n\"kernel\": 5}").unwrap_err().to_string();
        assert!(json_error.contains("line 2"), "{json_error}");
    }

    #[test]
    fn command_line_forms_parse() {
        assert_eq!("unix:/tmp/a".parse::<SerialOutput>(), Ok(SerialOutput::Unix("/tmp/a".into())));
        assert_eq!("/tmp/a.log".parse::<SerialOutput>(), Ok(SerialOutput::File("/tmp/a.log".into())));
        assert_eq!("discard".parse::<SerialOutput>(), Ok(SerialOutput::Discard));
        assert!("unix:".parse::<SerialOutput>().is_err());
        assert_eq!("probe".parse::<Kernel>(), Ok(Kernel::Probe));
        assert_eq!("./probe".parse::<Kernel>(), Ok(Kernel::Path("./probe".into())));
    }
}

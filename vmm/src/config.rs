//! What one VM run is asked to do, and the checks made before anything is created.

use std::borrow::Cow;
use std::fs::File;
use std::io::{LineWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use crate::boot::EntryProtocol;
use crate::memory::{MIB, MIN_MEMORY_MIB, host_memory};

/// Most vCPUs: xAPIC IDs are 8 bits and 0xff is the broadcast ID.
pub const MAX_VCPUS: u32 = 254;

/// Where the kernel comes from.
#[derive(Debug, Clone)]
pub enum KernelSource {
    /// An image built into the binary (the probe guest).
    Embedded {
        /// Its name in messages.
        name: &'static str,
        /// The image.
        image: &'static [u8],
    },
    /// A file.
    File(PathBuf),
}

impl KernelSource {
    /// The name used in messages.
    pub fn name(&self) -> String {
        match self {
            KernelSource::Embedded { name, .. } => name.to_string(),
            KernelSource::File(path) => path.display().to_string(),
        }
    }

    /// The image bytes.
    pub fn read(&self) -> Result<Cow<'static, [u8]>, ConfigError> {
        match self {
            KernelSource::Embedded { image, .. } => Ok(Cow::Borrowed(image)),
            KernelSource::File(path) => std::fs::read(path)
                .map(Cow::Owned)
                .map_err(|e| ConfigError::Kernel { path: path.clone(), reason: e.to_string() }),
        }
    }
}

/// A device to pass through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A host PCI device bound to vfio-pci.
    Vfio(passthrough::Bdf),
    /// A device served over vfio-user on a Unix socket.
    VfioUser(PathBuf),
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some(("vfio", bdf)) => bdf.parse().map(DeviceSpec::Vfio).map_err(|e| e.to_string()),
            Some(("vfio-user", path)) if !path.is_empty() => Ok(DeviceSpec::VfioUser(PathBuf::from(path))),
            _ => Err(format!("{s:?}: write vfio=0000:63:00.0 or vfio-user=/path/to/socket")),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Vfio(bdf) => write!(f, "vfio={bdf}"),
            DeviceSpec::VfioUser(path) => write!(f, "vfio-user={}", path.display()),
        }
    }
}

/// Where the guest's serial output goes.
#[derive(Debug, Clone, Default)]
pub enum SerialOutput {
    /// The VMM's standard output.
    #[default]
    Stdout,
    /// A file, created or truncated.
    File(PathBuf),
    /// Nowhere.
    Discard,
}

impl SerialOutput {
    /// Opens the sink, line-buffered.
    pub fn open(&self) -> Result<Box<dyn Write + Send>, ConfigError> {
        Ok(match self {
            SerialOutput::Stdout => Box::new(std::io::stdout()),
            SerialOutput::File(path) => Box::new(LineWriter::new(
                File::create(path).map_err(|e| ConfigError::Serial { path: path.clone(), reason: e.to_string() })?,
            )),
            SerialOutput::Discard => Box::new(std::io::sink()),
        })
    }
}

/// One VM run.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The kernel.
    pub kernel: KernelSource,
    /// An initrd.
    pub initrd: Option<PathBuf>,
    /// The kernel command line.
    pub cmdline: String,
    /// Guest memory in MiB.
    pub memory_mib: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Serial output.
    pub serial: SerialOutput,
    /// Stop the VM after this long.
    pub timeout: Option<Duration>,
    /// Install the seccomp filters (default); off only for debugging.
    pub seccomp: bool,
    /// Which boot entry to use.
    pub entry: EntryProtocol,
    /// A virtio-iommu in front of every PCI endpoint.
    pub iommu: Option<crate::platform::IommuConfig>,
    /// Devices to pass through, in bus order.
    pub devices: Vec<DeviceSpec>,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            kernel: KernelSource::File(PathBuf::new()),
            initrd: None,
            cmdline: String::new(),
            memory_mib: 256,
            vcpus: 1,
            serial: SerialOutput::Stdout,
            timeout: None,
            seccomp: true,
            entry: EntryProtocol::Auto,
            iommu: None,
            devices: Vec::new(),
        }
    }
}

/// Invalid options: the user's to fix (exit code 2).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Less memory than any guest needs.
    #[error("--memory {0}: at least {MIN_MEMORY_MIB} MiB is needed")]
    MemoryTooSmall(u64),
    /// More memory than the host has.
    #[error("--memory {asked}: the host has only {host} MiB")]
    MemoryExceedsHost {
        /// MiB asked for.
        asked: u64,
        /// MiB the host has.
        host: u64,
    },
    /// A vCPU count out of range.
    #[error("--vcpus {0}: must be between 1 and {MAX_VCPUS}")]
    Vcpus(u32),
    /// The kernel file cannot be read.
    #[error("kernel image {path}: {reason}", path = path.display())]
    Kernel {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The serial output file cannot be created.
    #[error("--serial {path}: {reason}", path = path.display())]
    Serial {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A timeout of zero.
    #[error("--timeout must be more than 0")]
    ZeroTimeout,
}

impl VmConfig {
    /// Checks the options that do not depend on the kernel image.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.memory_mib < MIN_MEMORY_MIB {
            return Err(ConfigError::MemoryTooSmall(self.memory_mib));
        }
        let host = host_memory().unwrap_or(u64::MAX);
        if self.memory_mib.saturating_mul(MIB) > host {
            return Err(ConfigError::MemoryExceedsHost { asked: self.memory_mib, host: host / MIB });
        }
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(ConfigError::Vcpus(self.vcpus));
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(ConfigError::ZeroTimeout);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_option() {
        let ok = VmConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        let zero = VmConfig { memory_mib: 0, ..VmConfig::default() };
        assert_eq!(zero.validate(), Err(ConfigError::MemoryTooSmall(0)));
        assert!(zero.validate().unwrap_err().to_string().starts_with("--memory 0"));
        let huge = VmConfig { memory_mib: u64::MAX / MIB, ..VmConfig::default() };
        assert!(matches!(huge.validate(), Err(ConfigError::MemoryExceedsHost { .. })));
        assert_eq!(VmConfig { vcpus: 0, ..VmConfig::default() }.validate(), Err(ConfigError::Vcpus(0)));
        assert_eq!(VmConfig { vcpus: 255, ..VmConfig::default() }.validate(), Err(ConfigError::Vcpus(255)));
        let t = VmConfig { timeout: Some(Duration::ZERO), ..VmConfig::default() };
        assert_eq!(t.validate(), Err(ConfigError::ZeroTimeout));
    }

    #[test]
    fn device_specs_parse() {
        assert_eq!("vfio=0000:63:00.0".parse::<DeviceSpec>().unwrap().to_string(), "vfio=0000:63:00.0");
        assert_eq!("vfio-user=/tmp/x.sock".parse::<DeviceSpec>(), Ok(DeviceSpec::VfioUser("/tmp/x.sock".into())));
        assert!("vfio=63:00".parse::<DeviceSpec>().unwrap_err().contains("not a PCI address"));
        assert!("usb=1".parse::<DeviceSpec>().unwrap_err().contains("vfio-user="));
        assert!("vfio-user=".parse::<DeviceSpec>().is_err());
    }

    #[test]
    fn unreadable_kernel_names_the_path() {
        let err = KernelSource::File("/nonexistent/vmlinux".into()).read().unwrap_err();
        assert!(err.to_string().starts_with("kernel image /nonexistent/vmlinux: "), "{err}");
    }
}

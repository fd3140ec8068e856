//! A [`VmSpec`] checked against this host, and what it names opened: the kernel image and the
//! serial ports' outputs. All of it happens before any KVM object exists.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vm_spec::{Kernel, SerialOutput, VmSpec};

use crate::boot::KernelSource;
use crate::memory::{MIB, host_memory};

/// How long a serial write to a Unix socket may block the vCPU before the output is given up.
const SOCKET_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// A spec this host cannot run as asked, or a file it names that cannot be used: the user's to
/// fix (exit code 2).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// More memory than the host has.
    #[error("memory_mib (--memory) {asked}: the host has only {host} MiB")]
    MemoryExceedsHost {
        /// MiB asked for.
        asked: u64,
        /// MiB the host has.
        host: u64,
    },
    /// The kernel file cannot be read.
    #[error("kernel image {path}: {reason}", path = path.display())]
    Kernel {
        /// The path.
        path: PathBuf,
        /// What went wrong, in words.
        reason: String,
    },
    /// A serial output cannot be opened.
    #[error("serial output {path}: {reason}", path = path.display())]
    Serial {
        /// The path.
        path: PathBuf,
        /// What went wrong, in words.
        reason: String,
    },
}

/// Checks what depends on this host: memory.
pub fn check_host(spec: &VmSpec) -> Result<(), ConfigError> {
    let host = host_memory().unwrap_or(u64::MAX);
    if spec.memory_mib.saturating_mul(MIB) > host {
        return Err(ConfigError::MemoryExceedsHost { asked: spec.memory_mib, host: host / MIB });
    }
    Ok(())
}

/// The kernel image: `probe_image` for the probe, the file (open, its headers read) otherwise.
pub fn open_kernel(kernel: &Kernel, probe_image: &'static [u8]) -> Result<KernelSource<'static>, ConfigError> {
    match kernel {
        Kernel::Probe => Ok(KernelSource::Bytes(probe_image)),
        Kernel::Path(path) => {
            KernelSource::open(path).map_err(|e| ConfigError::Kernel { path: path.clone(), reason: e.to_string() })
        }
    }
}

/// Opens a serial port's sink, line-buffered where it is a file.
pub fn open_serial(output: &SerialOutput) -> Result<Box<dyn Write + Send>, ConfigError> {
    let failed = |path: &Path, reason: String| ConfigError::Serial { path: path.to_path_buf(), reason };
    Ok(match output {
        SerialOutput::Stdout => Box::new(std::io::stdout()),
        SerialOutput::File(path) => {
            Box::new(LineWriter::new(File::create(path).map_err(|e| failed(path, e.to_string()))?))
        }
        SerialOutput::Unix(path) => {
            let is_socket = std::fs::metadata(path).map(|m| m.file_type().is_socket());
            match is_socket {
                Err(e) => return Err(failed(path, e.to_string())),
                Ok(false) => return Err(failed(path, "not a Unix socket".into())),
                Ok(true) => {}
            }
            let stream = UnixStream::connect(path)
                .map_err(|e| failed(path, format!("cannot connect: {e} (is a reader listening?)")))?;
            stream.set_write_timeout(Some(SOCKET_WRITE_TIMEOUT)).map_err(|e| failed(path, e.to_string()))?;
            Box::new(stream)
        }
        SerialOutput::Discard => Box::new(std::io::sink()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_bounds_memory() {
        let ok = VmSpec::new(Kernel::Probe);
        assert_eq!(check_host(&ok), Ok(()));
        let huge = VmSpec { memory_mib: u64::MAX / MIB, ..VmSpec::new(Kernel::Probe) };
        assert!(matches!(check_host(&huge), Err(ConfigError::MemoryExceedsHost { .. })));
    }

    #[test]
    fn unreadable_files_name_their_path() {
        let err = open_kernel(&Kernel::Path("/nonexistent/vmlinux".into()), b"").err().unwrap();
        assert!(err.to_string().starts_with("kernel image /nonexistent/vmlinux: "), "{err}");
        assert!(matches!(open_kernel(&Kernel::Probe, b"ELF").unwrap(), KernelSource::Bytes(b"ELF")));
        let err = open_serial(&SerialOutput::Unix("/nonexistent/agent.sock".into())).err().unwrap();
        assert!(err.to_string().starts_with("serial output /nonexistent/agent.sock: "), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        let err = open_serial(&SerialOutput::Unix(file)).err().unwrap();
        assert!(err.to_string().ends_with("not a Unix socket"), "{err}");
    }

    #[test]
    fn a_unix_socket_output_reaches_its_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut sink = open_serial(&SerialOutput::Unix(path)).unwrap();
        sink.write_all(b"frame\n").unwrap();
        drop(sink);
        let (mut reader, _) = listener.accept().unwrap();
        let mut got = String::new();
        std::io::Read::read_to_string(&mut reader, &mut got).unwrap();
        assert_eq!(got, "frame\n");
    }
}

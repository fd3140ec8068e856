//! Why a step of the jail could not be taken, or a setting of it is not valid.

use std::path::PathBuf;

/// A jail step's failure, or a bad setting.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A system call of the step failed.
    #[error("{call}: {source}")]
    Call {
        /// What the call was for.
        call: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A file of the step (a cgroup's, /proc's) could not be made, read or written.
    #[error("{what} {}: {source}", path.display())]
    File {
        /// What was done with it (`creating`, `writing "0" to`, ...).
        what: String,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The host is not as the step needs it (no cgroup hierarchy, capabilities still held,
    /// no Landlock, a resource limit refused); the message says what.
    #[error("{0}")]
    Host(String),
    /// A setting from the environment is not valid.
    #[error("{name}={value}: {why}")]
    Setting {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        why: crate::SettingError,
    },
}

impl JailError {
    /// The last OS error, as the failure of `call`.
    pub(crate) fn last(call: &'static str) -> JailError {
        JailError::Call { call, source: std::io::Error::last_os_error() }
    }
}

/// `Ok` for a call that returned 0, else the last OS error as `call`'s failure.
pub(crate) fn check(call: &'static str, result: libc::c_int) -> Result<(), JailError> {
    if result == 0 { Ok(()) } else { Err(JailError::last(call)) }
}

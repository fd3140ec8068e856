//! Resource limits, set while the process may still raise them: locked memory sized for VFIO's
//! pinning of the guest's RAM, open files, threads (counted per uid, and the uid is the
//! process's own), and no core dumps (a core would hold the guest's memory).

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::error::JailError;
use crate::{JailSpec, MEMORY_OVERHEAD, OPEN_FILES, THREAD_ALLOWANCE};

/// Sets both limits of `resource` to `value` (`None`: unlimited).
fn set(resource: Resource, value: Option<u64>) -> Result<(), String> {
    setrlimit(resource, Rlimit { current: value, maximum: value }).map_err(|e| {
        let value = value.map_or("unlimited".to_string(), |v| v.to_string());
        format!("{resource:?} {value}: {}", std::io::Error::from(e))
    })
}

/// Applies the limits for `spec`; says what they are. The thread limit counts every process of
/// the uid, so it is set only when the process gets a uid of its own (`own_uid`).
pub(crate) fn apply(spec: &JailSpec, own_uid: bool) -> Result<String, JailError> {
    let mut said = Vec::new();
    let mut failed = Vec::new();
    // A higher limit the starter gave (unlimited for root's VFIO) stays.
    let wanted = spec.memory.saturating_add(MEMORY_OVERHEAD);
    let memlock = getrlimit(Resource::Memlock).current.map(|current| wanted.max(current));
    // Locked memory enables (VFIO's pinning) rather than confines: where the hard limit cannot
    // be raised (no CAP_SYS_RESOURCE), the hard limit it is, and the detail says so.
    let mib = |v: Option<u64>| v.map_or("unlimited".to_string(), |v| format!("{} MiB", v >> 20));
    match set(Resource::Memlock, memlock) {
        Ok(()) => said.push(format!("memlock {}", mib(memlock))),
        Err(_) => {
            let hard = getrlimit(Resource::Memlock).maximum;
            match set(Resource::Memlock, hard) {
                Ok(()) => said.push(format!(
                    "memlock {} (its hard limit: raising it to {} needs CAP_SYS_RESOURCE, so VFIO can pin no more)",
                    mib(hard),
                    mib(memlock)
                )),
                Err(e) => failed.push(e),
            }
        }
    }
    let open_files = getrlimit(Resource::Nofile).maximum.map_or(OPEN_FILES, |hard| OPEN_FILES.min(hard));
    match set(Resource::Nofile, Some(open_files)) {
        Ok(()) => said.push(format!("{open_files} open files")),
        Err(e) => failed.push(e),
    }
    if own_uid {
        let threads = spec.threads + THREAD_ALLOWANCE;
        match set(Resource::Nproc, Some(threads)) {
            Ok(()) => said.push(format!("{threads} threads")),
            Err(e) => failed.push(e),
        }
    }
    match set(Resource::Core, Some(0)) {
        Ok(()) => said.push("no core dumps".to_string()),
        Err(e) => failed.push(e),
    }
    if failed.is_empty() { Ok(said.join(", ")) } else { Err(JailError::Host(failed.join("; "))) }
}

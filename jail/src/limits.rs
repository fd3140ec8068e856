//! Resource limits, set while the process may still raise them: locked memory sized for VFIO's
//! pinning of the guest's RAM, open files, threads (counted per uid, and the uid is the
//! process's own), and no core dumps (a core would hold the guest's memory).

use crate::error::JailError;
use crate::{JailSpec, MEMORY_OVERHEAD, OPEN_FILES, THREAD_ALLOWANCE};

fn set(resource: libc::__rlimit_resource_t, what: &str, value: u64) -> Result<(), String> {
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: setrlimit reads a live rlimit.
    if unsafe { libc::setrlimit(resource, &limit) } == 0 {
        Ok(())
    } else {
        Err(format!("{what} {value}: {}", std::io::Error::last_os_error()))
    }
}

fn get(resource: libc::__rlimit_resource_t) -> libc::rlimit {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes a live rlimit.
    unsafe { libc::getrlimit(resource, &mut limit) };
    limit
}

fn current(resource: libc::__rlimit_resource_t) -> u64 {
    get(resource).rlim_cur
}

fn hard(resource: libc::__rlimit_resource_t) -> u64 {
    get(resource).rlim_max
}

/// Applies the limits for `spec`; says what they are. The thread limit counts every process of
/// the uid, so it is set only when the process gets a uid of its own (`own_uid`).
pub(crate) fn apply(spec: &JailSpec, own_uid: bool) -> Result<String, JailError> {
    let mut said = Vec::new();
    let mut failed = Vec::new();
    // A higher limit the starter gave (unlimited for root's VFIO) stays.
    let memlock = spec.memory.saturating_add(MEMORY_OVERHEAD).max(current(libc::RLIMIT_MEMLOCK));
    // Locked memory enables (VFIO's pinning) rather than confines: where the hard limit cannot
    // be raised (no CAP_SYS_RESOURCE), the hard limit it is, and the detail says so.
    let mib = |v: u64| if v == libc::RLIM_INFINITY { "unlimited".to_string() } else { format!("{} MiB", v >> 20) };
    match set(libc::RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK", memlock) {
        Ok(()) => said.push(format!("memlock {}", mib(memlock))),
        Err(_) => {
            let hard = hard(libc::RLIMIT_MEMLOCK);
            match set(libc::RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK", hard) {
                Ok(()) => said.push(format!(
                    "memlock {} (its hard limit: raising it to {} needs CAP_SYS_RESOURCE, so VFIO can pin no more)",
                    mib(hard),
                    mib(memlock)
                )),
                Err(e) => failed.push(e),
            }
        }
    }
    let open_files = OPEN_FILES.min(hard(libc::RLIMIT_NOFILE));
    match set(libc::RLIMIT_NOFILE, "RLIMIT_NOFILE", open_files) {
        Ok(()) => said.push(format!("{open_files} open files")),
        Err(e) => failed.push(e),
    }
    if own_uid {
        let threads = spec.threads + THREAD_ALLOWANCE;
        match set(libc::RLIMIT_NPROC, "RLIMIT_NPROC", threads) {
            Ok(()) => said.push(format!("{threads} threads")),
            Err(e) => failed.push(e),
        }
    }
    match set(libc::RLIMIT_CORE, "RLIMIT_CORE", 0) {
        Ok(()) => said.push("no core dumps".to_string()),
        Err(e) => failed.push(e),
    }
    if failed.is_empty() { Ok(said.join(", ")) } else { Err(JailError::Host(failed.join("; "))) }
}

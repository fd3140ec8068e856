//! Landlock: a ruleset that handles every filesystem and TCP access right the kernel knows and
//! grants none, and scopes signals and abstract unix sockets to the process's own domain. Best
//! effort over the kernel's Landlock ABI: what the kernel lacks is said, not silently dropped.

use landlock::{ABI, Access, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetStatus, Scope};

use crate::error::JailError;

/// The newest ABI this code knows; older kernels enforce the part they have.
const NEWEST: ABI = ABI::V6;

/// Restricts this thread (and the threads it starts) to no filesystem access at all.
pub(crate) fn deny_everything() -> Result<String, JailError> {
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(NEWEST))
        .and_then(|r| r.handle_access(AccessNet::from_all(NEWEST)))
        .and_then(|r| r.scope(Scope::from_all(NEWEST)))
        .and_then(|r| r.create())
        .and_then(|r| r.restrict_self())
        .map_err(|e| JailError::Host(format!("landlock: {e}")))?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => {
            Ok("no filesystem or TCP access; signals and abstract sockets only within".into())
        }
        RulesetStatus::PartiallyEnforced => {
            Ok("no filesystem access (the kernel's Landlock is older than ABI 6: TCP or scopes not enforced)".into())
        }
        RulesetStatus::NotEnforced => {
            Err(JailError::Host("this kernel has no Landlock (or it is not enabled at boot: lsm=...,landlock)".into()))
        }
    }
}

/// The kernel's Landlock ABI version, if it has Landlock.
pub(crate) fn abi_version() -> Option<i64> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_long = 1;
    // SAFETY: landlock_create_ruleset with a null attribute, size 0 and the VERSION flag only
    // returns a number.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (version > 0).then_some(version)
}

//! Confining a driverlab VMM or device-model process: the jail it puts itself in once it has
//! opened what it needs, so that a guest that breaks out of a device emulation finds nothing to
//! take. Firecracker's jailer is the floor; Landlock is Cloud Hypervisor's addition.
//!
//! Two calls, both while the process has a single thread:
//!
//! 1. [`enter_namespaces`], first thing: new mount, PID, IPC and UTS namespaces. A new PID
//!    namespace takes a fork: the process that was started stays behind as a supervisor that
//!    waits and passes the exit status on, the work goes on in its child (PID 1 inside). It
//!    must come before anything a fork cannot carry (KVM ties a VM to the process that created
//!    it). The supervisor then makes a new network namespace while the child sets up.
//! 2. [`confine`], once every file, device and socket is open: that network namespace joined
//!    (the child's sockets until then are Unix sockets by path), its own cgroup (memory, pids),
//!    rlimits, an empty root (`pivot_root` onto a read-only tmpfs, the host's tree unmounted),
//!    a per-process uid and gid without capabilities, `no_new_privs`, and a Landlock ruleset
//!    that denies every filesystem and TCP access and signals and abstract sockets outside it.
//!
//! Each step the host cannot take (not root, no Landlock, no cgroup to write) is recorded in
//! the [`Confinement`] with its reason, never skipped silently; the seccomp filters come after
//! ([`seccomp`] builds and installs them; each process names what it may call).

mod cgroup;
mod error;
mod identity;
mod limits;
mod namespaces;
mod preflight;
mod root;
mod ruleset;
pub mod seccomp;

pub use error::JailError;
pub use namespaces::{Namespaces, Signals, enter_namespaces, termination_signals};
pub use preflight::{Readiness, preflight};
pub use vm_spec::confinement::Confinement;

/// The first uid (and gid) of the per-process range: a process runs as `UID_BASE` plus its
/// supervisor's host PID, so no two live jailed processes share a uid.
pub const UID_BASE: u32 = 100_000_000;
/// How many uids the range holds: every PID up to Linux's largest `pid_max`.
pub const UID_COUNT: u32 = 1 << 22;
/// The cgroup each jailed process gets one below, under the cgroup it was started in.
pub const CGROUP_PARENT: &str = "driverlab";
/// The environment variable that moves the uid range (`driverlab serve --jail-uid-base` sets it
/// for the VMMs and models it starts).
pub const UID_BASE_ENV: &str = "DRIVERLAB_JAIL_UID_BASE";
/// The environment variable that names the cgroup parent (`driverlab serve
/// --jail-cgroup-parent` sets it).
pub const CGROUP_PARENT_ENV: &str = "DRIVERLAB_JAIL_CGROUP_PARENT";
/// Memory a VMM needs beyond its guest's RAM (its own heap, page tables, device buffers); its
/// cgroup's limit is the guest's RAM plus this.
pub const MEMORY_OVERHEAD: u64 = 256 << 20;
/// Threads a process may start beyond its vCPUs (main, control socket, device threads).
pub const THREAD_ALLOWANCE: u64 = 16;
/// Open files a jailed process may hold.
pub const OPEN_FILES: u64 = 4096;

/// What a process is confined to.
#[derive(Debug, Clone)]
pub struct JailSpec {
    /// A name for its cgroup and hostname (`vm`, `aqc100`).
    pub name: String,
    /// Memory it may lock for DMA pinning and use in all (bytes): the guest's RAM, or a model's
    /// buffers.
    pub memory: u64,
    /// Threads it may run beyond [`THREAD_ALLOWANCE`].
    pub threads: u64,
    /// The CPUs it was given (a VMM: its vCPUs): its CPU time is that many CPUs plus a tenth.
    pub cpus: u32,
    /// The uid range's start ([`UID_BASE`] unless the operator set it).
    pub uid_base: u32,
    /// The cgroup to create its own below ([`CGROUP_PARENT`] unless the operator set it).
    pub cgroup_parent: String,
}

impl JailSpec {
    /// A spec with the default uid range and cgroup parent.
    pub fn new(name: &str, memory: u64, threads: u64, cpus: u32) -> JailSpec {
        JailSpec { name: name.into(), memory, threads, cpus, uid_base: UID_BASE, cgroup_parent: CGROUP_PARENT.into() }
    }

    /// The same, with the uid range and cgroup parent from [`UID_BASE_ENV`] and
    /// [`CGROUP_PARENT_ENV`] where they are set; an invalid value is an error that names it.
    pub fn from_env(name: &str, memory: u64, threads: u64, cpus: u32) -> Result<JailSpec, JailError> {
        let mut spec = JailSpec::new(name, memory, threads, cpus);
        fn setting(name: &'static str, value: &str) -> impl FnOnce(SettingError) -> JailError + use<> {
            let value = value.to_string();
            move |why| JailError::Setting { name, value, why }
        }
        if let Ok(value) = std::env::var(UID_BASE_ENV) {
            spec.uid_base = parse_uid_base(&value).map_err(setting(UID_BASE_ENV, &value))?;
        }
        if let Ok(value) = std::env::var(CGROUP_PARENT_ENV) {
            spec.cgroup_parent = parse_cgroup_parent(&value).map_err(setting(CGROUP_PARENT_ENV, &value))?;
        }
        Ok(spec)
    }
}

/// Why a jail setting is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    /// The uid range's start is no whole number.
    #[error("not a uid (a whole number)")]
    NotAUid,
    /// The uid range would overlap system or login uids, or run past the invalid uid.
    #[error("must be from 65536 to {highest}, so that its {UID_COUNT} uids are nobody else's")]
    UidOutOfRange {
        /// The highest start that fits.
        highest: u32,
    },
    /// The cgroup parent is no relative path of plain names.
    #[error("must be a relative path of plain names (letters, digits, . _ -), e.g. driverlab or lab/ci")]
    CgroupParent,
}

/// Checks a uid range start: at least 65536 (above every system and login uid) and low enough
/// that the whole range ([`UID_COUNT`] uids) fits below the invalid uid 4294967295.
pub fn parse_uid_base(text: &str) -> Result<u32, SettingError> {
    let base: u32 = text.trim().parse().map_err(|_| SettingError::NotAUid)?;
    let highest = u32::MAX - 1 - UID_COUNT;
    if !(65536..=highest).contains(&base) {
        return Err(SettingError::UidOutOfRange { highest });
    }
    Ok(base)
}

/// Checks a cgroup parent: a relative path of plain names (letters, digits, `.`, `_`, `-`),
/// created under the cgroup the process was started in.
pub fn parse_cgroup_parent(text: &str) -> Result<String, SettingError> {
    let plain = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    if text.starts_with('/') || !text.split('/').all(plain) {
        return Err(SettingError::CgroupParent);
    }
    Ok(text.to_string())
}

/// Takes every step of the jail after [`enter_namespaces`] (see the crate's docs), recording
/// each in `confinement`. The process must still have a single thread: threads started later
/// inherit the jail, threads started before would escape it.
pub fn confine(spec: &JailSpec, namespaces: &Namespaces, confinement: &mut Confinement) {
    namespaces::join_network(namespaces, confinement);
    let threads = namespaces::thread_count();
    if threads != 1 {
        for step in &vm_spec::confinement::STEPS[1..] {
            confinement.missed(step, format!("the process already runs {threads} threads"));
        }
        return;
    }
    let root_user = identity::is_root();
    let id = spec.uid_base.saturating_add(namespaces.supervisor_pid % UID_COUNT);
    let joined = match &namespaces.cgroup {
        Some(started_in) => Ok((started_in.clone(), " (started in it)")),
        None => cgroup::join(spec, namespaces.supervisor_pid).map(|joined| (joined, "")),
    };
    match joined {
        Ok((joined, how)) => {
            confinement.done("cgroup", format!("{}{how}", joined.describe()));
            confinement.cgroup = Some(joined.path);
        }
        Err(e) => confinement.missed("cgroup", e.to_string()),
    }
    match limits::apply(spec, root_user) {
        Ok(detail) => confinement.done("rlimits", detail),
        Err(e) => confinement.missed("rlimits", e.to_string()),
    }
    if namespaces.entered {
        match root::pivot_to_empty_root(&spec.name) {
            Ok(how) => confinement.done("root", how),
            Err(e) => confinement.missed("root", e.to_string()),
        }
    } else {
        confinement.missed("root", "no mount namespace of its own (see namespaces)");
    }
    if root_user {
        let dropped = identity::drop_to(id);
        // Any change of credentials clears the death signal: set it again.
        namespaces::rearm_death_signal(namespaces);
        match dropped {
            Ok(()) => {
                confinement.done("identity", format!("uid and gid {id}, no supplementary groups, no capabilities"));
                confinement.uid = Some(id);
            }
            Err(e) => confinement.missed("identity", e.to_string()),
        }
    } else {
        confinement.missed("identity", "not root: it keeps the uid it was started with");
    }
    match identity::no_new_privs() {
        Ok(()) => confinement.done("no_new_privs", "set"),
        Err(e) => confinement.missed("no_new_privs", e.to_string()),
    }
    match ruleset::deny_everything() {
        Ok(detail) => confinement.done("landlock", detail),
        Err(e) => confinement.missed("landlock", e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_settings_are_checked() {
        assert_eq!(parse_uid_base("200000000"), Ok(200_000_000));
        assert!(parse_uid_base("1000").unwrap_err().to_string().contains("from 65536"));
        assert!(parse_uid_base("4294967000").is_err(), "the range would pass 4294967295");
        assert!(parse_uid_base("x").is_err());
        assert_eq!(parse_cgroup_parent("lab/ci-1").as_deref(), Ok("lab/ci-1"));
        for bad in ["/abs", "a/../b", "", "a//b", "sp ace", "."] {
            assert!(parse_cgroup_parent(bad).is_err(), "{bad:?}");
        }
    }
}

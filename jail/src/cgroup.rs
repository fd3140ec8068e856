//! A cgroup of the process's own, under the cgroup it was started in: a memory limit (the
//! guest's RAM plus [`crate::MEMORY_OVERHEAD`]), a pids limit, and CPU time for the CPUs it was
//! given plus a tenth of one for its other threads. cgroup v2 where the host has it, the v1
//! `memory`, `pids` and `cpu` hierarchies otherwise. Cgroups that jailed processes left
//! behind empty are removed when the next one is made.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::JailError;
use crate::{JailSpec, MEMORY_OVERHEAD, THREAD_ALLOWANCE};

const ROOT: &str = "/sys/fs/cgroup";

/// The cgroup a process joined.
#[derive(Debug, Clone)]
pub(crate) struct Joined {
    /// Its path below the hierarchy's root (v1: the memory hierarchy's).
    pub path: String,
    memory: u64,
    pids: u64,
    /// CPU time per [`CPU_PERIOD_US`], µs.
    cpu_quota: u64,
    version: Version,
}

/// The CFS period the CPU quota is given over, µs.
const CPU_PERIOD_US: u64 = 100_000;

impl Joined {
    pub(crate) fn describe(&self) -> String {
        format!(
            "cgroup v{} {}: memory {} MiB, {} pids, {:.1} CPUs",
            self.version.number(),
            self.path,
            self.memory >> 20,
            self.pids,
            self.cpu_quota as f64 / CPU_PERIOD_US as f64
        )
    }
}

fn write(path: &Path, value: &str) -> Result<(), JailError> {
    std::fs::write(path, value).map_err(|source| JailError::File {
        what: format!("writing {value:?} to"),
        path: path.to_path_buf(),
        source,
    })
}

fn create(dir: &Path) -> Result<(), JailError> {
    std::fs::create_dir_all(dir).map_err(|source| JailError::File {
        what: "creating".into(),
        path: dir.to_path_buf(),
        source,
    })
}

/// The process's cgroup in the hierarchy of `controller` (v1), or in the unified one (`None`).
fn own_cgroup(controller: Option<&str>) -> Result<String, JailError> {
    let path = "/proc/self/cgroup";
    let text = std::fs::read_to_string(path).map_err(|source| JailError::File {
        what: "reading".into(),
        path: path.into(),
        source,
    })?;
    cgroup_of(&text, controller)
}

/// The cgroup `/proc/PID/cgroup` (`text`) names for `controller` (v1) or the unified hierarchy.
fn cgroup_of(text: &str, controller: Option<&str>) -> Result<String, JailError> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let wanted = match controller {
                None => controllers.is_empty(),
                Some(c) => controllers.split(',').any(|x| x == c),
            };
            wanted.then(|| path.to_string())
        })
        .next()
        .ok_or_else(|| {
            JailError::Host(format!("/proc/self/cgroup names no {} hierarchy", controller.unwrap_or("unified")))
        })
}

/// Removes the empty cgroups earlier processes of `prefix` left in `parent`.
fn sweep(parent: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            // Fails (EBUSY) for a cgroup that still has processes: it stays.
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// Makes cgroup `KIND-PID` in `parent`, removing the empty ones of the same kind.
fn make(parent: &Path, kind: &str, pid: u32) -> Result<PathBuf, JailError> {
    create(parent)?;
    sweep(parent, &format!("{kind}-"));
    let dir = parent.join(format!("{kind}-{pid}"));
    match std::fs::create_dir(&dir) {
        Ok(()) => Ok(dir),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(dir),
        Err(source) => Err(JailError::File { what: "creating".into(), path: dir, source }),
    }
}

/// The cgroup hierarchies a host has: the unified one (v2) or the v1 ones, a hierarchy per
/// controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

impl Version {
    /// This host's: v2 where /sys/fs/cgroup is the unified hierarchy.
    fn of_host() -> Version {
        if Path::new(ROOT).join("cgroup.controllers").exists() { Version::V2 } else { Version::V1 }
    }

    /// The file a process writes `0` into to join a cgroup.
    ///
    /// v2: `cgroup.procs`. v1: `tasks`, which moves the writing thread alone: the jail's
    /// process has one thread then, so that moves the process, and the kernel skips the cgroup
    /// threadgroup rwsem that moving a whole process takes for writing, whose writer waits for
    /// an RCU grace period (`cgroup_procs_write_start()` takes it only for a pid other than 0 or
    /// a whole thread group, kernel/cgroup/cgroup.c): 0.3 ms a move here against 5 to 15 ms
    /// (docs/benchmarks.md).
    fn member_file(self) -> &'static str {
        match self {
            Version::V1 => "tasks",
            Version::V2 => "cgroup.procs",
        }
    }

    fn number(self) -> u8 {
        match self {
            Version::V1 => 1,
            Version::V2 => 2,
        }
    }
}

/// Makes cgroup `KIND-PID` in `parent` (see [`make`]), writes `limits` (file, value) into it and
/// moves this single-threaded process in through `member` ([`Version::member_file`]). Another process's
/// sweep may remove the new cgroup while it is still empty, between its creation and the move:
/// then it is made again (a few times at most).
fn make_and_enter(
    parent: &Path,
    kind: &str,
    pid: u32,
    limits: &[(&str, String)],
    member: &str,
) -> Result<(), JailError> {
    const ATTEMPTS: usize = 4;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let dir = make(parent, kind, pid)?;
        let result = limits
            .iter()
            .try_for_each(|(file, value)| write(&dir.join(file), value))
            .and_then(|()| write(&dir.join(member), "0"));
        match result {
            Err(_) if attempt < ATTEMPTS && !dir.exists() => continue,
            other => return other,
        }
    }
}

/// How long the jail's way into a cgroup takes on this host (`driverlab doctor`), in a cgroup
/// of its own below [`crate::CGROUP_PARENT`] (in the unified hierarchy, else the v1 memory one),
/// removed after: v2, a child started in it (`clone3`, as the jail's supervisor starts its
/// child) or, where the kernel refuses that, a child that sleeps moved in through
/// `cgroup.procs`; v1, a thread of this process that moves itself through `tasks` (as the
/// jail's process does) and ends.
pub(crate) fn time_a_move() -> Result<Duration, JailError> {
    let version = Version::of_host();
    let (hierarchy, controller) = match version {
        Version::V2 => (PathBuf::from(ROOT), None),
        Version::V1 => (Path::new(ROOT).join("memory"), Some("memory")),
    };
    let own = own_cgroup(controller)?;
    let parent = hierarchy.join(own.trim_start_matches('/')).join(crate::CGROUP_PARENT);
    match version {
        Version::V2 => time_starting_a_child_in(&parent).unwrap_or_else(|| time_moving_a_child(&parent)),
        Version::V1 => time_moving_a_thread(&parent),
    }
}

/// Times starting a child (which exits at once) in a new cgroup in `parent`; `None` where the
/// kernel refuses the clone or the cgroup cannot be made.
fn time_starting_a_child_in(parent: &Path) -> Option<Result<Duration, JailError>> {
    let dir = make(parent, "doctor", std::process::id()).ok()?;
    let opened: std::os::fd::OwnedFd = std::fs::File::open(&dir).ok()?.into();
    let started = Instant::now();
    let child = crate::namespaces::clone_into_cgroup(&opened);
    if child == 0 {
        // SAFETY: _exit(2) ends the child at once, running nothing of its copy of this process.
        unsafe { libc::_exit(0) };
    }
    let took = started.elapsed();
    if child > 0 {
        let mut status = 0;
        // SAFETY: waitpid writes into a live integer.
        unsafe { libc::waitpid(child, &mut status, 0) };
    }
    drop(opened);
    remove_when_empty(&dir);
    (child > 0).then_some(Ok(took))
}

/// Times moving a child process into a new cgroup in `parent` by its pid.
fn time_moving_a_child(parent: &Path) -> Result<Duration, JailError> {
    let mut child = std::process::Command::new("sleep")
        .arg("10")
        .spawn()
        .map_err(|e| JailError::Host(format!("starting `sleep` to move: {e}")))?;
    let timed = make(parent, "doctor", child.id()).and_then(|dir| {
        let started = Instant::now();
        let moved = write(&dir.join("cgroup.procs"), &child.id().to_string());
        let took = started.elapsed();
        let _ = child.kill();
        let _ = child.wait();
        remove_when_empty(&dir);
        moved.map(|()| took)
    });
    let _ = child.kill();
    let _ = child.wait();
    timed
}

/// Times a thread of this process moving itself into a new v1 cgroup in `parent`.
fn time_moving_a_thread(parent: &Path) -> Result<Duration, JailError> {
    let dir = make(parent, "doctor", std::process::id())?;
    let tasks = dir.join(Version::V1.member_file());
    let moved = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let started = Instant::now();
                write(&tasks, "0").map(|()| started.elapsed())
            })
            .join()
    });
    remove_when_empty(&dir);
    moved.map_err(|_| JailError::Host("the thread timing a move panicked".into()))?
}

/// Removes cgroup `dir` once the process or thread moved in has left it (an ended task leaves
/// its cgroup a moment after its waiter sees it end); gives up after a second.
fn remove_when_empty(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A v2 cgroup made for a child not yet started, with its limits: the child is started in it
/// (`clone3` with `CLONE_INTO_CGROUP`, [`crate::namespaces`]), so that no process is moved: a
/// move into a v2 cgroup takes the cgroup threadgroup rwsem for writing, whose writer waits for
/// an RCU grace period unless the host mounted cgroup2 with `favordynmods`
/// (`cgroup_attach_lock()`, kernel/cgroup/cgroup.c), where a child forked into a cgroup only
/// reads it (`cgroup_css_set_fork()`).
pub(crate) struct ForChild {
    /// The cgroup's directory, open: `clone3` takes it.
    pub dir: std::os::fd::OwnedFd,
    /// What the child will have joined.
    pub joined: Joined,
}

/// The limits of a jailed process's cgroup: memory (bytes), pids, CPU time per
/// [`CPU_PERIOD_US`] (µs).
fn limits(spec: &JailSpec) -> (u64, u64, u64) {
    let memory = spec.memory.saturating_add(MEMORY_OVERHEAD);
    let pids = spec.threads + THREAD_ALLOWANCE;
    let cpu_quota = spec.cpus as u64 * CPU_PERIOD_US + CPU_PERIOD_US / 10;
    (memory, pids, cpu_quota)
}

/// On a cgroup v2 host, makes the cgroup of the process `supervisor_pid` is about to start (see
/// [`ForChild`]); `None` on a v1 host, where the process joins its cgroups itself ([`join`]).
pub(crate) fn make_for_child(spec: &JailSpec, supervisor_pid: u32) -> Result<Option<ForChild>, JailError> {
    if Version::of_host() != Version::V2 {
        return Ok(None);
    }
    let plan = v2_plan(spec, supervisor_pid)?;
    let dir = make(&plan.parent, &spec.name, supervisor_pid)?;
    plan.limits.iter().try_for_each(|(file, value)| write(&dir.join(file), value))?;
    let opened =
        std::fs::File::open(&dir).map_err(|source| JailError::File { what: "opening".into(), path: dir, source })?;
    Ok(Some(ForChild { dir: opened.into(), joined: plan.joined }))
}

/// A jailed process's v2 cgroup, before it is made.
struct V2Plan {
    /// Where it goes, the controllers on for its children.
    parent: PathBuf,
    /// What the process will have joined.
    joined: Joined,
    /// The files to write in it, and what.
    limits: [(&'static str, String); 3],
}

/// Plans a jailed process's v2 cgroup, turning the controllers on in its parent on the way.
fn v2_plan(spec: &JailSpec, supervisor_pid: u32) -> Result<V2Plan, JailError> {
    let (memory, pids, cpu_quota) = limits(spec);
    let own = own_cgroup(None)?;
    let own_dir = Path::new(ROOT).join(own.trim_start_matches('/'));
    let parent = own_dir.join(&spec.cgroup_parent);
    // The controllers must be on for the children of the process's cgroup and of the parent.
    for dir in [&own_dir, &parent] {
        create(dir)?;
        write(&dir.join("cgroup.subtree_control"), "+memory +pids +cpu").map_err(|e| {
            JailError::Host(format!(
                "{e} (a cgroup with processes cannot give its children controllers: start driverlab in a \
                 delegated cgroup)"
            ))
        })?;
    }
    let limits = [
        ("memory.max", memory.to_string()),
        ("pids.max", pids.to_string()),
        ("cpu.max", format!("{cpu_quota} {CPU_PERIOD_US}")),
    ];
    let path = format!("{}/{}/{}-{supervisor_pid}", own.trim_end_matches('/'), spec.cgroup_parent, spec.name);
    Ok(V2Plan { parent, joined: Joined { path, memory, pids, cpu_quota, version: Version::V2 }, limits })
}

/// Makes the process's cgroup and moves it there.
pub(crate) fn join(spec: &JailSpec, supervisor_pid: u32) -> Result<Joined, JailError> {
    let (memory, pids, cpu_quota) = limits(spec);
    let name = format!("{}-{supervisor_pid}", spec.name);
    let root = Path::new(ROOT);
    if Version::of_host() == Version::V2 {
        let plan = v2_plan(spec, supervisor_pid)?;
        make_and_enter(&plan.parent, &spec.name, supervisor_pid, &plan.limits, Version::V2.member_file())?;
        return Ok(plan.joined);
    }
    let mut path = String::new();
    let limits = [
        ("memory", "memory.limit_in_bytes", memory),
        ("pids", "pids.max", pids),
        ("cpu", "cpu.cfs_quota_us", cpu_quota),
    ];
    for (controller, limit, value) in limits {
        let hierarchy = root.join(controller);
        if !hierarchy.is_dir() {
            return Err(JailError::Host(format!(
                "no cgroup v2 at {ROOT} and no v1 {controller} hierarchy at {}",
                hierarchy.display()
            )));
        }
        let own = own_cgroup(Some(controller))?;
        let parent = hierarchy.join(own.trim_start_matches('/')).join(&spec.cgroup_parent);
        make_and_enter(&parent, &spec.name, supervisor_pid, &[(limit, value.to_string())], Version::V1.member_file())?;
        // The memory hierarchy's path is the one reported (the pids one may sit elsewhere).
        if path.is_empty() {
            path = format!("{}/{}/{name}", own.trim_end_matches('/'), spec.cgroup_parent);
        }
    }
    Ok(Joined { path, memory, pids, cpu_quota, version: Version::V1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_cgroup_is_read_per_hierarchy() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/84b9\n8:pids:/\n0::/\n";
        assert_eq!(cgroup_of(v1, Some("memory")).unwrap(), "/process_api/84b9");
        assert_eq!(cgroup_of(v1, Some("pids")).unwrap(), "/");
        assert_eq!(cgroup_of(v1, None).unwrap(), "/");
        assert_eq!(cgroup_of("3:cpu,cpuacct:/a\n", Some("cpuacct")).unwrap(), "/a");
        assert!(cgroup_of("4:memory:/x\n", Some("pids")).unwrap_err().to_string().contains("no pids hierarchy"));
    }

    #[test]
    fn empty_cgroups_of_the_kind_are_swept_and_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["vm-1", "vm-2", "aqc100-3"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        std::fs::write(dir.path().join("vm-2").join("cgroup.procs"), "7\n").unwrap();
        let made = make(dir.path(), "vm", 9).unwrap();
        assert_eq!(made, dir.path().join("vm-9"));
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        // vm-2 is not empty here (a real cgroup with processes refuses rmdir the same way).
        assert_eq!(left, ["aqc100-3", "vm-2", "vm-9"]);
    }

    #[test]
    fn a_cgroup_gets_its_limits_then_the_process() {
        let dir = tempfile::tempdir().unwrap();
        make_and_enter(dir.path(), "vm", 9, &[("pids.max", "17".into())], Version::V2.member_file()).unwrap();
        let made = dir.path().join("vm-9");
        assert_eq!(std::fs::read_to_string(made.join("pids.max")).unwrap(), "17");
        assert_eq!(std::fs::read_to_string(made.join("cgroup.procs")).unwrap(), "0");
        // v1: the thread moves itself through `tasks` (the quick path for one thread).
        make_and_enter(dir.path(), "model", 9, &[], Version::V1.member_file()).unwrap();
        let made = dir.path().join("model-9");
        assert_eq!(std::fs::read_to_string(made.join("tasks")).unwrap(), "0");
        assert!(!made.join("cgroup.procs").exists());
        // A parent that cannot be made is an error that names it, not a loop.
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let err = make_and_enter(&file.join("sub"), "vm", 9, &[], Version::V2.member_file()).unwrap_err().to_string();
        assert!(err.contains("creating"), "{err}");
    }
}

//! New mount, PID, IPC, UTS and network namespaces, and the supervisor a new PID namespace
//! needs: the process that was started forks, its child goes on as PID 1 of the new namespace,
//! and it waits for that child and leaves with the child's status. A new network namespace is
//! the dearest of them (about 0.6 ms, the kernel's per-namespace set-up of every network
//! subsystem): the supervisor, idle otherwise, makes it while its child sets up, and the child
//! joins it when [`crate::confine`] starts ([`join_network`]); each jailed process still has one
//! of its own, shared with its supervisor alone.

use std::io::{Read, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use rustix::process::{PidfdFlags, getpid, pidfd_open};
use rustix::thread::{ThreadNameSpaceType, move_into_thread_name_spaces};

use vm_spec::confinement::Confinement;

use crate::JailSpec;
use crate::cgroup::{ForChild, Joined};

/// What [`enter_namespaces`] did.
#[derive(Debug, Clone)]
pub struct Namespaces {
    /// Whether the process is in namespaces of its own.
    pub entered: bool,
    /// The host PID of the process that was started (the supervisor, or the process itself
    /// when no namespaces were entered): what its starter knows and may signal.
    pub supervisor_pid: u32,
    /// The read end of a pipe whose write end only the supervisor holds: it reads end-of-file
    /// (POLLHUP) once the supervisor is gone.
    supervisor_pipe: Option<i32>,
    /// The cgroup the process was started in (a cgroup v2 host), so [`crate::confine`] need
    /// not move it into one.
    pub(crate) cgroup: Option<Joined>,
    /// The network namespace still to join, until [`join_network`] settles it.
    network: Arc<Mutex<Network>>,
}

/// Where a jailed process's network namespace stands.
#[derive(Debug, Default)]
enum Network {
    /// To join the one its supervisor makes, through the supervisor's pidfd; without one (no
    /// pidfd, Linux before 5.8), to make its own.
    ToJoin(Option<OwnedFd>),
    /// Joined or made, or no namespaces entered: nothing left to do.
    #[default]
    Settled,
}

/// The byte the supervisor writes after the child's PID: whether it made the network namespace
/// the child is to join.
const NETWORK_MADE: u8 = 1;

/// How many threads this process runs.
pub(crate) fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

fn last_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// A file the supervisor removes once its child has ended (the child, jailed, cannot): the
/// control socket. It is removed only if the child made it: a file that was there before and is
/// still the same (another VMM's live socket) stays.
struct Cleanup {
    path: PathBuf,
    before: Option<(u64, u64)>,
}

impl Cleanup {
    fn note(path: &Path) -> Cleanup {
        Cleanup { path: path.to_path_buf(), before: identity(path) }
    }

    fn run(&self) {
        if let Some(now) = identity(&self.path)
            && Some(now) != self.before
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// What the supervisor does for its child besides waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signals {
    /// SIGTERM and SIGINT end the supervisor, and so the child (its death signal): a VMM.
    EndBoth,
    /// The supervisor passes SIGTERM and SIGINT on to the child, which waits for them (blocked,
    /// with `sigwait`) to report and exit: a device model. They are blocked from before the
    /// fork, so none is lost (PID 1 of a namespace drops signals it does not handle).
    Forward,
}

/// The child the supervisor passes signals on to.
static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(signal: libc::c_int) {
    let child = CHILD.load(Ordering::Relaxed);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe; the child is the supervisor's own.
        unsafe { libc::kill(child, signal) };
    }
}

/// SIGINT and SIGTERM, the signals that end a process on request.
pub fn termination_signals() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is valid for sigemptyset, which initialises it; sigaddset only
    // writes it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Enters new namespaces, recording the step in `confinement`. Must be called while the
/// process has one thread, before it opens KVM. Returns in the child (PID 1 of the new PID
/// namespace, its host PID in `confinement.host_pid`; on a cgroup v2 host started in the cgroup
/// `jail` gives it); the supervisor never returns: it waits, handles `signals`, removes each of
/// `remove_after` the child made, and exits with the child's status (or dies of its signal).
/// Not root, or not single-threaded: nothing is entered and the step says why.
pub fn enter_namespaces(
    confinement: &mut Confinement,
    remove_after: &[&Path],
    signals: Signals,
    jail: &JailSpec,
) -> Namespaces {
    let supervisor_pid = std::process::id();
    let stay = |confinement: &mut Confinement, why: String| {
        confinement.missed("namespaces", why);
        confinement.host_pid = Some(supervisor_pid);
        Namespaces { entered: false, supervisor_pid, supervisor_pipe: None, cgroup: None, network: Arc::default() }
    };
    let threads = thread_count();
    if threads != 1 {
        return stay(confinement, format!("the process already runs {threads} threads"));
    }
    // SAFETY: unshare(2) with a namespace flag only changes this (single-threaded) process;
    // the new PID namespace is its children's.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        let e = std::io::Error::last_os_error();
        let why = if e.raw_os_error() == Some(libc::EPERM) {
            "not root: new namespaces need CAP_SYS_ADMIN".to_string()
        } else {
            format!("unshare: {e}")
        };
        return stay(confinement, why);
    }
    let cleanup: Vec<Cleanup> = remove_after.iter().map(|p| Cleanup::note(p)).collect();
    let terminations = termination_signals();
    if signals == Signals::Forward {
        // SAFETY: sets this (single) thread's mask from a valid set.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &terminations, std::ptr::null_mut()) };
    }
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return stay(confinement, last_error("pipe2"));
    }
    // SAFETY: both descriptors are fresh and owned here alone.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A cgroup that cannot be made here is made (or its failure recorded) by `confine`.
    let for_child = crate::cgroup::make_for_child(jail, supervisor_pid).ok().flatten();
    // The child joins the network namespace the supervisor makes through this (Linux 5.8);
    // without it, the child makes its own.
    let supervisor = pidfd_open(getpid(), PidfdFlags::empty()).ok();
    let (child, cgroup) = start_child(for_child);
    if child < 0 {
        return stay(confinement, last_error("fork"));
    }
    if child > 0 {
        drop(read_end);
        let mut pipe = std::fs::File::from(write_end);
        let _ = pipe.write_all(&(child as u32).to_le_bytes());
        let made = supervisor.is_some() && make_network_namespace();
        let _ = pipe.write_all(&[u8::from(made)]);
        // The write end stays open until the supervisor exits: the child's sign it is alive.
        std::mem::forget(pipe);
        if signals == Signals::Forward {
            CHILD.store(child, Ordering::Relaxed);
            // SAFETY: installs a handler that only calls kill(2), then unblocks the signals
            // for the supervisor (the child keeps them blocked).
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = forward as extern "C" fn(libc::c_int) as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut());
                libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &terminations, std::ptr::null_mut());
            }
        }
        supervise(child, cleanup);
    }
    drop(write_end);
    // The child dies with its supervisor: whoever started the process may kill it.
    // SAFETY: prctl with an integer argument.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let mut pid = [0u8; 4];
    let mut pipe = std::fs::File::from(read_end);
    let host_pid = match pipe.read_exact(&mut pid) {
        Ok(()) => u32::from_le_bytes(pid),
        // The supervisor died before it could say: the death signal is on its way.
        Err(_) => std::process::exit(1),
    };
    // Kept open for the life of the process (see `rearm_death_signal`).
    let pipe_fd = std::os::fd::IntoRawFd::into_raw_fd(pipe);
    confinement.host_pid = Some(host_pid);
    let flags = libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    // SAFETY: as above, for the child alone.
    if unsafe { libc::unshare(flags) } != 0 {
        confinement.missed("namespaces", last_error("a pid namespace, but unshare of mount, ipc and uts"));
        return Namespaces { entered: false, supervisor_pid, supervisor_pipe: None, cgroup, network: Arc::default() };
    }
    let hostname = b"driverlab";
    // SAFETY: sethostname reads `hostname.len()` bytes of a live buffer; it changes only the
    // new UTS namespace.
    unsafe { libc::sethostname(hostname.as_ptr().cast(), hostname.len()) };
    let network = Arc::new(Mutex::new(Network::ToJoin(supervisor)));
    Namespaces { entered: true, supervisor_pid, supervisor_pipe: Some(pipe_fd), cgroup, network }
}

/// The supervisor's half: a new network namespace for itself, which its child joins. Whether
/// it was made.
fn make_network_namespace() -> bool {
    // SAFETY: unshare(2) with a namespace flag changes only this (single-threaded) process.
    unsafe { libc::unshare(libc::CLONE_NEWNET) == 0 }
}

/// The child's half, first thing in [`crate::confine`]: joins the network namespace its
/// supervisor made meanwhile (waiting for the supervisor's word that it did), or makes one of
/// its own where the supervisor could not; then records the namespaces step. Only the calling
/// thread moves: call it while the process has one thread, as `confine` does. Does nothing the
/// second time, or where no namespaces were entered.
pub(crate) fn join_network(namespaces: &Namespaces, confinement: &mut Confinement) {
    let network = std::mem::take(&mut *namespaces.network.lock().unwrap_or_else(|e| e.into_inner()));
    let Network::ToJoin(supervisor) = network else { return };
    let (Some(pipe), true) = (namespaces.supervisor_pipe, namespaces.entered) else { return };
    let mut word = [0u8];
    // SAFETY: read(2) of one byte into a live buffer, from the pipe kept open for the life of
    // the process.
    if unsafe { libc::read(pipe, word.as_mut_ptr().cast(), 1) } != 1 {
        // The supervisor died before it said: the death signal is on its way.
        std::process::exit(1);
    }
    let joined = match supervisor {
        Some(fd) if word[0] == NETWORK_MADE => {
            move_into_thread_name_spaces(fd.as_fd(), ThreadNameSpaceType::NETWORK).is_ok()
        }
        _ => false,
    };
    // SAFETY: as in `enter_namespaces`, for this thread alone.
    if !joined && unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        confinement.missed("namespaces", last_error("mount, pid, ipc and uts of its own, but unshare of net"));
        return;
    }
    confinement.done("namespaces", "mount, pid, ipc, uts and net of its own (no network at all)");
}

/// Forks (the process has a single thread, so the child is a complete copy of it); with `into`,
/// the child starts in that cgroup (`clone3` with `CLONE_INTO_CGROUP`, Linux 5.7), and is given
/// what it joined. Where the kernel refuses that (older, or the cgroup swept away meanwhile by
/// another process), a plain fork: the child joins its cgroup itself later.
fn start_child(into: Option<ForChild>) -> (libc::pid_t, Option<Joined>) {
    if let Some(cgroup) = into {
        let child = clone_into_cgroup(&cgroup.dir);
        if child >= 0 {
            return (child, (child == 0).then_some(cgroup.joined));
        }
    }
    // SAFETY: the process has a single thread, so the child is a complete copy of it.
    (unsafe { libc::fork() }, None)
}

/// `clone3(2)`'s arguments (`struct clone_args`, include/uapi/linux/sched.h, up to `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_INTO_CGROUP` (include/uapi/linux/sched.h; not in the libc crate).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// A fork whose child starts in the cgroup `dir`: the child's pid in the parent, 0 in the
/// child, -1 on failure. A raw `clone3` runs none of glibc's fork handlers: its cached thread
/// ID stays the parent's in the child. glibc's `raise()` (an abort's) asks the kernel for the
/// thread ID instead, so that it works after `vfork` (`__pthread_kill_implementation()`,
/// nptl/pthread_kill.c); Rust's std locks with futexes of its own,
/// not glibc's owner-checked mutexes; threads the child starts get their own.
pub(crate) fn clone_into_cgroup(dir: &std::os::fd::OwnedFd) -> libc::pid_t {
    use std::os::fd::AsRawFd;
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM or a stack of its own is a fork: the child gets a copy of
    // the address space and goes on from this call; the process has a single thread, so the
    // copy is complete. `args` is live and its size is the one given.
    unsafe {
        libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) as libc::pid_t
    }
}

/// Sets the death signal again: a change of credentials (the jail's uid) clears it, and the
/// jailed process must not outlive its supervisor (whoever started it kills that one). If the
/// supervisor is already gone, the process ends here.
pub(crate) fn rearm_death_signal(namespaces: &Namespaces) {
    let Some(fd) = namespaces.supervisor_pipe else { return };
    // SAFETY: prctl with integer arguments; poll reads one live pollfd; kill targets this
    // process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        let mut pollfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        if libc::poll(&mut pollfd, 1, 0) > 0 && pollfd.revents & (libc::POLLHUP | libc::POLLIN) != 0 {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// The supervisor: waits for `child`, cleans up after it, and leaves as it did. Signals that
/// end the supervisor (the starter's SIGTERM, a terminal's SIGINT) end the child too, by its
/// death signal.
fn supervise(child: libc::pid_t, cleanup: Vec<Cleanup>) -> ! {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into a live integer.
        let waited = unsafe { libc::waitpid(child, &mut status, 0) };
        if waited == child {
            for file in &cleanup {
                file.run();
            }
            if libc::WIFEXITED(status) {
                std::process::exit(libc::WEXITSTATUS(status));
            }
            if libc::WIFSIGNALED(status) {
                let signal = libc::WTERMSIG(status);
                // SAFETY: back to the default action, then the same signal to this process,
                // so that the starter sees the child's death as it would have without a jail.
                unsafe {
                    libc::signal(signal, libc::SIG_DFL);
                    libc::kill(libc::getpid(), signal);
                }
                std::process::exit(128 + signal);
            }
        } else if waited < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this process's cgroup in the unified hierarchy, read in a child with only
    /// async-signal-safe calls (the test harness runs threads), is `want` (`0::/want\n`).
    fn child_is_in(want: &[u8]) -> bool {
        let mut text = [0u8; 4096];
        // SAFETY: open(2) of a NUL-terminated path, read(2) into a live stack buffer of the
        // length given, close(2) of the descriptor opened here.
        let n = unsafe {
            let fd = libc::open(c"/proc/self/cgroup".as_ptr(), libc::O_RDONLY);
            let n = libc::read(fd, text.as_mut_ptr().cast(), text.len());
            libc::close(fd);
            n
        };
        let text = &text[..n.max(0) as usize];
        text.split(|&b| b == b'\n').any(|line| line.strip_prefix(b"0::").is_some_and(|path| path == want))
    }

    fn net_of(pid: &str) -> std::path::PathBuf {
        std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap()
    }

    /// Runs [`join_network`] in a forked child, as a jailed process's first step of `confine`:
    /// its supervisor (`supervisor`, a pidfd) said `word`. The child's network namespace, or
    /// `None` if it did not record the namespaces step as taken.
    fn joined_in_child(supervisor: Option<OwnedFd>, word: u8) -> Option<std::path::PathBuf> {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) writes two descriptors into the array; write(2) reads one byte of a
        // live buffer.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            assert_eq!(libc::write(fds[1], [word].as_ptr().cast(), 1), 1);
        }
        let mut report = [0; 2];
        // SAFETY: as above.
        assert_eq!(unsafe { libc::pipe(report.as_mut_ptr()) }, 0);
        let network = Arc::new(Mutex::new(Network::ToJoin(supervisor)));
        let namespaces =
            Namespaces { entered: true, supervisor_pid: 0, supervisor_pipe: Some(fds[0]), cgroup: None, network };
        // SAFETY: glibc's fork(2) leaves malloc usable in the child; the child touches no lock
        // another thread of the harness could hold (no output) and ends with _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let mut confinement = Confinement::default();
            join_network(&namespaces, &mut confinement);
            join_network(&namespaces, &mut confinement);
            let taken = confinement.steps.len() == 1 && confinement.steps[0].done;
            let net = if taken { net_of("self").into_os_string().into_encoded_bytes() } else { Vec::new() };
            // SAFETY: write(2) of a live buffer; _exit(2) ends the child without the parent's
            // destructors.
            unsafe {
                libc::write(report[1], net.as_ptr().cast(), net.len());
                libc::_exit(0);
            }
        }
        assert!(child > 0, "fork: {}", std::io::Error::last_os_error());
        let mut status = 0;
        // SAFETY: waitpid writes into a live integer; close(2) of the descriptors made here.
        unsafe {
            assert_eq!(libc::waitpid(child, &mut status, 0), child);
            for fd in [fds[0], fds[1], report[1]] {
                libc::close(fd);
            }
        }
        // SAFETY: the read end is this function's alone.
        let mut said = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(report[0]) });
        let mut net = Vec::new();
        said.read_to_end(&mut net).unwrap();
        (!net.is_empty()).then(|| std::path::PathBuf::from(String::from_utf8(net).unwrap()))
    }

    #[test]
    fn a_jailed_child_joins_its_supervisors_new_network_namespace_or_makes_its_own() {
        let test = "a_jailed_child_joins_its_supervisors_new_network_namespace_or_makes_its_own";
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            testkit::skip(test, testkit::Lacks::Setup, "not root: a new network namespace needs CAP_SYS_ADMIN");
            return;
        }
        let host = net_of("self");
        // A supervisor: makes its network namespace, then waits to be killed.
        let mut ready = [0; 2];
        // SAFETY: as in `joined_in_child`.
        assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
        // SAFETY: as in `joined_in_child`; the child makes only system calls.
        let supervisor = unsafe { libc::fork() };
        if supervisor == 0 {
            let made = u8::from(make_network_namespace());
            // SAFETY: write(2) of a live byte, then pause(2) until the test kills it.
            unsafe {
                libc::write(ready[1], [made].as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            }
        }
        assert!(supervisor > 0, "fork: {}", std::io::Error::last_os_error());
        let mut made = [0u8];
        // SAFETY: read(2) of one byte into a live buffer.
        assert_eq!(unsafe { libc::read(ready[0], made.as_mut_ptr().cast(), 1) }, 1);
        let theirs = net_of(&supervisor.to_string());
        let pid = rustix::process::Pid::from_raw(supervisor).unwrap();
        let pidfd = || Some(pidfd_open(pid, PidfdFlags::empty()).expect("pidfd_open (Linux 5.3)"));
        let joined = joined_in_child(pidfd(), NETWORK_MADE);
        // Where the supervisor said it made none, or had no pidfd: a namespace of the child's own.
        let refused = joined_in_child(pidfd(), 0);
        let own = joined_in_child(None, 0);
        // SAFETY: kill(2) and waitpid(2) of the child forked here.
        unsafe {
            libc::kill(supervisor, libc::SIGKILL);
            libc::waitpid(supervisor, std::ptr::null_mut(), 0);
        }
        assert_eq!(made, [1], "the supervisor made its network namespace");
        assert_ne!(theirs, host);
        assert_eq!(joined.as_ref(), Some(&theirs), "the child joined the supervisor's");
        let own = own.expect("the namespaces step is taken");
        assert!(own != host && own != theirs, "{own:?}: neither the host's nor the supervisor's");
        let refused = refused.expect("the namespaces step is taken");
        assert!(refused != host && refused != theirs, "{refused:?}: not the supervisor's when it did not say so");
    }

    #[test]
    fn a_child_cloned_into_a_cgroup_starts_in_it() {
        let test = "a_child_cloned_into_a_cgroup_starts_in_it";
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            testkit::skip(test, testkit::Lacks::Setup, "not root: mounting a cgroup2 hierarchy needs root");
            return;
        }
        // A cgroup2 hierarchy of the test's own (the host's may be v1): membership needs no
        // controller.
        let dir = tempfile::tempdir().unwrap();
        let mount = std::process::Command::new("mount").args(["-t", "cgroup2", "none"]).arg(dir.path()).output();
        if !mount.as_ref().is_ok_and(|o| o.status.success()) {
            testkit::skip(test, testkit::Lacks::Setup, format!("mount -t cgroup2 failed here: {mount:?}"));
            return;
        }
        let mounted = testkit::Mounted::at(dir.path());
        let cgroup = dir.path().join("child-test");
        std::fs::create_dir(&cgroup).unwrap();
        let opened: std::os::fd::OwnedFd = std::fs::File::open(&cgroup).unwrap().into();
        let child = clone_into_cgroup(&opened);
        if child == 0 {
            // SAFETY: _exit(2) ends the child without running the parent's destructors.
            unsafe { libc::_exit(if child_is_in(b"/child-test") { 0 } else { 1 }) };
        }
        assert!(child > 0, "clone3: {}", std::io::Error::last_os_error());
        let mut status = 0;
        // SAFETY: waitpid writes into a live integer.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        std::fs::remove_dir(&cgroup).unwrap();
        // A cgroup gone (swept by another process) is refused, and the jail forks instead.
        let gone = clone_into_cgroup(&opened);
        if gone == 0 {
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        drop(opened);
        assert!(mounted.unmount(), "umount");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child saw another cgroup: {status:#x}");
        assert!(gone < 0, "clone3 into a removed cgroup");
    }
}

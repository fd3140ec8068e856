//! What a device-model process may call once it serves: one allow-list for all its threads (the
//! vfio-user server, the data path, the control socket, the signal waiter), installed on every
//! thread at once after the jail and after the threads started, so no thread can start another,
//! open a file, make a socket or run a program. Anything else kills the process (SIGSYS),
//! named on stderr first.

use jail::seccomp::{BpfProgram, RUNTIME, SeccompError, allow_all, argument_is, compile};

/// Calls a model's threads make beyond the Rust runtime's ([`RUNTIME`]).
const MODEL_RUNTIME: &[i64] = &[
    libc::SYS_getrandom,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_sched_getaffinity,
    // A thread started just before the filter may still be in its start-up (glibc's robust
    // futex list, Rust's guard page and signal stack, its name below) when the filter reaches it.
    libc::SYS_set_robust_list,
];

/// What serving takes: the vfio-user and control sockets already bound (accepting, messages with
/// descriptors), the client's memory mapped from the descriptors it sends, eventfds signalled,
/// the wire (a TAP's descriptor or the generator) read and written.
const SERVING: &[i64] = &[
    libc::SYS_accept4,
    // A reset clears a shared-memory BAR by truncating its memfd and growing it again.
    libc::SYS_ftruncate,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_sendto,
    libc::SYS_shutdown,
    libc::SYS_write,
    libc::SYS_writev,
];

/// A TAP wire's link state, read on the socket opened before the jail.
const SIOCGIFFLAGS: u64 = libc::SIOCGIFFLAGS;

/// The filter for every thread of a model process. `may_unlink`: the process removes its own
/// sockets on SIGTERM (a model without the jail; a jailed one leaves that to its supervisor).
pub fn model_filter(may_unlink: bool) -> Result<BpfProgram, SeccompError> {
    let mut rules = allow_all(RUNTIME);
    rules.extend(allow_all(MODEL_RUNTIME));
    rules.extend(allow_all(SERVING));
    // `try_clone` of a stream (F_DUPFD_CLOEXEC) and std's descriptor checks (F_GETFD).
    rules.insert(
        libc::SYS_fcntl,
        vec![argument_is(1, libc::F_GETFD as u64)?, argument_is(1, libc::F_DUPFD_CLOEXEC as u64)?],
    );
    rules.insert(libc::SYS_ioctl, vec![argument_is(1, SIOCGIFFLAGS)?]);
    rules.insert(libc::SYS_prctl, vec![argument_is(0, libc::PR_SET_NAME as u64)?]);
    if may_unlink {
        rules.insert(libc::SYS_unlink, vec![]);
        rules.insert(libc::SYS_unlinkat, vec![]);
    }
    compile(rules)
}

/// Names a refused call on stderr before the model dies of it, then installs
/// [`model_filter`] on every thread of the process.
pub fn install(may_unlink: bool) -> Result<(), SeccompError> {
    let filter = model_filter(may_unlink)?;
    jail::seccomp::report_violations("model")?;
    jail::seccomp::apply_to_all_threads(&filter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jail::seccomp::in_child;

    #[test]
    fn a_model_cannot_open_files_make_sockets_start_threads_or_programs() {
        let filter = model_filter(false).unwrap();
        fn open_shadow() {
            // SAFETY: a plain system call; the filter kills the child before it runs.
            unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, c"/etc/shadow".as_ptr(), libc::O_RDONLY) };
        }
        fn open_socket() {
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0) };
        }
        fn start_thread() {
            // SAFETY: as above (clone with no flags would be a fork).
            unsafe { libc::syscall(libc::SYS_clone, 0, 0, 0, 0, 0) };
        }
        fn exec_shell() {
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_execve, c"/bin/sh".as_ptr(), 0, 0) };
        }
        fn unlink_root() {
            // SAFETY: as above: a jailed model's filter has no unlink.
            unsafe { libc::syscall(libc::SYS_unlink, c"/tmp/x".as_ptr()) };
        }
        fn other_ioctl() {
            // SAFETY: as above: TUNSETIFF is done before the filter, never after.
            unsafe { libc::syscall(libc::SYS_ioctl, -1, 0x4004_54ca, 0) };
        }
        fn other_prctl() {
            // SAFETY: as above: only a thread's name may be set.
            unsafe { libc::syscall(libc::SYS_prctl, libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
        }
        for body in [open_shadow, open_socket, start_thread, exec_shell, unlink_root, other_ioctl, other_prctl] {
            assert_eq!(in_child(&filter, body), (true, libc::SIGSYS));
        }
    }

    #[test]
    fn serving_calls_pass_and_unlink_only_without_the_jail() {
        // The sockets exist before the filter, as a model's are bound before its jail.
        let mut fds = [0; 2];
        // SAFETY: socketpair into a local array.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) }, 0);
        let serving = move || {
            // SAFETY: writes, reads and polls on the pair, the ioctl a TAP wire uses (on a bad
            // descriptor: EBADF, but allowed), a descriptor clone, closes.
            unsafe {
                libc::write(fds[0], b"x".as_ptr().cast(), 1);
                let mut buf = [0u8; 1];
                libc::read(fds[1], buf.as_mut_ptr().cast(), 1);
                let mut poll = libc::pollfd { fd: fds[1], events: libc::POLLIN, revents: 0 };
                libc::poll(&mut poll, 1, 0);
                libc::ioctl(-1, libc::SIOCGIFFLAGS, 0);
                libc::fcntl(fds[0], libc::F_DUPFD_CLOEXEC, 3);
                libc::prctl(libc::PR_SET_NAME, c"model-test".as_ptr());
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
        };
        let unlink_missing = || {
            // SAFETY: unlink of a path that does not exist: ENOENT, but allowed.
            unsafe { libc::syscall(libc::SYS_unlink, c"/nonexistent/driverlab-model.sock".as_ptr()) };
        };
        let jailed = model_filter(false).unwrap();
        let free = model_filter(true).unwrap();
        assert_eq!(in_child(&jailed, serving), (false, 0));
        assert_eq!(in_child(&free, unlink_missing), (false, 0));
        assert_eq!(in_child(&jailed, unlink_missing), (true, libc::SIGSYS));
        // SAFETY: closing the parent's copies.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}

//! Seccomp, the last step of a jail: allow-lists of system calls compiled into BPF, installed
//! on one thread or on every thread of the process, and a SIGSYS handler that names the call a
//! filter refused before the process dies of it. What each process may call is its own crate's
//! knowledge (the VMM's threads in `vmm::seccomp`, a device model's in `device_models::seccomp`);
//! this module only builds and installs.

use std::collections::BTreeMap;
use std::sync::OnceLock;

pub use seccompiler::BpfProgram;
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// A filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
#[error("seccomp filter: {0}")]
pub struct SeccompError(String);

/// What any thread of a Rust program makes between its start and its end: memory, futexes,
/// signal masks and stacks, time and sleeping, exiting. Every filter starts from these.
pub const RUNTIME: &[i64] = &[
    libc::SYS_brk,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_close,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_futex,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_madvise,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_munmap,
    libc::SYS_nanosleep,
    libc::SYS_rseq,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sched_yield,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
];

/// Keeps every thread's allocations in glibc's main arena. A thread arena that shrinks after
/// large frees asks `/proc/sys/vm/overcommit_memory` once (`check_may_shrink_heap()`, glibc's
/// malloc/arena.c), an `openat` no filter here allows: the VMM died of SIGSYS when a guest's
/// driver tore down a 2048-buffer RX ring (the nested box, 2026-12-05). The main arena shrinks
/// with `brk`, which [`RUNTIME`] allows. Call it first thing, before any thread starts.
pub fn one_malloc_arena() {
    // SAFETY: mallopt only sets a malloc parameter; M_ARENA_MAX takes effect for arenas made
    // after it, so it is called before any thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

/// Per system call, the argument conditions under which it is allowed (none: always).
pub type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// Allows every call in `syscalls` with any arguments, and `fcntl(F_GETFD)` (debug builds of std
/// check a descriptor with it before closing it).
pub fn allow_all(syscalls: &[i64]) -> Rules {
    let mut rules: Rules = syscalls.iter().map(|&nr| (nr, vec![])).collect();
    rules.insert(libc::SYS_fcntl, vec![argument_is(1, libc::F_GETFD as u64).expect("a valid single-condition rule")]);
    rules
}

/// A rule: argument `index` (as a 32-bit value) equals `value`.
pub fn argument_is(index: u8, value: u64) -> Result<SeccompRule, SeccompError> {
    let condition = SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
        .map_err(|e| SeccompError(e.to_string()))?;
    SeccompRule::new(vec![condition]).map_err(|e| SeccompError(e.to_string()))
}

/// Rules allowing `ioctl` with exactly these request numbers.
pub fn ioctl_requests(requests: &[u64]) -> Result<Vec<SeccompRule>, SeccompError> {
    requests.iter().map(|&request| argument_is(1, request)).collect()
}

/// Compiles `rules`: a call outside them traps (SIGSYS) into the handler that
/// [`report_violations`] installs, which names it and then lets the kernel kill the process.
pub fn compile(rules: Rules) -> Result<BpfProgram, SeccompError> {
    let filter = SeccompFilter::new(rules, SeccompAction::Trap, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(|e| SeccompError(e.to_string()))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| SeccompError(e.to_string()))
}

/// Installs `filter` on the calling thread (and the threads it starts afterwards).
pub fn apply(filter: &BpfProgram) -> Result<(), SeccompError> {
    seccompiler::apply_filter(filter).map_err(|e| SeccompError(e.to_string()))
}

/// Installs `filter` on every thread of the process at once (`SECCOMP_FILTER_FLAG_TSYNC`).
pub fn apply_to_all_threads(filter: &BpfProgram) -> Result<(), SeccompError> {
    seccompiler::apply_filter_all_threads(filter).map_err(|e| SeccompError(e.to_string()))
}

/// Runs `body` in a forked child of this process after installing `filter` there, and returns
/// how the child ended: `(true, signal)` if a signal killed it (SIGSYS: the filter refused a
/// call), else `(false, exit code)` (0: `body` returned; 100: the filter could not be
/// installed). How a filter's tests see what it allows; `body` should make plain system calls.
pub fn in_child(filter: &BpfProgram, body: impl FnOnce()) -> (bool, i32) {
    // SAFETY: fork; the child installs the filter, runs `body` and `_exit`s without unwinding
    // into the parent's state.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        if apply(filter).is_err() {
            // SAFETY: terminating the child.
            unsafe { libc::_exit(100) };
        }
        body();
        // SAFETY: terminating the child.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFSIGNALED(status) { (true, libc::WTERMSIG(status)) } else { (false, libc::WEXITSTATUS(status)) }
}

/// Where the kernel puts the system call's number in the `siginfo_t` of a seccomp SIGSYS
/// (`si_syscall`, after `si_signo`, `si_errno`, `si_code`, padding and `si_call_addr`).
const SI_SYSCALL_OFFSET: usize = 24;

/// What the report calls the process (`VMM`, `model`), set once by [`report_violations`].
static PROCESS: OnceLock<&'static str> = OnceLock::new();

/// Installs the handler that reports a seccomp violation before the process dies of it: one line
/// on stderr, `seccomp: system call N is not allowed; the PROCESS dies of SIGSYS`.
pub fn report_violations(process: &'static str) -> Result<(), SeccompError> {
    let _ = PROCESS.set(process);
    vmm_sys_util::signal::register_signal_handler(libc::SIGSYS, on_violation)
        .map_err(|e| SeccompError(format!("installing the SIGSYS handler: {e}")))
}

extern "C" fn on_violation(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passed a siginfo_t for a seccomp SIGSYS, whose si_syscall it filled.
    let nr = unsafe { std::ptr::read_unaligned((info as *const u8).add(SI_SYSCALL_OFFSET).cast::<i32>()) };
    let mut line = [0u8; 128];
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        let n = bytes.len().min(line.len() - len);
        line[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
    };
    put(b"seccomp: system call ");
    let mut digits = [0u8; 12];
    let mut value = nr.unsigned_abs();
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    put(&digits[at..]);
    put(b" is not allowed; the ");
    put(PROCESS.get().copied().unwrap_or("process").as_bytes());
    put(b" dies of SIGSYS\n");
    // SAFETY: write(2) of a buffer on this stack (allowed in every filter); then the same system
    // call again: with SIGSYS blocked in its own handler, the kernel kills the process with it.
    unsafe {
        libc::write(2, line.as_ptr().cast(), len);
        libc::syscall(nr as libc::c_long, 0, 0, 0, 0, 0, 0);
        // Allowed with these arguments after all: end as the kill would have.
        libc::abort();
    }
}

//! Seccomp filters, one per thread kind, installed after set-up and before the guest runs.
//!
//! Anything not listed kills the whole process (SIGSYS): a compromised vCPU thread cannot open
//! files, create sockets or start programs. The vCPU thread may only issue the KVM ioctls its run
//! loop needs.

use std::collections::BTreeMap;

use kvm_bindings::{KVMIO, kvm_irq_routing, kvm_irqfd, kvm_regs, kvm_sregs, kvm_translation};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// KVM ioctl request numbers (kvm-ioctls keeps its own private).
mod request {
    #![allow(missing_docs)]
    use super::*;
    use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};

    ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
    ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
    ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
    ioctl_iowr_nr!(KVM_TRANSLATE, KVMIO, 0x85, kvm_translation);
    ioctl_iow_nr!(KVM_SET_GSI_ROUTING, KVMIO, 0x6a, kvm_irq_routing);
    ioctl_iow_nr!(KVM_IRQFD, KVMIO, 0x76, kvm_irqfd);
}
use request::{KVM_GET_REGS, KVM_GET_SREGS, KVM_IRQFD, KVM_RUN, KVM_SET_GSI_ROUTING, KVM_TRANSLATE};

/// Errors building the filters.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the seccomp filter: {0}")]
pub struct SeccompError(String);

/// System calls every thread makes: memory, futexes, signals, time, exiting, writing logs.
const COMMON: &[i64] = &[
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
    libc::SYS_write,
    libc::SYS_writev,
];

/// The main thread, once the vCPUs run: wait, stop the vCPUs, print the summary, exit.
const MAIN_ONLY: &[i64] = &[libc::SYS_fsync];

/// The two filters.
pub struct Filters {
    /// For the main (event loop) thread.
    pub main: BpfProgram,
    /// For each vCPU thread.
    pub vcpu: BpfProgram,
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>) -> Result<BpfProgram, SeccompError> {
    let filter = SeccompFilter::new(rules, SeccompAction::KillProcess, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(|e| SeccompError(e.to_string()))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| SeccompError(e.to_string()))
}

fn allow_all(syscalls: &[i64]) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = syscalls.iter().map(|&nr| (nr, vec![])).collect();
    // Debug builds of std check a descriptor with fcntl(F_GETFD) before closing it.
    let getfd = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, libc::F_GETFD as u64)
        .and_then(|c| SeccompRule::new(vec![c]))
        .expect("a valid single-condition rule");
    rules.insert(libc::SYS_fcntl, vec![getfd]);
    rules
}

fn ioctl_requests(requests: &[u64]) -> Result<Vec<SeccompRule>, SeccompError> {
    requests
        .iter()
        .map(|&request| {
            let condition = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)
                .map_err(|e| SeccompError(e.to_string()))?;
            SeccompRule::new(vec![condition]).map_err(|e| SeccompError(e.to_string()))
        })
        .collect()
}

/// The main thread's filter.
pub fn main_filter() -> Result<BpfProgram, SeccompError> {
    let mut rules = allow_all(COMMON);
    rules.extend(allow_all(MAIN_ONLY));
    compile(rules)
}

/// A vCPU thread's filter.
pub fn vcpu_filter() -> Result<BpfProgram, SeccompError> {
    let mut rules = allow_all(COMMON);
    // Device emulation on the vCPU thread reprograms MSI routes and irqfds (MSI-X table writes).
    let requests = [KVM_RUN(), KVM_GET_REGS(), KVM_GET_SREGS(), KVM_TRANSLATE(), KVM_SET_GSI_ROUTING(), KVM_IRQFD()]
        .map(u64::from);
    rules.insert(libc::SYS_ioctl, ioctl_requests(&requests)?);
    compile(rules)
}

/// Both filters.
pub fn filters() -> Result<Filters, SeccompError> {
    Ok(Filters { main: main_filter()?, vcpu: vcpu_filter()? })
}

/// Installs `filter` on the calling thread.
pub fn apply(filter: &BpfProgram) -> Result<(), SeccompError> {
    seccompiler::apply_filter(filter).map_err(|e| SeccompError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `body` in a forked child after installing `filter`; returns how the child ended.
    fn in_child(filter: &BpfProgram, body: fn()) -> (bool, i32) {
        // SAFETY: fork in a test process; the child only makes raw system calls and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            if seccompiler::apply_filter(filter).is_err() {
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

    #[test]
    fn forbidden_syscall_kills_the_process() {
        let vcpu = vcpu_filter().unwrap();
        let main = main_filter().unwrap();
        fn open_socket() {
            // SAFETY: a plain system call; the filter should kill us before it runs.
            unsafe { libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0) };
        }
        fn exec_shell() {
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_execve, c"/bin/sh".as_ptr(), 0, 0) };
        }
        fn wrong_ioctl() {
            // SAFETY: KVM_CREATE_VM on stdin: not on the vCPU's list.
            unsafe { libc::syscall(libc::SYS_ioctl, 0, 0xae01, 0) };
        }
        assert_eq!(in_child(&vcpu, open_socket), (true, libc::SIGSYS));
        assert_eq!(in_child(&main, open_socket), (true, libc::SIGSYS));
        assert_eq!(in_child(&vcpu, exec_shell), (true, libc::SIGSYS));
        assert_eq!(in_child(&vcpu, wrong_ioctl), (true, libc::SIGSYS));
        assert_eq!(in_child(&main, wrong_ioctl), (true, libc::SIGSYS));
    }

    #[test]
    fn allowed_syscalls_pass() {
        let vcpu = vcpu_filter().unwrap();
        fn allowed() {
            // SAFETY: KVM_RUN on an invalid fd fails with EBADF, which is fine: it was allowed.
            unsafe { libc::syscall(libc::SYS_ioctl, -1, KVM_RUN() as u64, 0) };
            // SAFETY: writing nothing to stderr.
            unsafe { libc::write(2, std::ptr::null(), 0) };
        }
        assert_eq!(in_child(&vcpu, allowed), (false, 0));
    }
}

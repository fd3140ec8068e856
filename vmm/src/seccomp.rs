//! Seccomp filters, one per thread kind, installed after set-up and before the guest runs.
//!
//! Anything not listed kills the whole process (SIGSYS): a compromised vCPU thread cannot open
//! files, create sockets or start programs. The vCPU thread may only issue the KVM ioctls its run
//! loop needs.

use jail::seccomp::{BpfProgram, RUNTIME, allow_all, compile, ioctl_requests};
pub use jail::seccomp::{SeccompError, apply};
use kvm_bindings::{
    KVMIO, kvm_clock_data, kvm_debugregs, kvm_device_attr, kvm_irq_routing, kvm_irqchip, kvm_irqfd, kvm_lapic_state,
    kvm_mp_state, kvm_msrs, kvm_regs, kvm_sregs, kvm_translation, kvm_userspace_memory_region, kvm_vcpu_events,
    kvm_xcrs, kvm_xsave,
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
    ioctl_iow_nr!(KVM_SET_USER_MEMORY_REGION, KVMIO, 0x46, kvm_userspace_memory_region);
    ioctl_iowr_nr!(KVM_GET_IRQCHIP, KVMIO, 0x62, kvm_irqchip);
    ioctl_ior_nr!(KVM_GET_CLOCK, KVMIO, 0x7c, kvm_clock_data);
    ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
    ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_lapic_state);
    ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_mp_state);
    ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);
    ioctl_ior_nr!(KVM_GET_DEBUGREGS, KVMIO, 0xa1, kvm_debugregs);
    ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_xsave);
    ioctl_ior_nr!(KVM_GET_XCRS, KVMIO, 0xa6, kvm_xcrs);
    ioctl_iow_nr!(KVM_GET_DEVICE_ATTR, KVMIO, 0xe2, kvm_device_attr);
    ioctl_iow_nr!(KVM_HAS_DEVICE_ATTR, KVMIO, 0xe3, kvm_device_attr);

    const VFIO_TYPE: u32 = b';' as u32;
    const VFIO_BASE: u32 = 100;
    ioctl_io_nr!(VFIO_DEVICE_SET_IRQS, VFIO_TYPE, VFIO_BASE + 10);
    ioctl_io_nr!(VFIO_DEVICE_RESET, VFIO_TYPE, VFIO_BASE + 11);
    ioctl_io_nr!(VFIO_IOMMU_MAP_DMA, VFIO_TYPE, VFIO_BASE + 13);
    ioctl_io_nr!(VFIO_IOMMU_UNMAP_DMA, VFIO_TYPE, VFIO_BASE + 14);
}
use request::{
    KVM_GET_CLOCK, KVM_GET_DEBUGREGS, KVM_GET_DEVICE_ATTR, KVM_GET_IRQCHIP, KVM_GET_LAPIC, KVM_GET_MP_STATE,
    KVM_GET_MSRS, KVM_GET_REGS, KVM_GET_SREGS, KVM_GET_VCPU_EVENTS, KVM_GET_XCRS, KVM_GET_XSAVE, KVM_HAS_DEVICE_ATTR,
    KVM_IRQFD, KVM_RUN, KVM_SET_GSI_ROUTING, KVM_SET_USER_MEMORY_REGION, KVM_TRANSLATE, VFIO_DEVICE_RESET,
    VFIO_DEVICE_SET_IRQS, VFIO_IOMMU_MAP_DMA, VFIO_IOMMU_UNMAP_DMA,
};

/// What passed-through devices need from any thread: MSI-X eventfds, DMA maps, reset.
fn device_ioctls() -> [u64; 4] {
    [VFIO_DEVICE_SET_IRQS(), VFIO_DEVICE_RESET(), VFIO_IOMMU_MAP_DMA(), VFIO_IOMMU_UNMAP_DMA()].map(u64::from)
}

/// System calls every thread makes beyond the Rust runtime's ([`RUNTIME`]): writing logs, and
/// passed-through devices' vfio-user sockets and kernel VFIO region access.
const COMMON: &[i64] = &[
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_read,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_sendto,
];

/// The main thread, once the vCPUs run: check a restored VM's snapshot RAM file (its data
/// extents, `lseek`), wait, stop the vCPUs, print the summary, remove the control socket, exit.
const MAIN_ONLY: &[i64] = &[libc::SYS_lseek, libc::SYS_fsync, libc::SYS_unlink, libc::SYS_unlinkat];

/// The control thread: accept a client, bound its time, answer it.
const CONTROL_ONLY: &[i64] = &[libc::SYS_accept4, libc::SYS_setsockopt];

/// The filters, one per kind of thread.
pub struct Filters {
    /// For the main (event loop) thread.
    pub main: BpfProgram,
    /// For each vCPU thread.
    pub vcpu: BpfProgram,
    /// For the control socket's thread.
    pub control: BpfProgram,
}

/// What the main thread adds to write a snapshot into the files made before the jail: their
/// size (the memory file's data extents come through `lseek`, in [`MAIN_ONLY`]).
const SNAPSHOT_WRITES: &[i64] = &[libc::SYS_ftruncate];

/// The main thread's filter; with `snapshot` (the VM has somewhere to write one) it may also read
/// the VM's irqchips and clock and write the snapshot's files.
pub fn main_filter(snapshot: bool) -> Result<BpfProgram, SeccompError> {
    let mut rules = allow_all(RUNTIME);
    rules.extend(allow_all(COMMON));
    rules.extend(allow_all(MAIN_ONLY));
    // Teardown: passed-through devices are reset and their DMA maps taken down.
    let mut requests = device_ioctls().to_vec();
    if snapshot {
        rules.extend(allow_all(SNAPSHOT_WRITES));
        requests.extend([KVM_GET_IRQCHIP(), KVM_GET_CLOCK()].map(u64::from));
    }
    rules.insert(libc::SYS_ioctl, ioctl_requests(&requests)?);
    compile(rules)
}

/// The control thread's filter: its socket, and reading devices' counters (vfio-user messages and
/// region reads are in the common set). With `hotplug` (the VM has hot-plug slots) it also plugs
/// and pulls devices: a departing device's decoding (KVM slots), vectors (irqfds, routes), reset
/// and DMA maps; an arriving one's DMA maps.
pub fn control_filter(hotplug: bool) -> Result<BpfProgram, SeccompError> {
    let mut rules = allow_all(RUNTIME);
    rules.extend(allow_all(COMMON));
    rules.extend(allow_all(CONTROL_ONLY));
    if hotplug {
        let mut requests: Vec<u64> =
            [KVM_SET_GSI_ROUTING(), KVM_IRQFD(), KVM_SET_USER_MEMORY_REGION()].map(u64::from).to_vec();
        requests.extend(device_ioctls());
        rules.insert(libc::SYS_ioctl, ioctl_requests(&requests)?);
    }
    compile(rules)
}

/// A vCPU thread's filter; with `snapshot` it may also read the rest of its vCPU's state.
pub fn vcpu_filter(snapshot: bool) -> Result<BpfProgram, SeccompError> {
    let mut rules = allow_all(RUNTIME);
    rules.extend(allow_all(COMMON));
    // Device emulation on the vCPU thread reprograms MSI routes and irqfds (MSI-X table writes),
    // moves passed-through BAR windows (KVM slots), and drives passed-through devices.
    let mut requests: Vec<u64> = [
        KVM_RUN(),
        KVM_GET_REGS(),
        KVM_GET_SREGS(),
        KVM_TRANSLATE(),
        KVM_SET_GSI_ROUTING(),
        KVM_IRQFD(),
        KVM_SET_USER_MEMORY_REGION(),
    ]
    .map(u64::from)
    .to_vec();
    requests.extend(device_ioctls());
    if snapshot {
        requests.extend(
            [
                KVM_GET_MP_STATE(),
                KVM_GET_MSRS(),
                KVM_GET_XSAVE(),
                KVM_GET_XCRS(),
                KVM_GET_DEBUGREGS(),
                KVM_GET_LAPIC(),
                KVM_GET_VCPU_EVENTS(),
                KVM_HAS_DEVICE_ATTR(),
                KVM_GET_DEVICE_ATTR(),
            ]
            .map(u64::from),
        );
    }
    rules.insert(libc::SYS_ioctl, ioctl_requests(&requests)?);
    compile(rules)
}

/// The filters; `hotplug`: the VM has hot-plug slots (see [`control_filter`]); `snapshot`: it
/// may be snapshotted (see [`main_filter`], [`vcpu_filter`]).
pub fn filters(hotplug: bool, snapshot: bool) -> Result<Filters, SeccompError> {
    Ok(Filters { main: main_filter(snapshot)?, vcpu: vcpu_filter(snapshot)?, control: control_filter(hotplug)? })
}

/// Installs the handler that reports a seccomp violation before the process dies of it: one line
/// on stderr, `seccomp: system call N is not allowed; the VMM dies of SIGSYS`.
pub fn report_violations() -> std::io::Result<()> {
    jail::seccomp::report_violations("VMM").map_err(|e| std::io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jail::seccomp::in_child;

    #[test]
    fn a_violation_is_named_on_stderr_and_still_kills_with_sigsys() {
        let filter = vcpu_filter(false).unwrap();
        let mut fds = [0; 2];
        // SAFETY: pipe(2) into a local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fork in a test process; the child only makes raw system calls and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: the child points its stderr at the pipe, installs the reporter and the
            // filter, and makes a call the filter forbids (socket, 41).
            unsafe {
                libc::dup2(fds[1], 2);
                if report_violations().is_err() || apply(&filter).is_err() {
                    libc::_exit(100);
                }
                libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0);
                libc::_exit(0);
            }
        }
        // SAFETY: closing our copy of the write end, reading the pipe, waiting for our child.
        let (said, status) = unsafe {
            libc::close(fds[1]);
            let mut buf = [0u8; 256];
            let n = libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len());
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            (String::from_utf8_lossy(&buf[..n.max(0) as usize]).into_owned(), status)
        };
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS, "status {status:#x}");
        assert_eq!(said, format!("seccomp: system call {} is not allowed; the VMM dies of SIGSYS\n", libc::SYS_socket));
    }

    #[test]
    fn forbidden_syscall_kills_the_process() {
        let vcpu = vcpu_filter(false).unwrap();
        let main = main_filter(false).unwrap();
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
        let control = control_filter(false).unwrap();
        assert_eq!(in_child(&control, open_socket), (true, libc::SIGSYS));
        assert_eq!(in_child(&control, wrong_ioctl), (true, libc::SIGSYS));
        assert_eq!(in_child(&control, exec_shell), (true, libc::SIGSYS));
    }

    #[test]
    fn only_a_vm_that_may_be_snapshotted_reads_its_state_and_sizes_files() {
        fn read_the_irqchip() {
            // SAFETY: KVM_GET_IRQCHIP on an invalid fd fails with EBADF: it was allowed.
            unsafe { libc::syscall(libc::SYS_ioctl, -1, KVM_GET_IRQCHIP() as u64, 0) };
        }
        fn size_a_file() {
            // SAFETY: ftruncate on an invalid fd fails with EBADF.
            unsafe { libc::syscall(libc::SYS_ftruncate, -1, 0) };
        }
        fn read_the_lapic() {
            // SAFETY: as above, KVM_GET_LAPIC.
            unsafe { libc::syscall(libc::SYS_ioctl, -1, KVM_GET_LAPIC() as u64, 0) };
        }
        let (main, saving_main) = (main_filter(false).unwrap(), main_filter(true).unwrap());
        assert_eq!(in_child(&main, read_the_irqchip), (true, libc::SIGSYS));
        assert_eq!(in_child(&main, size_a_file), (true, libc::SIGSYS));
        assert_eq!(in_child(&saving_main, read_the_irqchip), (false, 0));
        assert_eq!(in_child(&saving_main, size_a_file), (false, 0));
        let (vcpu, saving_vcpu) = (vcpu_filter(false).unwrap(), vcpu_filter(true).unwrap());
        assert_eq!(in_child(&vcpu, read_the_lapic), (true, libc::SIGSYS));
        assert_eq!(in_child(&saving_vcpu, read_the_lapic), (false, 0));
    }

    #[test]
    fn allowed_syscalls_pass() {
        let vcpu = vcpu_filter(false).unwrap();
        fn allowed() {
            // SAFETY: KVM_RUN on an invalid fd fails with EBADF, which is fine: it was allowed.
            unsafe { libc::syscall(libc::SYS_ioctl, -1, KVM_RUN() as u64, 0) };
            // SAFETY: writing nothing to stderr.
            unsafe { libc::write(2, std::ptr::null(), 0) };
        }
        assert_eq!(in_child(&vcpu, allowed), (false, 0));
    }

    #[test]
    fn the_control_thread_drives_devices_only_in_a_vm_with_hot_plug_slots() {
        fn reset_a_device() {
            // SAFETY: VFIO_DEVICE_RESET on an invalid fd fails with EBADF: it was allowed.
            unsafe { libc::syscall(libc::SYS_ioctl, -1, VFIO_DEVICE_RESET() as u64, 0) };
        }
        fn run_a_vcpu() {
            // SAFETY: as above, KVM_RUN: a vCPU thread's call, never the control thread's.
            unsafe { libc::syscall(libc::SYS_ioctl, -1, KVM_RUN() as u64, 0) };
        }
        let (plain, hotplug) = (control_filter(false).unwrap(), control_filter(true).unwrap());
        assert_eq!(in_child(&plain, reset_a_device), (true, libc::SIGSYS));
        assert_eq!(in_child(&hotplug, reset_a_device), (false, 0));
        assert_eq!(in_child(&hotplug, run_a_vcpu), (true, libc::SIGSYS));
    }
}

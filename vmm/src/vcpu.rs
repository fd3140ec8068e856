//! vCPU threads: set-up, the run loop that dispatches exits to the buses, and the kick that gets a
//! thread out of KVM_RUN when the VM stops.

use std::cell::Cell;
use std::os::unix::thread::JoinHandleExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use jail::seccomp::BpfProgram;
use kvm_bindings::{CpuId, kvm_fpu, kvm_run};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_device::bus::{Access, Bus};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

use crate::boot::BootEntry;
use crate::exit::{ExitCounters, ExitKind, StopCause, VmStop};
use crate::pause::SnapshotPause;
use crate::snapshot::{KvmStateError, VcpuSaves, VcpuState};
use crate::x86::{boot_cpu, cpuid, lapic, msr};

/// KVM_INTERNAL_ERROR_EMULATION.
const SUBERROR_EMULATION: u32 = 1;
/// KVM_SYSTEM_EVENT_SHUTDOWN, _RESET, _CRASH.
const SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const SYSTEM_EVENT_RESET: u32 = 2;
const SYSTEM_EVENT_CRASH: u32 = 3;

/// The signal used to kick vCPU threads out of KVM_RUN.
pub fn kick_signal() -> i32 {
    SIGRTMIN()
}

thread_local! {
    /// This thread's `kvm_run` page, for the kick signal handler.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Setting immediate_exit makes a KVM_RUN that starts after the signal return at once; one
    // already running was interrupted by the signal itself.
    KVM_RUN.with(|run| {
        let run = run.get();
        if !run.is_null() {
            // SAFETY: the page belongs to this thread's VcpuFd, which outlives the run loop that
            // published the pointer; a byte store is async-signal-safe.
            unsafe { std::ptr::write_volatile(&raw mut (*run).immediate_exit, 1) };
        }
    });
}

/// Installs the kick signal handler (once per process).
pub fn register_kick_handler() -> std::io::Result<()> {
    register_signal_handler(kick_signal(), on_kick).map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}

/// Errors setting a vCPU up.
#[derive(Debug, thiserror::Error)]
#[error("vCPU {id}: {what}: {source}")]
pub struct VcpuError {
    id: u32,
    what: String,
    source: kvm_ioctls::Error,
}

/// One vCPU with what its run loop needs.
pub struct Vcpu {
    fd: VcpuFd,
    id: u32,
    io_bus: Arc<Bus>,
    mmio_bus: Arc<Bus>,
    memory: GuestMemoryMmap,
    stop: Arc<VmStop>,
    counters: Arc<ExitCounters>,
    final_rips: Arc<std::sync::Mutex<Vec<Option<FinalPlace>>>>,
    saves: Option<Arc<VcpuSaves>>,
    pause: Arc<SnapshotPause>,
}

/// A running vCPU thread.
pub struct VcpuThread {
    handle: JoinHandle<()>,
    done: Arc<AtomicBool>,
}

impl VcpuThread {
    /// Whether the thread has left the guest for good and dropped what it held.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Sends the kick signal to the thread.
    pub fn kick(&self) {
        use vmm_sys_util::signal::Killable;
        let _ = self.handle.kill(kick_signal());
    }

    /// Waits for the thread to end, once [`VcpuThread::is_done`]. A filtered thread ends with the
    /// exit system call, which std's join cannot tell from a lost thread, so it is joined with
    /// pthread_join (which frees its stack) and std's handle is forgotten.
    pub fn join(self) {
        let thread = self.handle.as_pthread_t();
        // SAFETY: the thread was created joinable and nobody else joins or detaches it; the
        // handle that could is forgotten right after.
        unsafe { libc::pthread_join(thread, std::ptr::null_mut()) };
        std::mem::forget(self.handle);
    }
}

/// What the VM shares with each of its vCPUs.
#[derive(Clone)]
pub struct VcpuShared {
    /// Port I/O devices.
    pub io_bus: Arc<Bus>,
    /// MMIO devices.
    pub mmio_bus: Arc<Bus>,
    /// Guest memory (to describe emulation failures).
    pub memory: GuestMemoryMmap,
    /// Where a vCPU reports why the VM must stop.
    pub stop: Arc<VmStop>,
    /// Exit counters.
    pub counters: Arc<ExitCounters>,
    /// Where each vCPU was when it stopped (filled as the threads end).
    pub final_rips: Arc<std::sync::Mutex<Vec<Option<FinalPlace>>>>,
    /// Where each vCPU leaves its state when the VM stops for a snapshot (a VM started with
    /// somewhere to write one).
    pub saves: Option<Arc<VcpuSaves>>,
    /// Where a snapshot taken while the VM goes on holds the vCPUs.
    pub pause: Arc<SnapshotPause>,
}

impl Vcpu {
    /// Configures `fd` as vCPU `id` of `count`: CPUID, MSRs, FPU, LAPIC; and, for the boot vCPU,
    /// the entry state. Secondary vCPUs wait for INIT/SIPI from the guest.
    pub fn new(
        fd: VcpuFd,
        id: u32,
        count: u32,
        supported_cpuid: &CpuId,
        tsc_khz: Option<u32>,
        boot: Option<&BootEntry>,
        shared: VcpuShared,
    ) -> Result<Vcpu, VcpuError> {
        let err = |what: &str| {
            let what = what.to_string();
            move |source| VcpuError { id, what, source }
        };
        fd.set_cpuid2(&cpuid::configure(supported_cpuid, id, count, tsc_khz)).map_err(err("KVM_SET_CPUID2"))?;
        let msrs = msr::boot_msrs();
        let set = fd.set_msrs(&msrs).map_err(err("KVM_SET_MSRS"))?;
        if set != msrs.as_slice().len() {
            let index = msr::boot_msr_index(set).unwrap_or(0);
            return Err(VcpuError {
                id,
                what: format!("KVM_SET_MSRS refused MSR {index:#x}"),
                source: kvm_ioctls::Error::new(libc::EINVAL),
            });
        }
        fd.set_fpu(&kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() }).map_err(err("KVM_SET_FPU"))?;
        let mut lapic = fd.get_lapic().map_err(err("KVM_GET_LAPIC"))?;
        lapic::configure_lint(&mut lapic);
        fd.set_lapic(&lapic).map_err(err("KVM_SET_LAPIC"))?;
        if let Some(entry) = boot {
            let mut sregs = fd.get_sregs().map_err(err("KVM_GET_SREGS"))?;
            boot_cpu::configure_sregs(&mut sregs, entry);
            fd.set_sregs(&sregs).map_err(err("KVM_SET_SREGS"))?;
            fd.set_regs(&boot_cpu::boot_regs(entry)).map_err(err("KVM_SET_REGS"))?;
        }
        Ok(Vcpu {
            fd,
            id,
            io_bus: shared.io_bus,
            mmio_bus: shared.mmio_bus,
            memory: shared.memory,
            stop: shared.stop,
            counters: shared.counters,
            final_rips: shared.final_rips,
            saves: shared.saves,
            pause: shared.pause,
        })
    }

    /// Puts a snapshot's state into this (new, not yet running) vCPU, its TSC in step with the
    /// VM's clock as `clock` says.
    pub fn restore(&self, state: &VcpuState, clock: &crate::snapshot::tsc::ClockPair) -> Result<(), KvmStateError> {
        state.restore(&self.fd, Some(clock))
    }

    /// When the VM stops for a snapshot: completes the instruction whose port or MMIO access
    /// was handled last (KVM finishes it on the next entry, which `immediate_exit` makes return
    /// at once), then leaves the vCPU's state for the snapshot.
    fn save_for_snapshot(&mut self) {
        if matches!(self.stop.reason(), Some(StopCause::Snapshot)) {
            self.save_state();
        }
    }

    /// For a snapshot taken while the VM goes on: saves this vCPU's state as
    /// [`Vcpu::save_for_snapshot`] does, then holds until the snapshot is written.
    fn save_and_hold(&mut self) {
        self.save_state();
        self.pause.hold(&self.stop);
    }

    /// Completes the last access and leaves the vCPU's state in `saves`.
    fn save_state(&mut self) {
        let Some(saves) = self.saves.clone() else { return };
        self.fd.set_kvm_immediate_exit(1);
        let completed = match self.fd.run() {
            Err(e) if e.errno() == libc::EINTR => Ok(()),
            Err(e) => Err(e),
            // With immediate_exit set KVM does not enter the guest: no exit can come back.
            Ok(_) => Err(kvm_ioctls::Error::new(libc::EBUSY)),
        }
        .map_err(|source| KvmStateError::Kvm { what: "KVM_RUN (completing the last access)", source });
        self.fd.set_kvm_immediate_exit(0);
        saves.put(self.id, completed.and_then(|()| VcpuState::capture(&saves.msr_indices, &self.fd)));
    }

    /// Starts the vCPU's thread, which installs `seccomp` (if any) before entering the guest.
    pub fn start(mut self, seccomp: Option<BpfProgram>) -> std::io::Result<VcpuThread> {
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        let handle = std::thread::Builder::new().name(format!("vcpu{}", self.id)).spawn(move || {
            let filtered = seccomp.is_some();
            if let Some(filter) = seccomp
                && let Err(e) = crate::seccomp::apply(&filter)
            {
                self.stop.request(StopCause::VmmError(format!("vCPU {}: {e}", self.id)));
                finished.store(true, Ordering::Release);
                return;
            }
            let run = self.fd.get_kvm_run() as *mut kvm_run;
            KVM_RUN.with(|cell| cell.set(run));
            self.run_loop(run);
            self.save_for_snapshot();
            KVM_RUN.with(|run| run.set(std::ptr::null_mut()));
            let place = self.final_place();
            let mut rips = self.final_rips.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = rips.get_mut(self.id as usize) {
                *slot = place;
            }
            drop(rips);
            drop(self);
            finished.store(true, Ordering::Release);
            if filtered {
                // The thread ends here, under its filter: glibc's end-of-thread work (TLS
                // destructors, malloc's arena hand-back) may make calls the filter forbids (an
                // `open` of /sys/devices/system/cpu/online, seen after Linux guests), so it ends
                // with the exit system call itself; [`VcpuThread::join`] frees its stack.
                // SAFETY: everything this thread owned was dropped above; nothing on its stack
                // is referenced from elsewhere.
                unsafe { libc::syscall(libc::SYS_exit, 0) };
            }
        })?;
        Ok(VcpuThread { handle, done })
    }

    fn run_loop(&mut self, run: *mut kvm_run) {
        while !self.stop.is_stopping() {
            if self.pause.is_holding() {
                self.save_and_hold();
                continue;
            }
            if let Some(reason) = self.run_once(run) {
                self.stop.request(reason);
            }
        }
    }

    /// Runs the guest until the next exit and handles it; returns a reason if the VM must stop.
    /// `run` is this vCPU's `kvm_run` page.
    fn run_once(&mut self, run: *mut kvm_run) -> Option<StopCause> {
        let exit = match self.fd.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                // Kicked: the loop condition decides whether to go on.
                self.fd.set_kvm_immediate_exit(0);
                return None;
            }
            Err(e) => {
                return Some(StopCause::VmmError(format!("vCPU {}: KVM_RUN failed: {e}", self.id)));
            }
        };
        match exit {
            VcpuExit::IoIn(port, data) => {
                let (mut claimed, mut unclaimed) = (0, 0);
                for item in data.chunks_mut(io_access_size(run)) {
                    tally(self.io_bus.read(port as u64, item), &mut claimed, &mut unclaimed, "in", port as u64, &[]);
                }
                self.counters.record(ExitKind::IoIn, port as u64, claimed, unclaimed);
                None
            }
            VcpuExit::IoOut(port, data) => {
                let (mut claimed, mut unclaimed) = (0, 0);
                for item in data.chunks(io_access_size(run)) {
                    tally(self.io_bus.write(port as u64, item), &mut claimed, &mut unclaimed, "out", port as u64, item);
                }
                self.counters.record(ExitKind::IoOut, port as u64, claimed, unclaimed);
                None
            }
            VcpuExit::MmioRead(addr, data) => {
                let (mut claimed, mut unclaimed) = (0, 0);
                tally(self.mmio_bus.read(addr, data), &mut claimed, &mut unclaimed, "mmio read", addr, &[]);
                self.counters.record(ExitKind::MmioRead, addr, claimed, unclaimed);
                None
            }
            VcpuExit::MmioWrite(addr, data) => {
                let (mut claimed, mut unclaimed) = (0, 0);
                tally(self.mmio_bus.write(addr, data), &mut claimed, &mut unclaimed, "mmio write", addr, data);
                self.counters.record(ExitKind::MmioWrite, addr, claimed, unclaimed);
                None
            }
            VcpuExit::Shutdown => Some(StopCause::TripleFault),
            VcpuExit::SystemEvent(kind, _) => Some(match kind {
                SYSTEM_EVENT_SHUTDOWN => StopCause::PowerOff,
                SYSTEM_EVENT_RESET => StopCause::Reset,
                SYSTEM_EVENT_CRASH => StopCause::Panic,
                other => StopCause::VmmError(format!("vCPU {}: unknown system event {other}", self.id)),
            }),
            VcpuExit::FailEntry(hardware_reason, _) => Some(StopCause::EntryFailure { hardware_reason }),
            VcpuExit::InternalError => Some(self.internal_error()),
            VcpuExit::Hlt => Some(StopCause::VmmError(format!("vCPU {}: HLT reached user space", self.id))),
            other => Some(StopCause::VmmError(format!("vCPU {}: unexpected exit {other:?}", self.id))),
        }
    }

    /// Where the vCPU stopped: its rip and, where the guest's page tables map it, the
    /// guest-physical address and the code there; its paging state.
    fn final_place(&self) -> Option<FinalPlace> {
        let regs = self.fd.get_regs().ok()?;
        let rip = regs.rip;
        let code = self.code_at(rip);
        let sregs = self.fd.get_sregs().ok();
        let paging = sregs.filter(|s| s.cr0 & CR0_PG != 0).map(|s| {
            let root = GuestAddress(s.cr3 & CR3_ROOT_MASK);
            Paging { cr3: s.cr3, root_in_memory: self.memory.address_in_range(root) }
        });
        let mut registers = format!(
            "rax {:#x} rbx {:#x} rcx {:#x} rdx {:#x} rsi {:#x} rdi {:#x} rbp {:#x} rsp {:#x} r8 {:#x} r9 {:#x} \
             r10 {:#x} r11 {:#x} r12 {:#x} r13 {:#x} r14 {:#x} r15 {:#x} rip {:#x} rflags {:#x}",
            regs.rax,
            regs.rbx,
            regs.rcx,
            regs.rdx,
            regs.rsi,
            regs.rdi,
            regs.rbp,
            regs.rsp,
            regs.r8,
            regs.r9,
            regs.r10,
            regs.r11,
            regs.r12,
            regs.r13,
            regs.r14,
            regs.r15,
            regs.rip,
            regs.rflags
        );
        if let Some(s) = sregs {
            registers.push_str(&format!(
                " cr0 {:#x} cr2 {:#x} cr3 {:#x} cr4 {:#x} efer {:#x}",
                s.cr0, s.cr2, s.cr3, s.cr4, s.efer
            ));
        }
        // The top of the stack: return addresses show how the vCPU got where it is.
        let stack: Vec<String> = (0..STACK_WORDS)
            .map_while(|i| {
                let t = self.fd.translate_gva(regs.rsp.checked_add(i * 8)?).ok().filter(|t| t.valid != 0)?;
                self.memory.read_obj::<u64>(GuestAddress(t.physical_address)).ok()
            })
            .map(|word| format!("{word:#x}"))
            .collect();
        registers.push_str(&format!("; stack {}", stack.join(" ")));
        Some(FinalPlace { rip, code, paging, registers })
    }

    /// The guest-physical address of `rip` (through the vCPU's page tables) and the
    /// [`CODE_BYTES`] bytes of guest memory there.
    fn code_at(&self, rip: u64) -> Option<(u64, [u8; CODE_BYTES])> {
        let t = self.fd.translate_gva(rip).ok().filter(|t| t.valid != 0)?;
        let mut code = [0u8; CODE_BYTES];
        self.memory.read_slice(&mut code, GuestAddress(t.physical_address)).ok()?;
        Some((t.physical_address, code))
    }

    /// Describes KVM_EXIT_INTERNAL_ERROR: the suberror, RIP and the instruction bytes there.
    fn internal_error(&mut self) -> StopCause {
        // SAFETY: reading the `internal` member of the exit union after KVM reported
        // KVM_EXIT_INTERNAL_ERROR, which is the member KVM filled.
        let suberror = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
        let kind = if suberror == SUBERROR_EMULATION { "emulation failure" } else { "internal error" };
        let mut detail = format!("{kind} on vCPU {}", self.id);
        if let Ok(regs) = self.fd.get_regs() {
            detail.push_str(&format!(" at rip {:#x}", regs.rip));
            if let Some((_, code)) = self.code_at(regs.rip) {
                detail.push_str(&format!(" (code {})", hex_bytes(&code[..8])));
            }
        }
        StopCause::InternalError { suberror, detail }
    }
}

/// How many bytes of code at a stopped vCPU's rip a report shows.
pub const CODE_BYTES: usize = 16;
/// CR0.PG.
const CR0_PG: u64 = 1 << 31;
/// How many quadwords at a stopped vCPU's stack pointer its register dump shows.
const STACK_WORDS: u64 = 32;
/// The page-table root's address bits in CR3 (without PCID and the flag bits).
const CR3_ROOT_MASK: u64 = 0x000f_ffff_ffff_f000;
/// The lowest address of the upper half of a 48- or 57-bit address space (the kernel's).
const UPPER_HALF: u64 = 0xff00_0000_0000_0000;

/// A stopped vCPU's paging: where its page tables are.
#[derive(Debug, Clone, Copy)]
pub struct Paging {
    /// CR3.
    pub cr3: u64,
    /// Whether CR3's page-table root lies in guest memory.
    pub root_in_memory: bool,
}

/// Where a vCPU stopped, for a hang's report.
#[derive(Debug, Clone)]
pub struct FinalPlace {
    /// Its rip.
    pub rip: u64,
    /// The guest-physical address of rip and the code there, where the guest's page tables map
    /// rip (a hang that ran into unmapped or garbage code shows which).
    pub code: Option<(u64, [u8; CODE_BYTES])>,
    /// Its paging, when paging is on.
    pub paging: Option<Paging>,
    /// Its registers and the top of its stack, for the VMM's log.
    pub registers: String,
}

impl FinalPlace {
    /// Why no guest can be in this state, if none can: a running vCPU whose page tables lie
    /// outside guest memory, or that sits at a kernel address its own page tables do not map
    /// (it would have faulted, and the kernel would have said so), was not left there by its
    /// guest. The host's virtualization lost its state (a hypervisor below the VMM's KVM, as in
    /// a nested lab box under QEMU TCG, is where this has been seen).
    pub fn impossible(&self) -> Option<String> {
        let paging = self.paging?;
        if !paging.root_in_memory {
            return Some(format!("its page tables (cr3 {:#x}) are outside guest memory", paging.cr3));
        }
        if self.code.is_none() && self.rip >= UPPER_HALF {
            return Some(format!("it is at kernel address {:#x}, which its own page tables do not map", self.rip));
        }
        None
    }
}

impl std::fmt::Display for FinalPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rip {:#x}", self.rip)?;
        match &self.code {
            Some((gpa, code)) => write!(f, " (gpa {gpa:#x}, code {})", hex_bytes(code))?,
            None => write!(f, " (not mapped)")?,
        }
        match &self.paging {
            Some(p) if p.root_in_memory => write!(f, ", cr3 {:#x}", p.cr3),
            Some(p) => write!(f, ", cr3 {:#x} (outside guest memory)", p.cr3),
            None => write!(f, ", paging off"),
        }
    }
}

/// `f0 48 0f ...`.
fn hex_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

/// The size of one access of a KVM_EXIT_IO: string I/O (`rep outsb`) can hand over several
/// accesses at once, `count` of them of `size` bytes each.
fn io_access_size(run: *mut kvm_run) -> usize {
    // SAFETY: `run` is this vCPU's mapped `kvm_run` page and the exit is KVM_EXIT_IO, so the
    // `io` member is the valid one; the data slice handed out by kvm-ioctls lies elsewhere in the
    // page.
    let size = unsafe { std::ptr::read_volatile(&raw const (*run).__bindgen_anon_1.io.size) };
    usize::from(size.max(1))
}

/// Counts one access as claimed or not.
fn tally(access: Access, claimed: &mut u64, unclaimed: &mut u64, kind: &str, addr: u64, written: &[u8]) {
    if access == Access::Unclaimed {
        *unclaimed += 1;
        tracing::trace!("unclaimed {kind} at {addr:#x} {written:02x?}");
    } else {
        *claimed += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(rip: u64, mapped: bool, paging: Option<(u64, bool)>) -> FinalPlace {
        FinalPlace {
            rip,
            code: mapped.then_some((0x1000, [0x90; CODE_BYTES])),
            paging: paging.map(|(cr3, root_in_memory)| Paging { cr3, root_in_memory }),
            registers: String::new(),
        }
    }

    #[test]
    fn only_states_no_guest_can_reach_are_called_lost() {
        // A kernel spinning in its own mapped code, a user address not mapped (it may be paged
        // out), a vCPU that never turned paging on (a secondary CPU waiting for SIPI): the guest's.
        assert_eq!(place(0xffff_ffff_8100_0000, true, Some((0x10_0000, true))).impossible(), None);
        assert_eq!(place(0x40_0000, false, Some((0x10_0000, true))).impossible(), None);
        assert_eq!(place(0, false, None).impossible(), None);
        // A kernel address its own page tables do not map, page tables outside guest memory.
        let unmapped = place(0xffff_ffff_c041_3c60, false, Some((0x10_0000, true)));
        assert!(unmapped.impossible().unwrap().contains("kernel address 0xffffffffc0413c60"), "{unmapped}");
        let outside = place(0xffff_ffff_8100_0000, true, Some((0x1_2345_6000, false)));
        assert!(outside.impossible().unwrap().contains("cr3 0x123456000"), "{outside}");
        assert!(outside.to_string().ends_with("cr3 0x123456000 (outside guest memory)"), "{outside}");
        assert!(place(0x10_0000, true, None).to_string().ends_with(", paging off"));
    }
}

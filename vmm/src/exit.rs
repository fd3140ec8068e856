//! How a VM run ends inside the VMM: the reasons, the stop signal vCPUs, devices and the control
//! socket raise, and the exit counters. The exit codes and the exit line itself are the process's
//! contract and live in `vm_spec::exit`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use std::collections::HashMap;
use vm_device::guest_event::{GuestEvent, GuestEventSink};

use vm_spec::exit::CENSUS_TOP;
use vm_spec::exit::ExitReason;
use vm_spec::{AddressCount, ExitCounts};

/// Why a VM stopped, with what the exit line's `detail` says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCause {
    /// ACPI S5 from the guest.
    PowerOff,
    /// A reset request (i8042, ACPI reset register).
    Reset,
    /// KVM_EXIT_SHUTDOWN: a triple fault.
    TripleFault,
    /// The guest announced a panic.
    Panic,
    /// The spec's timeout expired.
    Timeout,
    /// Stopped through the control socket after the guest ignored the power button.
    Shutdown,
    /// KVM_EXIT_INTERNAL_ERROR.
    InternalError {
        /// KVM's suberror (1 = emulation failure).
        suberror: u32,
        /// Where and what.
        detail: String,
    },
    /// KVM_EXIT_FAIL_ENTRY.
    EntryFailure {
        /// Hardware entry failure reason.
        hardware_reason: u64,
    },
    /// The VMM failed while the VM ran.
    VmmError(String),
    /// Stopped to be snapshotted (`vm.snapshot`).
    Snapshot,
}

impl StopCause {
    /// The reason the exit line gives.
    pub fn reason(&self) -> ExitReason {
        match self {
            StopCause::PowerOff => ExitReason::Poweroff,
            StopCause::Reset => ExitReason::Reset,
            StopCause::TripleFault => ExitReason::TripleFault,
            StopCause::Panic => ExitReason::Panic,
            StopCause::Timeout => ExitReason::Timeout,
            StopCause::Shutdown => ExitReason::Shutdown,
            StopCause::InternalError { .. } => ExitReason::KvmInternalError,
            StopCause::EntryFailure { .. } => ExitReason::EntryFailure,
            StopCause::VmmError(_) => ExitReason::VmmError,
            StopCause::Snapshot => ExitReason::Snapshot,
        }
    }

    /// The process exit code.
    pub fn exit_code(&self) -> i32 {
        self.reason().exit_code()
    }

    /// Details worth printing, if any.
    pub fn detail(&self) -> Option<String> {
        match self {
            StopCause::InternalError { suberror, detail } => Some(format!("suberror {suberror}: {detail}")),
            StopCause::EntryFailure { hardware_reason } => {
                Some(format!("hardware entry failure reason {hardware_reason:#x}"))
            }
            StopCause::VmmError(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// How often the power button is pressed again while a requested shutdown's grace runs.
pub const SHUTDOWN_REMINDER: Duration = Duration::from_secs(1);

/// Where vCPUs, devices and the control socket ask for the VM to stop, and where the main thread
/// waits for it. The first reason wins.
#[derive(Default)]
pub struct VmStop {
    state: Mutex<StopState>,
    changed: Condvar,
    stopping: AtomicBool,
}

#[derive(Default)]
struct StopState {
    reason: Option<StopCause>,
    /// When a requested shutdown turns into a forced stop.
    shutdown_by: Option<Instant>,
}

impl VmStop {
    /// A stop signal that nobody has raised yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, StopState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the VM to stop for `reason`; ignored if a reason is already set.
    pub fn request(&self, reason: StopCause) {
        let mut state = self.state();
        if state.reason.is_none() {
            tracing::debug!("stopping: {}", reason.reason());
            state.reason = Some(reason);
            self.stopping.store(true, Ordering::SeqCst);
            self.changed.notify_all();
        }
    }

    /// Asks for the VM to be stopped (reason [`StopCause::Shutdown`]) `grace` from now, unless
    /// it stops by itself first; an earlier request keeps its earlier deadline.
    pub fn request_shutdown(&self, grace: Duration) {
        let by = Instant::now() + grace;
        let mut state = self.state();
        if state.shutdown_by.is_none_or(|earlier| by < earlier) {
            state.shutdown_by = Some(by);
            self.changed.notify_all();
        }
    }

    /// The stop's reason, once one was requested.
    pub fn reason(&self) -> Option<StopCause> {
        self.state().reason.clone()
    }

    /// True once a stop was requested.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Waits for a stop request and returns its reason: [`StopCause::Timeout`] once `timeout`
    /// has passed, [`StopCause::Shutdown`] once a requested shutdown's grace has.
    pub fn wait(&self, timeout: Option<Duration>) -> StopCause {
        self.wait_with(timeout, || {})
    }

    /// As [`VmStop::wait`], calling `while_shutting_down` every [`SHUTDOWN_REMINDER`] while a
    /// requested shutdown's grace runs (the VMM presses the power button again, for a guest that
    /// was not listening yet).
    pub fn wait_with(&self, timeout: Option<Duration>, while_shutting_down: impl FnMut()) -> StopCause {
        // Nothing is asked of it here: only a stop ends the wait.
        self.wait_or(timeout, || false, while_shutting_down)
            .unwrap_or_else(|| StopCause::VmmError("the VM's wait ended without a stop".into()))
    }

    /// Wakes whoever waits in [`VmStop::wait_or`], to look at its `asked` again.
    pub fn nudge(&self) {
        let _state = self.state();
        self.changed.notify_all();
    }

    /// As [`VmStop::wait_with`], returning `None` when `asked` says so (checked at each
    /// [`VmStop::nudge`]) before a stop.
    pub fn wait_or(
        &self,
        timeout: Option<Duration>,
        asked: impl Fn() -> bool,
        mut while_shutting_down: impl FnMut(),
    ) -> Option<StopCause> {
        let timeout_at = timeout.map(|t| Instant::now() + t);
        let mut reminded_at: Option<Instant> = None;
        let mut state = self.state();
        loop {
            if let Some(reason) = &state.reason {
                return Some(reason.clone());
            }
            if asked() {
                return None;
            }
            let now = Instant::now();
            if state.shutdown_by.is_some() {
                match reminded_at {
                    None => reminded_at = Some(now),
                    Some(at) if now >= at + SHUTDOWN_REMINDER => {
                        while_shutting_down();
                        reminded_at = Some(now);
                    }
                    Some(_) => {}
                }
            }
            let reminder = reminded_at.map(|at| (at + SHUTDOWN_REMINDER, None));
            let next = [
                state.shutdown_by.map(|at| (at, Some(StopCause::Shutdown))),
                timeout_at.map(|at| (at, Some(StopCause::Timeout))),
                reminder,
            ]
            .into_iter()
            .flatten()
            .min_by_key(|(at, _)| *at);
            state = match next {
                Some((at, Some(reason))) if at <= now => {
                    drop(state);
                    self.request(reason);
                    self.state()
                }
                Some((at, _)) => {
                    let wait = at.saturating_duration_since(now);
                    self.changed.wait_timeout(state, wait).unwrap_or_else(|p| p.into_inner()).0
                }
                None => self.changed.wait(state).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}

impl GuestEventSink for VmStop {
    fn guest_event(&self, event: GuestEvent) {
        self.request(match event {
            GuestEvent::PowerOff => StopCause::PowerOff,
            GuestEvent::Reset => StopCause::Reset,
            GuestEvent::Panic => StopCause::Panic,
        });
    }
}

/// The kinds of exits the census counts apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// `in`.
    IoIn,
    /// `out`.
    IoOut,
    /// An MMIO read.
    MmioRead,
    /// An MMIO write.
    MmioWrite,
}

impl ExitKind {
    const ALL: [ExitKind; 4] = [ExitKind::IoIn, ExitKind::IoOut, ExitKind::MmioRead, ExitKind::MmioWrite];

    fn name(self) -> &'static str {
        match self {
            ExitKind::IoIn => "io_in",
            ExitKind::IoOut => "io_out",
            ExitKind::MmioRead => "mmio_read",
            ExitKind::MmioWrite => "mmio_write",
        }
    }

    fn is_io(self) -> bool {
        matches!(self, ExitKind::IoIn | ExitKind::IoOut)
    }
}

/// Per address: accesses claimed and unclaimed.
type Census = HashMap<u64, [u64; 2]>;

/// VM exits that reached the VMM, counted over all vCPUs: totals, by kind, and a census of the
/// addresses (ports and MMIO apart). Always on: an exit costs a few microseconds, a census entry
/// an uncontended lock and a hash-map update.
#[derive(Debug, Default)]
pub struct ExitCounters {
    /// Port I/O exits.
    pub io: AtomicU64,
    /// MMIO exits.
    pub mmio: AtomicU64,
    /// Accesses no device claimed.
    pub unclaimed: AtomicU64,
    by_kind: [AtomicU64; 4],
    ports: Mutex<Census>,
    mmio_addresses: Mutex<Census>,
}

impl ExitCounters {
    /// Counts one exit of `kind` at `addr`, with its accesses (a string I/O exit has several):
    /// how many of them a device claimed and how many none did.
    pub fn record(&self, kind: ExitKind, addr: u64, claimed: u64, unclaimed: u64) {
        let total = if kind.is_io() { &self.io } else { &self.mmio };
        total.fetch_add(1, Ordering::Relaxed);
        self.by_kind[kind as usize].fetch_add(1, Ordering::Relaxed);
        if unclaimed > 0 {
            self.unclaimed.fetch_add(unclaimed, Ordering::Relaxed);
        }
        let census = if kind.is_io() { &self.ports } else { &self.mmio_addresses };
        let mut census = census.lock().unwrap_or_else(|p| p.into_inner());
        let entry = census.entry(addr).or_default();
        entry[0] += claimed;
        entry[1] += unclaimed;
    }

    /// A snapshot.
    pub fn counts(&self) -> ExitCounts {
        let top = |census: &Mutex<Census>| {
            let census = census.lock().unwrap_or_else(|p| p.into_inner());
            let mut all: Vec<(u64, [u64; 2])> = census.iter().map(|(&a, &c)| (a, c)).collect();
            all.sort_by_key(|&(addr, [c, u])| (std::cmp::Reverse(c + u), addr));
            all.into_iter()
                .take(CENSUS_TOP)
                .map(|(addr, [claimed, unclaimed])| AddressCount { addr: format!("{addr:#x}"), claimed, unclaimed })
                .collect()
        };
        ExitCounts {
            io: self.io.load(Ordering::Relaxed),
            mmio: self.mmio.load(Ordering::Relaxed),
            unclaimed: self.unclaimed.load(Ordering::Relaxed),
            by_kind: ExitKind::ALL
                .iter()
                .map(|k| (k.name().to_string(), self.by_kind[*k as usize].load(Ordering::Relaxed)))
                .filter(|(_, n)| *n > 0)
                .collect(),
            top_ports: top(&self.ports),
            top_mmio: top(&self.mmio_addresses),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_reason_has_its_own_code_and_name() {
        let reasons = [
            StopCause::PowerOff,
            StopCause::VmmError("x".into()),
            StopCause::Reset,
            StopCause::InternalError { suberror: 1, detail: "x".into() },
            StopCause::Panic,
            StopCause::Timeout,
            StopCause::Shutdown,
        ];
        let codes: Vec<i32> = reasons.iter().map(StopCause::exit_code).collect();
        assert_eq!(codes, vec![0, 1, 3, 4, 5, 6, 7]);
        assert!(!codes.contains(&vm_spec::exit::code::BAD_INPUT));
        assert_eq!(StopCause::TripleFault.exit_code(), vm_spec::exit::code::RESET);
        assert_ne!(StopCause::TripleFault.reason(), StopCause::Reset.reason());
    }

    #[test]
    fn first_stop_reason_wins_and_wakes_the_waiter() {
        let stop = Arc::new(VmStop::new());
        let s = stop.clone();
        let t = std::thread::spawn(move || s.wait(None));
        stop.guest_event(GuestEvent::PowerOff);
        stop.request(StopCause::Timeout);
        assert_eq!(t.join().unwrap(), StopCause::PowerOff);
        assert!(stop.is_stopping());
        assert_eq!(VmStop::new().wait(Some(Duration::from_millis(1))), StopCause::Timeout);
    }

    #[test]
    fn a_requested_shutdown_forces_the_stop_after_its_grace() {
        let stop = Arc::new(VmStop::new());
        let s = stop.clone();
        let t = std::thread::spawn(move || s.wait(Some(Duration::from_secs(60))));
        stop.request_shutdown(Duration::from_secs(30));
        stop.request_shutdown(Duration::from_millis(5));
        stop.request_shutdown(Duration::from_secs(30));
        assert_eq!(t.join().unwrap(), StopCause::Shutdown, "the earliest deadline wins");

        let reminded = Arc::new(VmStop::new());
        reminded.request_shutdown(Duration::from_millis(2500));
        let mut presses = 0;
        assert_eq!(reminded.wait_with(None, || presses += 1), StopCause::Shutdown);
        assert_eq!(presses, 2, "pressed again at 1 s and 2 s");
        let obeyed = Arc::new(VmStop::new());
        obeyed.request_shutdown(Duration::from_secs(30));
        obeyed.guest_event(GuestEvent::PowerOff);
        assert_eq!(obeyed.wait(None), StopCause::PowerOff);
    }

    #[test]
    fn the_census_counts_kinds_and_ranks_addresses_claimed_and_unclaimed() {
        let counters = ExitCounters::default();
        for _ in 0..5 {
            counters.record(ExitKind::IoIn, 0x71, 0, 1);
        }
        counters.record(ExitKind::IoOut, 0x70, 1, 0);
        counters.record(ExitKind::IoOut, 0x3f8, 16, 0);
        counters.record(ExitKind::MmioWrite, 0xc000_0000, 1, 0);
        let c = counters.counts();
        assert_eq!((c.io, c.mmio, c.unclaimed), (7, 1, 5));
        assert_eq!(c.by_kind["io_in"], 5);
        assert_eq!(c.by_kind["io_out"], 2);
        assert!(!c.by_kind.contains_key("mmio_read"), "kinds that never exited are left out");
        let ports: Vec<(&str, u64, u64)> =
            c.top_ports.iter().map(|a| (a.addr.as_str(), a.claimed, a.unclaimed)).collect();
        assert_eq!(ports, [("0x3f8", 16, 0), ("0x71", 0, 5), ("0x70", 1, 0)], "busiest first, by accesses");
        assert_eq!(c.top_mmio[0].addr, "0xc0000000");
        for port in 0..20u64 {
            counters.record(ExitKind::IoIn, 0x1000 + port, 1, 0);
        }
        assert_eq!(counters.counts().top_ports.len(), CENSUS_TOP);
    }
}

//! A snapshot taken while the VM goes on (`vm.snapshot` with `then: resume`): the control thread
//! asks; the main thread stops the vCPUs where they are (each saves its state and holds), writes
//! the snapshot and lets them go on; the control thread gets what was written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vm_spec::SnapshotWritten;

use crate::exit::VmStop;

/// The handshake of one pause at a time.
#[derive(Debug, Default)]
pub struct SnapshotPause {
    state: Mutex<PauseState>,
    changed: Condvar,
    /// vCPUs must hold (from the request to the snapshot's end): read on every vCPU loop.
    holding: AtomicBool,
}

#[derive(Debug, Default)]
struct PauseState {
    /// A pause was asked for that the main thread has not taken up yet.
    asked: bool,
    /// The last pause's outcome, for the control thread.
    outcome: Option<Result<SnapshotWritten, String>>,
}

impl SnapshotPause {
    fn state(&self) -> MutexGuard<'_, PauseState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The control thread: asks for a snapshot while the VM goes on (the main thread is woken
    /// through `stop`) and waits up to `timeout` for it; what was written, or why not.
    pub fn ask(&self, stop: &VmStop, timeout: Duration) -> Result<SnapshotWritten, String> {
        let deadline = Instant::now() + timeout;
        let mut state = self.state();
        state.asked = true;
        state.outcome = None;
        self.holding.store(true, Ordering::SeqCst);
        drop(state);
        stop.nudge();
        let mut state = self.state();
        loop {
            if let Some(outcome) = state.outcome.take() {
                return outcome;
            }
            if stop.is_stopping() {
                return Err("the VM stopped before its snapshot was written".into());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("the snapshot was not written within {} s", timeout.as_secs()));
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            state = self.changed.wait_timeout(state, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The main thread: whether a pause was asked for; takes it up.
    pub fn take_request(&self) -> bool {
        std::mem::take(&mut self.state().asked)
    }

    /// Whether a pause was asked for and not yet taken up (the main thread's wait checks it).
    pub fn is_asked(&self) -> bool {
        self.state().asked
    }

    /// A vCPU: whether it must save its state and hold.
    pub fn is_holding(&self) -> bool {
        self.holding.load(Ordering::SeqCst)
    }

    /// A vCPU that saved its state: waits until the snapshot is written (or the VM stops).
    pub fn hold(&self, stop: &VmStop) {
        let mut state = self.state();
        while self.is_holding() && !stop.is_stopping() {
            state = self.changed.wait_timeout(state, Duration::from_millis(50)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The main thread: the snapshot's outcome; the vCPUs go on.
    pub fn finish(&self, outcome: Result<SnapshotWritten, String>) {
        let mut state = self.state();
        state.outcome = Some(outcome);
        self.holding.store(false, Ordering::SeqCst);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_pause_is_asked_held_and_answered() {
        let (pause, stop) = (Arc::new(SnapshotPause::default()), Arc::new(VmStop::new()));
        let asker = {
            let (pause, stop) = (pause.clone(), stop.clone());
            std::thread::spawn(move || pause.ask(&stop, Duration::from_secs(10)))
        };
        while !pause.is_asked() {
            std::thread::yield_now();
        }
        assert!(pause.is_holding() && pause.take_request() && !pause.is_asked());
        let holder = {
            let (pause, stop) = (pause.clone(), stop.clone());
            std::thread::spawn(move || pause.hold(&stop))
        };
        let written = SnapshotWritten { ms: 1.0, state_bytes: 2, ram_data_bytes: 3 };
        pause.finish(Ok(written.clone()));
        holder.join().unwrap();
        assert_eq!(asker.join().unwrap(), Ok(written));
        assert!(!pause.is_holding());
    }

    #[test]
    fn a_vm_that_stops_ends_the_wait() {
        let (pause, stop) = (SnapshotPause::default(), VmStop::new());
        stop.request(crate::exit::StopCause::PowerOff);
        let why = pause.ask(&stop, Duration::from_secs(10)).unwrap_err();
        assert!(why.contains("stopped before"), "{why}");
        pause.hold(&stop);
    }
}

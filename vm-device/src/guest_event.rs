//! Requests by the guest to end its run, as devices raise them and the VMM receives them.

/// A request by the guest to end the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestEvent {
    /// Power off (S5).
    PowerOff,
    /// Reset the machine.
    Reset,
    /// The guest reported a panic.
    Panic,
}

/// Where devices send [`GuestEvent`]s; the VMM implements it.
pub trait GuestEventSink: Send + Sync {
    /// Records the event; the first one ends the run.
    fn guest_event(&self, event: GuestEvent);
}

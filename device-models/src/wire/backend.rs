//! Where the NIC's frames come from and go to: a host TAP device or a frame generator. A backend
//! is split into a source (read by the model's data-path thread) and a sink (written when the
//! driver transmits).

use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

/// How a source wants to be waited for when it has nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Poll this file descriptor for input.
    Fd(RawFd),
    /// The next frame is due then.
    At(Instant),
    /// Never again (a generator that sent its count).
    Exhausted,
}

/// Frames arriving from the wire.
pub trait FrameSource: Send {
    /// The next frame, or `None` if none is ready now. The frame lives in the source until the
    /// next call (no copy on the way to the NIC).
    fn receive(&mut self) -> io::Result<Option<&[u8]>>;
    /// What to wait for when `receive` had nothing.
    fn readiness(&self) -> Readiness;
    /// True if frames wait for free descriptors (the source is only read when the ring has
    /// room); false if they arrive on their own schedule and are dropped when it has none.
    fn lossless(&self) -> bool;
    /// The largest frame this source produces.
    fn max_frame(&self) -> usize;
    /// Whether the far end of the wire is there (the link can be up).
    fn carrier(&mut self) -> bool;
}

/// Frames leaving for the wire.
pub trait FrameSink: Send {
    /// Sends one frame.
    fn transmit(&mut self, frame: &[u8]) -> io::Result<()>;
}

/// A backend: both directions and a description for logs.
pub struct Backend {
    /// Received frames.
    pub source: Box<dyn FrameSource>,
    /// Transmitted frames.
    pub sink: Box<dyn FrameSink>,
    /// What it is, for logs ("tap dl0", "generator 1514 B flat out").
    pub description: String,
}

/// A backend with no wire: nothing arrives, transmitted frames are counted by the model only.
pub fn unplugged() -> Backend {
    struct Nothing;
    impl FrameSource for Nothing {
        fn receive(&mut self) -> io::Result<Option<&[u8]>> {
            Ok(None)
        }
        fn readiness(&self) -> Readiness {
            Readiness::Exhausted
        }
        fn lossless(&self) -> bool {
            true
        }
        fn max_frame(&self) -> usize {
            1514
        }
        fn carrier(&mut self) -> bool {
            true
        }
    }
    impl FrameSink for Nothing {
        fn transmit(&mut self, _: &[u8]) -> io::Result<()> {
            Ok(())
        }
    }
    Backend { source: Box::new(Nothing), sink: Box::new(Nothing), description: "no backend".into() }
}

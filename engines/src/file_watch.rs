//! Waiting for a file to be written to: how the engines' watchdogs see the guest agent's frames
//! the moment they land in its log (inotify), instead of on their next periodic look, so that
//! the counters of a workload's begin and end are read at the frame. A [`Waker`] ends a wait
//! from another thread at once.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::fs::inotify;

/// What ended a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The file was written to.
    Written,
    /// The [`Waker`] was used.
    Stopped,
    /// The time was up.
    TimedOut,
}

/// A watch on one file's writes, with a waker.
#[derive(Debug)]
pub struct FileWatch {
    inotify: Option<OwnedFd>,
    stop: Arc<OwnedFd>,
}

/// Ends a [`FileWatch::wait`] from another thread, and every wait after it.
#[derive(Debug, Clone)]
pub struct Waker {
    /// An eventfd.
    stop: Arc<OwnedFd>,
}

impl Waker {
    /// Wakes the watch: its current and every later wait returns [`Woken::Stopped`].
    pub fn wake(&self) {
        // Only a counter at its maximum refuses a write, and then the watch is awake anyway.
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
    }
}

impl FileWatch {
    /// A watch on writes to `file` (created empty if it is missing, so that the watch is on the
    /// file the writer opens), or, with `None`, a watch that only times out or is woken.
    pub fn new(file: Option<&Path>) -> io::Result<(FileWatch, Waker)> {
        let stop = Arc::new(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let inotify = match file {
            Some(file) => {
                std::fs::OpenOptions::new().create(true).append(true).open(file)?;
                let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
                inotify::add_watch(&fd, file, inotify::WatchFlags::MODIFY)?;
                Some(fd)
            }
            None => None,
        };
        let waker = Waker { stop: stop.clone() };
        Ok((FileWatch { inotify, stop }, waker))
    }

    /// Waits up to `timeout` for a write to the file or the waker. Writes that came since the
    /// last wait end this one at once; all of them count as one.
    pub fn wait(&self, timeout: Duration) -> Woken {
        let mut fds = vec![PollFd::new(&*self.stop, PollFlags::IN)];
        if let Some(inotify) = &self.inotify {
            fds.push(PollFd::new(inotify, PollFlags::IN));
        }
        let timeout = Timespec::try_from(timeout).unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 });
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(ready) if ready > 0 => {}
            _ => return Woken::TimedOut,
        }
        if !fds[0].revents().is_empty() {
            return Woken::Stopped;
        }
        if let Some(inotify) = &self.inotify {
            // Drain the events: one wake stands for every write so far.
            let mut buf = [0u8; 4096];
            while rustix::io::read(inotify, &mut buf).is_ok_and(|n| n > 0) {}
        }
        Woken::Written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_write_wakes_the_watch_a_waker_stops_it_and_nothing_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.log");
        let (watch, waker) = FileWatch::new(Some(&path)).unwrap();
        assert!(path.exists(), "made empty for the writer");
        assert_eq!(watch.wait(Duration::from_millis(10)), Woken::TimedOut);
        let writer = std::thread::spawn({
            let path = path.clone();
            move || {
                std::thread::sleep(Duration::from_millis(50));
                let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
                file.write_all(b"a").unwrap();
                file.write_all(b"b").unwrap();
            }
        });
        assert_eq!(watch.wait(Duration::from_secs(30)), Woken::Written);
        writer.join().unwrap();
        // The second write may have come after the first wake; either way the watch then waits.
        let _ = watch.wait(Duration::from_millis(1));
        assert_eq!(watch.wait(Duration::from_millis(10)), Woken::TimedOut);
        waker.wake();
        assert_eq!(watch.wait(Duration::from_secs(30)), Woken::Stopped);
        assert_eq!(watch.wait(Duration::from_secs(30)), Woken::Stopped, "and stays stopped");
        let (plain, waker) = FileWatch::new(None).unwrap();
        assert_eq!(plain.wait(Duration::from_millis(1)), Woken::TimedOut);
        waker.wake();
        assert_eq!(plain.wait(Duration::from_secs(30)), Woken::Stopped);
    }
}

//! Failures gathered during the run and the closing `done` line.

use core::cell::UnsafeCell;

use crate::json;

/// Most failures kept; later ones are counted but not listed.
const MAX_FAILURES: usize = 32;
/// Longest failure message kept.
const MAX_MESSAGE: usize = 120;

struct Failure {
    text: [u8; MAX_MESSAGE],
    len: usize,
}

struct Failures {
    items: [Failure; MAX_FAILURES],
    count: usize,
}

/// The probe runs on one CPU at CPL3 and its interrupt stubs never touch this: a plain cell is
/// enough.
struct FailureCell(UnsafeCell<Failures>);

// SAFETY: only the single CPL3 thread of the probe accesses the cell.
unsafe impl Sync for FailureCell {}

static FAILURES: FailureCell = FailureCell(UnsafeCell::new(Failures {
    items: [const { Failure { text: [0; MAX_MESSAGE], len: 0 } }; MAX_FAILURES],
    count: 0,
}));

fn with_failures<R>(f: impl FnOnce(&mut Failures) -> R) -> R {
    // SAFETY: single-threaded; no reference escapes `f`.
    f(unsafe { &mut *FAILURES.0.get() })
}

/// Records a failure made of a message and a detail (e.g. an option name).
pub fn fail_with(message: &str, detail: &str) {
    with_failures(|failures| {
        if failures.count < MAX_FAILURES {
            let item = &mut failures.items[failures.count];
            let mut len = 0;
            for part in [message, detail] {
                for &b in part.as_bytes() {
                    if len < MAX_MESSAGE {
                        item.text[len] = b;
                        len += 1;
                    }
                }
            }
            // Truncation may have split a UTF-8 sequence: back off to a boundary.
            while core::str::from_utf8(&item.text[..len]).is_err() {
                len -= 1;
            }
            item.len = len;
        }
        failures.count += 1;
    });
}

/// Records a failure.
pub fn fail(message: &str) {
    fail_with(message, "");
}

/// Writes `{"probe":"done","ok":BOOL,"failures":[...]}`.
pub fn done() {
    with_failures(|failures| {
        json::section("done", |o| {
            o.bool("ok", failures.count == 0).array("failures", |a| {
                for item in &failures.items[..failures.count.min(MAX_FAILURES)] {
                    a.str(core::str::from_utf8(&item.text[..item.len]).unwrap_or("?"));
                }
            });
            if failures.count > MAX_FAILURES {
                o.u64("failures_not_listed", (failures.count - MAX_FAILURES) as u64);
            }
        })
    });
}

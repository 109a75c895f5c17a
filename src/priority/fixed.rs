//! Where no per-thread raise is tested: a worker's priority is set once at start and
//! never lent.
//!
//! Lending needs a call that raises *another* thread's priority, within limits an
//! unprivileged process can read, and a test that shows it worked. Linux has all three
//! (`setpriority` on a tid, `RLIMIT_NICE`, `/proc`); the other OSes nicework builds for
//! have per-thread calls that act on the calling thread only (macOS's QoS classes,
//! FreeBSD's `rtprio_thread` for another thread needs privilege) or that no machine here
//! can test (Windows' `SetThreadPriority` on another thread's handle). So there the raise
//! limit is `None`: a flusher waits at the worker's priority, and `Metrics::lending`
//! counts every wait as `not_raised`.

use std::io;

/// A thread as lending names it.
pub(crate) type Tid = std::thread::ThreadId;

/// The calling thread.
pub(crate) fn current_tid() -> Tid {
    std::thread::current().id()
}

fn unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "per-thread nice values exist on Linux only",
    )
}

/// Per-thread nice values are Linux's: an error here.
pub(crate) fn set_nice(_tid: Tid, _nice: i32) -> io::Result<()> {
    Err(unsupported())
}

/// No per-thread nice: every thread counts as nice 0, so no waiter ever asks for a raise.
pub(crate) fn current_nice() -> io::Result<i32> {
    Ok(0)
}

/// Whether the calling thread runs under `SCHED_IDLE`: a Linux class.
pub(crate) fn current_is_idle() -> bool {
    false
}

/// No raise is possible (see the module docs).
pub(crate) fn raise_limit() -> Option<i32> {
    None
}

/// Never called while [`raise_limit`] is `None`; an error if it were.
pub(crate) fn raise(_tid: Tid, _nice: i32, _from_idle: bool) -> io::Result<()> {
    Err(unsupported())
}

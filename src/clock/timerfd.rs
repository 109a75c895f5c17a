//! The timerfd the worker threads sleep on.
//!
//! One `CLOCK_MONOTONIC` timerfd per scheduler, opened as two descriptors: the programming
//! end lives in the core (under its lock, so the programmed deadline and the structure
//! never disagree), and each worker owns a `dup` of it to block in `read(2)` without the
//! lock. `timerfd_settime` from any thread re-programs the timer a reader is already
//! blocked on, so arming an earlier deadline needs no extra wakeup fd, and an expiry that
//! happens before the reader blocks is kept in the fd's counter, so none is lost.
//!
//! A hosted scheduler (`build_hosted`) opens its timerfd non-blocking: the host polls the
//! `Driver`'s end for readability, and `run_due` drains it without blocking.

use std::io;
use std::os::fd::{AsFd, FromRawFd, IntoRawFd};
use std::time::Duration;

use timerfd::{ClockId, SetTimeFlags, TimerFd, TimerState};

/// The programming end.
#[derive(Debug)]
pub(crate) struct Sleeper {
    fd: TimerFd,
}

/// A worker's blocking end.
#[derive(Debug)]
pub(crate) struct SleeperReader {
    fd: TimerFd,
}

impl Sleeper {
    /// Disarming the timer wakes no reader blocked on it (see `scheduler::standby`).
    pub(crate) const DISARM_IS_SILENT: bool = true;

    pub(crate) fn new() -> io::Result<Self> {
        Ok(Sleeper {
            fd: TimerFd::new_custom(ClockId::Monotonic, false, true)?,
        })
    }

    /// A timer whose reads never block, for a hosted scheduler's `Driver`.
    pub(crate) fn new_nonblocking() -> io::Result<Self> {
        Ok(Sleeper {
            fd: TimerFd::new_custom(ClockId::Monotonic, true, true)?,
        })
    }

    /// A new descriptor of the same timer for a worker to block on.
    pub(crate) fn reader(&self) -> io::Result<SleeperReader> {
        let owned = self.fd.as_fd().try_clone_to_owned()?;
        // SAFETY: `owned` is a freshly duplicated timerfd descriptor whose ownership we
        // hand over to the new `TimerFd`.
        let fd = unsafe { TimerFd::from_raw_fd(owned.into_raw_fd()) };
        Ok(SleeperReader { fd })
    }

    /// Fires once, `after_ns` from now (at least 1 ns: zero would disarm).
    pub(crate) fn program(&mut self, after_ns: u64) {
        let after = Duration::from_nanos(after_ns.max(1));
        self.fd
            .set_state(TimerState::Oneshot(after), SetTimeFlags::Default);
    }

    /// A timerfd turns readable at the deadline itself, earlier or not: nothing to do.
    #[inline]
    pub(crate) fn signal_host(&self) {}

    pub(crate) fn disarm(&mut self) {
        self.fd
            .set_state(TimerState::Disarmed, SetTimeFlags::Default);
    }
}

impl SleeperReader {
    /// Blocks until the timer fires.
    pub(crate) fn wait(&self) {
        self.fd.read();
    }

    /// Clears a non-blocking timer's expirations, so the descriptor is readable again
    /// only at the next one.
    pub(crate) fn drain(&self) {
        self.fd.read();
    }

    /// A timerfd is readable only once its deadline passed, which `run_due` sees anyway.
    #[inline]
    pub(crate) fn host_signalled(&self) -> bool {
        false
    }
}

impl AsFd for SleeperReader {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

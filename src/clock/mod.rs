//! Time sources.
//!
//! A real scheduler reads `CLOCK_MONOTONIC` (through `Instant`) and sleeps on a timerfd
//! ([`timerfd`]); a manual scheduler has a virtual clock that only
//! [`Scheduler::advance`](crate::Scheduler::advance) moves. Both count nanoseconds from the
//! scheduler's epoch, the `Instant` it was created at, so deadlines are plain `u64`s and
//! saturate instead of overflowing: a delay of `Duration::MAX` is "in 584 years".

pub(crate) mod timerfd;

use std::time::{Duration, Instant};

/// Converts a duration to nanoseconds, saturating at `u64::MAX`.
pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The scheduler's clock.
#[derive(Debug)]
pub(crate) struct Clock {
    epoch: Instant,
    manual: bool,
}

impl Clock {
    pub(crate) fn new(manual: bool) -> Self {
        Clock {
            epoch: Instant::now(),
            manual,
        }
    }

    pub(crate) fn is_manual(&self) -> bool {
        self.manual
    }

    /// Real time since the epoch; manual schedulers keep their own virtual now.
    pub(crate) fn real_now_ns(&self) -> u64 {
        nanos(self.epoch.elapsed())
    }

    /// The `Instant` for a scheduler time, saturating far in the future.
    pub(crate) fn instant_at(&self, ns: u64) -> Instant {
        let offset = Duration::from_nanos(ns);
        self.epoch
            .checked_add(offset)
            .unwrap_or_else(|| self.epoch + Duration::from_secs(u32::MAX.into()))
    }
}

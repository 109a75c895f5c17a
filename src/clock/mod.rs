//! Time sources: `mod.rs` holds the clock (full readings, and manual time's counterpart),
//! `coarse.rs` the cheaper coarse readings the lock-free arming paths take,
//! `touch_tick.rs` the tick a long timeout's touch reads instead of a clock, and the
//! sleeper a worker blocks on (`clock::sleeper`): `timerfd.rs` on Linux, `alarm.rs` (a
//! timed condition-variable wait) on every other OS and on Linux built with
//! `--cfg nicework_portable`.
//!
//! A real scheduler reads `Instant` (`CLOCK_MONOTONIC` on Linux) and sleeps on its timer;
//! a manual scheduler has a virtual clock that only
//! [`Scheduler::advance`](crate::Scheduler::advance) moves. Both count nanoseconds from the
//! scheduler's epoch, so deadlines are plain `u64`s and saturate instead of overflowing.

// The sleeper a worker blocks on: a timerfd on Linux, a timed condition-variable wait
// elsewhere (and on Linux with `--cfg nicework_portable`).
#[cfg(all(target_os = "linux", not(nicework_portable)))]
#[path = "timerfd.rs"]
pub(crate) mod sleeper;
#[cfg(not(all(target_os = "linux", not(nicework_portable))))]
#[path = "alarm.rs"]
pub(crate) mod sleeper;

mod coarse;
pub(crate) mod touch_tick;

use std::time::{Duration, Instant};

use coarse::Coarse;

/// Converts a duration to nanoseconds, saturating at `u64::MAX`.
pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The scheduler's clock.
///
/// Full readings are `Instant::now()` since the epoch `Instant`, so the scheduler's time
/// is exactly `Instant`'s: `sched.now()` is never earlier than an `Instant::now()` read
/// before it, and `deadline()` after `reschedule(d)` never earlier than that
/// `Instant::now() + d`. Coarse readings count from the same epoch (see `coarse`).
#[derive(Debug)]
pub(crate) struct Clock {
    /// The epoch as an `Instant`: the scheduler's time 0.
    epoch: Instant,
    /// The coarse clock, counted from the same epoch.
    coarse: Coarse,
    manual: bool,
}

impl Clock {
    pub(crate) fn new(manual: bool) -> Self {
        let (epoch, coarse) = Coarse::around(Instant::now);
        Clock {
            epoch,
            coarse,
            manual,
        }
    }

    pub(crate) fn is_manual(&self) -> bool {
        self.manual
    }

    /// The scheduler's time 0.
    pub(crate) fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Real time since the epoch, exactly as `Instant` counts it; manual schedulers keep
    /// their own virtual now.
    pub(crate) fn real_now_ns(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.epoch))
    }

    /// A reading of the coarse clock that is never earlier than the real time (see the
    /// module docs).
    #[inline]
    pub(crate) fn coarse_upper_ns(&self) -> u64 {
        self.coarse.upper_ns()
    }

    /// A reading of the coarse clock that is never later than the real time.
    #[inline]
    pub(crate) fn coarse_lower_ns(&self) -> u64 {
        self.coarse.lower_ns()
    }

    /// How much later than the real time [`coarse_upper_ns`](Self::coarse_upper_ns) may
    /// be; `u64::MAX` where there is no coarse clock, so no delay is timed with it.
    #[inline]
    pub(crate) fn coarse_margin_ns(&self) -> u64 {
        self.coarse.margin_ns()
    }

    /// Compares the coarse clock with `precise_ns` (a full reading just taken) and raises
    /// the margin to twice the lag if that is more than the margin.
    pub(crate) fn observe_coarse_lag(&self, precise_ns: u64) {
        self.coarse.observe_lag(precise_ns);
    }

    /// The `Instant` for a scheduler time, saturating far in the future.
    pub(crate) fn instant_at(&self, ns: u64) -> Instant {
        let offset = Duration::from_nanos(ns);
        self.epoch
            .checked_add(offset)
            .unwrap_or_else(|| self.epoch + Duration::from_secs(u32::MAX.into()))
    }
}

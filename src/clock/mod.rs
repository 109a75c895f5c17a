//! Time sources: `mod.rs` holds the clock (full and coarse readings, and manual time's
//! counterpart), `timerfd.rs` the timerfd a worker sleeps on.
//!
//! A real scheduler reads `CLOCK_MONOTONIC` and sleeps on a timerfd ([`timerfd`]); a
//! manual scheduler has a virtual clock that only
//! [`Scheduler::advance`](crate::Scheduler::advance) moves. Both count nanoseconds from the
//! scheduler's epoch, so deadlines are plain `u64`s and saturate instead of overflowing.
//!
//! # The coarse clock
//!
//! The lock-free arming paths (`reschedule`, `schedule`, a timeout work's `touch`) read
//! `CLOCK_MONOTONIC_COARSE` instead: the same time base, as of the last timer tick, read
//! from the vDSO in a few ns where a full read costs up to ten times that on a VM. It lags
//! the real time by one kernel tick on bare metal, but on a VM the CPU that updates it
//! can be descheduled by the host, and lags of four ticks (16 ms at 250 Hz) were measured
//! on the development VM. So [`Clock::coarse_upper_ns`] adds a *margin*: eight ticks and
//! at least 32 ms, raised to twice any lag a worker observes (each worker wakeup reads
//! both clocks and compares). Nothing runs early as long as the coarse clock never lags
//! by more than that margin; a deadline computed from it may be up to the margin late.
//! The arming paths use it only for delays of at least 100 margins, so that lateness is
//! at most 1 % of the delay; shorter delays read the full clock.

pub(crate) mod timerfd;

use std::time::{Duration, Instant};

/// Reads a clock, in nanoseconds.
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks exist on every Linux kernel
    // nicework supports (2.6.32+), so the call cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Reads `CLOCK_MONOTONIC_COARSE` (glibc answers it from the vDSO, no system call).
///
/// rustix's direct vDSO call is a few ns cheaper, but its vDSO lookup crashes under
/// valgrind, which maps the vDSO differently; users run their tests under valgrind, so
/// nicework stays with libc here.
#[inline]
fn read_coarse() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

/// The smallest margin added to coarse readings (see the module docs).
const MIN_COARSE_MARGIN_NS: u64 = 32_000_000;

/// The coarse clock's resolution: how far it may lag the real time.
fn coarse_resolution_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as in `read`.
    let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        // No coarse clock: fall back to a generous bound (a 100 Hz tick).
        return 10_000_000;
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Converts a duration to nanoseconds, saturating at `u64::MAX`.
pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The scheduler's clock.
///
/// Full readings are `Instant::now()` since the epoch `Instant`, so the scheduler's time
/// is exactly `Instant`'s: `sched.now()` is never earlier than an `Instant::now()` read
/// before it, and `deadline()` after `reschedule(d)` never earlier than that
/// `Instant::now() + d`. Coarse readings have no `Instant` form; they count from two raw
/// readings of `CLOCK_MONOTONIC` taken just before and just after the epoch `Instant`,
/// whichever keeps each bound true (see the module docs).
#[derive(Debug)]
pub(crate) struct Clock {
    /// The epoch as an `Instant`: the scheduler's time 0.
    epoch: Instant,
    /// A raw `CLOCK_MONOTONIC` reading taken just before `epoch`: counting from it errs
    /// late (upper bounds).
    epoch_raw_before_ns: u64,
    /// A raw `CLOCK_MONOTONIC` reading taken just after `epoch`: counting from it errs
    /// early (lower bounds).
    epoch_raw_after_ns: u64,
    /// What [`coarse_upper_ns`](Self::coarse_upper_ns) adds to a coarse reading; only
    /// ever raised ([`observe_coarse_lag`](Self::observe_coarse_lag)). A std atomic:
    /// manual schedulers (and so loom models) never use the coarse clock.
    coarse_margin_ns: std::sync::atomic::AtomicU64,
    manual: bool,
}

impl Clock {
    pub(crate) fn new(manual: bool) -> Self {
        let epoch_raw_before_ns = read(libc::CLOCK_MONOTONIC);
        let epoch = Instant::now();
        let epoch_raw_after_ns = read(libc::CLOCK_MONOTONIC);
        Clock {
            epoch,
            epoch_raw_before_ns,
            epoch_raw_after_ns,
            coarse_margin_ns: std::sync::atomic::AtomicU64::new(
                coarse_resolution_ns()
                    .saturating_mul(8)
                    .max(MIN_COARSE_MARGIN_NS),
            ),
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
        read_coarse()
            .saturating_sub(self.epoch_raw_before_ns)
            .saturating_add(self.coarse_margin_ns())
    }

    /// A reading of the coarse clock that is never later than the real time.
    #[inline]
    pub(crate) fn coarse_lower_ns(&self) -> u64 {
        read_coarse().saturating_sub(self.epoch_raw_after_ns)
    }

    /// How much later than the real time [`coarse_upper_ns`](Self::coarse_upper_ns) may be.
    #[inline]
    pub(crate) fn coarse_margin_ns(&self) -> u64 {
        self.coarse_margin_ns
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Compares the coarse clock with `precise_ns` (a full reading just taken) and raises
    /// the margin to twice the lag if that is more than the margin.
    pub(crate) fn observe_coarse_lag(&self, precise_ns: u64) {
        let lag = precise_ns.saturating_sub(self.coarse_lower_ns());
        if lag.saturating_mul(2) > self.coarse_margin_ns() {
            self.coarse_margin_ns
                .fetch_max(lag.saturating_mul(2), std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The `Instant` for a scheduler time, saturating far in the future.
    pub(crate) fn instant_at(&self, ns: u64) -> Instant {
        let offset = Duration::from_nanos(ns);
        self.epoch
            .checked_add(offset)
            .unwrap_or_else(|| self.epoch + Duration::from_secs(u32::MAX.into()))
    }
}

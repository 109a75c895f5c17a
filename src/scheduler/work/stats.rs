//! Per-work statistics: the columns of the kernel patch's `task_mm_cid_work` table.
//!
//! Only the thread running the work writes them (runs are exclusive), so each field is a
//! load and a store, never a read-modify-write. A snapshot may mix the timings of two
//! adjacent runs, and a run's timings may show before its count does; but the counts
//! agree with each other: `parks <= runs` in every snapshot (see
//! [`StatsCounters::count_run`]).
//!
//! The two maxima share one word as two 32-bit [`Approx`] values (exact below 16.7 ms,
//! then within one part in 16 million, always rounded down), which keeps a work's header
//! at 72 bytes.

use std::time::{Duration, Instant};

use super::WorkRef;
use crate::scheduler::shared::Shared;
use crate::sync::{AtomicU64, Ordering};

/// A snapshot of a work's statistics, from [`Work::stats`](crate::Work::stats).
///
/// Taken without a lock while the work may be running: the counts agree with each other
/// (`parks <= runs`, and each only grows), but the timings may include a run that is not
/// counted in `runs` yet, or mix two adjacent runs.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Scheduler};
///
/// let sched = Scheduler::manual();
/// let work = sched.every(Duration::from_millis(10), |_| Next::Park);
/// sched.advance(Duration::from_millis(10));
/// let stats = work.stats();
/// assert_eq!((stats.runs, stats.parks), (1, 1));
/// assert!(stats.last_run.is_some());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WorkStats {
    /// Completed runs, including ones that panicked.
    pub runs: u64,
    /// Runs that returned [`Next::Park`](crate::Next::Park).
    pub parks: u64,
    /// Wall time spent in the callback, summed over all runs.
    pub busy_total: Duration,
    /// The longest single run.
    pub busy_max: Duration,
    /// The largest delay between a deadline and the start of its run.
    pub lateness_max: Duration,
    /// When the latest run started (in the scheduler's clock: virtual for `manual()`).
    pub last_run: Option<Instant>,
}

impl WorkStats {
    /// Mean time per run, or zero before the first run.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(nicework::WorkStats::default().busy_avg(), std::time::Duration::ZERO);
    /// ```
    pub fn busy_avg(&self) -> Duration {
        match u32::try_from(self.runs) {
            Ok(0) => Duration::ZERO,
            Ok(runs) => self.busy_total / runs,
            Err(_) => {
                Duration::from_nanos((self.busy_total.as_nanos() / u128::from(self.runs)) as u64)
            }
        }
    }
}

/// A work's statistics; each field is `A:` (see the [`scheduler`](crate::scheduler)
/// module's legend of guard tags). Relaxed loads and
/// stores, no read-modify-write: each field has one writer at a time.
#[derive(Debug)]
pub(crate) struct StatsCounters {
    /// A: completed runs; written under the core lock as a run completes (`count_run`).
    runs: AtomicU64,
    parks: AtomicU64,
    busy_total_ns: AtomicU64,
    /// The longest run (high half) and the largest lateness (low half), as [`Approx`].
    maxima: AtomicU64,
    /// Start of the latest run in scheduler ns, plus one (zero: never ran).
    last_run_ns: AtomicU64,
}

impl StatsCounters {
    pub(crate) fn new() -> Self {
        StatsCounters {
            runs: AtomicU64::new(0),
            parks: AtomicU64::new(0),
            busy_total_ns: AtomicU64::new(0),
            maxima: AtomicU64::new(0),
            last_run_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Counts a completed run, and whether it parked; called under the core lock, as the
    /// run completes. `runs` is stored before `parks` and [`snapshot`](Self::snapshot)
    /// loads them in the other order (release and acquire), so a snapshot that sees a
    /// run's park also sees the run: `parks <= runs` in every snapshot.
    pub(crate) fn count_run(&self, parked: bool) {
        self.runs
            .store(self.runs.load(Ordering::Relaxed) + 1, Ordering::Release);
        if parked {
            self.parks
                .store(self.parks.load(Ordering::Relaxed) + 1, Ordering::Release);
        }
    }

    /// Records a run's timings; only the thread that ran it calls this.
    pub(crate) fn record(&self, started_ns: u64, busy: Duration, lateness_ns: u64) {
        let busy_ns = u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX);
        let bump = |field: &AtomicU64, by: u64| {
            field.store(
                field.load(Ordering::Relaxed).saturating_add(by),
                Ordering::Relaxed,
            )
        };
        // Unconditional stores: busy time is wall-clock, and a branch on it would make the
        // sequence of atomic operations differ between loom executions.
        let maxima = self.maxima.load(Ordering::Relaxed);
        let busy_max = ((maxima >> 32) as u32).max(Approx::encode(busy_ns));
        let lateness_max = (maxima as u32).max(Approx::encode(lateness_ns));
        self.maxima.store(
            (u64::from(busy_max) << 32) | u64::from(lateness_max),
            Ordering::Relaxed,
        );
        bump(&self.busy_total_ns, busy_ns);
        self.last_run_ns
            .store(started_ns.saturating_add(1), Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, instant_at: impl Fn(u64) -> Instant) -> WorkStats {
        let last = self.last_run_ns.load(Ordering::Relaxed);
        let maxima = self.maxima.load(Ordering::Relaxed);
        // `parks` first: see `count_run`.
        let parks = self.parks.load(Ordering::Acquire);
        let runs = self.runs.load(Ordering::Acquire);
        WorkStats {
            runs,
            parks,
            busy_total: Duration::from_nanos(self.busy_total_ns.load(Ordering::Relaxed)),
            busy_max: Duration::from_nanos(Approx::decode((maxima >> 32) as u32)),
            lateness_max: Duration::from_nanos(Approx::decode(maxima as u32)),
            last_run: last.checked_sub(1).map(instant_at),
        }
    }
}

/// A nanosecond count in 32 bits: an 8-bit shift and a 24-bit mantissa. Exact below
/// 2^24 ns (16.7 ms), then rounded down to 24 significant bits. Encodings order like the
/// values they encode, so a maximum is a plain integer `max`.
struct Approx;

impl Approx {
    fn encode(ns: u64) -> u32 {
        let bits = 64 - ns.leading_zeros();
        let shift = bits.saturating_sub(24);
        (shift << 24) | (ns >> shift) as u32
    }

    fn decode(encoded: u32) -> u64 {
        u64::from(encoded & 0x00FF_FFFF) << (encoded >> 24)
    }
}

impl Shared {
    /// A snapshot of `work`'s statistics: what `Work::stats` shows.
    pub(crate) fn stats_of(&self, work: &WorkRef) -> WorkStats {
        work.header().stats.snapshot(|ns| self.instant_at(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::Approx;

    #[test]
    fn approx_is_exact_for_small_values_and_never_rounds_up() {
        for ns in [0, 1, 999, (1 << 24) - 1] {
            assert_eq!(Approx::decode(Approx::encode(ns)), ns);
        }
        for ns in [
            1 << 24,
            250_000_000,
            1_000_000_000,
            3_600_000_000_123,
            u64::MAX,
        ] {
            let back = Approx::decode(Approx::encode(ns));
            assert!(back <= ns && ns - back <= ns >> 23, "{ns} -> {back}");
        }
        assert_eq!(Approx::decode(Approx::encode(250_000_000)), 250_000_000);
    }

    #[test]
    fn approx_keeps_order() {
        let values = [0u64, 5, 1 << 24, (1 << 24) + 7, 1 << 40, u64::MAX];
        for pair in values.windows(2) {
            assert!(Approx::encode(pair[0]) <= Approx::encode(pair[1]));
        }
    }
}

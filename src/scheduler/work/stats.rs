//! Per-work statistics: the columns of the kernel patch's `task_mm_cid_work` table.
//!
//! Only the thread running the work writes them (runs are exclusive), so each field is a
//! load and a store, never a read-modify-write. A snapshot may mix the timings of two
//! adjacent runs, and a run's timings may show before its count does; but the counts
//! agree with each other: `parks <= runs` in every snapshot (see
//! [`StatsCounters::count_run`]).
//!
//! The two maxima share one word as two 22-bit [`Approx`] values (exact below 65 µs,
//! then within one part in 65,536, always rounded down), and with them the live timer
//! entry's placement that the lock-free arm reads (see [`entry`](super::entry)), which
//! keeps a work's header at 72 bytes. The word has two writers, the running thread (the
//! maxima) and the core lock's holder (the placement), so each edits its own bits with a
//! compare-and-swap.

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

/// A work's statistics; each field is `A:` (see the legend of guard tags in `sync`).
/// Relaxed loads and stores, no read-modify-write: each field has one writer at a time,
/// but for the word the maxima share with the placement (see the module docs).
#[derive(Debug)]
pub(crate) struct StatsCounters {
    /// A: completed runs; written under the core lock as a run completes (`count_run`).
    runs: AtomicU64,
    /// Runs that parked (bits 0..48, saturating) and the work's leeway (bits 48..64, as
    /// [`LeewayCode`](super::leeway::LeewayCode) encodes it); both written under the core
    /// lock only, so a load and a store each.
    parks_and_leeway: AtomicU64,
    busy_total_ns: AtomicU64,
    /// The live timer entry's placement (bits 44..64, written under the core lock, see
    /// [`entry`](super::entry)), the longest run (bits 22..44) and the largest lateness
    /// (bits 0..22), each as an [`Approx`] (written by the running thread).
    maxima_and_placement: AtomicU64,
    /// Start of the latest run in scheduler ns, plus one (zero: never ran).
    last_run_ns: AtomicU64,
}

impl StatsCounters {
    pub(crate) fn new() -> Self {
        StatsCounters {
            runs: AtomicU64::new(0),
            parks_and_leeway: AtomicU64::new(0),
            busy_total_ns: AtomicU64::new(0),
            maxima_and_placement: AtomicU64::new(0),
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
            let word = self.parks_and_leeway.load(Ordering::Relaxed);
            if word & PARKS_MASK != PARKS_MASK {
                self.parks_and_leeway.store(word + 1, Ordering::Release);
            }
        }
    }

    /// The work's leeway, encoded (0: none beyond the scheduler's slack).
    #[inline]
    pub(crate) fn leeway_code(&self) -> u16 {
        (self.parks_and_leeway.load(Ordering::Relaxed) >> LEEWAY_SHIFT) as u16
    }

    /// Sets the work's leeway; under the core lock, the only place the word is written.
    pub(crate) fn set_leeway_code(&self, code: u16) {
        let word = self.parks_and_leeway.load(Ordering::Relaxed);
        self.parks_and_leeway.store(
            (word & PARKS_MASK) | (u64::from(code) << LEEWAY_SHIFT),
            Ordering::Release,
        );
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
        let (busy, lateness) = (Approx::encode(busy_ns), Approx::encode(lateness_ns));
        self.edit_shared_word(|word| {
            let busy_max = Approx::field(word, BUSY_SHIFT).max(busy);
            let lateness_max = Approx::field(word, LATENESS_SHIFT).max(lateness);
            (word & PLACEMENT_MASK) | (busy_max << BUSY_SHIFT) | (lateness_max << LATENESS_SHIFT)
        });
        bump(&self.busy_total_ns, busy_ns);
        self.last_run_ns
            .store(started_ns.saturating_add(1), Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, instant_at: impl Fn(u64) -> Instant) -> WorkStats {
        let last = self.last_run_ns.load(Ordering::Relaxed);
        let maxima = self.maxima_and_placement.load(Ordering::Relaxed);
        // `parks` first: see `count_run`.
        let parks = self.parks_and_leeway.load(Ordering::Acquire) & PARKS_MASK;
        let runs = self.runs.load(Ordering::Acquire);
        WorkStats {
            runs,
            parks,
            busy_total: Duration::from_nanos(self.busy_total_ns.load(Ordering::Relaxed)),
            busy_max: Duration::from_nanos(Approx::decode(Approx::field(maxima, BUSY_SHIFT))),
            lateness_max: Duration::from_nanos(Approx::decode(Approx::field(
                maxima,
                LATENESS_SHIFT,
            ))),
            last_run: last.checked_sub(1).map(instant_at),
        }
    }

    /// The live timer entry's placement, as [`entry::Placement`](super::entry::Placement)
    /// encodes it (acquire: after the state word that named its epoch).
    #[inline]
    pub(crate) fn placement(&self) -> u32 {
        (self.maxima_and_placement.load(Ordering::Acquire) >> PLACEMENT_SHIFT) as u32
    }

    /// Records where the live entry was placed; under the core lock, after the CAS that
    /// made the entry live.
    pub(crate) fn set_placement(&self, placement: u32) {
        self.edit_shared_word(|word| {
            (word & !PLACEMENT_MASK) | (u64::from(placement) << PLACEMENT_SHIFT)
        });
    }

    /// Applies `edit` to the word the maxima share with the placement: a CAS loop, as
    /// each of its two writers changes only its own bits.
    fn edit_shared_word(&self, edit: impl Fn(u64) -> u64) {
        let word = &self.maxima_and_placement;
        let mut old = word.load(Ordering::Relaxed);
        loop {
            match word.compare_exchange_weak(old, edit(old), Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => old = now,
            }
        }
    }
}

/// Where the leeway sits in the parks word: its top 16 bits.
const LEEWAY_SHIFT: u32 = 48;
/// The parks count's bits (it saturates there: 2.8e14 parks).
const PARKS_MASK: u64 = (1 << LEEWAY_SHIFT) - 1;
/// Where the lateness maximum sits in the shared word.
const LATENESS_SHIFT: u32 = 0;
/// Where the busy maximum sits in the shared word.
const BUSY_SHIFT: u32 = APPROX_BITS;
/// Where the placement sits in the shared word: its top bits.
const PLACEMENT_SHIFT: u32 = 2 * APPROX_BITS;
const PLACEMENT_MASK: u64 = !((1 << PLACEMENT_SHIFT) - 1);
/// Bits of one [`Approx`].
const APPROX_BITS: u32 = 22;

/// A nanosecond count in 22 bits: a 6-bit shift and a 16-bit mantissa. Exact below
/// 2^16 ns (65 µs), then rounded down to 16 significant bits (within one part in
/// 65,536). Encodings order like the values they encode, so a maximum is a plain integer
/// `max`.
struct Approx;

impl Approx {
    const MANTISSA_BITS: u32 = 16;

    fn encode(ns: u64) -> u64 {
        let bits = 64 - ns.leading_zeros();
        let shift = bits.saturating_sub(Self::MANTISSA_BITS);
        (u64::from(shift) << Self::MANTISSA_BITS) | (ns >> shift)
    }

    fn decode(encoded: u64) -> u64 {
        (encoded & ((1 << Self::MANTISSA_BITS) - 1)) << (encoded >> Self::MANTISSA_BITS)
    }

    /// The encoding at `shift` in a shared word.
    fn field(word: u64, shift: u32) -> u64 {
        (word >> shift) & ((1 << APPROX_BITS) - 1)
    }
}

// === `impl Shared`, this file's part: a work's statistics snapshot. ===
impl Shared {
    /// A snapshot of `work`'s statistics: what `Work::stats` shows.
    pub(crate) fn stats_of(&self, work: &WorkRef) -> WorkStats {
        work.header().stats.snapshot(|ns| self.instant_at(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::{Approx, StatsCounters};
    use std::time::Duration;

    #[test]
    fn the_maxima_and_the_placement_keep_each_others_bits() {
        let stats = StatsCounters::new();
        stats.set_placement((1 << 20) - 1);
        stats.record(5, Duration::from_nanos(u64::MAX), u64::MAX);
        assert_eq!(stats.placement(), (1 << 20) - 1);
        stats.set_placement(3);
        let snapshot = stats.snapshot(|_| std::time::Instant::now());
        assert!(snapshot.busy_max > Duration::from_secs(1 << 33));
        assert!(snapshot.lateness_max > Duration::from_secs(1 << 33));
        assert_eq!(stats.placement(), 3);
    }

    #[test]
    fn approx_is_exact_for_small_values_and_never_rounds_up() {
        for ns in [0, 1, 999, (1 << 16) - 1, 3 << 40] {
            assert_eq!(Approx::decode(Approx::encode(ns)), ns);
        }
        for ns in [
            (1 << 16) + 1,
            250_000_000,
            1_000_000_000,
            3_600_000_000_123,
            u64::MAX,
        ] {
            let encoded = Approx::encode(ns);
            assert!(encoded < 1 << super::APPROX_BITS, "{ns} fits");
            let back = Approx::decode(encoded);
            assert!(back <= ns && ns - back <= ns >> 15, "{ns} -> {back}");
        }
    }

    #[test]
    fn approx_keeps_order() {
        let values = [0u64, 5, 1 << 24, (1 << 24) + 7, 1 << 40, u64::MAX];
        for pair in values.windows(2) {
            assert!(Approx::encode(pair[0]) <= Approx::encode(pair[1]));
        }
    }
}

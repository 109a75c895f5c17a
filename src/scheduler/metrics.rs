//! [`Metrics`]: one snapshot of a scheduler's diagnostics.
//!
//! Everything is read under the core lock at one moment, except the wakeup count, which
//! is read right after (a counter the lock does not cover: see `wakeups`).

use crate::scheduler::shared::Shared;
use crate::scheduler::wait::lending::LendingStats;

/// A snapshot of a scheduler's diagnostics, from [`Scheduler::metrics`].
///
/// It may grow fields in later versions (`#[non_exhaustive]`).
///
/// [`Scheduler::metrics`]: crate::Scheduler::metrics
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Works armed now (waiting for their deadline or due). Counted by a pass over the
    /// timer entries, so reading it costs time in proportion to them: a diagnostic, not
    /// something to poll on a hot path.
    pub armed: usize,
    /// Entries in the timer structure: the armed works plus stale entries (of works
    /// cancelled, re-armed earlier or dropped) that leave when their tick comes or in
    /// the next sweep. It stays below about twice the armed works plus a constant.
    pub timer_entries: usize,
    /// How many times the worker threads went to sleep and woke up so far (0 for a manual
    /// or hosted scheduler). On Linux the sum of their `voluntary_ctxt_switches` in
    /// `/proc/self/task/TID/status`; elsewhere the workers' own count of the times their
    /// timed and idle waits returned. With every work parked it stays flat.
    pub worker_wakeups: u64,
    /// `Yield` increments the workers deferred because more threads were runnable than
    /// there are CPUs (see [`Builder::back_off`](crate::Builder::back_off)).
    pub deferred_yields: u64,
    /// Callbacks that panicked so far, each caught, reported as a `tracing` error event,
    /// and its work poisoned ([`Work::is_poisoned`](crate::Work::is_poisoned)); the other
    /// works carried on.
    pub panics: u64,
    /// How flushes lent their priority: runs they executed themselves, runs in progress
    /// they raised, runs they only waited for.
    pub lending: LendingStats,
}

impl Metrics {
    /// Reads the snapshot. In a `fork()`ed child (where the lock may be held by a thread
    /// that is gone) it is all zeros.
    pub(super) fn read(shared: &Shared) -> Metrics {
        let Some(core) = shared.lock_unless_forked() else {
            return Metrics::default();
        };
        let mut metrics = Metrics {
            armed: shared.count_armed(&core),
            timer_entries: core.wheel.len(),
            worker_wakeups: 0,
            deferred_yields: core.deferred_yields,
            panics: core.panics,
            lending: core.lending.stats,
        };
        drop(core);
        metrics.worker_wakeups = shared.wakeups.read();
        metrics
    }
}

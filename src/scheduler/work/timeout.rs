//! Idle timeouts: works that run once `idle` has passed without activity.
//!
//! # Idle timeout vs periodic maintenance
//!
//! - [`every`](crate::Scheduler::every) is periodic maintenance: *activity wakes* a parked work
//!   (`touch()` arms it for its period) and the callback decides whether to re-arm. Use it
//!   for a purge, a compaction, a flush of dirty state: work to do *because* something
//!   happened.
//! - [`timeout`](crate::Scheduler::timeout) is an idle timeout: *activity postpones* the run.
//!   Use it to close a connection, drop a session or evict an entry once it has been left
//!   alone: work to do because *nothing* happened.
//!
//! # Rules
//!
//! An armed timeout work is due at the later of its deadline (set at creation to
//! now + idle, or by `schedule`/`reschedule`, `Next::Again` = now + idle,
//! `Next::After(d)`) and its latest `touch()` + idle. So the callback never runs while the
//! work was touched within the last `idle`.
//!
//! "Touched" means a `touch()` that returned before the run began (before `is_running()`
//! turned true). A touch still in progress as a run begins, like one during the run,
//! cannot hold that run back (the callback may begin just after it returns); it
//! re-arms the work for touch + idle when the run ends.
//!
//! - `touch()` on an armed (or running) timeout work records the time and takes no lock:
//!   a few atomic loads, a clock read (see "Precision") and a compare, plus one
//!   `fetch_max` when the time read has moved past the recorded stamp. It never touches
//!   the timer structure and wakes nothing.
//! - The timer entry stays where it was. When it fires before the postponed deadline, the
//!   worker places it again for the rest, without calling the callback; that is not a run
//!   in the stats.
//! - `touch()` on a parked timeout work arms it for now + idle; after `Next::Stop` or
//!   `cancel_sync` it does nothing (as for every work).
//! - A touch during a run is never lost: the work ends armed, due no earlier than that
//!   touch + idle, whatever the callback returned, except `Stop`, a cancellation or a
//!   panic.
//!
//! # Precision: one rule for every idle
//!
//! - **Never early:** a timeout runs no earlier than its last touch + idle.
//! - **Late by at most `max(slack, idle / 100)`** after that, plus the time its worker
//!   waits for a CPU (a nice-19 worker on a busy machine). On a real scheduler, an idle
//!   long enough that the coarse clock's margin is at most 1/100 of it (on Linux 100 ×
//!   32 ms = 3.2 s, more on a VM whose coarse clock lags) stamps touches with the coarse
//!   clock's upper reading, which errs late by up to that margin and never early (see
//!   `clock`); shorter idles, every idle elsewhere, and every idle on a manual scheduler
//!   read the full clock, and the reap waits only for the slack.
//! - **Touches cost no wakeups:** a touch stores a stamp and wakes nothing. While a work
//!   is touched, its timer entry fires at most once per idle (at the deadline it was
//!   placed for, to place itself again for the rest); left alone, it wakes a worker once,
//!   for the reap. Entries due within one slack of each other share a wakeup.
//!
//! A coarse stamp moves once per kernel tick, so a work touched from many threads takes
//! one `fetch_max` per tick, not one per touch.

use super::WorkRef;
use crate::scheduler::shared::Shared;
use crate::scheduler::work::state::units_ceil;
use crate::sync::{Ordering, load_ordered_after_seqcst_writes};

/// A timeout work's touch stamp is the time of its latest touch + 1, or 0 if never
/// touched; this high bit, set at creation and kept by every touch, says its touches
/// read the coarse clock.
pub(super) const COARSE_TOUCH: u64 = 1 << 63;

// === `impl Shared`, this file's part: a timeout work's lock-free touch and when a touched
// work is due. ===
impl Shared {
    /// A timeout work's postponement: due no earlier than this (units) by its latest
    /// touch; 0 for other works.
    pub(crate) fn postponed_to(&self, work: &WorkRef) -> u64 {
        if !work.header().state.load().is_timeout() {
            return 0;
        }
        let stamp = work.header().period_or_touch.load(Ordering::Acquire);
        touch_due(stamp, work.period_ns())
    }

    /// A timeout work's touch: records the time (the coarse clock's upper reading for a
    /// long idle, else the full clock), raising the stamp only when the time read moved
    /// past it, and arms the work only if it is neither armed nor running.
    ///
    /// Ordering: the stamp's `fetch_max` comes before a `SeqCst` re-read of the state
    /// word, and both the worker's decision to run (it sets `FIRING`, then reads the
    /// stamp) and a run's completion (it clears `RUNNING`, then reads the stamp) do the
    /// mirror image. So either they see the new stamp, or this touch sees their state
    /// change: it clears `FIRING` (the worker's take then fails and decides again) or
    /// finds the work neither armed nor running and arms it itself.
    #[inline(always)]
    pub(crate) fn touch_timeout(&self, work: &WorkRef) {
        // No fork gate here: recording a stamp in a forked child's copy is harmless, and
        // the slow path below has the gate.
        let stamp_word = &work.header().period_or_touch;
        let recorded = load_ordered_after_seqcst_writes(stamp_word);
        let coarse = recorded & COARSE_TOUCH;
        let time = if coarse != 0 {
            self.clock.coarse_upper_ns()
        } else {
            self.now_ns()
        };
        // A stamp is the time + 1, so 0 means "never touched", and it stays below the
        // flag bit (a saturated virtual clock reads u64::MAX).
        let stamp = (time.min(COARSE_TOUCH - 2) + 1) | coarse;
        if stamp > recorded {
            stamp_word.fetch_max(stamp, Ordering::SeqCst);
        }
        // Read after the stamp, also when another touch recorded the same one: if the
        // worker set FIRING before this read, it may have read the stamp before that other
        // touch stored it, so this touch clears FIRING too, and the worker decides again.
        let state = work.header().state.load_after_seqcst_writes();
        if state.is_firing() {
            work.header().state.clear_firing();
        }
        if state.is_pending_or_running() {
            return;
        }
        self.touch_slow(work);
    }

    /// A timeout work stamped `stamp` is taken to run without a decision that read its
    /// stamp (a flush). A touch during the run may read the same coarse time as the touch
    /// before it (the coarse clock moves once per kernel tick) and would store nothing, so
    /// the run's completion would miss it: the stamp is lowered by one nanosecond (still
    /// never early: it is rounded up by the coarse margin, milliseconds), and any touch
    /// from now on stores a higher one. Returns the stamp the run is taken with; a touch
    /// that raised the stamp meanwhile keeps it, and counts as a touch during the run.
    pub(crate) fn taking_timeout_run(&self, work: &WorkRef, stamp: u64) -> u64 {
        if stamp & COARSE_TOUCH == 0 || stamp & !COARSE_TOUCH <= 1 {
            return stamp;
        }
        match work.header().period_or_touch.compare_exchange(
            stamp,
            stamp - 1,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => stamp - 1,
            Err(_) => stamp,
        }
    }

    /// Whether a timeout work with this idle duration stamps its touches with the coarse
    /// clock: a real scheduler, and an idle long enough that the coarse clock's margin is
    /// at most 1/100 of it (see `clock`).
    pub(super) fn coarse_touch(&self, idle_ns: u64) -> bool {
        self.coarse_for(idle_ns)
    }
}

/// When a work touched at `stamp` may run (units): 0 if it was never touched, else its
/// touch + `idle_ns`.
pub(crate) fn touch_due(stamp: u64, idle_ns: u64) -> u64 {
    let Some(touched) = (stamp & !COARSE_TOUCH).checked_sub(1) else {
        return 0;
    };
    units_ceil(touched.saturating_add(idle_ns))
}

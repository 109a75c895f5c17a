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
//!   a few atomic loads and a compare (an idle of 1 s or more reads the scheduler's
//!   touch tick, a shorter one the clock), plus one `fetch_max` when the tick or clock
//!   has moved since the last recorded touch. It never touches the timer structure.
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
//! - **Never early:** the callback runs no earlier than the last touch + idle.
//! - **Late by at most `idle / 16 + leeway`** after that (the leeway is the slack unless
//!   the work has a longer one, see `leeway`), plus the time the worker waits for a CPU
//!   (a nice-19 worker on a busy machine).
//! - **Wakeups:** left alone, a timeout wakes a worker only for its reap. While touched,
//!   its timer fires at most once per idle (to place itself again), and a timeout that
//!   stamps with the touch tick keeps it moving: one refresh per tick interval (the
//!   shortest any live timeout asks for), shared by all of them.
//!
//! A timeout needs a refresh of the touch tick every `max(idle / 16, leeway / 2)`; where
//! that is at least 62.5 ms (an idle of 1 s or more, or a leeway of 125 ms or more) on a
//! real scheduler, its touches are stamped with the tick (see `clock::touch_tick`): no
//! clock is read, and a stamp counts as the time the tick after it was published, so
//! the reap may be up to one interval late and never early. When half the leeway sets
//! the interval, the window after the reap keeps the other half (see `leeway`), so the
//! lateness stays within `idle / 16 + leeway`. Other timeouts read the full clock, and
//! their reaps are rounded up to a multiple of 1/16 of their idle: the same allowance,
//! so lateness has no step where ticks begin (only the refresher's wakeups start
//! there), and reaps due close together share a wakeup. A manual scheduler reads its
//! virtual clock and rounds nothing, so tests see exact times.
//!
//! So a cache whose maintenance must not hold its lock while writers want it runs that
//! maintenance as a timeout every write touches, with the leeway the maintenance can
//! afford: `sched.timeout(Duration::from_millis(300), drain).leeway(Duration::from_millis(150))`
//! runs the drain once writes stop for 300 ms, at most about 170 ms later, and each
//! write's touch reads no clock.

use super::{Header, WorkRef};
use crate::clock::nanos as nanos_of;
use crate::clock::touch_tick::TICK_MIN_INTERVAL_NS;
use crate::scheduler::shared::{Core, Shared};
use crate::scheduler::work::state::units_ceil;
use crate::sync::{Ordering, load_ordered_after_seqcst_writes};

/// A timeout work's touch stamp (the time of its latest touch + 1, or 0 if never
/// touched): the high bit says it is recorded with the full clock.
pub(super) const PRECISE_TOUCH: u64 = 1 << 63;

/// A timeout may run up to this part of its idle late (besides its leeway).
pub(crate) const IDLE_PARTS: u64 = 16;

// === `impl Shared`, this file's part: a timeout work's lock-free touch and when a touched
// work is due. ===
impl Shared {
    /// A timeout work's postponement: due no earlier than this (units) by its latest
    /// touch; 0 for other works.
    ///
    /// A read: it never publishes a tick (see `clock::touch_tick`), and in a `fork()`ed child
    /// (where the tick's lock may be held by a thread that is gone) a tick stamp counts
    /// as touched now.
    pub(crate) fn postponed_to(&self, work: &WorkRef) -> u64 {
        if !work.header().state.load().is_timeout() {
            return 0;
        }
        let stamp = work.header().period_or_touch.load(Ordering::Acquire);
        due_after_touch(stamp, work.period_ns(), self.coalesces_reaps(), |tick| {
            let now = self.now_ns();
            if self.is_forked_copy() {
                now
            } else {
                self.touch_tick.read_upper_time_ns(tick, now)
            }
        })
    }

    /// A timeout work's touch: records the time (the touch tick for a long idle, else the
    /// full clock), raising the stamp at most once per tick, and arms the work only if it
    /// is neither armed nor running.
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
        let precise = recorded & PRECISE_TOUCH;
        // A tick stamp is the tick (from 1); a full-clock stamp is the time + 1. So 0
        // means "never touched", and stamps stay below the precision bit (a saturated
        // virtual clock reads u64::MAX).
        let stamp = if precise == 0 {
            self.touch_tick.current()
        } else {
            (self.now_ns().min(PRECISE_TOUCH - 2) + 1) | precise
        };
        let stored = stamp > recorded;
        if stored {
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
            // Only a touch that postpones something keeps the tick moving: a stopped or
            // parked work's touch costs no refresh.
            if stored && precise == 0 && self.touch_tick.note_touch() {
                self.wake_touch_tick();
            }
            return;
        }
        self.touch_slow(work);
    }

    /// Whether this timeout work's touches are stamped with the touch tick.
    pub(crate) fn stamps_with_ticks(&self, work: &WorkRef) -> bool {
        Self::stamp_is_a_tick(work.header())
    }

    /// Whether a timeout work's header holds a tick stamp.
    #[inline]
    pub(crate) fn stamp_is_a_tick(header: &Header) -> bool {
        header.period_or_touch.load(Ordering::Relaxed) & PRECISE_TOUCH == 0
    }

    /// A timeout work stamped `stamp` is taken to run without a decision that read its
    /// stamp (a flush): the tick moves past the stamp, so a touch during the run is seen
    /// by the run's completion (see `clock::touch_tick`).
    pub(crate) fn taking_timeout_run(&self, stamp: u64) {
        if stamp & PRECISE_TOUCH == 0 {
            self.touch_tick.move_past(stamp, || self.now_ns());
        }
    }

    /// When a timeout work touched at `stamp` may run (units): never earlier than the
    /// true touch + idle. A tick stamp counts as the time its next tick was published
    /// (see `clock::touch_tick`), which may publish that tick now.
    pub(crate) fn touch_due(&self, stamp: u64, idle_ns: u64) -> u64 {
        due_after_touch(stamp, idle_ns, self.coalesces_reaps(), |tick| {
            self.touch_tick.upper_time_ns(tick, || self.now_ns())
        })
    }

    /// Whether a full-clock stamp's reap is coalesced to 1/16 of its idle (see "Precision"
    /// in the module docs): on real schedulers; a manual scheduler's tests expect exact
    /// times.
    fn coalesces_reaps(&self) -> bool {
        !self.clock.is_manual()
    }
}

/// When a work touched at `stamp` may run (units): 0 if it was never touched (either kind
/// of stamp), else its touch + `idle_ns`, the touch being a full-clock stamp's time or
/// `tick_bound` of a tick stamp. With `coalesce`, a full-clock stamp's due time is rounded
/// up to a multiple of 1/16 of the idle, the lateness a tick stamp may have: reaps due
/// close together share a wakeup, and one rule bounds both kinds.
fn due_after_touch(
    stamp: u64,
    idle_ns: u64,
    coalesce: bool,
    tick_bound: impl FnOnce(u64) -> u64,
) -> u64 {
    let Some(clock_stamp) = (stamp & !PRECISE_TOUCH).checked_sub(1) else {
        return 0;
    };
    if stamp & PRECISE_TOUCH == 0 {
        return units_ceil(tick_bound(stamp).saturating_add(idle_ns));
    }
    let due = clock_stamp.saturating_add(idle_ns);
    let granule = idle_ns / IDLE_PARTS;
    if coalesce && granule > 1 {
        units_ceil(due.div_ceil(granule).saturating_mul(granule))
    } else {
        units_ceil(due)
    }
}

// === `impl Shared`, this file's second part: which timeouts stamp with the touch tick
// (`clock::touch_tick`), and waking a worker (or the host) for its refresher. ===
/// The scheduler's side of the tick: which timeouts stamp with it, and waking a worker
/// (or the host) for the refresher.
impl Shared {
    /// The refresh interval a timeout with this idle and leeway (ns) needs from the touch
    /// tick: 1/16 of its idle, or half its leeway when that is more (the other half is
    /// its window; see `window_end`).
    pub(crate) fn tick_interval(idle_ns: u64, leeway_ns: u64) -> u64 {
        (idle_ns / IDLE_PARTS).max(leeway_ns / 2)
    }

    /// Whether a timeout that needs `interval_ns` stamps with the touch tick: on a real
    /// scheduler (not in a forked child, where the tick's lock may be held by a thread
    /// that is gone), for an interval of at least [`TICK_MIN_INTERVAL_NS`].
    fn ticks_for(&self, interval_ns: u64) -> bool {
        (!self.clock.is_manual() || self.manual_ticks())
            && interval_ns >= TICK_MIN_INTERVAL_NS
            && !self.is_forked_copy()
    }

    /// Whether a new timeout work with this idle duration (and no leeway of its own yet)
    /// stamps its touches with the touch tick, registering it so; else it stamps with
    /// the full clock.
    pub(super) fn tick_touch(&self, idle_ns: u64) -> bool {
        let interval = Self::tick_interval(idle_ns, self.slack_ns());
        if !self.ticks_for(interval) {
            return false;
        }
        let now = self.now_ns();
        if let Some(at) = self.touch_tick.register_interval(interval, now) {
            // A refresh scheduled for a longer interval moved earlier: make sure someone
            // wakes for it.
            if let Some(mut core) = self.lock_unless_forked() {
                if !core.shutdown {
                    self.kick(&mut core, at, now);
                }
            }
        }
        true
    }

    /// A timeout work got a new leeway (`leeway_before_ns` was the one it stamped for).
    /// Under the core lock, from `Work::leeway`, which owns the handle, so no touch of
    /// this work runs meanwhile; but a run may, whose completion compares the stamp with
    /// the one it was taken with, in the same form. So:
    ///
    /// - A work stamping with the clock moves to the tick only while it was never touched
    ///   and is not running (the usual `sched.timeout(idle, f).leeway(l)`): a converted
    ///   touch would count from the conversion, later than the touch. Otherwise it keeps
    ///   the clock, which is exact.
    /// - A work stamping with the tick keeps it, for the interval the new leeway needs,
    ///   while it runs, and else moves to the clock where that interval is too short: its
    ///   stamp becomes the tick's bound, which is up to one old interval late, so until
    ///   its next touch the reap may be that much later than the new leeway allows.
    pub(crate) fn retick_timeout(
        &self,
        core: &mut Core,
        work: &WorkRef,
        leeway_before_ns: u64,
        now_ns: u64,
    ) {
        if self.is_forked_copy() {
            return;
        }
        let idle = work.period_ns();
        let stamp_word = &work.header().period_or_touch;
        let stamp = stamp_word.load(Ordering::Acquire);
        let running = work.header().state.load().is_running();
        let ticked = stamp & PRECISE_TOUCH == 0;
        let before = Self::tick_interval(idle, leeway_before_ns);
        let after = Self::tick_interval(idle, nanos_of(self.leeway_of(work.header())));
        let ticks = if ticked {
            running || self.ticks_for(after)
        } else {
            self.ticks_for(after) && stamp & !PRECISE_TOUCH == 0 && !running
        };
        if ticked && (!ticks || after != before) {
            self.touch_tick.unregister_interval(before);
        }
        if ticks && (!ticked || after != before) {
            if let Some(at) = self.touch_tick.register_interval(after, now_ns) {
                self.kick(core, at, now_ns);
            }
        }
        if ticks == ticked {
            return;
        }
        let converted = if ticks {
            0 // never touched
        } else {
            match stamp {
                0 => PRECISE_TOUCH,
                tick => {
                    let bound = self.touch_tick.upper_time_ns(tick, || self.now_ns());
                    (bound.min(PRECISE_TOUCH - 2) + 1) | PRECISE_TOUCH
                }
            }
        };
        stamp_word.store(converted, Ordering::SeqCst);
    }

    /// A timeout work's life ends: if it stamped with ticks, the refresher no longer runs
    /// for it (see `clock::touch_tick`).
    pub(crate) fn forget_tick_idle(&self, work: &WorkRef) {
        // Not in a forked child: the tick's lock may be held by a thread that is gone.
        if work.header().state.load().is_timeout()
            && self.stamps_with_ticks(work)
            && !self.is_forked_copy()
        {
            let leeway = nanos_of(self.leeway_of(work.header()));
            self.touch_tick
                .unregister_interval(Self::tick_interval(work.period_ns(), leeway));
        }
    }

    /// Whether a manual scheduler stamps long timeouts with ticks: only in loom models
    /// that ask for it, so they can drive the tick on the virtual clock.
    fn manual_ticks(&self) -> bool {
        #[cfg(all(loom, feature = "loom"))]
        return self.manual_ticks.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(all(loom, feature = "loom")))]
        false
    }

    /// A touch stored a tick stamp while the tick's refresher was parked: schedule it,
    /// and make sure a worker (or the host) wakes for it.
    #[cold]
    pub(super) fn wake_touch_tick(&self) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        let now = self.now_ns();
        self.wake_touch_tick_locked(&mut core, now);
    }

    /// [`wake_touch_tick`](Self::wake_touch_tick) with the core lock held.
    pub(super) fn wake_touch_tick_locked(&self, core: &mut Core, now_ns: u64) {
        if let Some(at) = self.touch_tick.wake(now_ns) {
            self.kick(core, at, now_ns);
        }
    }
}

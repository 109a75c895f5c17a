//! The operations behind [`Work`](super::Work): arming (`schedule`, `reschedule`, `touch`,
//! the first arm of `every`/`timeout`), cancelling (`cancel`, `cancel_sync`, the handle's
//! drop), `flush`, and `disable`/`enable`.
//!
//! # Fast and slow paths
//!
//! `cancel` is always one CAS of the state word. `reschedule` and `schedule` are one CAS
//! when the work still has a live timer entry placed no later than the new deadline
//! (the common case: a work re-armed for "now + the same delay" over and over, or
//! cancelled and re-armed); otherwise they take the core lock and link an entry. A
//! timeout work's `touch` records the time with a `fetch_max`, at most once per coarse
//! clock tick, and otherwise only reads. Nothing on these paths reads the full clock
//! when the delay is long enough for the coarse clock (see `clock`). Everything else
//! takes the core lock through the fork gate.

use std::time::Duration;

use super::WorkRef;
use crate::clock::nanos;
use crate::scheduler::shared::{cas, load, update, Shared};
use crate::scheduler::wait::cycles::WaitCycle;
use crate::scheduler::wait::{cycles as waits, frames};
use crate::scheduler::work::state::{
    State, CANCEL_WAITING, DETACHED, DISABLED, DISABLE_MAX, FIRING, ORPHANED, PENDING,
    PERIOD_CHANGING, QUEUED, REARM_REFUSED, RUNNING, STOPPED, TIMEOUT, TOUCHED_IN_RUN,
};
use crate::sync::{load_ordered_after_seqcst_writes, Ordering};

/// Whether a cancel comes from a dropped handle, whose closure must then be freed by
/// whoever ends the work's last run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    Keep,
    Drop,
    /// A drop that waits for the run in progress even if that closes a wait cycle.
    DropAndWait,
}

/// What a lock-free arming attempt did.
enum Fast {
    /// Armed; the old word.
    Armed(State),
    /// `schedule` found the work already pending.
    AlreadyPending,
    /// Needs the lock: no live entry, an earlier deadline, or a refusal to report.
    Slow,
}

/// A timeout work's touch stamp (the time of its latest touch + 1, or 0 if never
/// touched): the high bit says it is recorded with the full clock.
pub(super) const PRECISE_TOUCH: u64 = 1 << 63;

impl Shared {
    /// The lock-free arm: one CAS if the live entry can serve the new deadline.
    #[inline]
    fn arm_fast(&self, work: &WorkRef, deadline: u64, only_if_idle: bool, delay_ns: u64) -> Fast {
        if delay_ns == 0 {
            // Due now: the live entry may sit in a later tick, and a zero delay runs at
            // the next opportunity, so it gets an entry on the ready queue.
            return Fast::Slow;
        }
        loop {
            let old = load(work.header());
            if only_if_idle && old.has(PENDING) {
                return Fast::AlreadyPending;
            }
            if !old.has(QUEUED) || old.refuses_arm() || deadline < old.deadline() {
                return Fast::Slow;
            }
            // A `work()`'s period follows its arms, and an arm that changes it goes
            // through the lock so that deadline and period come from the same arm (see
            // `arm_locked`). Read after the state word (acquire), so a period stored
            // before a locked arm cleared `PERIOD_CHANGING` is seen here.
            if old.period_changing()
                || (old.period_follows_arms()
                    && work.header().period_or_touch.load(Ordering::Relaxed) != delay_ns)
            {
                return Fast::Slow;
            }
            let mut new = old;
            new.arm(deadline);
            if cas(work.header(), old, new) {
                return Fast::Armed(old);
            }
        }
    }

    pub(crate) fn schedule(&self, work: &WorkRef, delay: Duration) -> bool {
        if load(work.header()).has(PENDING) {
            return false;
        }
        self.arm(work, delay, true).is_some()
    }

    pub(crate) fn reschedule(&self, work: &WorkRef, delay: Duration) -> bool {
        self.arm(work, delay, false)
            .is_some_and(|old| old.has(PENDING))
    }

    /// Arms for now + `delay` (unless pending, with `only_if_idle`): lock-free when the
    /// live entry can serve the deadline, else under the lock. Returns the old word if
    /// it armed the work, `None` if that was refused (or it was pending).
    fn arm(&self, work: &WorkRef, delay: Duration, only_if_idle: bool) -> Option<State> {
        if self.is_forked_copy() {
            return None;
        }
        let delay_ns = nanos(delay);
        let deadline = Shared::deadline_after(self.now_for_delay(delay_ns), delay_ns);
        match self.arm_fast(work, deadline, only_if_idle, delay_ns) {
            Fast::Armed(old) => Some(old),
            Fast::AlreadyPending => None,
            Fast::Slow => self.arm_locked(work, delay_ns, only_if_idle),
        }
    }

    /// The locked arm, which also sets a `work()`'s period to `delay_ns` (`every` and
    /// timeout works keep theirs).
    ///
    /// Deadline and period are two words, so they agree by this protocol: the arm's CAS
    /// sets `PERIOD_CHANGING` together with the deadline, the period is stored, and a
    /// second CAS clears the flag, all under the core lock. Other locked arms are
    /// serialised by the lock; a lock-free arm takes the lock while it sees the flag, and
    /// otherwise only succeeds when the period already is its delay (see `arm_fast`). So
    /// whichever arm's CAS comes last in the word's order, its delay is the period left.
    fn arm_locked(&self, work: &WorkRef, delay_ns: u64, only_if_idle: bool) -> Option<State> {
        let mut core = self.lock_unless_forked()?;
        if core.shutdown {
            return None;
        }
        let now = self.now_ns();
        let period_word = &work.header().period_or_touch;
        // Stable here: only a locked arm writes a `work()`'s period.
        let period_changes = period_word.load(Ordering::Relaxed) != delay_ns;
        let (old, new) = self.commit(&mut core, work, now, |old| {
            if (only_if_idle && old.has(PENDING)) || old.refuses_arm() {
                return None;
            }
            let mut new = old;
            new.arm(Shared::deadline_after(now, delay_ns));
            if period_changes && old.period_follows_arms() {
                new.set(PERIOD_CHANGING);
            }
            Some(new)
        })?;
        if new.period_changing() {
            period_word.store(delay_ns, Ordering::Relaxed);
            update(work.header(), |old| Some(old.without(PERIOD_CHANGING)));
        }
        Some(old)
    }

    /// A timeout work's postponement: due no earlier than this (units) by its latest
    /// touch; 0 for other works.
    fn postponed_to(&self, work: &WorkRef) -> u64 {
        if !load(work.header()).has(TIMEOUT) {
            return 0;
        }
        let stamp = work.header().period_or_touch.load(Ordering::Acquire);
        self.touch_due(stamp, work.period_ns())
    }

    /// Arms for now + `delay` unless the work is pending for sooner (the kernel's
    /// `timer_reduce`); returns whether it armed the work or moved its deadline.
    pub(crate) fn schedule_within(&self, work: &WorkRef, delay: Duration) -> bool {
        if self.is_forked_copy() {
            return false;
        }
        let delay_ns = nanos(delay);
        // A time never later than the true one: a deadline at or before `earliest + delay`
        // is certainly sooner than `now + delay`.
        let earliest = self.now_lower_for_delay(delay_ns);
        let state = load(work.header());
        if state.has(PENDING)
            && !state.has(TIMEOUT)
            && state.deadline() <= Shared::deadline_after(earliest, delay_ns)
        {
            return false; // already due sooner: nothing to do, and no lock
        }
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        if core.shutdown {
            return false;
        }
        let now = self.now_ns();
        let deadline = Shared::deadline_after(now, delay_ns);
        // A timeout work stays due no earlier than its latest touch + idle: what moves is
        // its effective deadline, the later of the two.
        let postponed_to = self.postponed_to(work);
        self.commit(&mut core, work, now, |old| {
            let effective = old.deadline().max(postponed_to);
            if old.refuses_arm() || (old.has(PENDING) && effective <= deadline.max(postponed_to)) {
                return None;
            }
            let mut new = old;
            new.arm(deadline);
            Some(new)
        })
        .is_some()
    }

    /// The pending deadline (a timeout work's postponed one), if pending.
    pub(crate) fn deadline_ns(&self, work: &WorkRef) -> Option<u64> {
        let state = load(work.header());
        if !state.has(PENDING) {
            return None;
        }
        let due = state.deadline().max(self.postponed_to(work));
        Some(crate::scheduler::work::state::units_to_ns(due))
    }

    /// Gives up the handle: the work lives on until its callback returns `Stop` or
    /// `Park`, panics, or the scheduler shuts down. Returns whether the caller must drop
    /// the closure now (the work cannot run again).
    pub(crate) fn detach(&self, work: &WorkRef) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            // Inert in a forked child: keep it (leaked), as a dropped handle is there.
            std::mem::forget(work.clone());
            return false;
        };
        // Nobody can call `enable` any more; the count must not outlive the work (a
        // later work may get the same address).
        core.disable_counts.remove(&frames::address(work));
        let shutdown = core.shutdown;
        let (_, new) = update(work.header(), |old| {
            let mut new = old.with(DETACHED);
            if shutdown || !old.has(PENDING | RUNNING) || old.refuses_arm() {
                // Nothing will run it again: its life ends here.
                new.disarm();
                new.set(ORPHANED);
            }
            Some(new)
        })
        .expect("the edit always applies");
        drop(core);
        new.has(ORPHANED) && !new.has(RUNNING)
    }

    #[inline]
    pub(crate) fn touch(&self, work: &WorkRef) {
        // The fast path: one SeqCst load (a plain load on x86). See the module docs.
        let state = load_ordered_after_seqcst_writes(&work.header().state);
        if state & (PENDING | TIMEOUT) == PENDING {
            return;
        }
        self.touch_not_pending_or_timeout(work, State(state));
    }

    /// Out of line, so that the periodic work's fast path above stays a load and a test
    /// wherever it is inlined.
    #[inline(never)]
    fn touch_not_pending_or_timeout(&self, work: &WorkRef, state: State) {
        if state.has(TIMEOUT) {
            self.touch_timeout(work);
        } else {
            self.touch_slow(work);
        }
    }

    /// A timeout work's touch: records the time (raising the stamp at most once per
    /// clock tick), and arms the work only if it is neither armed nor running.
    ///
    /// Ordering: the stamp's `fetch_max` comes before a `SeqCst` re-read of the state
    /// word, and both the worker's decision to run (it sets `FIRING`, then reads the
    /// stamp) and a run's completion (it clears `RUNNING`, then reads the stamp) do the
    /// mirror image. So either they see the new stamp, or this touch sees their state
    /// change: it clears `FIRING` (the worker's take then fails and decides again) or
    /// finds the work neither armed nor running and arms it itself.
    #[inline(always)]
    fn touch_timeout(&self, work: &WorkRef) {
        // No fork gate here: recording a stamp in a forked child's copy is harmless, and
        // the slow path below has the gate.
        let stamp_word = &work.header().period_or_touch;
        let recorded = load_ordered_after_seqcst_writes(stamp_word);
        let precise = recorded & PRECISE_TOUCH;
        // Stamps are the time + 1, so that 0 means "never touched"; they stay below the
        // precision bit (a saturated virtual clock reads u64::MAX).
        let stamp = (self.touch_stamp(precise == 0).min(PRECISE_TOUCH - 2) + 1) | precise;
        if stamp > recorded {
            stamp_word.fetch_max(stamp, Ordering::SeqCst);
        }
        // Read after the stamp, also when another touch recorded the same one: if the
        // worker set FIRING before this read, it may have read the stamp before that other
        // touch stored it, so this touch clears FIRING too, and the worker decides again.
        let state = State(load_ordered_after_seqcst_writes(&work.header().state));
        if state.has(FIRING) {
            work.header().state.fetch_and(!FIRING, Ordering::SeqCst);
        }
        if state.has(PENDING | RUNNING) {
            return;
        }
        self.touch_slow(work);
    }

    #[cold]
    fn touch_slow(&self, work: &WorkRef) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        let now = self.now_ns();
        let period = work.period_ns().max(self.slack_ns());
        self.commit(&mut core, work, now, |old| {
            // A timeout work that became armed or running meanwhile has the new stamp.
            let busy = if old.has(TIMEOUT) {
                PENDING | RUNNING
            } else {
                PENDING
            };
            if old.has(busy | STOPPED) || old.refuses_arm() {
                return None;
            }
            if old.has(RUNNING) {
                // Semantic 8: a touch during a run only turns the callback's `Park` into
                // "armed"; whatever else it decides stands (see `complete`).
                return Some(old.with(TOUCHED_IN_RUN));
            }
            let mut new = old;
            new.arm(Shared::deadline_after(now, period));
            Some(new)
        });
    }

    pub(crate) fn cancel(&self, work: &WorkRef) -> bool {
        if self.is_forked_copy() {
            return false;
        }
        update(work.header(), |old| {
            old.has(PENDING).then(|| {
                let mut new = old;
                new.disarm();
                new
            })
        })
        .is_some()
    }

    pub(crate) fn cancel_sync(&self, work: &WorkRef) -> bool {
        self.cancel_and_wait(work, Release::Keep).0
    }

    /// `cancel_sync`, and for a dropped handle the hand-over of the closure. Disarms,
    /// refuses re-arms while a run is in progress, and waits for that run unless waiting
    /// would wait for ourselves: the run is this thread's own (a callback cancelling or
    /// dropping its own work) or the wait would close a cycle of waiting callbacks. Then
    /// the run's own re-arm is refused instead and, for a dropped handle, the runner frees
    /// the closure after the callback returned.
    ///
    /// Returns whether it was pending, and (for a dropped handle) whether the caller must
    /// drop the closure: no run is in progress and none can start.
    pub(super) fn cancel_and_wait(&self, work: &WorkRef, release: Release) -> (bool, bool) {
        let Some(mut core) = self.lock_unless_forked() else {
            return (false, false);
        };
        let released = release != Release::Keep;
        if released && load(work.header()).has(ORPHANED) {
            // Released before (`drop_waiting`, then the handle's own drop).
            return (false, false);
        }
        if released {
            // Nobody can call `enable` any more; the count must not outlive the work (a
            // later work may get the same address).
            core.disable_counts.remove(&frames::address(work));
        }
        // RUNNING only changes under the core lock (a take sets it, a completion clears
        // it), so what is decided here about the run in progress holds until the wait
        // below releases the lock.
        let running = load(work.header()).has(RUNNING);
        let waiting = if !running {
            None
        } else if frames::is_running_here(work) {
            Some(Err(WaitCycle::own()))
        } else if release == Release::DropAndWait {
            Some(Ok(waits::begin_wait_unchecked(work)))
        } else {
            Some(waits::begin_wait(work))
        };
        // One CAS disarms and refuses: a lock-free arm racing this call either lands
        // before it (and is disarmed here) or fails its CAS and finds the refusal. After a
        // `cancel_sync` only `schedule`/`reschedule` arm the work again: `touch` leaves it
        // stopped, as after `Next::Stop`.
        let (old, _) = update(work.header(), |old| {
            debug_assert_eq!(old.has(RUNNING), running, "RUNNING moved under the lock");
            let mut new = old;
            new.disarm();
            new.set(STOPPED);
            match &waiting {
                // "disable, flush, enable", as the kernel's cancel_delayed_work_sync,
                // with a refusal of its own that `enable()` cannot lift.
                Some(Ok(_)) => new.set(CANCEL_WAITING),
                // Waiting would wait for ourselves: the run's own re-arm is refused
                // instead, and a dropped handle leaves the closure to the runner.
                Some(Err(_)) => {
                    new.set(REARM_REFUSED);
                    if released {
                        new.set(ORPHANED);
                    }
                }
                None => {
                    if released {
                        new.set(ORPHANED);
                    }
                }
            }
            Some(new)
        })
        .expect("the edit always applies");
        let was_pending = old.has(PENDING);
        if released && old.has(QUEUED) {
            // Nothing arms it again: its entry is garbage.
            self.note_stale(&mut core, 1);
        }
        let waiting = match waiting {
            None => return (was_pending, released),
            Some(Err(cycle)) => {
                drop(core);
                cycle.report();
                return (was_pending, false);
            }
            Some(Ok(waiting)) => waiting,
        };
        let address = frames::address(work);
        *core.cancel_waiters.entry(address).or_insert(0) += 1;
        core = self.wait_for_run(core, work);
        drop(waiting);
        let last_waiter = match core.cancel_waiters.get_mut(&address) {
            Some(waiters) => {
                *waiters -= 1;
                *waiters == 0
            }
            None => false,
        };
        if last_waiter {
            core.cancel_waiters.remove(&address);
        }
        // One CAS again: a dropped handle's work goes from "refused while waiting" to
        // "orphaned" with no word in between that accepts an arm.
        update(work.header(), |old| {
            let mut new = old;
            if last_waiter {
                new.clear(CANCEL_WAITING);
            }
            if released {
                // The run ended and re-arms stayed refused: nothing runs it again.
                new.set(ORPHANED);
            }
            Some(new)
        });
        drop(core);
        (was_pending, released)
    }

    pub(crate) fn disable(&self, work: &WorkRef) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let count = core
            .disable_counts
            .entry(frames::address(work))
            .or_insert(0);
        let saturated = *count == DISABLE_MAX;
        if !saturated {
            *count += 1;
        }
        let (old, _) = update(work.header(), |old| {
            let mut new = old.with(DISABLED);
            new.disarm();
            Some(new)
        })
        .expect("the edit always applies");
        drop(core);
        if saturated {
            // Outside the lock: a subscriber is user code and may call into the scheduler.
            tracing::warn!(work = work.name(), "disable() nesting saturated");
        }
        old.has(PENDING)
    }

    pub(crate) fn enable(&self, work: &WorkRef) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        let address = frames::address(work);
        let Some(count) = core.disable_counts.get_mut(&address) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            core.disable_counts.remove(&address);
            update(work.header(), |old| Some(old.without(DISABLED)));
        }
    }

    /// The owning handle is being dropped; returns whether the caller must drop the
    /// closure (else it is leaked in a forked child, or the runner drops it).
    pub(crate) fn release(&self, work: &WorkRef) -> bool {
        if self.is_forked_copy() {
            // The closure may be running in the parent's copy of a worker that does
            // not exist here: keep it (leaked) rather than free it under that run.
            std::mem::forget(work.clone());
            return false;
        }
        self.cancel_and_wait(work, Release::Drop).1
    }

    /// Arms a new work (`every`, `timeout`) for its first run.
    pub(crate) fn arm_new(&self, work: &WorkRef, delay: Duration) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        let now = self.now_ns();
        self.commit(&mut core, work, now, |old| {
            let mut new = old;
            new.arm(Shared::deadline_after(now, nanos(delay)));
            Some(new)
        });
    }
}

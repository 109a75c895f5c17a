//! Arming: `schedule`, `reschedule`, `schedule_within`, a periodic work's `touch`, the
//! first arm of `every`/`timeout`, `detach`, and the pending deadline.
//!
//! # Fast and slow paths
//!
//! `reschedule` and `schedule` are one CAS when the work still has a live timer entry
//! placed no later than the new deadline (the common case: a work re-armed for "now +
//! the same delay" over and over, or cancelled and re-armed); otherwise they take the
//! core lock and link an entry. A periodic work's `touch` is one load while it is armed.
//! Nothing on these paths reads the full clock when the delay is long enough for the
//! coarse clock (see `clock`). Everything else takes the core lock through the fork
//! gate.

use std::time::Duration;

use super::WorkRef;
use crate::clock::nanos;
use crate::scheduler::shared::Shared;
use crate::scheduler::wait::frames;
use crate::scheduler::work::state::{
    DETACHED, ORPHANED, PENDING, PERIOD_CHANGING, QUEUED, RUNNING, State, TIMEOUT, TOUCHED_IN_RUN,
};
use crate::sync::Ordering;

/// What a lock-free arming attempt did.
enum Fast {
    /// Armed; the old word.
    Armed(State),
    /// `schedule` found the work already pending.
    AlreadyPending,
    /// Needs the lock: no live entry, an earlier deadline, or a refusal to report.
    Slow,
}

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
            let old = work.header().state.load();
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
            if work.header().state.cas(old, new) {
                return Fast::Armed(old);
            }
        }
    }

    pub(crate) fn schedule(&self, work: &WorkRef, delay: Duration) -> bool {
        if work.header().state.load().has(PENDING) {
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
            work.header()
                .state
                .update(|old| Some(old.without(PERIOD_CHANGING)));
        }
        Some(old)
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
        let state = work.header().state.load();
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
        let state = work.header().state.load();
        if !state.has(PENDING) {
            return None;
        }
        let due = state.deadline().max(self.postponed_to(work));
        Some(crate::scheduler::work::state::units_to_ns(due))
    }

    /// [`deadline_ns`](Self::deadline_ns) as an `Instant`: what `Work::deadline` shows.
    pub(crate) fn deadline_of(&self, work: &WorkRef) -> Option<std::time::Instant> {
        self.deadline_ns(work).map(|ns| self.instant_at(ns))
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
        let (_, new) = work
            .header()
            .state
            .update(|old| {
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
        let state = work.header().state.load_after_seqcst_writes().0;
        if state & (PENDING | TIMEOUT) == PENDING {
            return;
        }
        if state & TIMEOUT != 0 {
            // Inline as well: a timeout's touch is a few loads, and a call would be a
            // good part of it.
            self.touch_timeout(work);
        } else {
            self.touch_slow(work);
        }
    }

    #[cold]
    pub(crate) fn touch_slow(&self, work: &WorkRef) {
        // A stopped work, or one that refuses to be armed, ignores the touch whatever the
        // lock would show: say so without taking it, so that touching such a work costs
        // no lock, and no worker a wait for one. A flag cleared after this read (a
        // `schedule`) orders the touch before it.
        let state = work.header().state.load_after_seqcst_writes();
        if state.refuses_touch() {
            return;
        }
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        let now = self.now_ns();
        let period = work.period_ns().max(self.slack_ns());
        let armed = self.commit(&mut core, work, now, |old| {
            // A timeout work that became armed or running meanwhile has the new stamp.
            let busy = if old.has(TIMEOUT) {
                PENDING | RUNNING
            } else {
                PENDING
            };
            if old.has(busy) || old.refuses_touch() {
                return None;
            }
            if old.has(RUNNING) {
                // A touch during a run only turns the callback's `Park` into
                // "armed"; whatever else it decides stands (see `complete`).
                return Some(old.with(TOUCHED_IN_RUN));
            }
            let mut new = old;
            new.arm(Shared::deadline_after(now, period));
            Some(new)
        });
        if let Some((old, _)) = armed {
            if old.has(TIMEOUT) && self.stamps_with_ticks(work) && self.touch_tick.note_touch() {
                // Its touches postpone it from now on: the tick must move.
                self.wake_touch_tick_locked(&mut core, now);
            }
        }
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

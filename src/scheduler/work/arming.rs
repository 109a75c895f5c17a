//! Arming: `schedule`, `reschedule`, `schedule_within`, a periodic work's `touch`, the
//! first arm of `every`/`timeout`, `detach`, and the pending deadline.
//!
//! # Fast and slow paths
//!
//! `reschedule` and `schedule` are one CAS when the work's live timer entry looks at it
//! no later than the new deadline (the common case: a work re-armed over and over, or
//! cancelled and re-armed, with the same delay or a changing one); otherwise they take
//! the core lock and link an entry. Whether the entry serves is read from the state
//! word's deadline and, for a deadline below it, from the entry's placement (see
//! "Placement" in `entry`), so a delay that jitters either way stays lock-free. A
//! `work()`'s period follows its arms, so its arm also takes the claim on the period in
//! that CAS, stores its delay (when it differs) and releases the claim with a `fetch_and`:
//! one more atomic operation, not the core lock (see the ground rules in `state`). A
//! periodic work's `touch` is one load while it is armed. Neither path reads the full
//! clock when the delay is long enough for the coarse clock (see `clock`; the locked path
//! reads it only to program the timer earlier). Everything else takes the core lock
//! through the fork gate.
//!
//! # The period rule
//!
//! Deadline and period agree: whichever arm's CAS comes last in the state word's order,
//! its deadline and its delay are the ones left, and a completion's `Next::Again` (or a
//! touch arming a parked work) decides from the period it read under its own claim
//! ([`Shared::claim_period`]), which its CAS releases.

use std::time::Duration;

use super::entry::Placement;
use super::{Header, WorkRef};
use crate::clock::nanos;
use crate::scheduler::shared::{Core, Shared};
use crate::scheduler::wait::frames;
use crate::scheduler::work::state::State;

/// Whether a work's live entry serves a deadline, and how it was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serves {
    /// It may not: the lock is needed.
    No,
    /// The deadline is not before the state word's.
    ByDeadline,
    /// Through this placement, which the arm reads again after its CAS.
    ByPlacement(u32),
}

/// What a lock-free arming attempt did.
enum Fast {
    /// Armed; the old word.
    Armed(State),
    /// `schedule` found the work already pending.
    AlreadyPending,
    /// Needs the lock: no live entry, an earlier deadline, the period claimed by another
    /// thread, or a refusal to report.
    Slow,
}

// === `impl Shared`, this file's part: arming: `schedule`, `reschedule`, `schedule_within`,
// a periodic work's `touch`, `detach`, the pending deadline, and the period rule. ===
impl Shared {
    /// The lock-free arm: one CAS if the live entry can serve the new deadline, plus, for
    /// a `work()`, the period's store (when it changes) and the claim's release.
    #[inline]
    fn arm_fast(&self, work: &WorkRef, deadline: u64, only_if_idle: bool, delay_ns: u64) -> Fast {
        if delay_ns == 0 {
            // Due now: the live entry may sit in a later tick, and a zero delay runs at
            // the next opportunity, so it gets an entry on the ready queue.
            return Fast::Slow;
        }
        let header = work.header();
        loop {
            let old = header.state.load();
            if only_if_idle && old.is_pending() {
                return Fast::AlreadyPending;
            }
            let serves = Shared::entry_serves(header, old, deadline);
            if !old.has_live_entry() || old.refuses_arm() || serves == Serves::No {
                return Fast::Slow;
            }
            // A `work()`'s period follows its arms: this CAS takes the claim on it, and
            // the period is stored under it (see the ground rules in `state`).
            if old.period_claimed() {
                return Fast::Slow;
            }
            if header.state.cas(old, old.armed_by_an_arm(deadline)) {
                if old.period_follows_arms() {
                    Shared::set_period_and_release(header, delay_ns);
                }
                if let Serves::ByPlacement(placement) = serves {
                    if header.stats.placement() != placement {
                        self.recheck_lowered(work);
                    }
                }
                return Fast::Armed(old);
            }
        }
    }

    /// An arm that took the claim on a `work()`'s period in its CAS: its delay is the
    /// period now (stored only if it differs), and the claim is released.
    #[inline]
    fn set_period_and_release(header: &Header, delay_ns: u64) {
        if header.claimed_period() != delay_ns {
            header.store_period(delay_ns);
        }
        header.state.release_period_claim();
    }

    /// Whether the live entry of `old` (a word with `QUEUED`) looks at the work no later
    /// than `deadline`: the deadline is not before the word's own (see the ground rules
    /// in `state`), or not before the entry's [`Placement`].
    #[inline]
    fn entry_serves(header: &Header, old: State, deadline: u64) -> Serves {
        if deadline >= old.deadline() {
            return Serves::ByDeadline;
        }
        let placement = header.stats.placement();
        if old.deadline() - deadline < Placement::REACH
            && Placement::serves(placement, old.epoch(), deadline)
        {
            Serves::ByPlacement(placement)
        } else {
            Serves::No
        }
    }

    /// After a lock-free arm lowered its deadline through a placement that has moved
    /// since (see "Placement" in `entry`): the entry that placement described may not be
    /// the live one, so under the lock the live entry is dropped and one is linked for the
    /// deadline as it stands. Lateness is all this can prevent; a work is never early.
    #[cold]
    #[inline(never)]
    fn recheck_lowered(&self, work: &WorkRef) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        let now = self.now_ns();
        self.relink(&mut core, work, now);
    }

    /// Gives a pending work a new live entry at its deadline (the one it had goes stale).
    pub(crate) fn relink(&self, core: &mut Core, work: &WorkRef, now_ns: u64) {
        let dropped = work
            .header()
            .state
            .update(|old| (old.is_pending() && old.has_live_entry()).then(|| old.without_entry()));
        if dropped.is_some() {
            self.note_stale(core, 1);
            // Pending without an entry: the commit links one.
            self.commit(core, work, now_ns, Some);
        }
    }

    pub(crate) fn schedule(&self, work: &WorkRef, delay: Duration) -> bool {
        if work.header().state.load().is_pending() {
            return false;
        }
        self.arm(work, delay, true).is_some()
    }

    pub(crate) fn reschedule(&self, work: &WorkRef, delay: Duration) -> bool {
        self.arm(work, delay, false)
            .is_some_and(|old| old.is_pending())
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
    /// timeout works keep theirs). A delay long enough for the coarse clock costs no full
    /// clock read here either (see [`Shared::commit_at`]).
    ///
    /// The period is set as on the lock-free path (see the ground rules in `state`): the
    /// CAS takes the claim on it, the period is stored, the claim released. Another
    /// thread may hold the claim at any moment (a lock-free arm does not take the core
    /// lock): an edit that finds it held waits for it outside the lock and tries again.
    fn arm_locked(&self, work: &WorkRef, delay_ns: u64, only_if_idle: bool) -> Option<State> {
        let header = work.header();
        loop {
            self.settle_period(header);
            let mut core = self.lock_unless_forked()?;
            if core.shutdown {
                return None;
            }
            // Read again under the lock: the wait for it (or for a claim) may have been
            // long, and the timer is programmed from this time.
            let now = self.now_for_delay(delay_ns);
            // Whether the last attempt found the period claimed by another thread.
            let mut held_off = false;
            let exact = !self.coarse_for(delay_ns);
            let committed = self.commit_at(&mut core, work, now, exact, |old| {
                held_off = old.period_claimed();
                if held_off || (only_if_idle && old.is_pending()) || old.refuses_arm() {
                    return None;
                }
                Some(old.armed_by_an_arm(Shared::deadline_after(now, delay_ns)))
            });
            if held_off {
                continue;
            }
            let (old, _) = committed?;
            if old.period_follows_arms() {
                Shared::set_period_and_release(header, delay_ns);
            }
            return Some(old);
        }
    }

    /// Waits until no thread holds the claim on `header`'s work's period (see the ground
    /// rules in `state`): a few instructions of another thread's, or a completion's or a
    /// touch's edit under the core lock. In a forked child, whose other threads are gone,
    /// it returns at once.
    pub(crate) fn settle_period(&self, header: &Header) {
        let mut round = 0;
        while header.state.load().period_claimed() && !self.is_forked_copy() {
            crate::sync::wait_round(&mut round);
        }
    }

    /// `work`'s period, as `Work::period` and `WorkInfo::period` show it: read once no
    /// arm is changing it.
    pub(crate) fn period_of(&self, work: &WorkRef) -> Duration {
        self.settle_period(work.header());
        Duration::from_nanos(work.period_ns())
    }

    /// Takes the claim on `work`'s period if it is a `work()`'s (waiting while another
    /// thread holds it), for an edit that decides from the period: the edit must then
    /// publish a word without the claim ([`State::without_period_claim`]), or the caller
    /// release it ([`StateCell::release_period_claim`]). Returns the period, and whether
    /// the claim was taken (`every` and timeout works have a period that never changes,
    /// and take none).
    ///
    /// [`StateCell::release_period_claim`]: crate::scheduler::work::state::StateCell::release_period_claim
    pub(crate) fn claim_period(&self, work: &WorkRef) -> (u64, bool) {
        let header = work.header();
        let mut round = 0;
        loop {
            let old = header.state.load();
            if !old.period_follows_arms() || self.is_forked_copy() {
                return (work.period_ns(), false);
            }
            if old.period_claimed() {
                crate::sync::wait_round(&mut round);
                continue;
            }
            if header.state.cas(old, old.with_period_claim()) {
                return (header.claimed_period(), true);
            }
        }
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
        if state.is_pending()
            && !state.is_timeout()
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
            if old.refuses_arm() || (old.is_pending() && effective <= deadline.max(postponed_to)) {
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
        if !state.is_pending() {
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
            .update(|old| Some(old.detached(shutdown)))
            .expect("the edit always applies");
        drop(core);
        new.is_orphaned() && !new.is_running()
    }

    #[inline]
    pub(crate) fn touch(&self, work: &WorkRef) {
        // The fast path: one SeqCst load (a plain load on x86). See the module docs.
        let state = work.header().state.load_after_seqcst_writes();
        if state.is_armed_periodic() {
            return;
        }
        if state.is_timeout() {
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
        // The period this touch arms for, claimed so that the word it decides on keeps
        // that period (see the ground rules in `state`).
        let (period, claimed) = self.claim_period(work);
        let period = period.max(self.slack_ns());
        let armed = self.commit(&mut core, work, now, |old| {
            // A timeout work that became armed or running meanwhile has the new stamp.
            let busy = if old.is_timeout() {
                old.is_pending_or_running()
            } else {
                old.is_pending()
            };
            let new = if busy || old.refuses_touch() {
                return None;
            } else if old.is_running() {
                // A touch during a run only turns the callback's `Park` into
                // "armed"; whatever else it decides stands (see `complete`).
                old.touched_during_run()
            } else {
                old.armed(Shared::deadline_after(now, period))
            };
            Some(if claimed {
                new.without_period_claim()
            } else {
                new
            })
        });
        if claimed && armed.is_none() {
            work.header().state.release_period_claim();
        }
        if let Some((old, _)) = armed {
            if old.is_timeout() && self.stamps_with_ticks(work) && self.touch_tick.note_touch() {
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

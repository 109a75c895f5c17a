//! The named transitions of the state word, and what each word says: every change a
//! caller makes to a work's state is one of these (see the module docs of
//! [`state`](super)). The flags stay private to `state`; this child module reads and
//! writes them for its callers.

use super::{
    CANCEL_WAITING, CLOSURE_DROPPED, DETACHED, DISABLED, FIRING, FIXED_PERIOD, FLUSH_TAKEOVER,
    ORPHANED, PENDING, POISONED, QUEUED, REARM_REFUSED, RUNNING, RUNNING_INCREMENT, STOPPED, State,
    TIMEOUT, TOUCHED_IN_RUN, YIELDED,
};

impl State {
    // --- What the word says. ---

    /// Logically armed: due at [`deadline`](Self::deadline).
    #[inline]
    pub(crate) fn is_pending(self) -> bool {
        self.has(PENDING)
    }

    /// Its callback is executing on some thread.
    #[inline]
    pub(crate) fn is_running(self) -> bool {
        self.has(RUNNING)
    }

    /// Armed or running: an instance exists.
    pub(crate) fn is_pending_or_running(self) -> bool {
        self.has(PENDING | RUNNING)
    }

    /// Armed, and not a timeout work: a touch has nothing to do (the `touch()` fast path).
    #[inline]
    pub(crate) fn is_armed_periodic(self) -> bool {
        self.0 & (PENDING | TIMEOUT) == PENDING
    }

    /// Its callback panicked.
    pub(crate) fn is_poisoned(self) -> bool {
        self.has(POISONED)
    }

    /// `disable` levels are held.
    pub(crate) fn is_disabled(self) -> bool {
        self.has(DISABLED)
    }

    /// A timeout work (`touch` postpones it).
    #[inline]
    pub(crate) fn is_timeout(self) -> bool {
        self.has(TIMEOUT)
    }

    /// The kind the work was made as.
    pub(crate) fn kind(self) -> Kind {
        if self.has(TIMEOUT) {
            Kind::Timeout
        } else if self.has(FIXED_PERIOD) {
            Kind::FixedPeriod
        } else {
            Kind::FollowsArms
        }
    }

    /// It has a live timer entry (see the ground rules).
    pub(crate) fn has_live_entry(self) -> bool {
        self.has(QUEUED)
    }

    /// Its handle is gone and nothing arms it again.
    pub(crate) fn is_orphaned(self) -> bool {
        self.has(ORPHANED)
    }

    /// Its closure was dropped.
    pub(crate) fn closure_dropped(self) -> bool {
        self.has(CLOSURE_DROPPED)
    }

    /// The pending instance is a `Yield` increment.
    pub(crate) fn is_yield_increment(self) -> bool {
        self.has(YIELDED)
    }

    /// The run in progress is a `Yield` increment.
    pub(crate) fn runs_an_increment(self) -> bool {
        self.has(RUNNING_INCREMENT)
    }

    /// A pending `Yield` increment that a flush takes over: no worker runs it.
    pub(crate) fn is_left_to_a_flusher(self) -> bool {
        self.has(FLUSH_TAKEOVER) && self.has(YIELDED)
    }

    /// A worker is deciding whether this timeout work is due (see the ground rules).
    #[inline]
    pub(crate) fn is_firing(self) -> bool {
        self.has(FIRING)
    }

    /// A detached work whose life ends with the run that just completed: nothing armed
    /// it, and nobody orphaned it yet.
    pub(crate) fn detached_life_is_over(self) -> bool {
        self.has(DETACHED) && !self.has(PENDING | ORPHANED)
    }

    // --- The transitions, each a new word from this one. ---

    /// The first word of a work: a `work()`, an `every()` (fixed period) or a timeout.
    pub(crate) fn new_work(kind: Kind) -> State {
        State(match kind {
            Kind::FollowsArms => 0,
            Kind::FixedPeriod => FIXED_PERIOD,
            Kind::Timeout => TIMEOUT | FIXED_PERIOD,
        })
    }

    /// Armed for `deadline` (units), by value.
    pub(crate) fn armed(mut self, deadline: u64) -> State {
        self.arm(deadline);
        self
    }

    /// `cancel`: disarmed, if it was pending.
    pub(crate) fn cancelled(self) -> Option<State> {
        self.is_pending().then(|| self.disarmed())
    }

    /// Disarmed, by value.
    pub(crate) fn disarmed(mut self) -> State {
        self.disarm();
        self
    }

    /// `cancel_sync` (or a drop): disarmed and stopped, with the refusal that holds while
    /// a run is in progress, and orphaned (`orphan`) when the handle is gone and no wait
    /// stands between it and the end of the work's life.
    pub(crate) fn cancelled_sync(self, refusal: Refusal, orphan: bool) -> State {
        let mut new = self.disarmed().with(STOPPED);
        match refusal {
            Refusal::None => {}
            Refusal::WhileWaiting => new.set(CANCEL_WAITING),
            Refusal::OwnRearm => new.set(REARM_REFUSED),
        }
        if orphan {
            new.set(ORPHANED);
        }
        new
    }

    /// A `cancel_sync` wait ends: the last waiter lifts its refusal, which a run still in
    /// progress keeps as the refusal of its own re-arm; a released handle's work is
    /// orphaned.
    pub(crate) fn cancel_wait_ended(self, last_waiter: bool, released: bool) -> State {
        let mut new = self;
        if last_waiter {
            new.clear(CANCEL_WAITING);
            if self.has(RUNNING) {
                new.set(REARM_REFUSED);
            }
        }
        if released {
            new.set(ORPHANED);
        }
        new
    }

    /// `disable`: refused and disarmed in one word.
    pub(crate) fn disabled(self) -> State {
        self.with(DISABLED).disarmed()
    }

    /// The last `enable`.
    pub(crate) fn enabled(self) -> State {
        self.without(DISABLED)
    }

    /// `detach`: marked detached, and when nothing will run it again (shutdown, no
    /// instance, or refused), disarmed and orphaned: its life ends here.
    pub(crate) fn detached(self, shutdown: bool) -> State {
        let mut new = self.with(DETACHED);
        if shutdown || !self.is_pending_or_running() || self.refuses_arm() {
            new.disarm();
            new.set(ORPHANED);
        }
        new
    }

    /// Orphaned: nothing arms it again; whoever ends its last run frees the closure.
    pub(crate) fn orphaned(self) -> State {
        self.with(ORPHANED)
    }

    /// Shutdown's drain: disarmed, its entry dropped, and a detached work that is not
    /// running orphaned (the drain frees it).
    pub(crate) fn drained(self) -> State {
        let mut new = self.without(PENDING | YIELDED | QUEUED);
        if self.has(DETACHED) && !self.has(RUNNING) {
            new.set(ORPHANED);
        }
        new
    }

    /// Its entry went stale: `QUEUED` cleared.
    pub(crate) fn without_entry(self) -> State {
        self.without(QUEUED)
    }

    /// A worker starts deciding whether this timeout work is due.
    pub(crate) fn firing(self) -> State {
        self.with(FIRING)
    }

    /// A flush takes over the work's `Yield` increments.
    pub(crate) fn taken_over_by_a_flush(self) -> State {
        self.with(FLUSH_TAKEOVER)
    }

    /// The flush's takeover ends.
    pub(crate) fn flush_takeover_ended(self) -> State {
        self.without(FLUSH_TAKEOVER)
    }

    /// A periodic work touched during its run: a `Park` will end armed.
    pub(crate) fn touched_during_run(self) -> State {
        self.with(TOUCHED_IN_RUN)
    }

    /// Whether it was touched during the run that completes.
    pub(crate) fn was_touched_during_run(self) -> bool {
        self.has(TOUCHED_IN_RUN)
    }

    /// A run ends: not running, and the run's own flags gone.
    pub(crate) fn run_ended(self) -> State {
        self.without(RUNNING | RUNNING_INCREMENT | REARM_REFUSED | TOUCHED_IN_RUN)
    }

    /// The callback panicked: poisoned and disarmed for good.
    pub(crate) fn poisoned(self) -> State {
        self.with(POISONED).disarmed()
    }

    /// `Next::Stop`: disarmed and stopped (`touch` no longer arms it).
    pub(crate) fn stopped(self) -> State {
        self.disarmed().with(STOPPED)
    }

    /// `Next::Yield`: armed for `deadline` as an increment a flusher may take over.
    pub(crate) fn armed_for_an_increment(self, deadline: u64) -> State {
        self.armed(deadline).with(YIELDED)
    }
}

/// Which kind of work a word starts as (see [`State::new_work`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A `work()` or a `once`: its period follows its arms.
    FollowsArms,
    /// An `every()`: its period is fixed.
    FixedPeriod,
    /// A timeout work.
    Timeout,
}

/// The refusal a `cancel_sync` (or drop) sets with its disarm (see [`State::cancelled_sync`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No run in progress: nothing to refuse beyond the disarm.
    None,
    /// A run to wait for: every arm is refused while the wait lasts ("disable, flush,
    /// enable", as the kernel's `cancel_delayed_work_sync`), with a flag of its own that
    /// `enable()` cannot lift.
    WhileWaiting,
    /// The run is the caller's own, or waiting would close a cycle: the run's own
    /// re-arm is refused instead.
    OwnRearm,
}

//! A work's state word: its flags and its deadline, in one atomic.
//!
//! The word owns its transitions, as tokio's `StateCell` does: the flags are private to
//! this module, and every change a caller makes is a named method of [`State`] (a new
//! word from an old one: `cancelled`, `cancelled_sync`, `disabled`, `detached`,
//! `run_ended`, `armed_for_an_increment`, ... in [`transitions`]; arming, entries and a
//! run's take here) or of [`StateCell`] (the flags no CAS writer decides on). Callers
//! decide *when* to apply a transition (a CAS loop, or `Shared::commit`, which also
//! links a timer entry); which bits it touches is said here.
//!
//! # Ground rules
//!
//! - Every write is a compare-and-swap of the whole word (or an atomic `fetch_and`/
//!   `fetch_or` of flags no other writer decides on), because some transitions happen
//!   without the scheduler's core lock: the fast paths of `reschedule`, `schedule`,
//!   `cancel` and a timeout work's `touch`. A writer under the lock computes its new word
//!   from the one it read and retries if the word moved meanwhile.
//! - `PENDING` means "logically armed": the deadline field holds when it is due. Arming
//!   and disarming are single CASes: a due work is taken (`PENDING` → `RUNNING`) by a CAS
//!   too, so a reschedule or cancel racing with the take is either before it (and the
//!   take sees it) or after it (and applies to the next instance).
//! - `QUEUED` means the work has a *live* entry in the timer structure: an entry tagged
//!   with the word's current `EPOCH`. While `QUEUED`, that entry sits at a tick no later
//!   than the deadline field (for a timeout work: no later than its effective due time).
//!   So a lock-free arm may set any deadline at or after the current one and rely on the
//!   entry to wake a worker in time; an earlier deadline needs a new entry, which only
//!   the lock may link (bumping `EPOCH`, so the old entry is recognised as stale).
//!   Entries are removed lazily: a cancelled work keeps its entry until its tick comes,
//!   and the worker then drops it (one wakeup at most, shared with anything else due).
//! - `RUNNING` is set exactly while one thread executes the callback; only the thread
//!   that set it may touch the closure. A due entry whose work is still `RUNNING` is
//!   dropped (`QUEUED` cleared) and the completion links a new one: non-reentrancy.
//! - `DISABLED` refuses every arm while the disable count (kept under the core lock) is
//!   above zero. `CANCEL_WAITING` refuses every arm while a `cancel_sync` (or a drop)
//!   waits for the running instance, as the kernel's `cancel_delayed_work_sync` is
//!   "disable, flush, enable"; it is a separate flag so that an `enable()` without a
//!   matching `disable()` cannot lift it.
//! - One CAS for each promise: a refusal and the disarm it guards are published
//!   together. `cancel_sync` and drop disarm and set `CANCEL_WAITING` (a run to wait
//!   for) or `REARM_REFUSED` (a run that is the caller's own, or a wait cycle) in one
//!   CAS, deciding which under the core lock, where `RUNNING` cannot change (only a take
//!   sets it and only a completion clears it, both under the lock). `disable` sets
//!   `DISABLED` and disarms in one CAS. So a lock-free arm racing them either lands first
//!   and is disarmed, or fails its CAS and finds the refusal. Shutdown is the lock's
//!   `shutdown` flag, not a bit: every locked arm goes through `Shared::commit`, which
//!   disarms once it is set, and a lock-free arm needs a live entry (`QUEUED`), which no
//!   work has once shutdown drained the timer structure.
//! - A `work()`'s period is a second word, which must agree with the deadline of the
//!   arm that set it, and which `Next::Again` and a touch of a parked work read to decide
//!   their new word. `PERIOD_CLAIMED` is a bit lock on it, taken by a CAS from a word
//!   without it, so one thread at a time holds it, and released by its holder (a
//!   `fetch_and`, or the CAS that publishes the holder's decision). An arm of a `work()`,
//!   lock-free or locked, takes it in the CAS that publishes its deadline, stores its
//!   delay and releases it; a completion or a touch that needs the period takes it first
//!   and releases it with the CAS of its new word. While it is held no other claim
//!   succeeds: arms go to the lock and wait there outside the core lock, readers wait.
//!   Every other transition keeps the bit as it is and never waits for it. A held claim
//!   is what makes the pair airtight: a decision made from the period read under it
//!   cannot be fooled by a word that another thread changed and brought back bit for bit
//!   meanwhile, as a decision from an unclaimed read could (a word that leaves and comes
//!   back carries no trace of the period stored in between).
//! - `FIRING` (timeout works): set by a worker before it reads the work's latest touch to
//!   decide whether it is due, and cleared by every `touch()` that records a newer time.
//!   The worker's take is a CAS that expects `FIRING`, so a touch that lands between the
//!   worker's read and its take makes the take fail and the decision is made again.
//!
//!   A touch stores its stamp, then loads the word and clears `FIRING` if it is set (all
//!   `SeqCst`). Its clear can come after the take: the worker read the stamp before the
//!   touch stored it, and the take's CAS came before the clear. That touch did not return
//!   before the take, and the callback may begin after it returned; it counts as a touch
//!   during the run, which the completion honours (it reads the stamp after clearing
//!   `RUNNING`, finds it newer than the one the run was taken with, and re-arms for
//!   touch + idle). A touch that *returned* before the take is never followed by that
//!   run: if it saw `FIRING`, its clear preceded the take, whose CAS then fails; if it
//!   did not, its load preceded the worker's `FIRING` CAS in the `SeqCst` order, so its
//!   stamp store did too, and the worker's stamp read after that CAS sees the stamp. No
//!   lock-free touch can promise more: whatever a worker checks last, a touch just after
//!   it overlaps the run's start. The loom model
//!   `timeout::touch_against_the_fire_that_re_arms` pins this: a touch after which the
//!   work is seen neither running nor run is never followed by the run.
//!
//! # Layout
//!
//! ```text
//! | 63 .. 21                     | 20 .. 19 | 18 .. 0 |
//! | deadline (100 µs units)      | epoch    | flags   |
//! ```
//!
//! The deadline counts 100 µs units from the scheduler's start, rounded up (never
//! early), and saturates at [`DEADLINE_NEVER`] (about 27 years), which is never due.

mod transitions;

pub(crate) use transitions::{Kind, Refusal};

use crate::sync::{AtomicU64, Ordering, load_ordered_after_seqcst_writes};

/// Logically armed: the deadline field is when it is due.
const PENDING: u64 = 1 << 0;
/// Its callback is executing on some thread.
const RUNNING: u64 = 1 << 1;
/// Its callback panicked; it never runs again.
const POISONED: u64 = 1 << 2;
/// The callback returned `Next::Stop`, or `cancel_sync` ran: `touch()` no longer arms
/// it, `schedule` does.
const STOPPED: u64 = 1 << 3;
/// Cancelled from inside its own run: the run's own re-arm is refused.
const REARM_REFUSED: u64 = 1 << 4;
/// Its handle was dropped: nothing arms it again, and whoever ends its last run frees
/// the closure.
const ORPHANED: u64 = 1 << 5;
/// The pending instance was armed by `Next::Yield`: a flusher takes it over.
const YIELDED: u64 = 1 << 6;
/// The period is fixed (`every`, `timeout`); `schedule`/`reschedule` only move the
/// deadline.
const FIXED_PERIOD: u64 = 1 << 7;
/// One or more `cancel_sync` (or drop) calls wait for the running instance; they are
/// counted in the core's `cancel_waiters`.
const CANCEL_WAITING: u64 = 1 << 8;
/// The run in progress is a `Yield` increment: a flusher waits for it and then takes
/// over the rest, where it does not wait for a run that `Again`/`After` armed.
const RUNNING_INCREMENT: u64 = 1 << 9;
/// A flush is taking over the work's `Yield` increments: workers leave a pending
/// increment to it instead of running it themselves.
const FLUSH_TAKEOVER: u64 = 1 << 10;
/// The disable count (kept in the core) is above zero: every arm is refused.
const DISABLED: u64 = 1 << 11;
/// Has a live entry in the timer structure (see the ground rules).
const QUEUED: u64 = 1 << 12;
/// A timeout work: `touch()` postpones it (see `timeout`).
const TIMEOUT: u64 = 1 << 13;
/// A worker is deciding whether this timeout work is due (see the ground rules).
const FIRING: u64 = 1 << 14;
/// A `work()`'s period word is claimed (see the ground rules).
const PERIOD_CLAIMED: u64 = 1 << 15;
/// The closure has been dropped (the handle let go of it, or its last run ended after
/// that, or a `once` work's one run consumed it): every arm is refused, and the
/// allocation may live on while timer entries still point at it.
const CLOSURE_DROPPED: u64 = 1 << 16;
/// A periodic work was touched while it ran: if the callback returns `Park`, it ends
/// armed for its period; any other decision stands.
const TOUCHED_IN_RUN: u64 = 1 << 17;
/// Its handle was given up with `Work::detach`: it lives on until its callback returns
/// `Stop` or `Park`, panics, or the scheduler shuts down, and is then freed.
const DETACHED: u64 = 1 << 18;

/// Largest disable nesting depth; deeper `disable()` calls are counted as this.
pub(crate) const DISABLE_MAX: u64 = (1 << 21) - 1;

const EPOCH_SHIFT: u32 = 19;
const EPOCH_MASK: u64 = EPOCH_VALUES << EPOCH_SHIFT;
/// Epochs wrap at four: a stale entry whose epoch comes round again is taken for live,
/// which costs one more entry until the work's next run, never a wrong run (a run needs
/// `PENDING` and a due deadline, whichever entry finds them).
const EPOCH_VALUES: u64 = 0b11;
const DEADLINE_SHIFT: u32 = 21;

/// Length of one deadline unit, in nanoseconds. Slacks are whole multiples of it.
pub(crate) const DEADLINE_UNIT_NS: u64 = 100_000;
/// The saturated deadline: never due.
pub(crate) const DEADLINE_NEVER: u64 = (1 << (64 - DEADLINE_SHIFT)) - 1;

/// Converts scheduler nanoseconds to deadline units, rounding up and saturating.
pub(crate) fn units_ceil(ns: u64) -> u64 {
    ns.div_ceil(DEADLINE_UNIT_NS).min(DEADLINE_NEVER)
}

/// Converts deadline units to scheduler nanoseconds (`u64::MAX` for never).
pub(crate) fn units_to_ns(units: u64) -> u64 {
    if units >= DEADLINE_NEVER {
        u64::MAX
    } else {
        units * DEADLINE_UNIT_NS
    }
}

/// A time in deadline units, rounded down, and short of the saturated deadline: a
/// never-due work stays never due even after `advance(Duration::MAX)`.
pub(crate) fn now_units(now_ns: u64) -> u64 {
    (now_ns / DEADLINE_UNIT_NS).min(DEADLINE_NEVER - 1)
}

/// The state word itself. Every transition goes through its methods: a plain load, a
/// CAS of the whole word, a CAS loop ([`update`](Self::update)), and the two flag edits
/// that no other writer decides on (`CLOSURE_DROPPED`, a touch clearing `FIRING`), and
/// the release of a period claim. Arms under the core lock go through `Shared::commit`, which is an
/// `update` that also links a timer entry.
#[derive(Debug)]
pub(crate) struct StateCell(AtomicU64);

impl StateCell {
    pub(crate) fn new(state: State) -> StateCell {
        StateCell(AtomicU64::new(state.0))
    }

    /// The word (acquire).
    #[inline]
    pub(crate) fn load(&self) -> State {
        State(self.0.load(Ordering::Acquire))
    }

    /// The word, ordered after the caller's earlier `SeqCst` writes (see
    /// [`load_ordered_after_seqcst_writes`]): the touch paths.
    #[inline]
    pub(crate) fn load_after_seqcst_writes(&self) -> State {
        State(load_ordered_after_seqcst_writes(&self.0))
    }

    /// Publishes `new` if the word still is `old`.
    #[inline]
    pub(crate) fn cas(&self, old: State, new: State) -> bool {
        self.0
            .compare_exchange(old.0, new.0, Ordering::SeqCst, Ordering::Acquire)
            .is_ok()
    }

    /// Applies `edit` with a CAS loop and returns the old and new words; `None` from
    /// `edit` leaves the word as it is. For edits that never arm (arming goes through
    /// `Shared::commit`, which links an entry when one is needed).
    pub(crate) fn update(
        &self,
        mut edit: impl FnMut(State) -> Option<State>,
    ) -> Option<(State, State)> {
        loop {
            let old = self.load();
            let new = edit(old)?;
            if old == new || self.cas(old, new) {
                return Some((old, new));
            }
        }
    }

    /// Sets `flag`, which no CAS writer decides on (`CLOSURE_DROPPED`); returns the word
    /// before.
    fn set_flag(&self, flag: u64) -> State {
        State(self.0.fetch_or(flag, Ordering::AcqRel))
    }

    /// Releases the claim on a `work()`'s period, which the caller holds (release: the
    /// next holder sees the period it stored).
    #[inline]
    pub(crate) fn release_period_claim(&self) {
        self.0.fetch_and(!PERIOD_CLAIMED, Ordering::AcqRel);
    }

    /// Marks the closure as dropped; returns whether it already was.
    pub(crate) fn mark_closure_dropped(&self) -> bool {
        self.set_flag(CLOSURE_DROPPED).has(CLOSURE_DROPPED)
    }

    /// Clears `FIRING`: a touch that recorded a newer stamp makes the worker's take fail
    /// (see the ground rules).
    pub(crate) fn clear_firing(&self) {
        self.0.fetch_and(!FIRING, Ordering::SeqCst);
    }
}

/// A decoded copy of the state word; edit it, then publish it with a CAS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State(u64);

impl State {
    fn has(self, flag: u64) -> bool {
        self.0 & flag != 0
    }

    fn set(&mut self, flag: u64) {
        self.0 |= flag;
    }

    fn clear(&mut self, flag: u64) {
        self.0 &= !flag;
    }

    /// With `flag` set (by value).
    fn with(mut self, flag: u64) -> State {
        self.set(flag);
        self
    }

    /// With `flag` cleared (by value).
    fn without(mut self, flag: u64) -> State {
        self.clear(flag);
        self
    }

    /// The deadline, in units (meaningful while `PENDING` or `QUEUED`).
    pub(crate) fn deadline(self) -> u64 {
        self.0 >> DEADLINE_SHIFT
    }

    fn set_deadline(&mut self, units: u64) {
        self.0 =
            (self.0 & ((1 << DEADLINE_SHIFT) - 1)) | (units.min(DEADLINE_NEVER) << DEADLINE_SHIFT);
    }

    /// The epoch of the live timer entry.
    pub(crate) fn epoch(self) -> u8 {
        ((self.0 & EPOCH_MASK) >> EPOCH_SHIFT) as u8
    }

    /// Arms for `deadline` (units): `PENDING`, not stopped, not a `Yield` increment.
    pub(crate) fn arm(&mut self, deadline: u64) {
        self.set_deadline(deadline);
        self.set(PENDING);
        self.clear(STOPPED | YIELDED);
    }

    /// Disarms: the pending instance (if any) will not run. The timer entry stays until
    /// its tick (see the ground rules).
    pub(crate) fn disarm(&mut self) {
        self.clear(PENDING | YIELDED);
    }

    /// Whether arming `self` (the old word) into `new` needs a new timer entry: there is
    /// no live one, or the new deadline is earlier than the one it was placed for.
    pub(crate) fn needs_entry(self, new: State) -> bool {
        new.has(PENDING) && (!self.has(QUEUED) || new.deadline() < self.deadline())
    }

    /// Claims a new live entry: `QUEUED` with the next epoch. Returns that epoch.
    pub(crate) fn claim_entry(&mut self) -> u8 {
        let epoch = (self.epoch() + 1) & EPOCH_VALUES as u8;
        self.0 = (self.0 & !EPOCH_MASK) | (u64::from(epoch) << EPOCH_SHIFT) | QUEUED;
        epoch
    }

    /// Whether an entry tagged `epoch` is the live one.
    pub(crate) fn is_live_entry(self, epoch: u8) -> bool {
        self.has(QUEUED) && self.epoch() == epoch
    }

    /// Takes the pending instance to run it: `RUNNING`, remembering whether it is a
    /// `Yield` increment. The timer entry is consumed (or left stale).
    pub(crate) fn start_run(&mut self) {
        let increment = self.has(YIELDED);
        self.clear(PENDING | YIELDED | QUEUED | FIRING);
        self.set(RUNNING);
        if increment {
            self.set(RUNNING_INCREMENT);
        }
    }

    /// Whether its period follows its arms (a `work()`, neither `every` nor timeout).
    pub(crate) fn period_follows_arms(self) -> bool {
        !self.has(FIXED_PERIOD | TIMEOUT)
    }

    /// Whether a thread holds the claim on a `work()`'s period (see
    /// [`PERIOD_CLAIMED`]).
    #[inline]
    pub(crate) fn period_claimed(self) -> bool {
        self.has(PERIOD_CLAIMED)
    }

    /// With the claim on the period taken.
    #[inline]
    pub(crate) fn with_period_claim(self) -> State {
        self.with(PERIOD_CLAIMED)
    }

    /// Armed for `deadline` by `schedule`/`reschedule`: a `work()`'s period follows its
    /// arms, so its arm also takes the claim on the period, to store its delay and
    /// release it after the CAS (see the ground rules).
    #[inline]
    pub(crate) fn armed_by_an_arm(self, deadline: u64) -> State {
        let new = self.armed(deadline);
        if self.period_follows_arms() {
            new.with_period_claim()
        } else {
            new
        }
    }

    /// With the claim on the period released.
    pub(crate) fn without_period_claim(self) -> State {
        self.without(PERIOD_CLAIMED)
    }

    /// Whether an arm request must be refused (disabled, poisoned, being cancelled,
    /// orphaned, or with nothing left to run: a `once` work after its run).
    pub(crate) fn refuses_arm(self) -> bool {
        self.has(DISABLED | POISONED | REARM_REFUSED | ORPHANED | CANCEL_WAITING | CLOSURE_DROPPED)
    }

    /// Whether a touch must not arm the work: it refuses every arm, or `Next::Stop` or
    /// `cancel_sync` stopped it (only `schedule`/`reschedule` arm it again).
    pub(crate) fn refuses_touch(self) -> bool {
        self.has(STOPPED) || self.refuses_arm()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_epoch_and_flags_do_not_overlap() {
        let mut state = State(RUNNING | FIXED_PERIOD | CLOSURE_DROPPED | DETACHED);
        state.arm(DEADLINE_NEVER);
        assert_eq!(state.deadline(), DEADLINE_NEVER);
        for _ in 0..9 {
            let epoch = state.claim_entry();
            assert!(state.is_live_entry(epoch));
            assert!(!state.is_live_entry((epoch + 1) & EPOCH_VALUES as u8));
        }
        assert!(state.has(RUNNING | PENDING | QUEUED | FIXED_PERIOD | CLOSURE_DROPPED | DETACHED));
        state.disarm();
        state.start_run();
        assert_eq!(state.deadline(), DEADLINE_NEVER);
        assert!(!state.has(PENDING | QUEUED));
    }

    #[test]
    fn units_round_up_and_saturate() {
        assert_eq!(units_ceil(0), 0);
        assert_eq!(units_ceil(1), 1);
        assert_eq!(units_ceil(DEADLINE_UNIT_NS), 1);
        assert_eq!(units_ceil(u64::MAX), DEADLINE_NEVER);
        assert_eq!(units_to_ns(DEADLINE_NEVER), u64::MAX);
        let mut state = State(0);
        state.set_deadline(u64::MAX);
        assert_eq!(state.deadline(), DEADLINE_NEVER);
    }

    #[test]
    fn moving_a_deadline_earlier_needs_an_entry() {
        let mut old = State(0);
        old.arm(10);
        assert!(old.needs_entry(old), "no live entry yet");
        old.claim_entry();
        let mut later = old;
        later.arm(20);
        assert!(!old.needs_entry(later));
        let mut earlier = old;
        earlier.arm(5);
        assert!(old.needs_entry(earlier));
        assert!(
            !old.needs_entry(old.without(PENDING)),
            "disarming needs none"
        );
    }
}

//! A work's state word.
//!
//! # Ground rules
//!
//! - The word is written only while the scheduler's core lock is held, so every writer
//!   sees the latest value and a plain `store` suffices (no read-modify-write loops).
//! - It is read without the lock by the fast paths: `touch()` (one `SeqCst` load),
//!   `is_pending()`, `is_running()`, `is_poisoned()`.
//! - `PENDING` is set exactly while the work owns a timer entry, whose key is in the top 32
//!   bits. `RUNNING` is set exactly while one thread executes the callback; only the thread
//!   that set it may touch the closure. Together they give non-reentrancy: a due entry
//!   whose work is still `RUNNING` is detached and goes back on the ready list when the run
//!   ends.
//! - The disable count (bits 11..32) refuses every arm while it is above zero, including the
//!   running callback's own re-arm. It belongs to `disable`/`enable` alone.
//! - `CANCEL_WAITING` refuses every arm while a `cancel_sync` (or a drop) waits for the
//!   running instance, as the kernel's `cancel_delayed_work_sync` is "disable, flush,
//!   enable". It is a separate flag, with the number of waiters kept under the core lock,
//!   so that an `enable()` without a matching `disable()` cannot lift it.
//!
//! # State field
//!
//! ```text
//! | 63 .. 32  | 31 .. 8        | 7 .. 0 |
//! | timer key | disable count  | flags  |
//! ```

/// Has a timer entry (armed, due, or waiting for its running instance to end).
pub(crate) const PENDING: u64 = 1 << 0;
/// Its callback is executing on some thread.
pub(crate) const RUNNING: u64 = 1 << 1;
/// Its callback panicked; it never runs again.
pub(crate) const POISONED: u64 = 1 << 2;
/// The callback returned `Next::Stop`: `touch()` no longer arms it, `schedule` does.
pub(crate) const STOPPED: u64 = 1 << 3;
/// Cancelled from inside its own run: the run's own re-arm is refused.
pub(crate) const REARM_REFUSED: u64 = 1 << 4;
/// Its handle was dropped inside its own run: the runner frees the closure afterwards.
pub(crate) const ORPHANED: u64 = 1 << 5;
/// The pending instance was armed by `Next::Yield`: a flusher takes it over.
pub(crate) const YIELDED: u64 = 1 << 6;
/// The period is fixed (`every`); `schedule`/`reschedule` only move the deadline.
pub(crate) const FIXED_PERIOD: u64 = 1 << 7;
/// One or more `cancel_sync` (or drop) calls wait for the running instance; they are
/// counted in the core's `cancel_waiters`. Kept apart from the disable count so that an
/// unmatched `enable()` can never undo their refusal.
pub(crate) const CANCEL_WAITING: u64 = 1 << 8;
/// The run in progress is a `Yield` increment: a flusher waits for it and then takes
/// over the rest, where it does not wait for a run that `Again`/`After` armed.
pub(crate) const RUNNING_INCREMENT: u64 = 1 << 9;
/// A flush is taking over the work's `Yield` increments: workers leave a pending
/// increment to it instead of running it themselves.
pub(crate) const FLUSH_TAKEOVER: u64 = 1 << 10;

const DISABLE_SHIFT: u32 = 11;
const DISABLE_ONE: u64 = 1 << DISABLE_SHIFT;
/// Largest disable nesting depth; deeper `disable()` calls are counted as this.
pub(crate) const DISABLE_MAX: u64 = (1 << 21) - 1;
const DISABLE_MASK: u64 = DISABLE_MAX << DISABLE_SHIFT;
const KEY_SHIFT: u32 = 32;

/// A decoded copy of the state word; edit it, then store it back under the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State(pub(crate) u64);

impl State {
    pub(crate) fn has(self, flag: u64) -> bool {
        self.0 & flag != 0
    }

    pub(crate) fn set(&mut self, flag: u64) {
        self.0 |= flag;
    }

    pub(crate) fn clear(&mut self, flag: u64) {
        self.0 &= !flag;
    }

    pub(crate) fn disabled(self) -> u64 {
        (self.0 & DISABLE_MASK) >> DISABLE_SHIFT
    }

    /// Adds one disable level; returns false (and changes nothing) at `DISABLE_MAX`.
    pub(crate) fn disable(&mut self) -> bool {
        if self.disabled() == DISABLE_MAX {
            return false;
        }
        self.0 += DISABLE_ONE;
        true
    }

    /// Removes one disable level; returns false if none was held.
    pub(crate) fn enable(&mut self) -> bool {
        if self.disabled() == 0 {
            return false;
        }
        self.0 -= DISABLE_ONE;
        true
    }

    /// The timer key, valid only while `PENDING`.
    pub(crate) fn key(self) -> u32 {
        (self.0 >> KEY_SHIFT) as u32
    }

    pub(crate) fn set_pending(&mut self, key: u32) {
        self.0 = (self.0 & 0xFFFF_FFFF) | (u64::from(key) << KEY_SHIFT) | PENDING;
    }

    pub(crate) fn clear_pending(&mut self) {
        self.0 &= 0xFFFF_FFFF & !(PENDING | YIELDED);
    }

    /// Takes the pending instance to run it: `RUNNING`, remembering whether it is a
    /// `Yield` increment. The timer entry must have been removed.
    pub(crate) fn start_run(&mut self) {
        let increment = self.has(YIELDED);
        self.clear_pending();
        self.set(RUNNING);
        if increment {
            self.set(RUNNING_INCREMENT);
        }
    }

    /// Whether an arm request must be refused (disabled, poisoned, being cancelled, or
    /// orphaned).
    pub(crate) fn refuses_arm(self) -> bool {
        self.disabled() > 0 || self.has(POISONED | REARM_REFUSED | ORPHANED | CANCEL_WAITING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_flags_do_not_overlap() {
        let mut state = State(RUNNING | FIXED_PERIOD);
        assert!(state.disable());
        state.set_pending(u32::MAX);
        assert_eq!(state.key(), u32::MAX);
        assert_eq!(state.disabled(), 1);
        assert!(state.has(RUNNING | PENDING));
        state.clear_pending();
        assert_eq!(state, State(RUNNING | FIXED_PERIOD | DISABLE_ONE));
        assert!(state.enable());
        assert!(!state.enable());
    }

    #[test]
    fn disable_saturates() {
        let mut state = State(DISABLE_MAX << DISABLE_SHIFT);
        assert!(!state.disable());
        assert_eq!(state.disabled(), DISABLE_MAX);
    }
}

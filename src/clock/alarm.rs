//! The portable timer a worker sleeps on: a deadline under a mutex and a condition
//! variable with a timed wait. Every OS has one; Linux uses it when built with
//! `--cfg nicework_portable`, so the suite tests it here too.
//!
//! It keeps the contract of the timerfd it stands in for ([`timerfd`](super)): the
//! programming end lives in the scheduler's core and programs one shot; a worker's reader
//! blocks until the programmed time passes, also when that time was moved earlier while
//! it slept; an expiry that passes before the reader blocks is not lost (the deadline
//! stays until a reader sees it passed); disarming leaves the reader blocked with no
//! deadline at all, so a scheduler with every work parked sleeps without a wakeup.
//!
//! Invariants:
//! - `deadline` is the one pending expiry: `program` replaces it, `disarm` clears it, and
//!   the reader that finds it passed clears it (a one-shot timer fires once).
//! - `program` notifies only when the new deadline is earlier than the one a sleeper may
//!   be waiting for (or there was none): a later one lets the sleeper wake at the old
//!   time, see the new one and sleep again, which costs one wakeup instead of two.
//! - Each return of the OS wait is counted in [`WakeupCounter`]: the wakeups a worker
//!   reports are the times it really woke, spurious and early ones included.
//!
//! The lock order is the core lock, then the alarm's: `program` runs under the core lock
//! and a sleeping reader holds only the alarm's.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Counts a worker's wakeups where no OS count exists.
pub(crate) type WakeupCounter = Arc<AtomicU64>;

#[derive(Debug)]
struct Alarm {
    /// When the programmed shot fires; `None` when disarmed or already seen.
    deadline: Mutex<Option<Instant>>,
    rung: Condvar,
    wakeups: WakeupCounter,
}

impl Alarm {
    fn deadline(&self) -> MutexGuard<'_, Option<Instant>> {
        // Only this module's code runs under the lock and none of it panics: a poisoned
        // lock still holds a consistent deadline.
        self.deadline
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The programming end.
#[derive(Debug)]
pub(crate) struct TimerSource {
    alarm: Arc<Alarm>,
}

/// A worker's blocking end.
#[derive(Debug)]
pub(crate) struct TimerReader {
    alarm: Arc<Alarm>,
}

impl TimerSource {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(TimerSource {
            alarm: Arc::new(Alarm {
                deadline: Mutex::new(None),
                rung: Condvar::new(),
                wakeups: WakeupCounter::default(),
            }),
        })
    }

    /// A timer for a hosted scheduler's `Driver`: nobody blocks on it, so it is the same
    /// timer (the host learns the deadline from `Driver::next_deadline` and its waker).
    pub(crate) fn new_nonblocking() -> io::Result<Self> {
        Self::new()
    }

    /// Another end of the same timer for a worker to block on.
    pub(crate) fn reader(&self) -> io::Result<TimerReader> {
        Ok(TimerReader {
            alarm: self.alarm.clone(),
        })
    }

    /// The count of wakeups the readers of this timer took.
    pub(crate) fn wakeups(&self) -> WakeupCounter {
        self.alarm.wakeups.clone()
    }

    /// Fires once, `after_ns` from now.
    pub(crate) fn program(&mut self, after_ns: u64) {
        let now = Instant::now();
        let at = now
            .checked_add(Duration::from_nanos(after_ns))
            // Beyond what `Instant` can hold: as good as never, but still armed.
            .unwrap_or_else(|| now + Duration::from_secs(u64::from(u32::MAX)));
        let mut deadline = self.alarm.deadline();
        let earlier = deadline.is_none_or(|old| at < old);
        *deadline = Some(at);
        drop(deadline);
        if earlier {
            self.alarm.rung.notify_all();
        }
    }

    /// No shot pending; a blocked reader keeps sleeping (it wakes at most once more, at
    /// the time it was waiting for, and sleeps on without a deadline).
    pub(crate) fn disarm(&mut self) {
        *self.alarm.deadline() = None;
    }
}

impl TimerReader {
    /// Blocks until the programmed time passes.
    pub(crate) fn wait(&self) {
        let mut deadline = self.alarm.deadline();
        loop {
            let now = Instant::now();
            deadline = match *deadline {
                Some(at) if at <= now => {
                    *deadline = None;
                    return;
                }
                Some(at) => {
                    self.alarm
                        .rung
                        .wait_timeout(deadline, at - now)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
                None => self
                    .alarm
                    .rung
                    .wait(deadline)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
            self.alarm.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Clears an expiry that passed, as reading a non-blocking timerfd does.
    pub(crate) fn drain(&self) {
        let mut deadline = self.alarm.deadline();
        if deadline.is_some_and(|at| at <= Instant::now()) {
            *deadline = None;
        }
    }
}

//! Idle timeouts: works that run once `idle` has passed without activity.
//!
//! # Idle timeout vs periodic maintenance
//!
//! - [`every`](Scheduler::every) is periodic maintenance: *activity wakes* a parked work
//!   (`touch()` arms it for its period) and the callback decides whether to re-arm. Use it
//!   for a purge, a compaction, a flush of dirty state: work to do *because* something
//!   happened.
//! - [`timeout`](Scheduler::timeout) is an idle timeout: *activity postpones* the run.
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
//!   an atomic load, a clock read and a compare, plus one `fetch_max` when the clock has
//!   moved since the last recorded touch. It never touches the timer structure.
//! - The timer entry stays where it was. When it fires before the postponed deadline, the
//!   worker places it again for the rest, without calling the callback; that is not a run
//!   in the stats.
//! - `touch()` on a parked timeout work arms it for now + idle; after `Next::Stop` or
//!   `cancel_sync` it does nothing (as for every work).
//! - A touch during a run is never lost: the work ends armed, due no earlier than that
//!   touch + idle, whatever the callback returned, except `Stop`, a cancellation or a
//!   panic.
//!
//! # Clock
//!
//! For an idle of at least 100 times the coarse clock's margin (on a 250 Hz kernel,
//! 3.2 s) touches are stamped with `CLOCK_MONOTONIC_COARSE`, which costs a few ns where
//! a full clock read costs up to ten times that; the stamp is then counted as up to that
//! margin later than recorded, so a timeout may run up to that much late (1 % of the
//! idle at most) and never early. Shorter idles read the full clock.

use std::time::Duration;

use crate::clock::nanos;
use crate::scheduler::{Ctx, Next, Scheduler, Work};

impl Scheduler {
    /// Creates an idle timeout: a work armed for now + `idle` that every
    /// [`touch`](Work::touch) postpones to touch + `idle`. Its period (for
    /// [`Next::Again`]) is `idle`. See "Idle timeout vs periodic maintenance" in the [crate docs](crate):
    /// activity postpones a timeout work, where it wakes a parked [`every`](Self::every)
    /// work.
    ///
    /// `idle` follows the rules of every delay: zero is due at the next opportunity (its
    /// re-arms round up to the slack), and a huge one saturates (never due).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let reaper = sched.timeout(Duration::from_secs(10), |_| Next::Park);
    /// sched.advance(Duration::from_secs(9));
    /// reaper.touch(); // active at 9 s: now due at 19 s
    /// sched.advance(Duration::from_secs(9));
    /// assert_eq!(reaper.stats().runs, 0); // the early fire at 10 s re-armed it
    /// sched.advance(Duration::from_secs(1));
    /// assert_eq!(reaper.stats().runs, 1);
    /// ```
    pub fn timeout<F>(&self, idle: Duration, f: F) -> Work
    where
        F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
    {
        let work = Work::new_timeout(self, f, nanos(idle));
        self.shared().arm_new(work.inner(), idle);
        work
    }
}

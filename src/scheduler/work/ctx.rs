//! What a callback receives ([`Ctx`]) and returns ([`Next`]).

use super::{Callback, WorkInner};
use std::time::{Duration, Instant};

use crate::Scheduler;

/// What a work's callback asks for next.
///
/// Every re-arm delay below the scheduler's slack (including zero) is rounded up to the
/// slack, so a callback can never spin a core by returning `Again` with a zero period;
/// [`Next::Yield`] is the explicit "run me again as soon as the others had their turn".
///
/// A re-arm is refused while the work is disabled or being cancelled
/// ([`Work::cancel_sync`](crate::Work::cancel_sync)), and it leaves an instance that was
/// armed during the run by `schedule`/`reschedule` where it is, as the kernel's
/// `queue_delayed_work` on a pending work does. A `touch()` during the run does not
/// override the decision: it only turns `Park` into "armed for the period"
/// (`Again`, `After`, `At` and `Yield` stand, and `Stop` stays stopped). Timeout works
/// differ on purpose: there a touch during the run postpones whatever was decided.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Scheduler};
///
/// let sched = Scheduler::manual();
/// let mut left = 3;
/// let work = sched.every(Duration::from_millis(5), move |_| {
///     left -= 1;
///     if left == 0 { Next::Park } else { Next::Again }
/// });
/// sched.advance(Duration::from_millis(100));
/// assert_eq!(work.stats().runs, 3);
/// assert!(!work.is_pending());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Re-arm after the work's period, measured from the end of this run (fixed delay: no
    /// burst of catch-up runs after a stall).
    Again,
    /// Re-arm after this delay; the period is unchanged.
    After(Duration),
    /// More to do: run again as soon as the other due works had their turn. While more
    /// threads are runnable than the machine has CPUs, a worker defers the next
    /// increment by a growing back-off instead ([`Builder::back_off`](crate::Builder::back_off)),
    /// so a long cleanup only uses idle CPU. A thread blocked in
    /// [`Work::flush`](crate::Work::flush) takes the remaining increments on itself.
    Yield,
    /// Nothing to do: stay disarmed until `touch()` or `schedule()`.
    Park,
    /// Done for good: `touch()` no longer arms it; a later `schedule()` or `reschedule()`
    /// does. An arm made while this run was in progress (from another thread, or by the
    /// callback itself) stands, as `schedule()` promises: its instance runs after this
    /// one, and only then is the work stopped (if that run stops it).
    Stop,
    /// Re-arm at this instant, on the scheduler's clock ([`Ctx::deadline`] and
    /// [`Scheduler::now`] are on it): a fixed rate is
    /// `Next::At(cx.deadline() + cx.period())`. An instant less than the slack ahead
    /// (including one in the past) is due at now + slack, so a late work never bursts or
    /// spins; one too far ahead saturates like `Duration::MAX` (never due).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let start = sched.now();
    /// let work = sched.every(Duration::from_millis(10), |cx| {
    ///     Next::At(cx.deadline() + cx.period()) // 10, 20, 30 ms: no drift
    /// });
    /// sched.advance(Duration::from_millis(35));
    /// assert_eq!(work.stats().runs, 3);
    /// assert_eq!(work.deadline(), Some(start + Duration::from_millis(40)));
    /// ```
    At(Instant),
}

/// The context a callback runs in.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Scheduler};
///
/// let sched = Scheduler::manual();
/// let work = sched
///     .every(Duration::from_millis(20), |cx| {
///         assert_eq!(cx.name(), "purge");
///         assert_eq!(cx.period(), Duration::from_millis(20));
///         assert_eq!(cx.lateness(), Duration::ZERO); // virtual time is never late
///         assert!(cx.runs() >= 1);
///         Next::Again
///     })
///     .named("purge");
/// assert_eq!(sched.advance(Duration::from_millis(60)), 3);
/// ```
pub struct Ctx<'a> {
    pub(crate) scheduler: &'a Scheduler,
    pub(crate) work: &'a WorkInner<dyn Callback>,
    pub(crate) deadline_ns: u64,
    pub(crate) started_ns: u64,
    pub(crate) runs: u64,
}

impl Ctx<'_> {
    /// The deadline this run was armed for.
    pub fn deadline(&self) -> Instant {
        self.scheduler.instant_at(self.deadline_ns)
    }

    /// How long after its deadline this run started.
    pub fn lateness(&self) -> Duration {
        Duration::from_nanos(self.started_ns.saturating_sub(self.deadline_ns))
    }

    /// This run's number, counting from 1.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// The work's period: what `Next::Again` and `touch()` re-arm it for. For a
    /// [`work()`](Scheduler::work), the delay of its latest `schedule`/`reschedule`,
    /// which another thread may change during the run.
    pub fn period(&self) -> Duration {
        self.scheduler.shared().settle_period(&self.work.header);
        Duration::from_nanos(self.work.period_ns())
    }

    /// The work's leeway (see [`Work::leeway`](crate::Work::leeway)): how late after its
    /// deadline it may run so that it shares a wakeup; the scheduler's slack when it has
    /// none of its own or a shorter one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let _work = sched
    ///     .every(Duration::from_secs(1), |cx| {
    ///         assert_eq!(cx.leeway(), Duration::from_millis(100));
    ///         Next::Again
    ///     })
    ///     .leeway(Duration::from_millis(100));
    /// assert_eq!(sched.advance(Duration::from_secs(1)), 1);
    /// ```
    pub fn leeway(&self) -> Duration {
        self.scheduler.shared().leeway_of(&self.work.header)
    }

    /// Whether the machine is contended: more threads runnable than it has CPUs online,
    /// the signal the workers' back-off reads (see
    /// [`Builder::back_off`](crate::Builder::back_off)). A long callback that holds
    /// something the foreground needs (a cache's lock, say) asks between batches, and
    /// when it is true ends its batch, releases what it holds and returns
    /// [`Next::Yield`]: a nice-19 worker that keeps the lock while it waits for a CPU
    /// stalls every thread that needs the lock.
    ///
    /// A reading is at most 1 ms old (one clock read, and one read of the load signal per
    /// millisecond per scheduler), so asking between batches costs little. Linux counts
    /// the runnable threads machine-wide; other unixes read the one-minute load average,
    /// which turns on and off up to a minute late; on Windows it is always false.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let log = Arc::new(Mutex::new((0..10_000u32).collect::<Vec<_>>()));
    /// let sched = Scheduler::manual();
    /// let drained = log.clone();
    /// let _drain = sched.every(Duration::from_millis(300), move |cx| {
    ///     let mut log = drained.lock().unwrap();
    ///     while let Some(entry) = log.pop() {
    ///         std::hint::black_box(entry); // apply it
    ///         if entry % 256 == 0 && cx.contended() {
    ///             return Next::Yield; // the lock is released; the rest after the others
    ///         }
    ///     }
    ///     Next::Again
    /// });
    /// sched.advance(Duration::from_millis(300));
    /// while !log.lock().unwrap().is_empty() {
    ///     sched.advance(Duration::from_millis(1));
    /// }
    /// ```
    pub fn contended(&self) -> bool {
        let shared = self.scheduler.shared();
        shared.contention.contended(shared.clock.real_now_ns())
    }

    /// The scheduler running this work.
    pub fn scheduler(&self) -> &Scheduler {
        self.scheduler
    }

    /// The work's name (its [`Work::named`](crate::Work::named) name, or the closure's
    /// type name).
    pub fn name(&self) -> &str {
        self.work.name()
    }
}

impl std::fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("name", &self.name())
            .field("runs", &self.runs)
            .field("lateness", &self.lateness())
            .finish()
    }
}

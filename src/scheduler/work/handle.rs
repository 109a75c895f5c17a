//! [`Work`]: a callback plus its arming state, and the owning handle to it.

use std::future::Future;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Ctx, Next, WorkStats};

use crate::Scheduler;
use crate::scheduler::shared::Shared;
use crate::scheduler::wait::flush::Waiting;
use crate::scheduler::work::allocation::{Callback, Closure, OnceClosure, TimeoutClosure, WorkRef};
use crate::scheduler::work::cancel::Release;
use crate::scheduler::work::state::{Kind, State};
use crate::scheduler::work::timeout::PRECISE_TOUCH;

/// The owning handle of a delayed work (the kernel's `struct delayed_work`).
///
/// Dropping it is [`cancel_sync`](Self::cancel_sync): when `drop` returns, the callback is
/// not running and never runs again, and the closure has been dropped. Dropped from inside
/// its own callback, the work is cancelled at once and its closure is freed right after
/// the callback returns.
///
/// # Waiting from inside callbacks
///
/// `flush`, `cancel_sync` and drop wait for a run in progress, except where waiting could
/// never end: for the work's own run (called from inside its own callback), and for a
/// run whose callback waits, directly or through a chain of other callbacks' waits, for
/// the caller's callback. Such a wait cycle is broken where it would close: that call
/// does not wait and behaves as inside the own callback (`flush` returns `false`,
/// `cancel_sync` and drop refuse the run's own re-arm, and a dropped work's closure is
/// freed when its run ends), and a `tracing` warning names both works. Cycles across
/// schedulers are found too.
///
/// # How long a wait takes
///
/// A thread that waits for a run in progress on a worker (in `flush`, `cancel_sync` or
/// drop, or that polls a pending [`cancel_async`](Self::cancel_async) or
/// [`drop_async`](Self::drop_async) future) lends it its priority, as the kernel's
/// `flush_work_at_nice`: where the process
/// may raise a thread (`CAP_SYS_NICE`, or an `RLIMIT_NICE` that allows the waiter's nice;
/// see [`Scheduler::raise_limit`](crate::Scheduler::raise_limit)) the worker runs the rest
/// of that run at the waiter's nice and goes back to its own after. Without that right
/// the waiter only waits: a nice-19 (or `SCHED_IDLE`) run on a machine whose CPUs are
/// busy gets a sliver of a CPU, so the wait can last many times the callback's own CPU
/// time. Keep callbacks short, cancel with [`cancel`](Self::cancel) where waiting is not
/// needed, and in async code use [`cancel_async`](Self::cancel_async) and
/// [`drop_async`](Self::drop_async), which wait without blocking the executor's thread.
///
/// # Panics in user code
///
/// A panic in the callback is caught and poisons the work. So is a panic raised while
/// dropping that panic's payload, and a panic in the closure's destructor wherever it
/// runs (in `drop(work)` on the caller, or on the worker after a work dropped itself):
/// nothing unwinds into nicework's threads or into the caller, no work is left marked
/// running, and every later call returns.
///
/// After the scheduler was shut down (its last handle dropped), arming calls return
/// `false`, `touch` does nothing, `cancel*` return `false` and `flush` returns `false`
/// unless it had to wait for a run still in progress.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Scheduler};
///
/// let sched = Scheduler::manual();
/// let work = sched.work(|_| Next::Park).named("purge");
/// assert!(work.schedule(Duration::from_millis(10)));
/// assert!(!work.schedule(Duration::from_millis(1))); // already pending: unchanged
/// assert!(work.reschedule(Duration::from_millis(1))); // moved
/// assert_eq!(sched.advance(Duration::from_millis(1)), 1);
/// work.touch(); // parked: armed again for its period (1 ms)
/// assert!(work.is_pending());
/// assert!(work.cancel_sync());
/// ```
pub struct Work {
    /// Dropped by hand in `Drop`, after the cancel, so that a panicking closure destructor
    /// is contained.
    inner: ManuallyDrop<WorkRef>,
    shared: Arc<Shared>,
}

impl Work {
    pub(crate) fn new<F>(scheduler: &Scheduler, f: F, period_ns: u64, fixed: bool) -> Work
    where
        F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
    {
        let kind = if fixed {
            Kind::FixedPeriod
        } else {
            Kind::FollowsArms
        };
        Work::from_callback(scheduler, Closure::new(f), kind, period_ns)
    }

    /// A `once` work (see [`Scheduler::once`]), not armed yet.
    pub(crate) fn new_once<F>(scheduler: &Scheduler, f: F) -> Work
    where
        F: FnOnce(&mut Ctx<'_>) + Send + 'static,
    {
        Work::from_callback(scheduler, OnceClosure::new(f), Kind::FollowsArms, 0)
    }

    /// A timeout work (see [`Scheduler::timeout`]); its period word is its touch stamp.
    pub(crate) fn new_timeout<F>(scheduler: &Scheduler, f: F, idle_ns: u64) -> Work
    where
        F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
    {
        let precise = if scheduler.shared().tick_touch(idle_ns) {
            0
        } else {
            PRECISE_TOUCH
        };
        Work::from_callback(
            scheduler,
            TimeoutClosure::new(idle_ns, f),
            Kind::Timeout,
            precise,
        )
    }

    fn from_callback(
        scheduler: &Scheduler,
        callback: impl Callback,
        kind: Kind,
        period_word: u64,
    ) -> Work {
        let work = WorkRef::new(State::new_work(kind), period_word, callback);
        scheduler.shared().register(&work);
        Work {
            inner: ManuallyDrop::new(work),
            shared: scheduler.shared().clone(),
        }
    }

    /// Whether the work's scheduler shut down: nothing will run the work any more.
    pub(crate) fn scheduler_is_shut_down(&self) -> bool {
        self.shared.is_shut_down()
    }

    /// The scheduler the work belongs to.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn inner(&self) -> &WorkRef {
        &self.inner
    }

    fn state(&self) -> State {
        self.inner.header().state.load()
    }

    /// Arms the work for `now + delay` unless it is already pending (the kernel's
    /// `queue_delayed_work`). A zero delay runs it at the next opportunity. For a
    /// [`work`](Scheduler::work) it also sets the period to `delay`; an
    /// [`every`](Scheduler::every) work keeps its period. Delays saturate at about 27
    /// years: such a work is never due.
    ///
    /// Returns `false` (and changes nothing) if it was already pending, or is disabled,
    /// poisoned, being cancelled, or its scheduler was shut down. It may arm a work that is
    /// running: the new instance runs after the current one ends.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.work(|_| Next::Park);
    /// assert!(work.schedule(Duration::ZERO));
    /// assert!(!work.schedule(Duration::ZERO));
    /// assert_eq!(sched.advance(Duration::ZERO), 1);
    /// ```
    pub fn schedule(&self, delay: Duration) -> bool {
        self.shared.schedule(&self.inner, delay)
    }

    /// Arms the work for exactly `now + delay`, moving a pending deadline (the kernel's
    /// `mod_delayed_work`). Returns whether it was pending before. Refused (returning
    /// `false`, arming nothing) while disabled, poisoned or after shutdown.
    ///
    /// Lock-free when the work's timer entry is placed no later than the new deadline,
    /// which is the common case of a work re-armed again and again, or cancelled and
    /// re-armed, whatever the delay: one compare-and-swap, and when the delay changes a
    /// [`work`](Scheduler::work)'s period, a store and an atomic `fetch_and` that publish
    /// the period with the deadline. An earlier deadline takes the scheduler's lock to
    /// place a new entry. A delay of a few seconds or more reads the coarse clock on
    /// either path. On a timeout work the run stays due no earlier than its latest
    /// touch + idle.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.work(|_| Next::Park);
    /// assert!(!work.reschedule(Duration::from_secs(60)));
    /// assert!(work.reschedule(Duration::from_millis(1)));
    /// assert_eq!(sched.advance(Duration::from_millis(1)), 1);
    /// ```
    pub fn reschedule(&self, delay: Duration) -> bool {
        self.shared.reschedule(&self.inner, delay)
    }

    /// Makes sure the work runs no later than now + `delay` (the kernel's
    /// `timer_reduce`): arms an idle work, moves a later deadline earlier, and leaves a
    /// sooner one. Returns `true` if it armed the work or moved its deadline, `false` if
    /// the deadline was already sooner or the work cannot be armed (disabled, poisoned,
    /// being cancelled, or its scheduler is gone). It does not change the period. With a
    /// zero delay on an idle work it is `schedule(Duration::ZERO)`.
    ///
    /// A reaper that sleeps until the earliest expiry among its objects calls this for
    /// each new expiry.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let start = sched.now();
    /// let reaper = sched.work(|_| Next::Park);
    /// assert!(reaper.schedule_within(Duration::from_secs(30))); // idle: armed
    /// assert!(!reaper.schedule_within(Duration::from_secs(60))); // later: unchanged
    /// assert!(reaper.schedule_within(Duration::from_secs(10))); // sooner: moved
    /// assert_eq!(reaper.deadline(), Some(start + Duration::from_secs(10)));
    /// ```
    pub fn schedule_within(&self, delay: Duration) -> bool {
        self.shared.schedule_within(&self.inner, delay)
    }

    /// The pending deadline, on the scheduler's clock, or `None` while the work is not
    /// pending. For a timeout work it is the postponed one (its latest touch + idle, if
    /// later). Deadlines are kept in 100 µs units, rounded up.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.work(|_| Next::Park);
    /// assert_eq!(work.deadline(), None);
    /// work.schedule(Duration::from_millis(250));
    /// assert_eq!(work.deadline(), Some(sched.now() + Duration::from_millis(250)));
    /// ```
    pub fn deadline(&self) -> Option<Instant> {
        self.shared.deadline_of(&self.inner)
    }

    /// Fire-and-forget: gives up the handle and lets the work live on until its callback
    /// returns [`Next::Stop`] or [`Next::Park`], panics, or the scheduler shuts down;
    /// its closure is then freed. A work that is neither pending nor running, or whose
    /// scheduler is gone, is freed at once. Works of [`global()`](crate::global) live as
    /// long as the process, like a detached thread.
    ///
    /// A detached work is for short, non-blocking jobs: a callback that blocks (a connect,
    /// a disk read) holds a worker, and other works of its scheduler wait for it. Give
    /// blocking or latency-critical jobs a scheduler of their own, with more workers and
    /// [`Priority::Normal`](crate::Priority::Normal), and keep nice-19 maintenance on the
    /// shared one (see [`Scheduler`]'s docs for the two-scheduler setup).
    ///
    /// # Examples
    ///
    /// A connection attempt retried with back-off, owned by nobody:
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let attempts = Arc::new(AtomicU32::new(0));
    /// let counter = attempts.clone();
    /// let mut backoff = Duration::from_millis(100);
    /// let connect = sched.work(move |_| {
    ///     if counter.fetch_add(1, Ordering::SeqCst) < 2 {
    ///         backoff *= 2; // failed: try again later
    ///         return Next::After(backoff);
    ///     }
    ///     Next::Stop // connected: done, the closure is freed
    /// });
    /// connect.schedule(Duration::ZERO);
    /// connect.detach();
    /// sched.advance(Duration::from_secs(1));
    /// assert_eq!(attempts.load(Ordering::SeqCst), 3);
    /// ```
    pub fn detach(self) {
        let mut this = ManuallyDrop::new(self);
        if this.shared.detach(&this.inner) {
            this.shared.end_life(&this.inner);
        }
        // SAFETY: `this` is never used again and never dropped (it is a `ManuallyDrop`),
        // so each field is taken exactly once; the reference we drop is not the last
        // one of a live closure (the closure was dropped above, or the work's timer
        // entry or its run holds the work).
        unsafe {
            drop(ManuallyDrop::take(&mut this.inner));
            drop(std::ptr::read(&this.shared));
        }
    }

    /// Activity hint: a parked work is armed for its period (at least the slack). On an
    /// already armed work this is one load. It does nothing on a work that is
    /// disabled, poisoned, stopped by [`Next::Stop`] or [`cancel_sync`](Self::cancel_sync), or
    /// whose scheduler is gone.
    ///
    /// On a [timeout](Scheduler::timeout) work, activity *postpones* the run instead: the
    /// work becomes due no earlier than now + its idle duration. On an armed or running
    /// timeout work this takes no lock and never touches the timer structure: it records
    /// the time (for an idle of 1 s or more, or a leeway of 125 ms or more, the
    /// scheduler's touch tick, a few loads and a `fetch_max` at most once per tick; else
    /// a clock read). The reap then comes at most `idle / 16 + leeway` after the last
    /// touch + idle, never before, and touches cost wakeups only while they come (see
    /// [`Scheduler::timeout`]'s precision rule). A touch during a run is never lost: the
    /// work ends armed for that touch + idle, unless the callback returned `Stop`.
    ///
    /// A touch racing with the callback returning [`Next::Park`] is never lost: the work
    /// ends armed. A touch during a run changes nothing else the callback decides:
    /// `Again`, `After`, `At` and `Yield` stand, and `Stop` stays stopped. If the callback decides to park by reading data the toucher wrote,
    /// write it with a `SeqCst` store or any read-modify-write (`fetch_add`, `swap`, ...)
    /// before `touch()`: then a touch that finds the work still pending is covered by a
    /// run that sees the write.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.every(Duration::from_millis(10), |_| Next::Park);
    /// sched.advance(Duration::from_millis(10));
    /// assert!(!work.is_pending());
    /// work.touch();
    /// assert!(work.is_pending());
    /// ```
    #[inline]
    pub fn touch(&self) {
        self.shared.touch(&self.inner)
    }

    /// Disarms the work without waiting for a running instance (the kernel's
    /// `cancel_delayed_work`); that instance may still re-arm itself. Returns whether it
    /// was pending.
    ///
    /// Lock-free: one compare-and-swap. The work's timer entry stays where it was until
    /// its tick (or a sweep) and is then dropped, so a cancelled work costs at most one
    /// wakeup, which it shares with anything else due then; re-arming it meanwhile for
    /// that deadline or later reuses the entry.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.every(Duration::from_millis(10), |_| Next::Again);
    /// assert!(work.cancel());
    /// assert!(!work.cancel());
    /// assert_eq!(sched.advance(Duration::from_secs(1)), 0);
    /// ```
    pub fn cancel(&self) -> bool {
        self.shared.cancel(&self.inner)
    }

    /// Disarms the work, refuses every re-arm (including the running callback's own
    /// `Next::Again`) until it returns, and waits for a running instance to finish. Returns
    /// whether it was pending. Afterwards the callback does not run again until a later
    /// `schedule`/`reschedule`; `touch` does not re-arm it (as after [`Next::Stop`]).
    ///
    /// Called from inside the work's own callback it cannot wait for itself: it disarms,
    /// refuses this run's own re-arm, and returns at once. The same holds where waiting
    /// would close a cycle of callbacks waiting for each other (see
    /// [Waiting from inside callbacks](Self#waiting-from-inside-callbacks)).
    ///
    /// The wait lends the caller's priority to the run where the process may, and
    /// otherwise can take a while (see [How long a wait takes](Self#how-long-a-wait-takes)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::new()?;
    /// let work = sched.every(Duration::from_millis(1), |_| Next::Again);
    /// std::thread::sleep(Duration::from_millis(5));
    /// work.cancel_sync();
    /// assert!(!work.is_running() && !work.is_pending());
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn cancel_sync(&self) -> bool {
        self.shared.cancel_sync(&self.inner)
    }

    /// [`cancel_sync`](Self::cancel_sync) for async code: disarms the work and refuses
    /// every re-arm at once, when called, and returns a future that resolves, to whether
    /// the work was pending, once no instance runs. It blocks no thread (an executor
    /// thread that awaits it goes on running other tasks) and uses only `std::task`, so
    /// any executor can poll it.
    ///
    /// While it waits for a run in progress on a worker it lends that run the priority
    /// of the threads that poll it, as `cancel_sync` lends the caller's: where the
    /// process may raise a thread, the worker runs the rest of that run at the best
    /// poller's nice and puts itself back when the run ends; without that right nothing
    /// is raised. A poll from a thread with a lower priority never lowers it.
    ///
    /// Dropped before it resolves, it never blocks either: the cancel stands, and the run
    /// in progress still has its own re-arm refused. Called from inside the work's own
    /// callback it resolves at once, as `cancel_sync` returns at once there.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.every(Duration::from_millis(10), |_| Next::Again);
    /// let cancelled = work.cancel_async(); // refused from here on
    /// assert_eq!(sched.advance(Duration::from_secs(1)), 0);
    /// # let waker = std::task::Waker::noop();
    /// # let mut cx = std::task::Context::from_waker(waker);
    /// # let mut cancelled = std::pin::pin!(cancelled);
    /// // In async code: `assert!(cancelled.await);`
    /// assert!(cancelled.as_mut().poll(&mut cx).is_ready());
    /// ```
    pub fn cancel_async(&self) -> impl Future<Output = bool> + Send + '_ {
        self.shared
            .cancel_without_blocking(&self.inner, Release::Keep)
    }

    /// Drop for async code: as [`cancel_async`](Self::cancel_async), then the closure is
    /// freed, on the thread that polls the future, when no instance runs (at once, in
    /// the call, if none does). Dropping the future before it resolves never blocks: the
    /// closure is then freed when the run in progress ends, by the thread that ran it.
    /// A `drop(work)` in async code blocks the executor's thread for as long as the run
    /// takes (a starved nice-19 run can take long; see
    /// [How long a wait takes](Self#how-long-a-wait-takes)); `drop_async().await` does not,
    /// and lends the run its pollers' priority as `cancel_async` does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.every(Duration::from_millis(10), |_| Next::Again);
    /// let dropped = work.drop_async(); // no run in progress: freed already
    /// # let waker = std::task::Waker::noop();
    /// # let mut cx = std::task::Context::from_waker(waker);
    /// # let mut dropped = std::pin::pin!(dropped);
    /// // In async code: `dropped.await;`
    /// assert!(dropped.as_mut().poll(&mut cx).is_ready());
    /// assert_eq!(sched.advance(Duration::from_secs(1)), 0);
    /// ```
    pub fn drop_async(self) -> impl Future<Output = ()> + Send + 'static {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again: both fields move out here, and
        // the handle's own `Drop` (which would wait) never runs.
        let (inner, shared) = unsafe {
            (
                ManuallyDrop::take(&mut this.inner),
                std::ptr::read(&this.shared),
            )
        };
        let wait = shared.cancel_without_blocking(&inner, Release::Drop);
        drop(inner);
        crate::scheduler::wait::futures::DropWait(wait)
    }

    /// Makes the work's current instance finish now, lending the caller's priority to it
    /// (the kernel's `flush_work_at_nice`). Returns `true` if it ran or waited for an
    /// instance, `false` if the work was idle.
    ///
    /// - **Pending, not started:** it runs now on the calling thread, at the caller's
    ///   priority, and `flush` returns when it finished.
    /// - **Running on a worker:** `flush` waits for that run. Where the process may raise
    ///   the worker ([`Scheduler::raise_limit`](crate::Scheduler::raise_limit) is `Some`: `CAP_SYS_NICE` or
    ///   `RLIMIT_NICE`) the worker is raised to the caller's nice (at most to the limit)
    ///   for the rest of that run and puts itself back afterwards. Without that right it
    ///   only waits: the library never lowers a thread it could not raise back.
    /// - **Incremental:** a work that returns [`Next::Yield`](crate::Next::Yield) is taken over: the flusher
    ///   runs the remaining increments itself, so a long cleanup never crawls at nice 19
    ///   while someone waits for it. The instance ends when an increment returns anything
    ///   but `Yield`; a work that yields for ever (a poller) never ends one, so its flush
    ///   returns only once it is cancelled or disabled from another thread. Poll with
    ///   `Again`/`After` instead.
    ///
    /// [`Scheduler::metrics`](crate::Scheduler::metrics) counts which of these happened (`lending`).
    ///
    /// Called from inside the work's own callback it returns `false` and changes nothing;
    /// so does a flush whose wait would close a cycle of callbacks waiting for each other
    /// (see [Waiting from inside callbacks](Self#waiting-from-inside-callbacks)).
    /// Instances armed by `Again`/`After` during the flush are not waited for: a
    /// self-re-arming work would otherwise never let `flush` return.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.every(Duration::from_secs(3600), |_| Next::Park);
    /// assert!(work.flush()); // ran now, on this thread
    /// assert_eq!(work.stats().runs, 1);
    /// assert!(!work.flush()); // parked: nothing to flush
    /// ```
    pub fn flush(&self) -> bool {
        self.shared().flush(self.inner(), Waiting::Wait)
    }

    /// Helps without waiting: a pending work runs now on the caller, as
    /// [`flush`](Self::flush) runs it (with the increments of a `Next::Yield` work, for as
    /// long as no worker holds one), and `true` is returned; a work that is running
    /// anywhere, or idle, returns `false` at once. It never waits for any state, on any
    /// thread: it only takes the scheduler's lock, which nothing holds across a callback.
    ///
    /// This is what a writer that finds a full write log calls (moka's pattern): if the
    /// drain is due, the writer runs it at its own priority instead of waiting for a
    /// nice-19 worker; if the worker is draining already, the writer goes on. A reader
    /// that must never block can call it too.
    ///
    /// `false` also from inside the work's own callback, after shutdown, and in a
    /// `fork()`ed child.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let drain = sched.work(|_| Next::Park);
    /// assert!(!drain.try_flush()); // idle: nothing to help with
    /// drain.schedule(Duration::from_secs(1));
    /// assert!(drain.try_flush()); // pending: ran here, now
    /// assert_eq!(drain.stats().runs, 1);
    /// ```
    pub fn try_flush(&self) -> bool {
        self.shared().flush(self.inner(), Waiting::Never)
    }

    /// Adds one level of disabling (the kernel's `disable_work`): while any is held nothing
    /// can arm the work. Also cancels a pending instance; returns whether there was one.
    /// Nesting saturates at about 2 million levels.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.every(Duration::from_millis(10), |_| Next::Again);
    /// assert!(work.disable());
    /// assert!(!work.schedule(Duration::ZERO));
    /// work.enable();
    /// assert!(work.schedule(Duration::ZERO));
    /// ```
    pub fn disable(&self) -> bool {
        self.shared.disable(&self.inner)
    }

    /// Removes one level of disabling. Without a matching [`disable`](Self::disable) it
    /// does nothing: in particular it never lifts the re-arm refusal of a `cancel_sync`
    /// or drop waiting for a run. It does not re-arm the work.
    pub fn enable(&self) {
        self.shared.enable(&self.inner)
    }

    /// Whether the work is armed (waiting for its deadline or due).
    pub fn is_pending(&self) -> bool {
        self.state().is_pending()
    }

    /// Whether its callback is executing on some thread.
    pub fn is_running(&self) -> bool {
        self.state().is_running()
    }

    /// Whether its callback panicked (it never runs again).
    pub fn is_poisoned(&self) -> bool {
        self.state().is_poisoned()
    }

    /// Whether [`disable`](Self::disable) levels are held.
    pub fn is_disabled(&self) -> bool {
        self.state().is_disabled()
    }

    /// Its id: the same for the work's whole life, and no other live work of the process
    /// has it; once the work's life ends (its handle is dropped, or a detached work is
    /// done) a new work may get it, as a new file may get a closed descriptor's number.
    /// [`WorkInfo::id`](crate::WorkInfo::id) shows the same, so an exporter can tell
    /// works with the same name apart.
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let (a, b) = (sched.work(|_| Next::Park), sched.work(|_| Next::Park));
    /// assert_ne!(a.id(), b.id());
    /// let mut ids = Vec::new();
    /// sched.works(|w| ids.push(w.id));
    /// ids.sort();
    /// let mut expected = vec![a.id(), b.id()];
    /// expected.sort();
    /// assert_eq!(ids, expected);
    /// ```
    pub fn id(&self) -> u64 {
        self.inner.id()
    }

    /// The period used by [`Next::Again`] and [`touch`](Self::touch) (a timeout work's
    /// idle duration).
    pub fn period(&self) -> Duration {
        self.shared.period_of(&self.inner)
    }

    /// A snapshot of its statistics.
    pub fn stats(&self) -> WorkStats {
        self.shared.stats_of(&self.inner)
    }

    /// Gives the work a name for tracing spans, panic events and [`Ctx::name`].
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.work(|_| Next::Park);
    /// assert!(work.name().contains("closure"));
    /// let work = work.named("shard-7 purge");
    /// assert_eq!(work.name(), "shard-7 purge");
    /// ```
    pub fn named(self, name: impl Into<String>) -> Work {
        self.inner.set_name(name.into().into_boxed_str());
        self
    }

    /// The work's name: its [`named`](Self::named) name, or the closure's type name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Lets the work run up to `leeway` after each deadline, so that it shares a worker
    /// wakeup with the works whose windows overlap its own; it never runs before its
    /// deadline. A builder step, like [`named`](Self::named); [`Ctx::leeway`] reads it.
    ///
    /// The workers (and a hosted [`Driver::next_deadline`](crate::Driver::next_deadline))
    /// wake at the earliest end of any armed window, and every wakeup runs every work
    /// whose deadline has come: a thousand `every(1 s)` works at a hundred phases wake the
    /// worker about ten times a second with a 100 ms leeway, once with a 1 s one, where
    /// without a leeway each phase costs a wakeup. A lone work still costs one wakeup per
    /// run, at the end of its window. Maintenance rarely minds being late; it is the
    /// wakeups that cost.
    ///
    /// - The scheduler's [`slack`](crate::Builder::slack) is every work's floor: a shorter
    ///   leeway (or none) counts as the slack, and the window then ends at the deadline
    ///   rounded up to the slack, as without this call.
    /// - A run starts by its deadline plus its leeway, plus the time a wakeup takes (the
    ///   slack covers it). [`Ctx::lateness`] shows how late each run was.
    /// - It is kept within 1/1024 of itself, rounded down (never longer than asked), up to
    ///   about 13.9 years; longer leeways are that.
    /// - It applies to every instance: `schedule`/`reschedule`, `Next::Again`/`After`,
    ///   [`touch`](Self::touch), a timeout's expiry, and a zero delay (which then runs
    ///   within the leeway; [`flush`](Self::flush) runs a pending instance at once). A
    ///   [`Next::Yield`] increment runs as soon as others had their turn, whatever the
    ///   leeway.
    /// - On a work that is armed already (as [`every`](crate::Scheduler::every),
    ///   [`once`](crate::Scheduler::once) and [`timeout`](crate::Scheduler::timeout)
    ///   return it), the pending instance gets the new window too when this call follows
    ///   the arm with no other arm on the scheduler in between, as in
    ///   `sched.every(p, f).leeway(l)`. Otherwise a longer leeway applies from the next
    ///   instance (the pending one keeps its narrower window), and a shorter one at once.
    /// - [`Scheduler::manual`](crate::Scheduler::manual) runs each work at its deadline, in
    ///   deadline order, as without a leeway: its clock moves only when told, so there are
    ///   no wakeups to share.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let (sched, driver) = Scheduler::builder().build_hosted()?;
    /// let leeway = Duration::from_secs(2);
    /// let a = sched.every(Duration::from_secs(10), |_| Next::Again).leeway(leeway);
    /// let b = sched.every(Duration::from_secs(11), |_| Next::Again).leeway(leeway);
    /// // One wake for both: by the end of a's window, when b's deadline has come too.
    /// let wake = driver.next_deadline().unwrap();
    /// assert!(wake >= b.deadline().unwrap());
    /// assert!(wake <= a.deadline().unwrap() + leeway);
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn leeway(self, leeway: Duration) -> Work {
        self.shared.set_leeway(&self.inner, leeway);
        self
    }
}

impl Work {
    /// Drop that waits for a run in progress even where that wait would close a wait
    /// cycle (`run_chunked`'s helpers borrow the caller's stack; they are set up so that
    /// no cycle can pass through this wait).
    pub(crate) fn drop_waiting(self) {
        let (_, drop_closure) = self
            .shared
            .cancel_and_wait(&self.inner, Release::DropAndWait);
        if drop_closure {
            self.shared.end_life(&self.inner);
        }
        // The handle's own drop finds the work released already and does nothing more.
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if self.shared.release(&self.inner) {
            // The closure's destructor is user code, and a panic in it must not escape
            // into the caller's `drop`.
            self.shared.end_life(&self.inner);
        }
        // Not the last reference to a live closure: it is dropped, or a runner owns its
        // end. SAFETY: `self.inner` is not used again: this is the handle's destructor.
        drop(unsafe { ManuallyDrop::take(&mut self.inner) });
    }
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("name", &self.name())
            .field("pending", &self.is_pending())
            .field("running", &self.is_running())
            .field("poisoned", &self.is_poisoned())
            .finish()
    }
}

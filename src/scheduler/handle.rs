//! [`Scheduler`]: the handle to a set of worker threads and one timer structure.
//!
//! - [`builder`](Scheduler::builder) / [`new`](Scheduler::new) start a real scheduler:
//!   worker threads at a low priority, sleeping on a timerfd.
//! - [`manual`](Scheduler::manual) has no threads and a virtual clock: works run on the
//!   thread that calls [`advance`](Scheduler::advance). Tests and loom models use it.
//! - [`global`](crate::global) is a lazily started default scheduler.
//!
//! The handle is `Clone + Send + Sync`. Dropping the last handle cancels every armed work,
//! wakes and joins the workers (waiting for runs in progress to finish). Works outlive it
//! as inert handles: their arming calls return `false` from then on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::builder::Builder;
use super::core::Shared;
use super::lending::LendingStats;

use crate::scheduler::{Ctx, Next, Work};
use crate::sync::{lock_std, Ordering};
use crate::{Error, Priority};

/// A handle to a scheduler of delayed works.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Scheduler};
///
/// let sched = Scheduler::new()?;
/// let (tx, rx) = std::sync::mpsc::channel();
/// let work = sched.work(move |_| {
///     tx.send(()).unwrap();
///     Next::Park
/// });
/// work.schedule(Duration::ZERO);
/// rx.recv_timeout(Duration::from_secs(10)).unwrap();
/// # Ok::<(), nicework::Error>(())
/// ```
pub struct Scheduler {
    shared: Arc<Shared>,
    /// Whether this handle counts towards keeping the workers alive. The handles the
    /// scheduler lends to callbacks through [`Ctx::scheduler`] do not.
    counted: bool,
}

impl Scheduler {
    /// A builder with the defaults: one worker at `Nice(19)`, 1 ms slack.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A scheduler with all defaults.
    ///
    /// # Errors
    ///
    /// As [`Builder::build`].
    ///
    /// # Examples
    ///
    /// ```
    /// let sched = nicework::Scheduler::new()?;
    /// assert_eq!(sched.workers(), 1);
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn new() -> Result<Scheduler, Error> {
        Builder::default().build()
    }

    /// A scheduler without threads, in virtual time: nothing runs until
    /// [`advance`](Self::advance) (or a [`Work::flush`]) runs it on the calling thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.every(Duration::from_millis(100), |_| Next::Again);
    /// assert_eq!(sched.advance(Duration::from_millis(250)), 2);
    /// assert_eq!(work.stats().runs, 2);
    /// ```
    pub fn manual() -> Scheduler {
        let shared = Shared::new(Builder::manual_config(), None, None);
        Scheduler::counted(Arc::new(shared))
    }

    pub(crate) fn counted(shared: Arc<Shared>) -> Scheduler {
        Scheduler {
            shared,
            counted: true,
        }
    }

    pub(crate) fn uncounted(shared: Arc<Shared>) -> Scheduler {
        Scheduler {
            shared,
            counted: false,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Creates an unarmed work. Its period (for [`Next::Again`] and
    /// [`Work::touch`]) is the delay of its latest `schedule`/`reschedule`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.work(|_| Next::Park);
    /// assert!(!work.is_pending());
    /// assert!(work.schedule(Duration::from_millis(5)));
    /// assert_eq!(sched.advance(Duration::from_millis(5)), 1);
    /// ```
    pub fn work<F>(&self, f: F) -> Work
    where
        F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
    {
        Work::new(self, f, 0, false)
    }

    /// Creates a work armed for `now + period` whose period stays `period`;
    /// `schedule`/`reschedule` only move its next deadline.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.every(Duration::from_millis(10), |_| Next::Again);
    /// assert!(work.is_pending());
    /// assert_eq!(sched.advance(Duration::from_millis(35)), 3);
    /// ```
    pub fn every<F>(&self, period: Duration, f: F) -> Work
    where
        F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
    {
        let work = Work::new(self, f, crate::clock::nanos(period), true);
        self.shared.arm_new(work.cell(), period);
        work
    }

    /// A periodic work for an object: the closure reaches `object` through a `Weak` (an
    /// `Arc` would be a cycle, since the object owns its work) and the work stops once the
    /// object is gone. If the last `Arc` drops during a run, the object, and with it the
    /// work, is dropped on the running thread after the callback returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let counter = Arc::new(AtomicU32::new(0));
    /// let work = sched.every_for(&counter, Duration::from_millis(10), |c, _| {
    ///     c.fetch_add(1, Ordering::Relaxed);
    ///     Next::Again
    /// });
    /// sched.advance(Duration::from_millis(20));
    /// assert_eq!(counter.load(Ordering::Relaxed), 2);
    /// drop(counter);
    /// sched.advance(Duration::from_millis(10));
    /// assert!(!work.is_pending()); // the object is gone: the work stopped itself
    /// ```
    pub fn every_for<T, F>(&self, object: &Arc<T>, period: Duration, mut f: F) -> Work
    where
        T: Send + Sync + 'static,
        F: FnMut(&T, &mut Ctx<'_>) -> Next + Send + 'static,
    {
        let object = Arc::downgrade(object);
        self.every(period, move |cx| match object.upgrade() {
            Some(object) => f(&object, cx),
            None => Next::Stop,
        })
    }

    /// Manual schedulers only: moves virtual time forward by `by` and runs every work that
    /// comes due, on the calling thread, each at its own deadline and in deadline order. A
    /// work re-armed with `Again` from a run at `t` is due at `t + period` and runs in the
    /// same call if that is still within `by`. Returns the number of runs.
    ///
    /// A work that keeps returning [`Next::Yield`] keeps running at the same virtual
    /// instant, as it would keep a real worker busy, so `advance` returns once it stops
    /// yielding. On a threaded scheduler this does nothing and returns 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let _work = sched.every(Duration::from_millis(100), |_| Next::Again);
    /// assert_eq!(sched.advance(Duration::from_millis(99)), 0);
    /// assert_eq!(sched.advance(Duration::from_millis(1)), 1);
    /// ```
    pub fn advance(&self, by: Duration) -> usize {
        if !self.is_manual() {
            return 0;
        }
        let borrowed = Scheduler::uncounted(self.shared.clone());
        self.shared.advance(&borrowed, by)
    }

    /// The scheduler's current time: virtual for a manual scheduler (in a `fork()`ed
    /// child, where a scheduler from before the fork is inert, the real time).
    pub fn now(&self) -> Instant {
        match self.shared.lock_unless_forked() {
            Some(core) => self.shared.instant_at(self.shared.now_ns(&core)),
            None => Instant::now(),
        }
    }

    pub(crate) fn instant_at(&self, ns: u64) -> Instant {
        self.shared.instant_at(ns)
    }

    /// Whether this is a [`manual`](Self::manual) scheduler.
    pub fn is_manual(&self) -> bool {
        self.shared.clock.is_manual()
    }

    /// Number of worker threads (0 for a manual scheduler, and in a `fork()`ed child for
    /// a scheduler made before the fork).
    pub fn workers(&self) -> usize {
        if self.is_manual() || self.shared.is_forked_copy() {
            0
        } else {
            self.shared.config.workers
        }
    }

    /// The workers' priority.
    pub fn priority(&self) -> Priority {
        self.shared.config.priority
    }

    /// The coalescing window (after clamping).
    pub fn slack(&self) -> Duration {
        Duration::from_nanos(self.shared.config.slack_ns)
    }

    /// The kernel thread ids of the worker threads (empty for a manual scheduler), for
    /// reading their `/proc/self/task/TID/` files.
    pub fn worker_tids(&self) -> Vec<i32> {
        if self.shared.is_forked_copy() {
            return Vec::new();
        }
        lock_std(&self.shared.worker_tids).clone()
    }

    /// How many times the worker threads went to sleep and woke up so far: the sum of
    /// their `voluntary_ctxt_switches` in `/proc/self/task/TID/status` (0 for a manual
    /// scheduler). With every work parked it stays flat.
    ///
    /// # Examples
    ///
    /// ```
    /// let sched = nicework::Scheduler::manual();
    /// assert_eq!(sched.worker_wakeups(), 0);
    /// ```
    pub fn worker_wakeups(&self) -> u64 {
        self.worker_tids().into_iter().map(voluntary_switches).sum()
    }

    /// The lowest nice value a flusher may raise a worker to while it waits for a run
    /// in progress (see [`Work::flush`]), read once when the scheduler was built: `-20`
    /// with `CAP_SYS_NICE`, `20 − RLIMIT_NICE` with a raised limit, and `None` for most
    /// unprivileged processes (the default limit is 0), where a flusher only waits.
    /// Always `None` for a manual scheduler, which has no workers to raise.
    ///
    /// # Examples
    ///
    /// ```
    /// let sched = nicework::Scheduler::new()?;
    /// match sched.raise_limit() {
    ///     Some(limit) => println!("a flush may raise the worker to nice {limit}"),
    ///     None => println!("a flush of a running work only waits"),
    /// }
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn raise_limit(&self) -> Option<i32> {
        self.shared
            .lock_unless_forked()
            .and_then(|core| core.lending.limit())
    }

    /// How flushes lent their priority so far: runs they executed themselves, runs in
    /// progress they raised, runs they only waited for.
    ///
    /// # Examples
    ///
    /// ```
    /// let sched = nicework::Scheduler::manual();
    /// assert_eq!(sched.lending_stats(), nicework::LendingStats::default());
    /// ```
    pub fn lending_stats(&self) -> LendingStats {
        self.shared
            .lock_unless_forked()
            .map_or_else(LendingStats::default, |core| core.lending.stats)
    }

    /// Whether the workers back off between `Yield` increments while the CPUs are busy
    /// (see [`Builder::back_off`]).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(nicework::Scheduler::new()?.backs_off()); // on by default
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn backs_off(&self) -> bool {
        self.shared.config.back_off
    }

    /// How many `Yield` increments the workers deferred so far because more threads were
    /// runnable than there are CPUs (see [`Builder::back_off`]).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(nicework::Scheduler::manual().deferred_yields(), 0);
    /// ```
    pub fn deferred_yields(&self) -> u64 {
        self.shared
            .lock_unless_forked()
            .map_or(0, |core| core.deferred_yields)
    }

    /// Number of armed works (in the wheel or due).
    pub fn armed(&self) -> usize {
        self.shared
            .lock_unless_forked()
            .map_or(0, |core| core.timers.len())
    }
}

/// A thread's `voluntary_ctxt_switches`, or 0 once it has exited.
fn voluntary_switches(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|count| count.trim().parse().ok())
        })
        .unwrap_or(0)
}

impl Clone for Scheduler {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Scheduler::counted(self.shared.clone())
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if !self.counted || self.shared.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        if self.shared.is_forked_copy() {
            // In a forked child there are no workers to stop, and the lock may be held by
            // a thread that is gone: leave everything as it is (see `fork`).
            std::mem::forget(self.shared.clone());
            return;
        }
        self.shared.shutdown();
        if super::worker::is_worker_of(&self.shared) {
            // Dropped from one of our own callbacks: that worker exits after the run.
            return;
        }
        let threads = std::mem::take(&mut *lock_std(&self.shared.threads));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("name", &self.shared.config.name)
            .field("manual", &self.is_manual())
            .field("workers", &self.workers())
            .field("priority", &self.priority())
            .field("slack", &self.slack())
            .finish()
    }
}

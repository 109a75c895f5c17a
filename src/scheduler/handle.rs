//! [`Scheduler`]: the handle to a set of worker threads and one timer structure.
//!
//! - [`builder`](Scheduler::builder) / [`new`](Scheduler::new) start a real scheduler:
//!   worker threads at a low priority, sleeping on a timerfd.
//! - [`manual`](Scheduler::manual) has no threads and a virtual clock: works run on the
//!   thread that calls [`advance`](Scheduler::advance). Tests and loom models use it.
//! - [`global`](crate::global) is a lazily started default scheduler.
//!
//! The constructors of works (`work`, `once`, `every`, `timeout` and their `_for`
//! forms) are in `making_works.rs`.
//!
//! The handle is `Clone + Send + Sync`. Dropping the last handle cancels every armed work,
//! wakes and joins the workers (waiting for runs in progress to finish). Works outlive it
//! as inert handles: their arming calls return `false` from then on.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scheduler::WorkInfo;
use crate::scheduler::builder::Builder;
use crate::scheduler::chunked;
use crate::scheduler::metrics::Metrics;
use crate::scheduler::shared::Shared;
use crate::sync::{Ordering, lock_std};
use crate::{Error, Priority};

/// A handle to a scheduler of delayed works.
///
/// Dropping the last handle cancels every armed work, then wakes and joins the workers,
/// waiting for runs in progress to finish. Dropped from inside a callback (of this or any
/// other scheduler) it does not join, since a worker's callback may be waiting for the
/// dropping one: the workers exit on their own once their runs end.
///
/// # Blocking jobs get a scheduler of their own
///
/// A worker runs one callback at a time, so a callback that blocks (a TCP connect, a
/// disk read) holds up every other work of its scheduler. Keep nice-19 maintenance on
/// the shared scheduler (or [`global()`](crate::global)), and give blocking or
/// latency-critical jobs, such as a pool's connection attempts, a scheduler of their own
/// with more workers and [`Priority::Normal`]:
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Priority, Scheduler};
///
/// // Purges and reapers: idle CPU only.
/// let maintenance = Scheduler::builder().name("maint").build()?;
/// // Connects may block for a TCP timeout: four at a time, at the caller's priority.
/// let connects = Scheduler::builder()
///     .name("connect")
///     .workers(4)
///     .priority(Priority::Normal)
///     .build()?;
/// let reaper = maintenance.every(Duration::from_secs(30), |_| Next::Park);
/// let attempt = connects.work(|_| {
///     // std::net::TcpStream::connect_timeout(..) would block here
///     Next::Stop
/// });
/// attempt.schedule(Duration::ZERO);
/// attempt.detach(); // fire-and-forget: freed once it returns Stop
/// # drop(reaper);
/// # Ok::<(), nicework::Error>(())
/// ```
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
#[repr(transparent)]
pub struct Scheduler {
    /// Every `Scheduler` owns: it counts in `Shared::handles`, and dropping the last one
    /// shuts the scheduler down. The non-owning use is [`Handle`].
    handle: Handle,
}

/// A non-owning handle: it reaches the scheduler without keeping its workers alive. The
/// worker loop, `flush` on a caller's thread and `advance` run callbacks through one, and
/// [`Ctx::scheduler`] shows it to the callback as a `&Scheduler` (cloning that makes an
/// owning handle, as cloning any `Scheduler` does).
#[derive(Debug, Clone)]
pub(crate) struct Handle {
    shared: Arc<Shared>,
}

impl Handle {
    pub(crate) fn new(shared: Arc<Shared>) -> Handle {
        Handle { shared }
    }

    /// The scheduler behind this handle, as the `&Scheduler` that callbacks see.
    pub(crate) fn as_scheduler(&self) -> &Scheduler {
        // SAFETY: `Scheduler` is `repr(transparent)` over `Handle`, so the two have the
        // same layout and a `&Handle` is a valid `&Scheduler` for the same lifetime. The
        // reference is shared, so the `Scheduler`'s `Drop` (which gives up ownership)
        // never runs on it; `Clone` through it counts a new owner as it should.
        unsafe { &*(self as *const Handle as *const Scheduler) }
    }
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

    /// A scheduler without threads, in virtual time, for tests: nothing runs until
    /// [`advance`](Self::advance) (or a [`Work::flush`](crate::Work::flush)) runs it on the calling thread,
    /// and time moves only by `advance`.
    ///
    /// Do not drive it from a real event loop: every `touch()`, `schedule()` and
    /// deadline is stamped with the virtual clock, which stands still between `advance`
    /// calls, so a timeout touched from another thread every 50 ms still reaps on the
    /// virtual schedule, and lateness adds up. A host's own loop uses
    /// [`Builder::build_hosted`], whose time is the real clock.
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
        #[cfg(all(loom, not(feature = "loom")))]
        warn_loom_without_feature();
        let shared = Shared::new(Builder::manual_config(), None, None, None);
        Scheduler::owning(Arc::new(shared))
    }

    /// A new owning handle; the caller has counted it in `Shared::handles`.
    pub(crate) fn owning(shared: Arc<Shared>) -> Scheduler {
        Scheduler {
            handle: Handle::new(shared),
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// Manual schedulers only: moves virtual time forward by `by` and runs every work that
    /// comes due, on the calling thread, each at its own deadline and in deadline order. A
    /// work re-armed with `Again` from a run at `t` is due at `t + period` and runs in the
    /// same call if that is still within `by`. Returns the number of runs.
    ///
    /// Deadlines count in whole ticks of the slack, as on a real scheduler: a work due
    /// inside a tick runs once `advance` reaches the end of that tick (at most one slack
    /// late, never early), so neighbouring deadlines share a run of the loop.
    ///
    /// A work that keeps returning [`Next::Yield`](crate::Next::Yield) keeps running at the same virtual
    /// instant, as it would keep a real worker busy, so `advance` returns once it stops
    /// yielding.
    ///
    /// In a `fork()`ed child a scheduler from before the fork is inert: `advance` returns 0
    /// there.
    ///
    /// # Panics
    ///
    /// On a threaded or hosted scheduler: its time is the real clock, which `advance`
    /// cannot move. Tests that drive time use [`Scheduler::manual`] (as tokio's
    /// `time::advance` panics when time is not paused).
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
        if self.shared().is_forked_copy() {
            return 0;
        }
        assert!(
            self.is_manual(),
            "Scheduler::advance called on a threaded or hosted scheduler: its time is the \
             real clock; make the scheduler with Scheduler::manual() to drive time in a test"
        );
        self.shared().advance(self, by)
    }

    /// The scheduler's current time: virtual for a manual scheduler (in a `fork()`ed
    /// child, where a scheduler from before the fork is inert, the real time).
    ///
    /// A real scheduler's clock is `Instant`'s, read in full: `now()` is never earlier
    /// than an `Instant::now()` read before it, and never later than one read after it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Instant;
    ///
    /// let sched = nicework::Scheduler::new()?;
    /// let before = Instant::now();
    /// let now = sched.now();
    /// assert!(before <= now && now <= Instant::now());
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn now(&self) -> Instant {
        if self.shared().is_forked_copy() {
            Instant::now()
        } else {
            self.shared().instant_at(self.shared().now_ns())
        }
    }

    pub(crate) fn instant_at(&self, ns: u64) -> Instant {
        self.shared().instant_at(ns)
    }

    /// Whether this is a [`manual`](Self::manual) scheduler.
    pub fn is_manual(&self) -> bool {
        self.shared().clock.is_manual()
    }

    /// Number of worker threads (0 for a manual scheduler, and in a `fork()`ed child for
    /// a scheduler made before the fork).
    pub fn workers(&self) -> usize {
        if self.is_manual() || self.shared().is_forked_copy() {
            0
        } else {
            self.shared().config.workers
        }
    }

    /// The workers' priority.
    pub fn priority(&self) -> Priority {
        self.shared().config.priority
    }

    /// The coalescing window (after clamping).
    pub fn slack(&self) -> Duration {
        Duration::from_nanos(self.shared().config.slack_ns)
    }

    /// Calls `f` with every live work of this scheduler: each work made by it whose life
    /// has not ended (its handle is alive, or it is detached and not yet done). A work
    /// made or ended while this runs may be seen or not.
    ///
    /// It costs time in proportion to the live works: one short lock to take a
    /// reference to each (which holds up the scheduler's work creations and drops for
    /// that long, and allocates a word per work), then `f` for each, with no lock held.
    /// So `f` may use the scheduler freely, even make or drop works. A panic in `f`
    /// propagates to the caller, and leaves the scheduler as it was.
    ///
    /// In a `fork()`ed child the copy of a parent's scheduler lists nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let a = sched.every(Duration::from_secs(1), |_| Next::Again).named("a");
    /// let b = sched.work(|_| Next::Park).named("b");
    /// let mut seen = Vec::new();
    /// sched.works(|w| seen.push(w.name.to_string()));
    /// seen.sort();
    /// assert_eq!(seen, ["a", "b"]);
    /// drop(b);
    /// let mut armed = 0;
    /// sched.works(|w| armed += usize::from(w.deadline.is_some()));
    /// assert_eq!(armed, 1);
    /// # drop(a);
    /// ```
    pub fn works(&self, f: impl FnMut(&WorkInfo<'_>)) {
        self.shared().visit_works(f);
    }

    /// Runs `f` over `range` in chunks, on the calling thread and on up to
    /// [`workers`](Self::workers) helpers at the scheduler's priority (padata's
    /// multithreaded jobs, ktask). `f` may borrow from the caller's stack.
    ///
    /// - Chunks are at least `min_chunk` long (0 counts as 1), and about four per thread
    ///   for load balance; every index of `range` is passed to `f` exactly once unless
    ///   the job stops early.
    /// - The caller runs chunks at its own priority; when none are left it lends its
    ///   priority to the helpers still running, as [`Work::flush`](crate::Work::flush) does.
    /// - An empty range returns `Ok(())` at once; a range no longer than `min_chunk` runs
    ///   inline on the caller, and so does every job on a manual scheduler.
    /// - Called from inside a work of this scheduler it never deadlocks: chunks no free
    ///   worker takes run on the caller (with `workers(1)`, all of them).
    ///
    /// # Errors
    ///
    /// The first `Err` returned by `f` stops handing out chunks; `run_chunked` returns it
    /// after the chunks in flight have ended.
    ///
    /// # Panics
    ///
    /// If `f` panics, no more chunks are handed out and the panic is resumed on the
    /// caller once every helper has stopped (a helper never unwinds).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use nicework::Scheduler;
    ///
    /// let sched = Scheduler::builder().workers(2).build()?;
    /// let data: Vec<u64> = (0..100_000).collect();
    /// let sum = AtomicU64::new(0);
    /// sched.run_chunked(0..data.len(), 1_000, |range| {
    ///     sum.fetch_add(data[range].iter().sum::<u64>(), Ordering::Relaxed);
    ///     Ok::<(), ()>(())
    /// }).unwrap();
    /// assert_eq!(sum.into_inner(), 100_000 * 99_999 / 2);
    ///
    /// let failed = sched.run_chunked(0..100, 1, |range| {
    ///     if range.contains(&42) { Err("bad element") } else { Ok(()) }
    /// });
    /// assert_eq!(failed, Err("bad element"));
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn run_chunked<E, F>(&self, range: Range<usize>, min_chunk: usize, f: F) -> Result<(), E>
    where
        F: Fn(Range<usize>) -> Result<(), E> + Sync,
        E: Send,
    {
        chunked::run_chunked(self, range, min_chunk, f)
    }

    /// A snapshot of the scheduler's diagnostics: armed works, worker wakeups, deferred
    /// `Yield` increments and priority lending.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let _work = sched.every(Duration::from_secs(1), |_| Next::Again);
    /// let metrics = sched.metrics();
    /// assert_eq!(metrics.armed, 1);
    /// assert_eq!(metrics.worker_wakeups, 0); // no worker threads
    /// ```
    pub fn metrics(&self) -> Metrics {
        Metrics::read(self.shared())
    }

    /// The lowest nice value a flusher may raise a worker to while it waits for a run
    /// in progress (see [`Work::flush`](crate::Work::flush)), read once when the scheduler was built: `-20`
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
        self.shared()
            .lock_unless_forked()
            .and_then(|core| core.lending.limit())
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
        self.shared().config.back_off
    }
}

/// A build with `--cfg loom` but without nicework's `loom` feature: the user's loom model
/// runs on nicework's std primitives and explores none of nicework's interleavings. Said
/// once per process, as a `tracing` warning and on stderr: inside `loom::model` loom
/// installs its own subscriber, which drops the warning unless `LOOM_LOG` is set.
#[cfg(all(loom, not(feature = "loom")))]
fn warn_loom_without_feature() {
    const WARNING: &str = "nicework is built with --cfg loom but without its `loom` feature: \
         it uses std's primitives, so a loom model explores none of nicework's interleavings; \
         enable the feature in [target.'cfg(loom)'.dependencies]";
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!("{WARNING}");
        eprintln!("warning: {WARNING}");
    });
}

impl Clone for Scheduler {
    fn clone(&self) -> Self {
        self.shared().handles.fetch_add(1, Ordering::Relaxed);
        Scheduler::owning(self.shared().clone())
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if self.shared().handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        if self.shared().is_forked_copy() {
            // In a forked child there are no workers to stop, and the lock may be held by
            // a thread that is gone: leave everything as it is (see `fork`).
            std::mem::forget(self.shared().clone());
            return;
        }
        self.shared().shutdown();
        if crate::scheduler::worker::is_worker_of(self.shared())
            || crate::scheduler::wait::frames::in_callback()
        {
            // Dropped from inside a callback. On one of our own workers: that worker exits
            // after the run. On any other thread running a callback: joining could wait
            // for a worker whose callback waits for ours (a wait cycle no graph sees), so
            // the workers are left to exit on their own once their runs end.
            return;
        }
        let threads = std::mem::take(&mut *lock_std(&self.shared().threads));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("name", &self.shared().config.name)
            .field("manual", &self.is_manual())
            .field("workers", &self.workers())
            .field("priority", &self.priority())
            .field("slack", &self.slack())
            .finish()
    }
}

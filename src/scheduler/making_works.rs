//! The [`Scheduler`]'s constructors of works: [`work`](Scheduler::work),
//! [`once`](Scheduler::once), [`every`](Scheduler::every),
//! [`timeout`](Scheduler::timeout), and the per-object forms that take an `Arc` or a
//! `Weak` of the object. `impl Scheduler` continues here from `handle.rs`.

use std::time::Duration;

use crate::clock::nanos;
use crate::scheduler::handle::Scheduler;
use crate::scheduler::work::object;
use crate::scheduler::{Ctx, Next, ObjectRef, Work};

impl Scheduler {
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

    /// Creates a work that runs `f` once, `delay` from now (scheduled-thread-pool's
    /// `execute_after`, the kernel's one-shot `queue_delayed_work`). `f` is consumed by
    /// that run, so its captures are freed as it returns; cancelled or dropped before it,
    /// `f` is dropped without running. After the run every arm (`schedule`, `reschedule`,
    /// `schedule_within`) returns `false` and `touch` does nothing; an arm made while the
    /// run is in progress (from inside it or from another thread) returns `true`, as on
    /// any running work, and is disarmed when the run ends. Until then it is a
    /// work like any other: `reschedule` moves it, `flush` or `try_flush` runs it now,
    /// `cancel_sync` waits for it. `sched.once(delay, f).detach()` is fire-and-forget:
    /// the work is freed after its run (or at shutdown, unrun).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::time::Duration;
    /// use nicework::Scheduler;
    ///
    /// let sched = Scheduler::manual();
    /// let ran = Arc::new(AtomicUsize::new(0));
    /// let counter = ran.clone();
    /// let work = sched.once(Duration::from_millis(5), move |_| {
    ///     counter.fetch_add(1, Ordering::SeqCst);
    /// });
    /// sched.advance(Duration::from_millis(10));
    /// assert_eq!(ran.load(Ordering::SeqCst), 1);
    /// assert!(!work.schedule(Duration::ZERO), "spent: it never runs again");
    /// assert_eq!(Arc::strong_count(&ran), 1, "the closure was freed by its run");
    ///
    /// // Fire-and-forget:
    /// sched.once(Duration::ZERO, |_| println!("cleanup")).detach();
    /// assert_eq!(sched.advance(Duration::from_millis(1)), 1);
    /// ```
    pub fn once<F>(&self, delay: Duration, f: F) -> Work
    where
        F: FnOnce(&mut Ctx<'_>) + Send + 'static,
    {
        let work = Work::new_once(self, f);
        work.schedule(delay);
        work
    }

    /// Creates a work armed for `now + period` whose period stays `period`;
    /// `schedule`/`reschedule` only move its next deadline. Many periodic works share
    /// the workers' wakeups when each says how late it may run:
    /// `sched.every(period, f).leeway(l)` (see [`Work::leeway`]).
    ///
    /// A callback that takes a lock the foreground threads need holds it at the workers'
    /// priority (nice 19 by default): see "A callback that holds what the foreground
    /// needs" on [`Priority`](crate::Priority) for what that costs and the four remedies.
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
        self.shared().arm_new(work.inner(), period);
        work
    }

    /// Creates an idle timeout: a work armed for now + `idle` that every
    /// [`touch`](Work::touch) postpones to touch + `idle`. Its period (for
    /// [`Next::Again`]) is `idle`. See "Idle timeout vs periodic maintenance" in the [crate docs](crate):
    /// activity postpones a timeout work, where it wakes a parked [`every`](Self::every)
    /// work.
    ///
    /// `idle` follows the rules of every delay: zero is due at the next opportunity (its
    /// re-arms round up to the slack), and a huge one saturates (never due).
    ///
    /// # Precision: one rule for every idle
    ///
    /// - **Never early:** the callback runs no earlier than the last touch + `idle` (a
    ///   touch that returned before the run began).
    /// - **Late by at most `idle / 16 + leeway`** after that (the slack, unless the work
    ///   has a longer [`leeway`](Work::leeway)), plus the time the worker waits for a CPU
    ///   (a nice-19 worker on a busy machine).
    /// - **Wakeups:** left alone, a timeout wakes a worker only for its reap. While
    ///   touched, its timer fires at most once per `idle` (to place itself again), and a
    ///   timeout whose touches read the scheduler's touch tick keeps it moving: one
    ///   refresh per `max(idle / 16, leeway / 2)` of the shortest such timeout, shared by
    ///   all of them, stopping once touches stop.
    ///
    /// Touches read no clock (a few loads) where `max(idle / 16, leeway / 2)` is at least
    /// 62.5 ms: an idle of 1 s or more, or a leeway of 125 ms or more given before the
    /// first touch (`sched.timeout(idle, f).leeway(l)`). Other timeouts read
    /// the clock, and their reaps are rounded up to 1/16 of the idle, the same allowance,
    /// so lateness has no step where ticks begin and reaps due close together share a
    /// wakeup. A manual scheduler rounds nothing. `cargo bench --bench timeouts` measures
    /// the rule from 10 ms to 60 s.
    ///
    /// A timeout that every write touches is how maintenance runs *while the object is
    /// quiet*, never holding a lock the writers want: `sched.timeout(300 ms,
    /// drain).leeway(150 ms)` drains once writes stop for 300 ms, and each write's touch
    /// costs a few loads (see "A callback that holds what the foreground needs" on
    /// [`Priority`](crate::Priority)).
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

    /// An unarmed work for an object, like [`work`](Self::work): the closure reaches the
    /// object through a `Weak` and the work stops once the object is gone (see
    /// [`ObjectRef`] for the two ways to pass it).
    ///
    /// Inside `Arc::new_cyclic` the object does not exist yet: a run that comes before
    /// the constructor returns calls nothing and re-arms for the work's period (at least
    /// 10 ms), so a slow constructor never stops the work. The work stops only once the
    /// object has been alive (at creation or at a run) and is gone. The same holds for
    /// [`every_for`](Self::every_for) and [`timeout_for`](Self::timeout_for).
    ///
    /// # Examples
    ///
    /// An object that owns its work, built in one step with `Arc::new_cyclic`:
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::{Arc, Weak};
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler, Work};
    ///
    /// struct Cache {
    ///     purges: AtomicU32,
    ///     purge: Work,
    /// }
    ///
    /// let sched = Scheduler::manual();
    /// let cache = Arc::new_cyclic(|me: &Weak<Cache>| Cache {
    ///     purges: AtomicU32::new(0),
    ///     purge: sched.work_for(me, |cache: &Cache, _| {
    ///         cache.purges.fetch_add(1, Ordering::Relaxed);
    ///         Next::Park
    ///     }),
    /// });
    /// cache.purge.schedule(Duration::from_millis(5));
    /// sched.advance(Duration::from_millis(5));
    /// assert_eq!(cache.purges.load(Ordering::Relaxed), 1);
    /// drop(cache); // drops its work too: nothing leaks, nothing runs again
    /// ```
    pub fn work_for<T, F>(&self, object: &impl ObjectRef<T>, f: F) -> Work
    where
        T: Send + Sync + 'static,
        F: FnMut(&T, &mut Ctx<'_>) -> Next + Send + 'static,
    {
        self.work(object::for_object(object.to_weak(), f))
    }

    /// A periodic work for an object, like [`every`](Self::every): the closure reaches
    /// the object through a `Weak` and the work stops once the object is gone. If the
    /// last `Arc` drops during a run, the object, and with it the work, is dropped on the
    /// running thread after the callback returns.
    ///
    /// The object's locks are the foreground's too: a callback that holds one does so at
    /// the workers' priority. See "A callback that holds what the foreground needs" on
    /// [`Priority`](crate::Priority) for the four remedies.
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
    pub fn every_for<T, F>(&self, object: &impl ObjectRef<T>, period: Duration, f: F) -> Work
    where
        T: Send + Sync + 'static,
        F: FnMut(&T, &mut Ctx<'_>) -> Next + Send + 'static,
    {
        self.every(period, object::for_object(object.to_weak(), f))
    }

    /// An idle timeout for an object, like [`timeout`](Self::timeout): the closure
    /// reaches the object through a `Weak` and the work stops once the object is gone.
    /// Its reaps follow `timeout`'s precision rule: never before the last touch +
    /// `idle`, at most `idle / 16 + leeway` after (plus the worker's wait for a CPU);
    /// touches wake nothing once they stop.
    ///
    /// # Examples
    ///
    /// A connection that owns its reaper:
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::{Arc, Weak};
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler, Work};
    ///
    /// struct Conn {
    ///     closed: AtomicBool,
    ///     reaper: Work,
    /// }
    ///
    /// let sched = Scheduler::manual();
    /// let idle = Duration::from_secs(30);
    /// let conn = Arc::new_cyclic(|me: &Weak<Conn>| Conn {
    ///     closed: AtomicBool::new(false),
    ///     reaper: sched.timeout_for(me, idle, |conn: &Conn, _| {
    ///         conn.closed.store(true, Ordering::Relaxed);
    ///         Next::Park
    ///     }),
    /// });
    /// sched.advance(Duration::from_secs(20));
    /// conn.reaper.touch(); // used: the reaper is postponed to 20 s + 30 s
    /// sched.advance(Duration::from_secs(29));
    /// assert!(!conn.closed.load(Ordering::Relaxed));
    /// sched.advance(Duration::from_secs(1));
    /// assert!(conn.closed.load(Ordering::Relaxed));
    /// ```
    pub fn timeout_for<T, F>(&self, object: &impl ObjectRef<T>, idle: Duration, f: F) -> Work
    where
        T: Send + Sync + 'static,
        F: FnMut(&T, &mut Ctx<'_>) -> Next + Send + 'static,
    {
        self.timeout(idle, object::for_object(object.to_weak(), f))
    }
}

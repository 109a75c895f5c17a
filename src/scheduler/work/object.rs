//! Per-object works: `work_for`, `every_for` and `timeout_for`, and [`ObjectRef`], which
//! lets them take the object as `&Arc<T>` or `&Weak<T>`.
//!
//! An object usually owns its work (its reaper, its flusher), so the work's closure must
//! not own the object: that would be a cycle that never drops. These constructors keep a
//! `Weak<T>` in the closure, upgrade it for each run, and stop the work (`Next::Stop`)
//! once the object is gone. Given a `Weak`, they work inside `Arc::new_cyclic`, so the
//! object can hold its `Work` directly, with no `Mutex<Option<Work>>` or `OnceLock` to
//! fill in after construction.
//!
//! An object under construction is not an object that is gone. A run that comes while
//! `Arc::new_cyclic`'s constructor still runs (the work was armed inside it, and the
//! constructor is slow) cannot upgrade the `Weak` yet: it calls nothing and re-arms for
//! the work's period, at least [`UNBUILT_RETRY`], so the work lives on once the object
//! exists. Only a `Weak` that has been seen alive (at creation, or by an earlier run)
//! and no longer upgrades stops the work. A `Weak` to an object that died before the work
//! was made has never been seen alive either: that work retries at its period until its
//! handle is dropped.
//!
//! If the last `Arc` drops during a run, the object, and with it the work, is dropped on
//! the running thread after the callback returns (see [`Work`]'s drop from inside its
//! own callback).

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::scheduler::{Ctx, Next, Scheduler, Work};

/// How a per-object constructor takes its object: `&Arc<T>` or `&Weak<T>`.
///
/// Implemented for [`Arc<T>`] and [`Weak<T>`] only (the trait is sealed).
pub trait ObjectRef<T>: sealed::Sealed {
    /// The weak reference the work keeps.
    fn to_weak(&self) -> Weak<T>;
}

impl<T> ObjectRef<T> for Arc<T> {
    fn to_weak(&self) -> Weak<T> {
        Arc::downgrade(self)
    }
}

impl<T> ObjectRef<T> for Weak<T> {
    fn to_weak(&self) -> Weak<T> {
        self.clone()
    }
}

mod sealed {
    pub trait Sealed {}
    impl<T> Sealed for std::sync::Arc<T> {}
    impl<T> Sealed for std::sync::Weak<T> {}
}

/// How soon a run that finds its object not yet built tries again, at the least (its
/// period, if longer): a constructor inside `Arc::new_cyclic` that takes a while costs a
/// few runs, never a spin.
pub(crate) const UNBUILT_RETRY: Duration = Duration::from_millis(10);

/// The closure of a per-object work: the object if it is still alive; `Stop` once it is
/// gone.
///
/// A `Weak` that has never upgraded may belong to an object still under construction in
/// `Arc::new_cyclic`, which is not an object that is gone: such a run re-arms for its
/// period (at least [`UNBUILT_RETRY`]) and calls nothing. Once the object has been seen
/// alive (at creation, or by a run), a failed upgrade means it is gone.
fn for_object<T, F>(object: Weak<T>, mut f: F) -> impl FnMut(&mut Ctx<'_>) -> Next + Send
where
    T: Send + Sync + 'static,
    F: FnMut(&T, &mut Ctx<'_>) -> Next + Send + 'static,
{
    let mut seen_alive = object.strong_count() > 0;
    move |cx| match object.upgrade() {
        Some(object) => {
            seen_alive = true;
            f(&object, cx)
        }
        None if seen_alive => Next::Stop,
        None => Next::After(cx.period().max(UNBUILT_RETRY)),
    }
}

impl Scheduler {
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
        self.work(for_object(object.to_weak(), f))
    }

    /// A periodic work for an object, like [`every`](Self::every): the closure reaches
    /// the object through a `Weak` and the work stops once the object is gone. If the
    /// last `Arc` drops during a run, the object, and with it the work, is dropped on the
    /// running thread after the callback returns.
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
        self.every(period, for_object(object.to_weak(), f))
    }

    /// An idle timeout for an object, like [`timeout`](Self::timeout): the closure
    /// reaches the object through a `Weak` and the work stops once the object is gone.
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
        self.timeout(idle, for_object(object.to_weak(), f))
    }
}

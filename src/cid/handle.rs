//! [`IdSpace`], the handle to a space of ids, and its builder: every public method of
//! both, thin wrappers over `SpaceInner` (`space.rs`), where the ids are owned and
//! compacted.

use std::sync::Arc;
use std::time::Duration;

use super::pin::Cid;
use super::space::SpaceInner;
use crate::Scheduler;
use crate::sync::Ordering;

/// The kernel's `MM_CID_SCAN_DELAY`.
const DEFAULT_SCAN_PERIOD: Duration = Duration::from_millis(100);

/// The shortest scan period: shorter ones (zero included) are raised to it, so a space
/// scans at most 100 times a second however it is configured.
pub const MIN_SCAN_PERIOD: Duration = Duration::from_millis(10);

/// A space of compacting concurrency ids, the user-space counterpart of rseq `mm_cid`.
///
/// What a space promises is listed in the [crate documentation](crate#guarantees); the
/// protocol behind it is written down in the source, at the top of `src/cid/mod.rs`.
///
/// # Two modes
///
/// While few threads use the space, each thread keeps its id from one guard to the next
/// (per-thread mode): `enter()` is a few loads and stores. Once the threads active in a
/// scan period outnumber the CPUs the process may run on by a quarter (the kernel's
/// `mm_cid` policy since Linux 6.19), each outermost guard borrows an id for its own
/// length, starting from the id of the CPU its thread runs on, with one compare-and-swap
/// (per-CPU mode): 200 threads on 2 CPUs then hold about 2 ids, plus one for each guard
/// alive beyond them (a thread preempted inside `with`). When fewer than three quarters
/// of the CPUs' worth of threads are active, the space goes back to per-thread mode. The
/// scan decides, so a switch takes effect within a scan period; a count that hovers at
/// one threshold does not flip the mode at each scan. The CPUs counted are the process's
/// affinity and, on Linux, its cgroup CPU quota, read again at most once a second.
///
/// # The scheduler it runs on
///
/// The space's compaction work runs on the scheduler it was built with. Keep that
/// scheduler alive as long as the space (or build it on [`global()`](crate::global)). If
/// the scheduler shuts down first, ids keep working (unique and dense on `enter()`, and a
/// thread's id is still released when it exits), but nothing reclaims the ids of idle
/// threads any more. [`PerCid`](crate::PerCid) slots above the high water are then
/// trimmed when a thread exits (its `on_reclaim` runs on the exiting thread): memory
/// shrinks at each thread exit, not in between. After a shrink from 64 threads to 4 whose
/// last exit came before the survivors moved down, the slots of the ids they left stay
/// until the next thread exits.
///
/// # Examples
///
/// ```
/// use nicework::{IdSpace, Scheduler};
///
/// let sched = Scheduler::manual();
/// let ids = IdSpace::new(&sched);
/// {
///     let cid = ids.enter();
///     assert_eq!(cid.get(), 0);
///     assert_eq!(ids.enter().get(), 0); // nested: the same id
/// }
/// assert_eq!((ids.held(), ids.high_water(), ids.threads()), (1, 1, 1));
/// ```
pub struct IdSpace {
    inner: Arc<SpaceInner>,
}

/// Configures an [`IdSpace`].
#[derive(Debug, Clone)]
pub struct IdSpaceBuilder {
    scan_period: Duration,
}

impl IdSpaceBuilder {
    /// How often the compaction work looks for idle threads (100 ms by default, the
    /// kernel's `MM_CID_SCAN_DELAY`). A thread that has not entered for one to two periods
    /// loses its id, and `PerCid` slots above the high water are trimmed at each scan.
    ///
    /// Periods shorter than [`MIN_SCAN_PERIOD`] (10 ms), zero included, are raised to it;
    /// a period too long for the scheduler's clock (about 27 years) means the scan never
    /// runs on its own, and ids are then given back only when threads exit. Rounded up to
    /// the scheduler's slack. A scan may run up to a quarter of the period late, so that
    /// it shares a wakeup with the scheduler's other works (see
    /// [`Work::leeway`](crate::Work::leeway)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{IdSpace, Scheduler, MIN_SCAN_PERIOD};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::builder().scan_period(Duration::ZERO).build(&sched);
    /// drop(ids.enter());
    /// sched.advance(MIN_SCAN_PERIOD / 2);
    /// assert_eq!(ids.compaction_stats().runs, 0); // not a busy loop
    /// sched.advance(MIN_SCAN_PERIOD);
    /// assert_eq!(ids.compaction_stats().runs, 1);
    /// ```
    pub fn scan_period(mut self, period: Duration) -> Self {
        self.scan_period = period.max(MIN_SCAN_PERIOD);
        self
    }

    /// Creates the space; its compaction work runs on `scheduler` and parks while no id is
    /// held.
    pub fn build(self, scheduler: &Scheduler) -> IdSpace {
        IdSpace {
            inner: SpaceInner::new(scheduler, self.scan_period),
        }
    }
}

impl IdSpace {
    /// A space with the default 100 ms scan period.
    pub fn new(scheduler: &Scheduler) -> IdSpace {
        IdSpace::builder().build(scheduler)
    }

    /// A builder for the scan period.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{IdSpace, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::builder().scan_period(Duration::from_millis(10)).build(&sched);
    /// drop(ids.enter());
    /// sched.advance(Duration::from_millis(30)); // idle for two scans: id reclaimed
    /// assert_eq!(ids.held(), 0);
    /// ```
    pub fn builder() -> IdSpaceBuilder {
        IdSpaceBuilder {
            scan_period: DEFAULT_SCAN_PERIOD,
        }
    }

    /// Pins the calling thread's id and returns a guard for it. The first call on a thread
    /// takes the lowest free id; later calls reuse it without any atomic read-modify-write,
    /// unless it is no longer below [`held`](Self::held), in which case the thread moves
    /// to the lowest free id. Nested calls on one thread return the same id. In per-CPU
    /// mode (see [Two modes](Self#two-modes)) an outermost call borrows an id for the
    /// guard's length instead, with one compare-and-swap.
    ///
    /// In a `fork()`ed child a space made before the fork never takes its lock (another
    /// thread may have held it at the fork): the forking thread keeps its id, other
    /// threads get fresh ids above the high water at the fork, unique but neither reused
    /// nor compacted. Make a new `IdSpace` after the fork for dense ids.
    ///
    /// # Panics
    ///
    /// If the thread already holds 2<sup>31</sup> - 1 guards of this space (on 64-bit
    /// targets; 2<sup>15</sup> - 1 on 32-bit ones), which only leaked guards can reach.
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{IdSpace, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let outer = ids.enter();
    /// let inner = ids.enter(); // nested: the same id
    /// assert_eq!(outer.get(), inner.get());
    /// ```
    #[inline]
    pub fn enter(&self) -> Cid<'_> {
        self.inner.enter()
    }

    /// Ids owned: by threads (pinned or not) in per-thread mode, and in per-CPU mode by
    /// the space for the guards that borrow them (an id no guard borrowed for a scan
    /// period is given back at the next scan, and a thread's exit gives back the ids that
    /// the threads left no longer need). A thread's id is released when the thread
    /// exits, before `JoinHandle::join` returns; the end of a `std::thread::scope` is not
    /// such a join (it can return before the threads' thread-local destructors ran), so
    /// join scoped threads explicitly before counting on `held()`. If a guard of the
    /// thread lives in a thread-local destroyed after nicework's exit hook, the id is
    /// released when that guard drops (still before `join` returns).
    pub fn held(&self) -> usize {
        self.inner.held.load(Ordering::Relaxed)
    }

    /// One past the highest owned id: every id handed out is below it.
    pub fn high_water(&self) -> usize {
        self.inner.high_water()
    }

    /// Live threads that have entered this space (an exiting thread counts until its
    /// last guard is dropped).
    pub fn threads(&self) -> usize {
        self.inner.threads.load(Ordering::Relaxed)
    }

    /// The compaction work's statistics (runs, parks, busy time), as in the kernel
    /// patch's `task_mm_cid_work` table.
    pub fn compaction_stats(&self) -> crate::WorkStats {
        self.inner.work.stats()
    }

    pub(crate) fn inner(&self) -> &Arc<SpaceInner> {
        &self.inner
    }
}

impl std::fmt::Debug for IdSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdSpace")
            .field("held", &self.held())
            .field("high_water", &self.high_water())
            .field("threads", &self.threads())
            .finish()
    }
}

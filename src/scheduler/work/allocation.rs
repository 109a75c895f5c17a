//! The heap half of a work: its header (state, period, statistics) and its closure.
//!
//! One `Arc<WorkInner<Closure<F>>>` is allocated per work and shared, unsized to a
//! [`WorkRef`] (`Arc<WorkInner<dyn Callback>>`), by the owning [`Work`](crate::Work)
//! handle, its timer entries, and the thread running it. The header is a plain field in
//! front of the unsized closure, so every path reaches it without a virtual call; only
//! calling (or dropping) the closure goes through the vtable.
//!
//! # The closure's life
//!
//! The closure sits behind an `UnsafeCell` in a `ManuallyDrop`: only the thread that set
//! `RUNNING` in the state word may call it, which is what makes the `unsafe impl Sync` on
//! [`Closure`] sound. It is dropped *explicitly*, by whoever ends the work's life: the
//! handle's drop once no run is in progress, or the runner of a run that was in progress
//! when the handle went (`ORPHANED`). That sets `CLOSURE_DROPPED`. The allocation itself
//! is freed by the last `Arc`, which may be a stale timer entry dropped under the core
//! lock: that drop runs no user code, because the closure is gone by then.
//!
//! # Size
//!
//! Arc counts (16 B) + state (8) + period (8) + five statistics words (40) = 72 B before
//! the closure's captures; a timeout work adds its idle duration (8). An armed work adds
//! its timer entry (16 B), so it stays within the kernel's 88-byte `struct delayed_work`
//! plus one word. A custom name lives in the [name table](crate::scheduler::work::names).

use std::mem::ManuallyDrop;
use std::sync::Arc;

use super::{Ctx, Next, StatsCounters, names};
use crate::scheduler::work::state::{CLOSURE_DROPPED, NAMED, StateCell, TIMEOUT};
use crate::sync::{AtomicU64, Ordering, UnsafeCell};

/// The part of a work that every thread may read.
#[derive(Debug)]
/// Each field is `A:` (see the [`scheduler`](crate::scheduler) module's legend of guard
/// tags).
pub(crate) struct Header {
    /// A: the state word (see `state`); CAS by the ops and the run lifecycle.
    pub(crate) state: StateCell,
    /// A: for a timeout work, the time of its latest `touch()` (scheduler ns, raised with
    /// `fetch_max` by `touch`); for any other work, the period for `Again` and `touch`
    /// (written by `schedule`/`reschedule`).
    pub(crate) period_or_touch: AtomicU64,
    /// A: run statistics; written by the running thread only (see `stats`).
    pub(crate) stats: StatsCounters,
}

impl Header {
    pub(crate) fn new(state: u64, period_ns: u64) -> Self {
        Header {
            state: StateCell::new(state),
            period_or_touch: AtomicU64::new(period_ns),
            stats: StatsCounters::new(),
        }
    }
}

/// A work's closure as the scheduler sees it: [`Closure`], or [`TimeoutClosure`] for a
/// timeout work.
pub(crate) trait Callback: Send + Sync + 'static {
    /// The closure's type name, the default work name.
    fn type_name(&self) -> &'static str;

    /// A timeout work's idle duration (its period); 0 for other works.
    fn idle_ns(&self) -> u64 {
        0
    }

    /// Whether its one run consumes the closure (`Scheduler::once`).
    fn is_once(&self) -> bool {
        false
    }

    /// Calls the closure.
    ///
    /// # Safety
    ///
    /// The caller must be the thread that set `RUNNING` in this work's state word, and
    /// `RUNNING` must still be set; the closure must not have been dropped.
    unsafe fn call(&self, cx: &mut Ctx<'_>) -> Next;

    /// Drops the closure in place.
    ///
    /// # Safety
    ///
    /// Called at most once, by the one thread that ends the work's life (see the module
    /// docs), while no run is in progress; the closure is never called afterwards.
    unsafe fn drop_closure(&self);
}

/// A counted reference to a work, as the scheduler's paths share it.
pub(crate) type WorkRef = Arc<WorkInner<dyn Callback>>;

/// A work's allocation: the header every thread may read, then the closure. Generic over
/// the closure so that it can be unsized to `WorkInner<dyn Callback>`.
pub(crate) struct WorkInner<C: ?Sized> {
    pub(crate) header: Header,
    callback: C,
}

impl<C: Callback> WorkInner<C> {
    pub(crate) fn new(header: Header, callback: C) -> Self {
        WorkInner { header, callback }
    }
}

impl WorkInner<dyn Callback> {
    /// The header: a plain field, reached without a virtual call.
    #[inline]
    pub(crate) fn header(&self) -> &Header {
        &self.header
    }

    /// The work's name: its custom name or its closure's type name.
    pub(crate) fn name(&self) -> &str {
        if self.header.state.load().has(NAMED) {
            if let Some(name) = names::get(self.address()) {
                return name;
            }
        }
        self.callback.type_name()
    }

    /// Gives the work a custom name.
    pub(crate) fn set_name(&self, name: Box<str>) {
        names::push(self.address(), name);
        self.header.state.set_flag(NAMED);
    }

    /// The address that identifies the work (in the name table, the wait graph and the
    /// lending bookkeeping).
    pub(crate) fn address(&self) -> usize {
        self as *const Self as *const u8 as usize
    }

    /// The period: a timeout work's idle duration, else the period word.
    pub(crate) fn period_ns(&self) -> u64 {
        if self.header.state.load().has(TIMEOUT) {
            self.callback.idle_ns()
        } else {
            self.header.period_or_touch.load(Ordering::Relaxed)
        }
    }

    /// Calls the closure.
    ///
    /// # Safety
    ///
    /// As [`Callback::call`]: the caller set `RUNNING`, and it is still set.
    pub(crate) unsafe fn call(&self, cx: &mut Ctx<'_>) -> Next {
        // SAFETY: forwarded from the caller.
        unsafe { self.callback.call(cx) }
    }

    /// Drops the closure and marks it dropped; nothing if a `once` work's run consumed it
    /// already (see [`mark_consumed`](Self::mark_consumed)).
    ///
    /// # Safety
    ///
    /// As [`Callback::drop_closure`].
    pub(crate) unsafe fn drop_closure(&self) {
        // Marked first: if the destructor panics, the closure counts as dropped (its
        // remains are leaked, never dropped twice).
        if self
            .header
            .state
            .set_flag(CLOSURE_DROPPED)
            .has(CLOSURE_DROPPED)
        {
            return;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.callback.drop_closure() }
    }

    /// Whether its one run consumes the closure.
    pub(crate) fn is_once(&self) -> bool {
        self.callback.is_once()
    }

    /// A `once` work's run consumed its closure: marked dropped, so every later arm is
    /// refused and nobody drops it again (what is left owns nothing).
    ///
    /// # Safety
    ///
    /// The caller holds `RUNNING` for the run that called the closure.
    pub(crate) unsafe fn mark_consumed(&self) {
        debug_assert!(self.is_once());
        self.header.state.set_flag(CLOSURE_DROPPED);
    }
}

impl<C: ?Sized> Drop for WorkInner<C> {
    fn drop(&mut self) {
        let state = self.header.state.load();
        if state.has(NAMED) {
            names::remove(self as *const Self as *const u8 as usize);
        }
        // Every path that ends a work's life drops the closure before the last reference
        // goes (see the module docs); a leaked handle never gets here. So nothing is
        // left to drop, and no user code runs wherever this drop happens.
        debug_assert!(
            state.has(CLOSURE_DROPPED),
            "a work's allocation was freed with its closure still alive"
        );
    }
}

impl std::fmt::Debug for WorkInner<dyn Callback> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkInner")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

/// A work's closure behind the cell that only the running thread may enter.
pub(crate) struct Closure<F> {
    func: UnsafeCell<ManuallyDrop<F>>,
}

impl<F> Closure<F> {
    pub(crate) fn new(func: F) -> Self {
        Closure {
            func: UnsafeCell::new(ManuallyDrop::new(func)),
        }
    }
}

// SAFETY: the closure is only reached through `call` and `drop_closure`, whose contracts
// (the RUNNING bit, set and cleared with the state word's CAS, and the single end of
// life) give one thread exclusive access at a time; `type_name` does not touch it.
unsafe impl<F: Send> Sync for Closure<F> {}

impl<F> Callback for Closure<F>
where
    F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
{
    fn type_name(&self) -> &'static str {
        std::any::type_name::<F>()
    }

    unsafe fn call(&self, cx: &mut Ctx<'_>) -> Next {
        // SAFETY: the caller holds RUNNING, so no other reference to the closure exists,
        // and it has not been dropped.
        self.func.with_mut(|func| unsafe { (**func)(cx) })
    }

    unsafe fn drop_closure(&self) {
        // SAFETY: the caller ends the work's life: no run is in progress and none will
        // start, so this is the only access, and it happens once.
        self.func
            .with_mut(|func| unsafe { ManuallyDrop::drop(&mut *func) })
    }
}

/// A timeout work's closure: the closure plus the idle duration, which only slow paths
/// read (the fast `touch()` records a time and needs no duration).
pub(crate) struct TimeoutClosure<F> {
    idle_ns: u64,
    closure: Closure<F>,
}

impl<F> TimeoutClosure<F> {
    pub(crate) fn new(idle_ns: u64, func: F) -> Self {
        TimeoutClosure {
            idle_ns,
            closure: Closure::new(func),
        }
    }
}

impl<F> Callback for TimeoutClosure<F>
where
    F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
{
    fn type_name(&self) -> &'static str {
        self.closure.type_name()
    }

    fn idle_ns(&self) -> u64 {
        self.idle_ns
    }

    unsafe fn call(&self, cx: &mut Ctx<'_>) -> Next {
        // SAFETY: forwarded from the caller.
        unsafe { self.closure.call(cx) }
    }

    unsafe fn drop_closure(&self) {
        // SAFETY: forwarded from the caller.
        unsafe { self.closure.drop_closure() }
    }
}

/// A `once` work's closure: taken out and called by its one run, which leaves nothing
/// behind (`mark_consumed`); dropped unrun if the work goes first.
pub(crate) struct OnceClosure<F> {
    func: UnsafeCell<Option<F>>,
}

impl<F> OnceClosure<F> {
    pub(crate) fn new(func: F) -> Self {
        OnceClosure {
            func: UnsafeCell::new(Some(func)),
        }
    }
}

// SAFETY: as for `Closure`: only the thread that holds RUNNING, or the one that ends the
// work's life, reaches the cell.
unsafe impl<F: Send> Sync for OnceClosure<F> {}

impl<F> Callback for OnceClosure<F>
where
    F: FnOnce(&mut Ctx<'_>) + Send + 'static,
{
    fn type_name(&self) -> &'static str {
        std::any::type_name::<F>()
    }

    fn is_once(&self) -> bool {
        true
    }

    unsafe fn call(&self, cx: &mut Ctx<'_>) -> Next {
        // SAFETY: the caller holds RUNNING, so no other reference to the cell exists.
        let func = self.func.with_mut(|func| unsafe { (*func).take() });
        // Consumed here: its captures are dropped as the call returns (or unwinds, inside
        // the run's containment).
        if let Some(func) = func {
            func(cx);
        }
        Next::Stop
    }

    unsafe fn drop_closure(&self) {
        // SAFETY: the caller ends the work's life: no run is in progress and none will
        // start, so this is the only access.
        drop(self.func.with_mut(|func| unsafe { (*func).take() }));
    }
}

//! The heap half of a work: its header (state, period, statistics) and its closure, and
//! [`WorkRef`], the counted reference every path shares it through.
//!
//! One `WorkInner<C>` is allocated per work, `C` its closure type, and shared by the
//! owning [`Work`](crate::Work) handle, its timer entries, and the thread running it.
//! The header is a plain field in front of the closure, so every path reaches it without
//! a virtual call; only calling (or dropping) the closure goes through the vtable.
//!
//! # References
//!
//! A [`WorkRef`] is one word: a pointer to the header, which `repr(C)` puts at the
//! allocation's address. The header's `widen` field, written once at creation, turns that
//! pointer back into a `WorkInner<dyn Callback>` for the paths that need the closure; the
//! rest read the header in place. Its count plays `Arc`'s strong count (relaxed clones,
//! a release decrement and an acquire fence before the free); there is no weak count,
//! since nothing needs one. So a timer entry, which is such a pointer tagged with an
//! epoch, is one word where a tagged `Arc<dyn Callback>` would be two.
//!
//! # The closure's life
//!
//! The closure sits behind an `UnsafeCell` in a `ManuallyDrop`: only the thread that set
//! `RUNNING` in the state word may call it, which is what makes the `unsafe impl Sync` on
//! [`Closure`] sound. It is dropped *explicitly*, by whoever ends the work's life: the
//! handle's drop once no run is in progress, or the runner of a run that was in progress
//! when the handle went (`ORPHANED`). That sets `CLOSURE_DROPPED`, after unlisting the work
//! from the [registry](crate::scheduler::work::listing) of live works. The allocation
//! itself is freed by the last `WorkRef`, which may be a stale timer entry dropped under
//! the core lock: that drop runs no user code, because the closure is gone by then.
//!
//! # Size
//!
//! The widening pointer (8 B) + the count and the registry slot (4 + 4) + state (8) +
//! period (8) + five statistics words (40) = 72 B before the closure's captures; a timeout
//! work adds its idle duration (8), and the registry holds one word per work (8–16 B
//! with its vector's growth). An armed work adds its timer entry (8 B), so it stays within
//! the kernel's 88-byte `struct delayed_work` plus one word. A custom name lives in the
//! [name table](crate::scheduler::work::names).

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, fence};

use super::listed_slots::NOT_LISTED;
use super::{Ctx, Next, StatsCounters, names};
use crate::scheduler::work::state::{State, StateCell};
use crate::sync::{AtomicU64, Ordering, UnsafeCell};

/// The top bit of a header's listing word: the work has a custom name.
const NAMED_BIT: u32 = 1 << 31;

/// The part of a work that every thread may read.
#[derive(Debug)]
/// Each field is `A:` (see the legend of guard tags in `sync`).
pub(crate) struct Header {
    /// I: turns a pointer to this header into one to the whole allocation, whose closure
    /// type only this function knows (a [`WorkRef`] is one word; see "References").
    widen: unsafe fn(NonNull<Header>) -> NonNull<WorkInner<dyn Callback>>,
    /// A: the number of [`WorkRef`]s (the allocation's owners); there is no weak count.
    refs: AtomicU32,
    /// T (the scheduler's registry lock for writes; relaxed reads may be stale): the
    /// work's slot in the registry of live works, or `NOT_LISTED` (see `listing`), in the
    /// low 31 bits; and A, the top bit (`NAMED_BIT`), set once when the work gets a custom
    /// name. Each writer edits only its own bits.
    registry_key_and_name: AtomicU32,
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
    /// The whole allocation that `this` heads.
    ///
    /// # Safety
    ///
    /// `this` points to the header of a work that stays alive for `'a`.
    #[inline]
    pub(crate) unsafe fn work<'a>(this: NonNull<Header>) -> &'a WorkInner<dyn Callback> {
        // SAFETY: the header is alive (the caller's promise), and its `widen` is the one
        // for its allocation's closure type.
        unsafe { (this.as_ref().widen)(this).as_ref() }
    }

    /// The period: a timeout work's idle duration (`idle_ns`, which only its closure
    /// knows), else the period word (which an arm holding the period's claim may be
    /// changing: see the ground rules in `state`).
    #[inline]
    fn period_ns(&self, idle_ns: impl FnOnce() -> u64) -> u64 {
        if self.state.load().is_timeout() {
            idle_ns()
        } else {
            self.period_or_touch.load(Ordering::Relaxed)
        }
    }

    /// A `work()`'s period, read by the holder of its claim.
    #[inline]
    pub(crate) fn claimed_period(&self) -> u64 {
        self.period_or_touch.load(Ordering::Relaxed)
    }

    /// Stores a `work()`'s period; by the holder of its claim, before it releases it.
    #[inline]
    pub(crate) fn store_period(&self, period_ns: u64) {
        self.period_or_touch.store(period_ns, Ordering::Relaxed);
    }

    /// The work's slot in the registry (see `listing`).
    pub(crate) fn registry_key(&self) -> u32 {
        self.registry_key_and_name.load(Ordering::Relaxed) & !NAMED_BIT
    }

    /// Sets the slot; under the registry lock. A CAS loop: `mark_named` may set its bit
    /// meanwhile.
    pub(crate) fn set_registry_key(&self, key: u32) {
        debug_assert!(key <= NOT_LISTED);
        let word = &self.registry_key_and_name;
        let mut old = word.load(Ordering::Relaxed);
        while let Err(now) = word.compare_exchange_weak(
            old,
            (old & NAMED_BIT) | key,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            old = now;
        }
    }

    /// Whether the work has a custom name in the name table.
    fn is_named(&self) -> bool {
        self.registry_key_and_name.load(Ordering::Acquire) & NAMED_BIT != 0
    }

    /// Marks the work as having a custom name (after it was put in the table: release).
    fn mark_named(&self) {
        self.registry_key_and_name
            .fetch_or(NAMED_BIT, Ordering::Release);
    }

    /// A header for a work whose closure is a `C`, with one reference.
    fn new<C: Callback>(state: State, period_ns: u64) -> Self {
        Header {
            widen: widen::<C>,
            refs: AtomicU32::new(1),
            registry_key_and_name: AtomicU32::new(NOT_LISTED),
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

/// [`Header::widen`] for a closure of type `C`.
///
/// # Safety
///
/// `header` points to the header of a live `WorkInner<C>`.
unsafe fn widen<C: Callback>(header: NonNull<Header>) -> NonNull<WorkInner<dyn Callback>> {
    // `WorkInner` is `repr(C)` with the header first, so the header's address is the
    // allocation's.
    header.cast::<WorkInner<C>>()
}

/// Past this many references the count saturates. Works have a handful (a handle, a
/// timer entry or two, a run, a waiter each); only leaks reach it (a `cancel_async`
/// future forgotten two billion times, say), and those leak the work instead.
const MAX_REFS: u32 = 1 << 31;
/// A saturated count: clones and drops leave it in place (each one that finds the count
/// past `MAX_REFS` stores it again, so racing ones cannot walk it down), and the
/// allocation is never freed. That is a leak of one work's header, where 32-bit counts
/// would otherwise wrap (a use after free) or abort the process as `Arc` does.
const SATURATED_REFS: u32 = 3 << 30;

/// A counted reference to a work, as the scheduler's paths share it: one word, where an
/// `Arc<WorkInner<dyn Callback>>` is two (see "References" in the module docs).
pub(crate) struct WorkRef {
    header: NonNull<Header>,
}

// SAFETY: a `WorkRef` shares a `WorkInner<dyn Callback>`, which is `Send + Sync` (its
// header is atomics, and `Callback: Send + Sync`), exactly as `Arc` would.
unsafe impl Send for WorkRef {}
// SAFETY: as for `Send`.
unsafe impl Sync for WorkRef {}

impl WorkRef {
    /// Allocates a work whose closure is `callback`: the first reference.
    pub(crate) fn new<C: Callback>(state: State, period_ns: u64, callback: C) -> WorkRef {
        let inner = Box::new(WorkInner {
            header: Header::new::<C>(state, period_ns),
            callback,
        });
        WorkRef {
            header: NonNull::from(Box::leak(inner)).cast::<Header>(),
        }
    }

    /// The header: read in place, without widening.
    #[inline]
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: this reference keeps the allocation alive.
        unsafe { self.header.as_ref() }
    }

    /// The header's address, with the allocation's provenance.
    pub(crate) fn header_ptr(&self) -> NonNull<Header> {
        self.header
    }

    /// The whole allocation, closure included.
    #[inline]
    pub(crate) fn inner(&self) -> &WorkInner<dyn Callback> {
        // SAFETY: this reference keeps the allocation alive for the borrow.
        unsafe { Header::work(self.header) }
    }

    /// The address that identifies the work (in the name table, the wait graph and the
    /// lending bookkeeping): its allocation's.
    #[inline]
    pub(crate) fn address(&self) -> usize {
        self.header.as_ptr().addr()
    }

    /// The work's id, as `Work::id` and `WorkInfo::id` show it: its address, unique
    /// among live works.
    #[inline]
    pub(crate) fn id(&self) -> u64 {
        self.address() as u64
    }

    /// The period (see [`Header::period_ns`]), widening only for a timeout work.
    pub(crate) fn period_ns(&self) -> u64 {
        self.header().period_ns(|| self.inner().callback.idle_ns())
    }

    /// Gives up this reference as a pointer to the header, for [`from_raw`](Self::from_raw).
    pub(crate) fn into_raw(self) -> NonNull<Header> {
        let header = self.header;
        std::mem::forget(self);
        header
    }

    /// Takes back a reference given up with [`into_raw`](Self::into_raw).
    ///
    /// # Safety
    ///
    /// `header` came from `into_raw`, and that reference has not been taken back yet.
    pub(crate) unsafe fn from_raw(header: NonNull<Header>) -> WorkRef {
        WorkRef { header }
    }

    /// Another reference to the work behind a header pointer.
    ///
    /// # Safety
    ///
    /// `header` points to a work that some reference keeps alive for the whole call.
    pub(crate) unsafe fn clone_from_raw(header: NonNull<Header>) -> WorkRef {
        // SAFETY: forwarded from the caller; the clone adds its own count.
        let borrowed = std::mem::ManuallyDrop::new(unsafe { WorkRef::from_raw(header) });
        (*borrowed).clone()
    }
}

impl Clone for WorkRef {
    #[inline]
    fn clone(&self) -> WorkRef {
        // Relaxed, as `Arc::clone`: a new reference is made from an existing one, which
        // keeps the allocation alive meanwhile; no access is ordered by the count. Past
        // `MAX_REFS` the count saturates (see `SATURATED_REFS`).
        let refs = &self.header().refs;
        if refs.fetch_add(1, Ordering::Relaxed) >= MAX_REFS {
            refs.store(SATURATED_REFS, Ordering::Relaxed);
        }
        WorkRef {
            header: self.header,
        }
    }
}

impl Drop for WorkRef {
    #[inline]
    fn drop(&mut self) {
        // Release, then an acquire fence before the free, as `Arc`'s drop: every use of
        // the work through another reference happens before the allocation goes.
        let refs = &self.header().refs;
        match refs.fetch_sub(1, Ordering::Release) {
            1 => {}
            old if old >= MAX_REFS => {
                refs.store(SATURATED_REFS, Ordering::Relaxed);
                return;
            }
            _ => return,
        }
        fence(Ordering::Acquire);
        // SAFETY: this was the last reference, so nothing else reaches the allocation;
        // it came from `Box::leak` in `new`, and the widened pointer carries the closure
        // type's layout and destructor.
        drop(unsafe { Box::from_raw((self.header().widen)(self.header).as_ptr()) });
    }
}

impl std::ops::Deref for WorkRef {
    type Target = WorkInner<dyn Callback>;

    fn deref(&self) -> &WorkInner<dyn Callback> {
        self.inner()
    }
}

impl std::fmt::Debug for WorkRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner().fmt(f)
    }
}

/// A work's allocation: the header every thread may read, then the closure. Generic over
/// the closure so that a pointer to it can be unsized to `WorkInner<dyn Callback>`;
/// `repr(C)` puts the header first, at the allocation's address.
#[repr(C)]
pub(crate) struct WorkInner<C: ?Sized> {
    pub(crate) header: Header,
    callback: C,
}

impl WorkInner<dyn Callback> {
    /// The work's name: its custom name or its closure's type name.
    pub(crate) fn name(&self) -> &str {
        if self.header.is_named() {
            if let Some(name) = names::get(self.address()) {
                return name;
            }
        }
        self.callback.type_name()
    }

    /// Gives the work a custom name.
    pub(crate) fn set_name(&self, name: Box<str>) {
        names::push(self.address(), name);
        self.header.mark_named();
    }

    /// The address that identifies the work (in the name table, the wait graph and the
    /// lending bookkeeping).
    pub(crate) fn address(&self) -> usize {
        self as *const Self as *const u8 as usize
    }

    /// The period (see [`Header::period_ns`]).
    pub(crate) fn period_ns(&self) -> u64 {
        self.header.period_ns(|| self.callback.idle_ns())
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
        if self.header.state.mark_closure_dropped() {
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
        self.header.state.mark_closure_dropped();
    }
}

impl<C: ?Sized> Drop for WorkInner<C> {
    fn drop(&mut self) {
        let state = self.header.state.load();
        if self.header.is_named() {
            names::remove(self as *const Self as *const u8 as usize);
        }
        // Every path that ends a work's life drops the closure before the last reference
        // goes (see the module docs); a leaked handle never gets here. So nothing is
        // left to drop, and no user code runs wherever this drop happens.
        debug_assert!(
            state.closure_dropped(),
            "a work's allocation was freed with its closure still alive"
        );
        debug_assert_eq!(
            self.header.registry_key(),
            NOT_LISTED,
            "a work's allocation was freed while listed"
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::work::state::Kind;

    #[test]
    fn a_count_past_max_refs_saturates_and_the_work_is_never_freed() {
        let work = WorkRef::new(
            State::new_work(Kind::FollowsArms),
            0,
            Closure::new(|_: &mut Ctx<'_>| Next::Park),
        );
        let refs = || work.header().refs.load(Ordering::Relaxed);
        // As if two billion references had been leaked (forgotten futures, say).
        work.header().refs.store(MAX_REFS - 2, Ordering::Relaxed);
        let clones: Vec<WorkRef> = (0..8).map(|_| work.clone()).collect();
        assert_eq!(refs(), SATURATED_REFS, "saturated from the third clone on");
        drop(clones);
        assert_eq!(refs(), SATURATED_REFS, "drops leave it saturated");
        let more: Vec<WorkRef> = (0..3).map(|_| work.clone()).collect();
        drop(more);
        assert_eq!(refs(), SATURATED_REFS);
        // The test frees what it made, ending the life first as every path does.
        // SAFETY: no run is in progress; this is the work's only end of life.
        unsafe { work.drop_closure() };
        work.header().refs.store(1, Ordering::Relaxed);
    }
}

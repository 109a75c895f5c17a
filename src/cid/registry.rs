//! The thread-local half of the orphan protocol (see `pin.rs`): the registry that owns a
//! thread's records, the one-entry cache `enter()`'s fast path reads, the list of
//! orphaned records, and the thread-exit hook that releases or orphans the records.
//!
//! # Invariants
//!
//! - A record is owned by its thread's registry until the exit hook runs, and afterwards,
//!   if a guard still pins it, by the thread's orphan list, until that guard's drop.
//! - The cache (`LAST`) only ever points at a record the registry owns: the exit hook
//!   clears it first, and the registry prunes a record only while setting it again.
//! - The cache key of a space is its address, with bit 0 set where membarrier is not
//!   registered, so that the fast path misses there and takes the path with the fence.
//! - The orphan list has no destructor, so it stays reachable for the whole teardown,
//!   whatever the order of the thread's other locals.

use std::cell::{Cell, RefCell};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Weak};

use super::barrier;
use super::record::{LENT, ORPHANED, PIN_ONE, PINS, ThreadRec, pinned};
use super::space::SpaceInner;
use crate::sync::{Ordering, thread_local};

/// One of the thread's records, with its space's serial number and a `Weak` to the space
/// (which keeps the space's allocation, so its address, `LAST`'s key, stays unique while
/// the record lives).
struct Entry {
    serial: u64,
    space: Weak<SpaceInner>,
    record: Arc<ThreadRec>,
}

/// The thread's records.
type Records = Vec<Entry>;

/// The thread's records. Its destructor is nicework's thread-exit hook.
struct Registry {
    records: RefCell<Records>,
}

impl Drop for Registry {
    /// Thread exit: releases every id at once, before `join()` returns elsewhere, except
    /// those still pinned by a guard. Such a guard lives in a thread-local destroyed after
    /// this one (std runs thread-local destructors in the reverse order of their
    /// registration, at each local's first use, and any `Cid<'static>` can be stored in
    /// one). Its record is marked `ORPHANED` and moved to `ORPHANS`, which has no
    /// destructor: nested `enter()`s made later in the teardown find it there, and the last
    /// guard's drop releases the id and frees the record.
    fn drop(&mut self) {
        exit_hook(self.records.get_mut());
    }
}

/// The thread-exit hook's work: releases the ids of `records` that no guard pins and
/// orphans the others (see `Registry::drop`).
fn exit_hook(records: &mut Records) {
    // The cache must not point into records that are going away.
    // `try_with`: loom destroys its mock thread-locals in any order.
    let _ = LAST.try_with(|last| last.set(NO_RECORD));
    let (mut orphans, unpinned): (Records, Records) = records
        .drain(..)
        .partition(|entry| pinned(entry.record.pin.load(Ordering::Relaxed)));
    for Entry { record, .. } in &orphans {
        let pin = record.pin.load(Ordering::Relaxed);
        // Relaxed: only this thread reads the bit; the scan only asks `pinned`.
        record.pin.store(pin | ORPHANED, Ordering::Relaxed);
    }
    // The orphans go where `enter()` looks first, before any release below runs user code
    // (a trim's `on_reclaim` once the scheduler is gone): a nested enter there must find
    // the pinned record and return its id.
    if !orphans.is_empty() && with_orphans(|list| list.append(&mut orphans)).is_none() {
        // Unreachable: `ORPHANS` has no destructor (in loom builds it is first used
        // here, after loom took the thread's locals away). Freeing the records would
        // free them under live guards; leak them, and their ids, instead.
        std::mem::forget(orphans);
    }
    for Entry { space, record, .. } in unpinned {
        if let Some(space) = space.upgrade() {
            space.release_thread(&record);
        }
    }
}

thread_local! {
    // loom's thread_local! has no `const { }` form, and this must build with both.
    #[allow(clippy::missing_const_for_thread_local)]
    static REGISTRY: Registry = Registry {
        records: RefCell::new(Vec::new()),
    };
}

// The fast path's one-entry cache: the last record looked up (its space's `key` and a
// pointer kept alive by `REGISTRY`: the record that `lookup_or_register` sets it to is
// pruned from there only by a later `lookup_or_register`, which sets it again). It has no
// destructor, so std can make it a plain `#[thread_local]` access with no
// lazy-initialisation check; `Registry::drop` clears it. Empty, it holds `NO_RECORD`: no
// space is at address 0, so its dangling pointer is never returned, and a hit needs no
// null check.
//
// `ORPHANS`: the records that the exit hook could not release because guards still pin
// them (a `Box<Records>` from `Box::into_raw`, or null). No destructor either, so it stays
// usable for the whole teardown, whatever the order of the other thread-locals; the drop of
// the last orphan's last guard frees it.
#[cfg(not(all(loom, feature = "loom")))]
thread_local! {
    static LAST: Cell<(usize, NonNull<ThreadRec>)> = const { Cell::new(NO_RECORD) };
    static ORPHANS: Cell<*mut Records> = const { Cell::new(ptr::null_mut()) };
}

// loom: `ORPHANS` is first used during the thread's teardown (by the exit hook), after
// loom took the thread's other locals away, so it stays reachable until the thread is gone.
// (Loom takes every local away before running any destructor, and runs them in an order
// that varies: a user's destructor that runs before the registry's cannot reach the
// registry: its `enter()` makes a late orphan, as after the registry's destruction.)
#[cfg(all(loom, feature = "loom"))]
thread_local! {
    #[allow(clippy::missing_const_for_thread_local)]
    static LAST: Cell<(usize, NonNull<ThreadRec>)> = Cell::new(NO_RECORD);
    #[allow(clippy::missing_const_for_thread_local)]
    static ORPHANS: Cell<*mut Records> = Cell::new(ptr::null_mut());
}

// Loom only: set once `run_exit_hook_now` ran, so lookups behave as after the registry's
// destruction (loom cannot order thread-local destructors; see `run_exit_hook_now`).
#[cfg(all(loom, feature = "loom"))]
thread_local! {
    #[allow(clippy::missing_const_for_thread_local)]
    static EXITED: Cell<bool> = Cell::new(false);
}

/// Loom only: runs the thread-exit hook on the calling thread now, as if the thread were
/// exiting while the guards it holds live in thread-locals destroyed after the hook. Loom
/// takes all of a finishing thread's locals away before running any destructor, in an
/// order that varies, so a model cannot arrange that order itself.
#[cfg(all(loom, feature = "loom"))]
pub(crate) fn run_exit_hook_now() {
    // As in std's teardown: once the hook starts, the registry is unreachable (code the
    // hook runs, such as a trim's `on_reclaim`, may enter a space meanwhile).
    let mut records = REGISTRY.with(|registry| std::mem::take(&mut *registry.records.borrow_mut()));
    EXITED.with(|exited| exited.set(true));
    exit_hook(&mut records);
}

/// `LAST` when empty.
const NO_RECORD: (usize, NonNull<ThreadRec>) = (0, NonNull::dangling());

/// The calling thread's record for `space`, registering it on first use; after the
/// thread's exit hook ran, the orphaned record if a guard still pins one. `None` while the
/// thread's locals are being destroyed and it has no pinned record for `space`.
#[inline]
pub(crate) fn record(space: &Arc<SpaceInner>) -> Option<NonNull<ThreadRec>> {
    cached(key(space)).or_else(|| find_or_register(space))
}

/// `enter()`'s fast lookup: the cached record if it is `space`'s and was cached where the
/// fast path's light barrier is a compiler fence (see `key`), else `None`. Two
/// thread-local loads and a compare with an address the caller has in a register.
#[inline(always)]
pub(crate) fn cached_fast(space: &SpaceInner) -> Option<NonNull<ThreadRec>> {
    cached(address(space))
}

fn address(space: &SpaceInner) -> usize {
    space as *const SpaceInner as usize
}

/// The key `LAST` caches `space`'s record under: the space's address, which no other space
/// can have while the record lives (its registry entry's `Weak` keeps the allocation), and `LAST`'s
/// record always lives. Bit 0 (an `Arc`'s contents are aligned) is set where membarrier is
/// not registered, so that `cached_fast` misses and `enter()` takes the path whose light
/// barrier reads the barrier mode (which never changes once a space exists).
fn key(space: &SpaceInner) -> usize {
    address(space) | usize::from(!barrier::asymmetric_light_ok())
}

/// The cached record (the last one looked up) if `key` is its key, else `None`.
#[inline(always)]
fn cached(key: usize) -> Option<NonNull<ThreadRec>> {
    // `try_with`: loom's mock of this const thread-local can be destroyed; std's cannot,
    // and there this compiles to the plain access.
    match LAST.try_with(Cell::get) {
        Ok((cached, last)) if cached == key => Some(last),
        _ => None,
    }
}

#[cold]
#[inline(never)]
fn find_or_register(space: &Arc<SpaceInner>) -> Option<NonNull<ThreadRec>> {
    #[cfg(all(loom, feature = "loom"))]
    if EXITED.with(Cell::get) {
        return with_orphans(|orphans| find(orphans, space.serial)).flatten();
    }
    match REGISTRY.try_with(|registry| lookup_or_register(registry, space)) {
        Ok(record) => Some(record),
        // The exit hook ran (or runs): only orphans are left.
        Err(_) => with_orphans(|orphans| find(orphans, space.serial)).flatten(),
    }
}

fn find(records: &Records, serial: u64) -> Option<NonNull<ThreadRec>> {
    records
        .iter()
        .find(|entry| entry.serial == serial)
        .map(|entry| NonNull::from(&*entry.record))
}

fn lookup_or_register(registry: &Registry, space: &Arc<SpaceInner>) -> NonNull<ThreadRec> {
    let mut records = registry.records.borrow_mut();
    let record = match find(&records, space.serial) {
        Some(record) => record,
        None => {
            // Forget records of spaces that are gone, so long-lived threads do not collect
            // them. (None is pinned: a guard borrows its space.)
            records.retain(|entry| entry.space.strong_count() > 0);
            let record = Arc::new(ThreadRec::new());
            space.add_thread(record.clone());
            let pointer = NonNull::from(&*record);
            records.push(Entry {
                serial: space.serial,
                space: Arc::downgrade(space),
                record,
            });
            pointer
        }
    };
    LAST.with(|last| last.set((key(space), record)));
    record
}

/// Runs `f` on the thread's orphan list, created empty if there is none; frees the list if
/// `f` leaves it empty. `None` if the list is unreachable (see `ORPHANS`).
fn with_orphans<R>(f: impl FnOnce(&mut Records) -> R) -> Option<R> {
    ORPHANS
        .try_with(|cell| {
            let pointer = cell.replace(ptr::null_mut());
            let mut list = if pointer.is_null() {
                Box::default()
            } else {
                // SAFETY: a non-null pointer in the cell came from `Box::into_raw` below, on
                // this thread, and was taken out of the cell above, so this is its only owner.
                unsafe { Box::from_raw(pointer) }
            };
            let result = f(&mut list);
            if !list.is_empty() {
                cell.set(Box::into_raw(list));
            }
            result
        })
        .ok()
}

/// After the thread's exit hook ran, a record for `space` made directly as an orphan, for
/// an `enter()` from a late thread-local destructor that found none: pinned (`ORPHANED` +
/// one guard), registered with the space, and in the orphan list, so that nested
/// `enter()`s find it and the guard's drop releases its id and frees it as for any orphan.
/// `None` if the orphan list is unreachable (see `ORPHANS`).
pub(crate) fn late_orphan(space: &Arc<SpaceInner>) -> Option<NonNull<ThreadRec>> {
    let record = Arc::new(ThreadRec::new());
    record.pin.store(ORPHANED | PIN_ONE, Ordering::Relaxed);
    let pointer = NonNull::from(&*record);
    let kept = Entry {
        serial: space.serial,
        space: Arc::downgrade(space),
        record: record.clone(),
    };
    with_orphans(move |orphans| orphans.push(kept))?;
    space.add_thread(record);
    Some(pointer)
}

/// Takes the orphaned `record` out of the thread's orphan list; called by the drop of its
/// last guard.
pub(crate) fn take_orphan(record: NonNull<ThreadRec>) -> Option<Arc<ThreadRec>> {
    with_orphans(|orphans| {
        let index = orphans
            .iter()
            .position(|entry| ptr::eq(Arc::as_ptr(&entry.record), record.as_ptr()))?;
        Some(orphans.swap_remove(index).record)
    })
    .flatten()
}

/// The id the calling thread pins in `space` (its outermost guard's), if any; never
/// registers a record.
pub(crate) fn pinned_id(space: &Arc<SpaceInner>) -> Option<usize> {
    let record = cached(key(space)).or_else(|| {
        REGISTRY
            .try_with(|registry| find(&registry.records.borrow(), space.serial))
            .ok()
            .flatten()
            .or_else(|| with_orphans(|orphans| find(orphans, space.serial)).flatten())
    })?;
    // SAFETY: the calling thread's own record, alive while it is in its registry or
    // orphan list, which only this thread changes, and not during this call.
    let record = unsafe { record.as_ref() };
    (record.pin.load(Ordering::Relaxed) & PINS & !(ORPHANED | LENT) != 0)
        .then(|| record.own.load(Ordering::Relaxed))
}

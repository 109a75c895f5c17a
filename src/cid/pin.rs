//! The pin protocol and the orphan protocol, with both of their halves: a thread's
//! per-space records and their words, the thread-local registry that finds them and
//! releases them when the thread exits, `enter()`'s paths (the owner's half), the [`Cid`]
//! guard, and the compaction scan's revoke step (the reclaimer's half). The letters in
//! the diagrams stand in comments at the lines that perform each step.
//!
//! # The pin protocol
//!
//! Each (thread, space) pair has a record: `cid` (the owned id or none, possibly marked
//! `MOVE`: see "Moving down"), `own` (the id the
//! thread last took; only the thread touches it), `pin`, and `seen` (the scan's). `pin` is
//! one word written only by the thread, with plain stores (a load, then a store): its low
//! half (`PINS`) holds the guard nesting depth and the `ORPHANED` flag (see below), so the
//! record is pinned while it is not zero; its high half counts the thread's first-level
//! enters. The scan only reads it: a thread whose count did not move since the scan's
//! previous look (kept in `seen`) has not entered since (a hint). Ids are owned in a
//! bitmap under the space's lock.
//!
//! ```text
//!  thread (enter, fast path)            reclaimer (scan, under the space lock)
//!  ─────────────────────────            ──────────────────────────────────────
//!  p := pin                             p := pin; moved := count(p) != seen
//!  if pinned(p): nested (N)             seen := count(p)
//!  pin := p + ENTER + PIN_ONE  (P)      if !moved and !pinned(p):  (idle)
//!  light barrier                          cid := NONE                        (R)
//!  c := cid                  (L)          heavy barrier  (membarrier)
//!  if c < MOVE: use c                     if pinned(pin) { cid := c } else { free(c) }  (C)
//!  else: slow path (takes the lock; a new id goes to `cid` and `own`)
//!  ...
//!  nested enter: pin += PIN_ONE, use own  (N)
//!  ...
//!  pin := pin - PIN_ONE  (release)  (U)
//! ```
//!
//! The heavy barrier (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`) makes every thread
//! execute a full fence, so the two store→load pairs, P→L and R→C, cannot both be
//! reordered: either the reclaimer's check C sees the pin (and gives the id back), or the
//! thread's load L sees `NONE` (and takes the lock, which the reclaimer holds, so it sees
//! the final state). A thread that loaded `c` is therefore always seen pinned, and an id
//! is freed only when its thread cannot be using it. The release store U makes the
//! holder's writes under the id (its [`PerCid`](super::PerCid) slots) visible to a reclaimer that sees
//! the pin cleared. The light barrier is a compiler fence where membarrier is registered,
//! and a `SeqCst` fence where it is not; loom builds use `SeqCst` fences on both sides,
//! and `loom-tests/tests/cid.rs` checks the protocol in every interleaving.
//!
//! The fast path tells the barrier mode apart without reading it: the thread-local cache
//! keys a record by its space's address, with the low bit set where membarrier is not
//! registered, so there the cache misses and the out-of-line path uses the fence (the mode
//! is decided once, when the first space is built, and never changes).
//!
//! Between R and C, `cid` reads `NONE` even for a thread that is pinned on `c` and will
//! get it back, so a nested `enter()` (N) does not read `cid`: it returns `own`. Only the
//! thread's own slow path gives `cid` a new id, and it writes `own` with it; the scan only
//! revokes `cid` and then gives the same id back or frees it. So `cid` is always `NONE`
//! or `own`: the `c` a first-level `enter()` used is `own`, and `own` does not change
//! while the thread is pinned. N adds nothing to the fast path.
//!
//! Every other change of ownership (first acquire, moving down, thread exit, orphan
//! release, transient ids during thread teardown) happens under the space's lock.
//!
//! ## Moving down
//!
//! Compaction moves a thread whose id is not below `held` at its next `enter()`. The
//! fast path does not read `held`: whoever makes it shrink (a thread's exit or orphan
//! release, a scan that frees ids, a transient id's release; all under the lock, in
//! `publish`) sets the `MOVE` bit (the top bit, which no id reaches) in the `cid` of every
//! record whose id is now not below it. Growth needs no mark, and neither does moving
//! down (it frees one id and takes one). So at any time an unmarked `cid` is below `held`
//! (`acquire` keeps an id only if it is below the count, and a new id is the lowest free
//! one, below the new count), and the fast path's test `c < MOVE` sends `NONE` and
//! marked ids alike to the slow path, where `acquire`, under the lock, strips the mark
//! and keeps the id if it is below the count by then, else frees it and takes the lowest
//! free one. Marking costs O(threads) under the lock, only when `held` shrinks, which is
//! rare (the same events already take the lock and touch the compaction work).
//!
//! The mark keeps the protocol's argument:
//!
//! - It is a third value of `cid`: `cid` is always `NONE`, `own` or `own | MOVE`, so a
//!   nested `enter()` still returns `own`, and the mark never changes which id a thread
//!   owns. Setting it frees nothing: the id stays owned in the bitmap until its thread's
//!   `acquire` (under the lock) or the scan's revoke protocol frees it, as before.
//! - A thread that already loaded its unmarked `c` (or holds a guard on it) when the mark
//!   lands keeps using `c`, which is still its own; its next first-level `enter()` sees
//!   the mark and moves under the lock, where no scan is halfway through a revoke. Only
//!   that first-level `enter()` frees the old id, and no guard of the thread holds it
//!   then (the record was unpinned), so no thread loses an id it is pinned on.
//! - A marked value is never used without the lock, so it needs no Dekker ordering: the
//!   fast path's load L matters only when it returns an unmarked id, and then the barrier
//!   argument above is unchanged.
//! - The scan revokes a marked `cid` like any other (R: `NONE`), frees the id without the
//!   mark, or gives back the value it read, mark included (C). All of R, the barrier, C
//!   and the marking run under one hold of the lock, and every other writer of `cid`
//!   takes that lock, so a thread that saw `NONE` sees the final value in `acquire`.
//!
//! # The orphan protocol
//!
//! A thread's records are owned by a thread-local registry whose destructor is nicework's
//! thread-exit hook. Std runs thread-local destructors in the reverse order of their
//! registration (at each local's first use), so a guard stored in a local first used
//! before the thread's first `enter()` is dropped after the hook ran. The hook therefore does not release a record
//! that is still pinned:
//!
//! ```text
//!  exit hook (registry destructor)            guard drop (any time, also later)
//!  ───────────────────────────────            ─────────────────────────────────
//!  for each record:                           d := pin - PIN_ONE
//!    if !pinned: release id, free record      pin := d                  (release)
//!    else: pin := pin | ORPHANED              if d's low half == ORPHANED:  (cold, last)
//!          move record to ORPHANS               take record out of ORPHANS
//!                                               release id (under the lock), free record
//! ```
//!
//! `pin` is written only by its thread, so the orphan bit costs the guard drop one
//! compare, and `enter()` nothing. `ORPHANS` is a thread-local without a destructor, so it
//! can be used for the whole teardown: a nested `enter()` made after the hook ran (the
//! registry is gone) finds the orphaned record there and, the record being pinned, takes
//! the nested path and returns `own`. An orphan's `pin` is never unpinned (its low half
//! keeps `ORPHANED`), so the scan never revokes its id; the
//! thread's id is released by the last guard's drop, still before `join()` returns. An
//! `enter()` for a space without an orphaned record takes a transient id for that guard
//! alone. A guard that is leaked (`mem::forget`) keeps its id, and after the thread exits
//! its record, forever.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Weak};

use super::barrier;
use super::space::{SpaceInner, SpaceState};
use crate::sync::{AtomicUsize, Ordering, lock, thread_local};

/// `ThreadRec::cid` when the thread owns no id.
pub(crate) const NO_ID: usize = usize::MAX;

/// Set in `ThreadRec::cid`, over the owned id, by whoever makes the space's `held` count
/// shrink below that id (under the space lock, `SpaceInner::publish`): the thread must
/// move to the lowest free id at its next `enter()`. `enter()`'s fast path uses `cid` only
/// when it is below `MOVE`, so `NO_ID` and marked ids both take the locked slow path,
/// which strips the mark. Ids never reach it (each one is a bit of a bitmap in memory).
pub(crate) const MOVE: usize = 1 << (usize::BITS - 1);

// `ThreadRec::pin`, one word that only its thread writes, with plain stores (a load, then a
// store): the low half is the guard nesting depth (in `PIN_ONE`s) and the `ORPHANED` flag,
// the high half counts the thread's first-level `enter()`s (wrapping), so the scan can tell
// whether the thread entered since it last looked without writing the word.

/// Set in `ThreadRec::pin` by the thread's exit hook when guards still pin the record (they
/// live in thread-locals destroyed after the hook). The depth bits stay the nesting depth,
/// so the record stays pinned for the scan, and the drop of the last guard, which leaves
/// exactly `ORPHANED` in the low half, releases the id and frees the record.
pub(crate) const ORPHANED: usize = 1;

/// One guard in `ThreadRec::pin`'s depth bits.
pub(crate) const PIN_ONE: usize = 2;

/// `ThreadRec::pin`'s low half: `ORPHANED` and the depth. Nesting that would carry out of
/// it panics (`enter_nested`), as `Rc` aborts on a count overflow.
pub(crate) const PINS: usize = (1 << (usize::BITS / 2)) - 1;

/// One first-level `enter()` in `ThreadRec::pin`'s high half.
pub(crate) const ENTERED_ONE: usize = PINS + 1;

/// Whether a `pin` value pins the record: a live guard, or an orphan (whose last guard's
/// drop frees the record, so it never reads unpinned to the scan).
#[inline]
pub(crate) fn pinned(pin: usize) -> bool {
    pin & PINS != 0
}

/// One thread's membership of one space. Written by its thread (`pin`, `own`, and `cid` only
/// under the space lock) and by the space's reclaimer (`cid` and `seen`, under the lock).
#[derive(Debug)]
pub(crate) struct ThreadRec {
    /// A: the id this thread owns, or `NO_ID`; with `MOVE` set while the id is not below
    /// the space's `held` count. Written by its thread under the space lock (`acquire`),
    /// by the scan under the lock (revoke, give back) and by whoever shrinks `held` under
    /// the lock (`publish` sets `MOVE`); read lock-free by the thread's `enter()`.
    pub(crate) cid: AtomicUsize,
    /// X (only its thread): the id the thread last took, set with `cid` by its `acquire`.
    /// Only the thread reads or writes it. `cid` is always `NO_ID`, `own` or
    /// `own | MOVE`: only `acquire` gives `cid` a new id; the scan revokes it (`NO_ID`)
    /// and gives the same value back or frees the id; `publish` only sets `MOVE`. So
    /// while the thread is pinned, `own` is its outermost guard's id, and a nested
    /// `enter()` returns it: `cid` may read `NO_ID` then, between a scan's revoke and its
    /// give-back, or carry `MOVE`.
    pub(crate) own: AtomicUsize,
    /// A: live guards on this thread (nesting depth, in `PIN_ONE`s), plus `ORPHANED` once
    /// the thread's exit hook ran, in the low half (`PINS`); the number of first-level
    /// `enter()`s in the high half (`ENTERED_ONE`s, wrapping). Only the thread writes it,
    /// with plain stores (a load, then a store); the scan reads it.
    pub(crate) pin: AtomicUsize,
    /// S (only the scan, under the lock): `pin`'s high half when the scan last looked; the
    /// thread entered since then if it moved (a heuristic for the reclaimer only).
    pub(crate) seen: AtomicUsize,
    /// I: the space this record belongs to.
    pub(crate) space: Weak<SpaceInner>,
}

impl ThreadRec {
    pub(crate) fn new(space: Weak<SpaceInner>) -> Self {
        ThreadRec {
            cid: AtomicUsize::new(NO_ID),
            own: AtomicUsize::new(NO_ID),
            pin: AtomicUsize::new(0),
            seen: AtomicUsize::new(0),
            space,
        }
    }
}

/// Records by space serial number.
type Records = Vec<(u64, Arc<ThreadRec>)>;

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
        .partition(|(_, record)| pinned(record.pin.load(Ordering::Relaxed)));
    for (_, record) in &orphans {
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
    for (_, record) in unpinned {
        if let Some(space) = record.space.upgrade() {
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
/// can have while the record lives (the record's `Weak` keeps the allocation), and `LAST`'s
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
        .find(|(other, _)| *other == serial)
        .map(|(_, record)| NonNull::from(&**record))
}

fn lookup_or_register(registry: &Registry, space: &Arc<SpaceInner>) -> NonNull<ThreadRec> {
    let mut records = registry.records.borrow_mut();
    let record = match find(&records, space.serial) {
        Some(record) => record,
        None => {
            // Forget records of spaces that are gone, so long-lived threads do not collect
            // them. (None is pinned: a guard borrows its space.)
            records.retain(|(_, record)| record.space.strong_count() > 0);
            let record = Arc::new(ThreadRec::new(Arc::downgrade(space)));
            space.add_thread(record.clone());
            let pointer = NonNull::from(&*record);
            records.push((space.serial, record));
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
    let record = Arc::new(ThreadRec::new(Arc::downgrade(space)));
    record.pin.store(ORPHANED | PIN_ONE, Ordering::Relaxed);
    let pointer = NonNull::from(&*record);
    let kept = record.clone();
    with_orphans(move |orphans| orphans.push((space.serial, kept)))?;
    space.add_thread(record);
    Some(pointer)
}

/// Takes the orphaned `record` out of the thread's orphan list; called by the drop of its
/// last guard.
pub(crate) fn take_orphan(record: NonNull<ThreadRec>) -> Option<Arc<ThreadRec>> {
    with_orphans(|orphans| {
        let index = orphans
            .iter()
            .position(|(_, other)| ptr::eq(Arc::as_ptr(other), record.as_ptr()))?;
        Some(orphans.swap_remove(index).1)
    })
    .flatten()
}

/// The scan's look at `record`: whether it is idle, neither entered since the scan's
/// previous look nor pinned. Reads `pin` only: the thread stays its only writer. (A "used"
/// bit in `pin` that the enter sets and the scan clears with a compare-exchange would make
/// the scan a second writer; the loom models then find the scan's check C reading the
/// cleared value past the thread's newer pin, which loom's partial modification order
/// allows. The count keeps the protocol's one-writer argument as it was.)
pub(crate) fn take_idle(record: &ThreadRec) -> bool {
    let pin = record.pin.load(Ordering::Relaxed);
    let entered = pin & !PINS;
    let seen = record.seen.load(Ordering::Relaxed);
    record.seen.store(entered, Ordering::Relaxed);
    entered == seen && !pinned(pin)
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
    (record.pin.load(Ordering::Relaxed) & PINS & !ORPHANED != 0)
        .then(|| record.own.load(Ordering::Relaxed))
}

// === the Cid guard ===

/// A pinned concurrency id. `!Send`: it belongs to the thread that entered.
///
/// While it lives, no other thread's guard has the same id, and its thread keeps the id:
/// also when the guard lives in a thread-local destroyed after nicework's own thread-exit
/// hook (a `Cid<'static>` of a leaked or static [`IdSpace`](super::IdSpace) can). A guard that is leaked
/// (`mem::forget`) keeps its id forever.
pub struct Cid<'a> {
    space: &'a SpaceInner,
    /// The thread's record (`None`: a transient id). A pointer, not a `&'a`: the record is
    /// the thread's, not the space's, and lives until this guard's drop (see `enter`), not
    /// for `'a`.
    record: Option<NonNull<ThreadRec>>,
    id: usize,
    _not_send: PhantomData<*const ()>,
}

impl<'a> Cid<'a> {
    #[inline]
    pub(super) fn new(
        space: &'a SpaceInner,
        record: Option<NonNull<ThreadRec>>,
        id: usize,
    ) -> Self {
        Cid {
            space,
            record,
            id,
            _not_send: PhantomData,
        }
    }

    /// The id: `0 <= id < high_water()` of its space.
    #[inline]
    pub fn get(&self) -> usize {
        self.id
    }
}

impl Drop for Cid<'_> {
    #[inline]
    fn drop(&mut self) {
        match self.record {
            Some(record) => {
                // SAFETY: a pinned record is not freed: the thread's exit hook orphans it
                // instead, and an orphan is freed by the drop of its last guard, in
                // `SpaceInner::release_orphan`, after the last use of this reference. The guard
                // is `!Send`, so this runs on the record's thread, the only one that
                // writes `pin`.
                let pin = unsafe { &record.as_ref().pin };
                let left = pin.load(Ordering::Relaxed) - PIN_ONE;
                // (U), release: what the holder wrote under this id happens-before a
                // reclaimer that sees the pin cleared (the pin protocol in `cid/mod.rs`).
                pin.store(left, Ordering::Release);
                if left & PINS == ORPHANED {
                    self.space.release_orphan(record);
                }
            }
            None => self.space.release_transient(self.id),
        }
    }
}

impl std::fmt::Debug for Cid<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Cid").field(&self.id).finish()
    }
}

// === the owner's half: enter() ===

impl SpaceInner {
    /// Pins the calling thread's id. The fast path: the thread's cached record, where the
    /// light barrier is a compiler fence (see `cached_fast`).
    #[inline]
    pub(crate) fn enter(self: &Arc<Self>) -> Cid<'_> {
        // The parts, not a `Cid`, come back from the cold path: two words return in
        // registers, so the fast path builds the guard in registers too.
        let (record, id) = match cached_fast(self) {
            Some(pointer) => self.enter_on(pointer, barrier::light_asymmetric),
            None => self.enter_looked_up(),
        };
        Cid::new(self, record, id)
    }

    /// `enter()` off the fast path: the record is not the cached one, or the light
    /// barrier must read the barrier mode (a fence where membarrier is not registered).
    #[cold]
    #[inline(never)]
    fn enter_looked_up(self: &Arc<Self>) -> (Option<NonNull<ThreadRec>>, usize) {
        match record(self) {
            Some(pointer) => self.enter_on(pointer, barrier::light),
            None => self.enter_transient(),
        }
    }

    /// Pins the id of `pointer`, the calling thread's record; `light` is the light barrier.
    /// Returns the guard's record and id.
    #[inline(always)]
    fn enter_on(
        &self,
        pointer: NonNull<ThreadRec>,
        light: fn(),
    ) -> (Option<NonNull<ThreadRec>>, usize) {
        // SAFETY: `pointer` is the calling thread's own record for this space
        // (`cached_fast` and `record` return no other: see `key`), and only this
        // thread frees it: its exit hook if no guard pins it (then neither finds it: the
        // registry is gone and the cache cleared), else the drop of its last guard (which
        // takes it out of the orphan list `record` searches), or the registry's pruning
        // once this space is gone (it is alive here). None of these runs during this call,
        // which calls no user code.
        let record = unsafe { pointer.as_ref() };
        let pin = record.pin.load(Ordering::Relaxed);
        if pinned(pin) {
            // (N): nested.
            return (Some(pointer), enter_nested(record, pin));
        }
        // (P): one plain store pins the record and counts the enter for the scan.
        record
            .pin
            .store(pin.wrapping_add(ENTERED_ONE + PIN_ONE), Ordering::Relaxed);
        // Orders the pin before reading the id; the reclaimer's heavy barrier pays for
        // the store→load order (see the module docs).
        light();
        // (L)
        let id = record.cid.load(Ordering::Relaxed);
        // `NO_ID` and ids marked to move both take the slow path: one compare with a
        // constant, and no load of `held` (see `publish`).
        let id = if id < MOVE {
            debug_assert_eq!(id, record.own.load(Ordering::Relaxed));
            id
        } else {
            self.acquire(record)
        };
        (Some(pointer), id)
    }

    /// The drop of an orphaned record's last guard (see `Registry::drop`): the id is free
    /// and the record is freed.
    #[cold]
    #[inline(never)]
    pub(super) fn release_orphan(&self, record: NonNull<ThreadRec>) {
        if let Some(record) = take_orphan(record) {
            self.release_thread(&record);
        }
    }

    /// The drop of a guard with an id just for itself (see `enter_transient`).
    #[cold]
    #[inline(never)]
    pub(super) fn release_transient(&self, id: usize) {
        if self.in_forked_child() {
            // Ids are not reused in a forked child (see `in_forked_child`).
            return;
        }
        let mut state = lock(&self.state);
        state.ids.release(id);
        self.publish(&state);
    }

    /// A guard for a thread whose locals are being torn down and that holds no record for
    /// this space: a late orphan record (see `late_orphan`), so that nested
    /// `enter()`s return the same id; failing that, an id just for this guard.
    #[cold]
    #[inline(never)]
    fn enter_transient(self: &Arc<Self>) -> (Option<NonNull<ThreadRec>>, usize) {
        if self.in_forked_child() {
            return (None, self.child_id());
        }
        if let Some(pointer) = late_orphan(self) {
            // SAFETY: the record was just made and is owned by this thread's orphan list,
            // which only the drop of its last guard (the one returned here) empties.
            let record = unsafe { pointer.as_ref() };
            let id = self.acquire(record);
            return (Some(pointer), id);
        }
        let mut state = lock(&self.state);
        let id = state.ids.take_lowest();
        self.publish(&state);
        (None, id)
    }
}

/// A nested `enter()` on `record`, whose `pin` reads `pin` (pinned): one more guard, and
/// the outer guard's id. Out of line (and cold only to keep it out of the way): the
/// first-level enter, the one that must be fast, then falls through without a taken branch.
#[cold]
#[inline(never)]
fn enter_nested(record: &ThreadRec, pin: usize) -> usize {
    assert!(pin & PINS <= PINS - PIN_ONE, "too many nested Cid guards");
    // (N): one more guard.
    record.pin.store(pin + PIN_ONE, Ordering::Relaxed);
    // Not `cid`: a scan may have revoked it for the moment (see `ThreadRec::own`).
    record.own.load(Ordering::Relaxed)
}

// === the reclaimer's half: the scan's revoke step ===

impl SpaceInner {
    /// The reclaimer's half of the pin protocol, in the scan, under the space's lock:
    /// revokes the ids of threads that did not enter since the previous scan (R), makes
    /// both sides' stores visible (the heavy barrier), and gives back each id whose
    /// thread turned out pinned, or frees it (C).
    pub(super) fn revoke_idle(&self, state: &mut SpaceState) {
        let mut revoked: Vec<(&ThreadRec, usize)> = Vec::new();
        let threads = std::mem::take(&mut state.threads);
        for record in &threads {
            let id = record.cid.load(Ordering::Relaxed);
            if take_idle(record) && id != NO_ID {
                // (R) of the pin protocol (see the module docs): revoke, then make both
                // sides' stores visible.
                record.cid.store(NO_ID, Ordering::Relaxed);
                revoked.push((record, id));
            }
        }
        if !revoked.is_empty() {
            // The heavy barrier: with it, P→L and R→C cannot both be reordered.
            barrier::heavy();
            for (record, id) in revoked {
                // (C): pinned across the barrier, or not.
                if !pinned(record.pin.load(Ordering::Acquire)) {
                    // Not pinned after the barrier: its next enter() sees NO_ID.
                    state.ids.release(id & !MOVE);
                } else {
                    // Pinned across the barrier: it may be using `id`; give it back
                    // (with its `MOVE` mark, if it had one).
                    record.cid.store(id, Ordering::Relaxed);
                }
            }
        }
        state.threads = threads;
    }
}

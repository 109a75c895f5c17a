//! The pin protocol and the orphan protocol: `enter()`'s paths (the owner's half), the
//! [`Cid`] guard, and the compaction scan's revoke step (the reclaimer's half), over a
//! thread's per-space records (`record.rs`). The thread-local registry that finds a
//! thread's records and orphans or releases them when the thread exits is
//! `registry.rs`. The letters in the diagrams stand in comments at the lines that
//! perform each step.
//!
//! # The pin protocol
//!
//! Each (thread, space) pair has a record: `cid` (the owned id or none, possibly marked
//! `MOVE`: see "Moving down"), `own` (the id the
//! thread last took; only the thread touches it), `pin`, `seen` (the scan's), and
//! `slots` (the thread's cached `PerCid` slot for `own`, which `acquire` empties: see
//! `slots.rs`; the scan never reads it). `pin` is
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

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use super::barrier;
use super::record::{
    CPU_MODE, ENTERED_ONE, MOVE, NO_ID, PIN_ONE, PINS, ThreadRec, last_guard_has_flags, pinned,
};
use super::registry::{cached_fast, late_orphan, record, take_orphan};
use super::slots::SlotCache;
use super::space::{SpaceInner, SpaceState};
use crate::sync::{Ordering, lock};

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
    ///
    /// While the space is in per-thread mode (threads are few), a thread keeps its id from
    /// one guard to the next. Once threads outnumber the CPUs (per-CPU mode, as the
    /// kernel's `mm_cid` switches to), each outermost guard borrows an id for its own
    /// length, starting from the id of the CPU the thread runs on, so two guards of one
    /// thread made one after the other may get different ids. Nested guards always get
    /// their outermost guard's id, and no two live guards of different threads share one,
    /// in either mode.
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{IdSpace, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let outer = ids.enter();
    /// assert_eq!(ids.enter().get(), outer.get());
    /// assert!(outer.get() < ids.high_water());
    /// ```
    #[inline]
    pub fn get(&self) -> usize {
        self.id
    }

    /// The thread's cache of its slot for this guard's id (see `SlotCache`); `None` for a
    /// transient id, which has no record.
    #[inline(always)]
    pub(super) fn slot_cache(&self) -> Option<&SlotCache> {
        // SAFETY: the record outlives the guard (see `Drop`), which `&self` borrows.
        self.record.map(|record| unsafe { &record.as_ref().slots })
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
                if last_guard_has_flags(left) {
                    self.space.drop_last_flagged(record, left, self.id);
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
        self.enter_by_lookup()
    }

    /// `enter()` without the fast path's test: for a caller that is off it already (a
    /// nested call, or a first-level one where the fast path missed), such as
    /// `PerCid::with`'s cold path, which saves a call this way.
    #[inline(always)]
    pub(crate) fn enter_uncached(self: &Arc<Self>) -> Cid<'_> {
        let (record, id) = self.enter_by_lookup();
        Cid::new(self, record, id)
    }

    /// The body of `enter_looked_up`.
    #[inline(always)]
    fn enter_by_lookup(self: &Arc<Self>) -> (Option<NonNull<ThreadRec>>, usize) {
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
        (Some(pointer), self.enter_first_level_on(record, pin, light))
    }

    /// `enter()`'s fast path for a first-level guard only: `None`, having done nothing, if
    /// the cached record is not this space's (see `cached_fast`) or the thread is pinned
    /// already (a nested `enter()`). `PerCid::with` starts here: a guard it gets from here
    /// is the thread's outermost one in this space, so no `with` of this thread on any
    /// `PerCid` of the space is in progress, and the light barrier is a compiler fence.
    #[inline(always)]
    pub(crate) fn enter_first_level(self: &Arc<Self>) -> Option<Cid<'_>> {
        let pointer = cached_fast(self)?;
        // SAFETY: as in `enter_on`: the calling thread's own record, not freed during this
        // call.
        let record = unsafe { pointer.as_ref() };
        let pin = record.pin.load(Ordering::Relaxed);
        if pinned(pin) {
            return None;
        }
        let id = self.enter_first_level_on(record, pin, barrier::light_asymmetric);
        Some(Cid::new(self, Some(pointer), id))
    }

    /// The first-level part of `enter_on`: `record`'s `pin` reads `pin`, not pinned.
    /// Pins it and returns the id.
    #[inline(always)]
    fn enter_first_level_on(&self, record: &ThreadRec, pin: usize, light: fn()) -> usize {
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
        if id < MOVE {
            debug_assert_eq!(id, record.own.load(Ordering::Relaxed));
            id
        } else if id == CPU_MODE {
            self.lend_id(record)
        } else {
            self.acquire(record)
        }
    }

    /// The drop of an orphaned record's last guard (see `Registry::drop`): the id is free
    /// and the record is freed.
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
        self.publish(&mut state);
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
        self.publish(&mut state);
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

impl SpaceInner {
    /// The reclaimer's half of the pin protocol, in the scan, under the space's lock:
    /// revokes the ids of threads that did not enter since the previous scan (R), makes
    /// both sides' stores visible (the heavy barrier), and gives back each id whose
    /// thread turned out pinned, or frees it (C). Threads in per-CPU mode own no id.
    /// Returns the threads active since the previous scan: those that entered, or are
    /// pinned.
    pub(super) fn revoke_idle(&self, state: &mut SpaceState) -> usize {
        let mut revoked: Vec<(&ThreadRec, usize)> = Vec::new();
        let mut active = 0;
        let threads = std::mem::take(&mut state.threads);
        for record in &threads {
            let id = record.cid.load(Ordering::Relaxed);
            let idle = take_idle(record);
            active += usize::from(!idle);
            if idle && id != NO_ID && id != CPU_MODE {
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
        active
    }
}

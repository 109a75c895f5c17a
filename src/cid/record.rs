//! A thread's record of one space ([`ThreadRec`]) and the values of its words: the owned
//! id (`NO_ID`, `MOVE`, `CPU_MODE`) and the pin word (`ORPHANED`, `LENT`, `PIN_ONE`,
//! `PINS`, `ENTERED_ONE`).
//!
//! The protocols that read and write them are in `pin.rs` (the pin and orphan protocols)
//! and `registry.rs` (the thread-local half); the space's scan reads them in `space.rs`.
//! This file imports nothing else of `cid` but the slot cache and the per-CPU table's
//! type, so each of those files may name a record without importing one another.

use super::cpu_ids::CpuIds;
use super::slots::SlotCache;
use crate::sync::AtomicUsize;

/// `ThreadRec::cid` when the thread owns no id.
pub(crate) const NO_ID: usize = usize::MAX;

/// `ThreadRec::cid` while the space is in per-CPU mode (`mode.rs`): the thread owns no id,
/// and each first-level `enter()` borrows one from the space's table of per-CPU ids. Above
/// `MOVE`, so the fast path's one compare sends it off the straight line too.
pub(crate) const CPU_MODE: usize = usize::MAX - 1;

/// Set in `ThreadRec::cid`, over the owned id, by whoever makes the space's `held` count
/// shrink below that id (under the space lock, `SpaceInner::publish`): the thread must
/// move to the lowest free id at its next `enter()`. `enter()`'s fast path uses `cid` only
/// when it is below `MOVE`, so `NO_ID` and marked ids both take the locked slow path,
/// which strips the mark. Ids never reach it (each one is a bit of a bitmap in memory).
pub(crate) const MOVE: usize = 1 << (usize::BITS - 1);

// `ThreadRec::pin`, one word that only its thread writes, with plain stores (a load, then a
// store): the low half is the guard nesting depth (in `PIN_ONE`s) and the `ORPHANED` and
// `LENT` flags,
// the high half counts the thread's first-level `enter()`s (wrapping), so the scan can tell
// whether the thread entered since it last looked without writing the word.

/// Set in `ThreadRec::pin` by the thread's exit hook when guards still pin the record (they
/// live in thread-locals destroyed after the hook). The depth bits stay the nesting depth,
/// so the record stays pinned for the scan, and the drop of the last guard, which leaves
/// exactly `ORPHANED` in the low half, releases the id and frees the record.
pub(crate) const ORPHANED: usize = 1;

/// Set in `ThreadRec::pin` while the outermost guard holds an id lent for its length alone
/// (per-CPU mode: `mode.rs`), which its drop gives back. With `ORPHANED`, the flags the drop
/// of a last guard looks at (`last_guard_has_flags`).
pub(crate) const LENT: usize = 2;

/// One guard in `ThreadRec::pin`'s depth bits.
pub(crate) const PIN_ONE: usize = 4;

/// `ThreadRec::pin`'s low half: `ORPHANED` and the depth. Nesting that would carry out of
/// it panics (`enter_nested`), as `Rc` aborts on a count overflow.
pub(crate) const PINS: usize = (1 << (usize::BITS / 2)) - 1;

/// One first-level `enter()` in `ThreadRec::pin`'s high half.
pub(crate) const ENTERED_ONE: usize = PINS + 1;

/// Whether `left`, the `pin` a guard's drop leaves, has no guard left but `ORPHANED` or
/// `LENT` set: the drop has more to do (one compare: the low half is 1, 2 or 3).
#[inline(always)]
pub(crate) fn last_guard_has_flags(left: usize) -> bool {
    (left & PINS).wrapping_sub(1) < (ORPHANED | LENT)
}

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
    /// A: the id this thread owns, or `NO_ID`, or `CPU_MODE` (it borrows one per outermost
    /// guard: `mode.rs`); with `MOVE` set while the id is not below
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
    /// X (only its thread): the thread's slot of one `PerCid` of this space, for `own`
    /// (see `SlotCache`); `acquire` empties it, and so does a borrow of another id or in
    /// another epoch of the per-CPU table (`cpu_ids.rs`).
    pub(crate) slots: SlotCache,
    /// X (only its thread): the per-CPU table's epoch when `own` was last borrowed from
    /// it; `usize::MAX` once `own` is an id the thread owns (per-thread mode, a forked
    /// child), so that a later borrow of the same number never keeps a slot cache filled
    /// for an id that may have been freed since (`mode.rs`, `lent`).
    pub(crate) lent_epoch: AtomicUsize,
    /// X (only its thread): the space's per-CPU table once the thread saw it (null
    /// before), so that a borrow and its give-back read the thread's own line. A std
    /// atomic: only its thread touches it.
    pub(crate) table: std::sync::atomic::AtomicPtr<CpuIds>,
}

impl ThreadRec {
    /// `cid`, read by a caller that holds the space lock. Every store to `cid` is made
    /// under that lock (a forked child, which never takes it, has no other thread that
    /// reads this), so the read needs no ordering, and adds no step to a loom model.
    #[inline]
    pub(crate) fn cid_locked(&self) -> usize {
        // SAFETY (loom's `unsync_load`): no store to `cid` is concurrent with a holder of
        // the space lock.
        #[cfg(all(loom, feature = "loom"))]
        let cid = unsafe { self.cid.unsync_load() };
        #[cfg(not(all(loom, feature = "loom")))]
        let cid = self.cid.load(crate::sync::Ordering::Relaxed);
        cid
    }

    pub(crate) fn new() -> Self {
        ThreadRec {
            cid: AtomicUsize::new(NO_ID),
            own: AtomicUsize::new(NO_ID),
            pin: AtomicUsize::new(0),
            seen: AtomicUsize::new(0),
            slots: SlotCache::new(),
            lent_epoch: AtomicUsize::new(usize::MAX),
            table: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

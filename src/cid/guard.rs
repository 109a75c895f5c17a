//! [`Cid`]: the guard of a pinned concurrency id, and the second half of the pin protocol.
//!
//! `IdSpace::enter` (`space.rs`) pins the thread's record and builds the guard; the guard's
//! drop unpins it with a relaxed load and a release store of the record's `pin` word (only
//! the record's own thread writes it, and guards are `!Send`). The drop of a guard that
//! outlived its thread's exit hook (its record is `ORPHANED`) releases the id and frees the
//! record once the last such guard goes; a guard without a record (a transient id, taken
//! when the thread's records were unreachable) releases its id alone.

use std::marker::PhantomData;
use std::ptr::NonNull;

use super::space::SpaceInner;
use super::thread::{ThreadRec, ORPHANED, PINS, PIN_ONE};
use crate::sync::Ordering;

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

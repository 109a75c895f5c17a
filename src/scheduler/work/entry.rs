//! A timer entry: a counted reference to a work, tagged with the epoch it was linked in.
//!
//! Entries are removed from the timer structure lazily (see `state`), so one may outlive
//! the work's handle; it holds a counted reference so that the work's header stays
//! readable until the entry is dropped. The closure is not kept alive by it: a work's
//! closure is dropped explicitly when its life ends (see `inner`), so dropping the last
//! entry of a dead work, which happens under the core lock, runs no user code.
//!
//! The epoch lives in the pointer's low bits, which are always zero because a
//! work's allocation is 8-aligned, so an entry is two words, like the `Arc` it holds.

use std::sync::Arc;

use super::{Callback, WorkInner, WorkRef};

const TAG_MASK: usize = 0b111;

/// A counted, epoch-tagged reference to an armed work.
pub(crate) struct Entry {
    tagged: *const WorkInner<dyn Callback>,
}

// SAFETY: it is an `Arc` of a `Send + Sync` work in disguise.
unsafe impl Send for Entry {}

impl Entry {
    pub(crate) fn new(work: &WorkRef, epoch: u8) -> Entry {
        let raw = Arc::into_raw(work.clone());
        debug_assert_eq!(raw.addr() & TAG_MASK, 0, "works are 8-aligned");
        Entry {
            tagged: raw.map_addr(|addr| addr | usize::from(epoch) & TAG_MASK),
        }
    }

    fn untagged(&self) -> *const WorkInner<dyn Callback> {
        self.tagged.map_addr(|addr| addr & !TAG_MASK)
    }

    /// The epoch the entry was linked in.
    pub(crate) fn epoch(&self) -> u8 {
        (self.tagged.addr() & TAG_MASK) as u8
    }

    pub(crate) fn work(&self) -> &WorkInner<dyn Callback> {
        // SAFETY: the untagged pointer came from `Arc::into_raw` and the entry still owns
        // that count, so the allocation is alive.
        unsafe { &*self.untagged() }
    }

    /// Another counted reference to the work.
    pub(crate) fn work_ref(&self) -> WorkRef {
        let raw = self.untagged();
        // SAFETY: the entry owns a count of this `Arc` (see `into_work`), so the
        // allocation is alive and adding a count is sound.
        unsafe {
            Arc::increment_strong_count(raw);
            Arc::from_raw(raw)
        }
    }

    /// The counted reference, for running the work.
    pub(crate) fn into_work(self) -> WorkRef {
        let raw = self.untagged();
        std::mem::forget(self);
        // SAFETY: `raw` came from `Arc::into_raw`, and forgetting `self` hands its count
        // over to the returned `Arc`.
        unsafe { Arc::from_raw(raw) }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: as in `into_work`; this gives the entry's count back.
        drop(unsafe { Arc::from_raw(self.untagged()) });
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("work", &self.untagged().addr())
            .field("epoch", &self.epoch())
            .finish()
    }
}

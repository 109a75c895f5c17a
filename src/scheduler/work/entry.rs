//! A timer entry: a counted reference to a work, tagged with the epoch it was linked in.
//!
//! Entries are removed from the timer structure lazily (see `state`), so one may outlive
//! the work's handle; it holds a counted reference so that the work's header stays
//! readable until the entry is dropped. The closure is not kept alive by it: a work's
//! closure is dropped explicitly when its life ends (see `inner`), so dropping the last
//! entry of a dead work, which happens under the core lock, runs no user code.
//!
//! The epoch lives in the pointer's low bits, which are always zero because a
//! work's allocation is 8-aligned, so an entry is one word, like the `WorkRef` it holds.

use std::ptr::NonNull;

use super::{Callback, Header, WorkInner, WorkRef};

const TAG_MASK: usize = 0b111;

/// A counted, epoch-tagged reference to an armed work.
pub(crate) struct Entry {
    tagged: NonNull<Header>,
}

// SAFETY: it is a `WorkRef` of a `Send + Sync` work in disguise.
unsafe impl Send for Entry {}

impl Entry {
    pub(crate) fn new(work: &WorkRef, epoch: u8) -> Entry {
        let raw = work.clone().into_raw();
        debug_assert_eq!(raw.addr().get() & TAG_MASK, 0, "works are 8-aligned");
        Entry {
            // SAFETY: or-ing bits into a non-null address leaves it non-null.
            tagged: raw.map_addr(|addr| unsafe {
                std::num::NonZero::new_unchecked(addr.get() | usize::from(epoch) & TAG_MASK)
            }),
        }
    }

    fn untagged(&self) -> NonNull<Header> {
        // SAFETY: the untagged address is the header's, which is not null.
        self.tagged
            .map_addr(|addr| unsafe { std::num::NonZero::new_unchecked(addr.get() & !TAG_MASK) })
    }

    /// The epoch the entry was linked in.
    pub(crate) fn epoch(&self) -> u8 {
        (self.tagged.addr().get() & TAG_MASK) as u8
    }

    /// The work's header, read in place.
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: the untagged pointer came from `WorkRef::into_raw` and the entry still
        // owns that count, so the allocation is alive.
        unsafe { self.untagged().as_ref() }
    }

    /// The address that identifies the work (as [`WorkRef::address`]).
    pub(crate) fn address(&self) -> usize {
        self.untagged().addr().get()
    }

    /// The whole work, closure included.
    pub(crate) fn work(&self) -> &WorkInner<dyn Callback> {
        // SAFETY: as in `header`; the borrow ends before the entry can go.
        unsafe { Header::work(self.untagged()) }
    }

    /// Another counted reference to the work.
    pub(crate) fn work_ref(&self) -> WorkRef {
        // SAFETY: the entry owns a count of this work (see `into_work`), so it is alive.
        unsafe { WorkRef::clone_from_raw(self.untagged()) }
    }

    /// The counted reference, for running the work.
    pub(crate) fn into_work(self) -> WorkRef {
        let raw = self.untagged();
        std::mem::forget(self);
        // SAFETY: `raw` came from `WorkRef::into_raw`, and forgetting `self` hands its
        // count over to the returned reference.
        unsafe { WorkRef::from_raw(raw) }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: as in `into_work`; this gives the entry's count back.
        drop(unsafe { WorkRef::from_raw(self.untagged()) });
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

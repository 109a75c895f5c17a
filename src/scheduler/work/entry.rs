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
//!
//! # Placement
//!
//! A lock-free arm may set any deadline at which the live entry will still look at the
//! work in time. The state word's deadline is one such bound, but each arm that moves
//! the deadline later raises it, and an arm that then wants a deadline between the
//! entry and the raised bound would have to take the lock and link a new entry: a
//! jittered keep-alive or a `deadline - now` re-arm would do so at every other call.
//! So the work also records where its live entry was placed, its [`Placement`], in 20
//! bits that share a word with the run maxima (see `stats`):
//!
//! - The time is kept in granules of 1.6 ms, rounded up, modulo 2^18 granules (7 minutes),
//!   and tagged with the epoch of the entry it describes. A deadline serves when its
//!   granule, rounded down, is not before the placement's: the deadline is then no
//!   earlier than the entry's tick.
//! - It is written under the core lock just before the CAS that makes an entry live (a
//!   link, in `Shared::commit`, or a move of an entry later, which claims a new epoch for
//!   the same entry in `classify`), and read by the lock-free arm after the state word
//!   whose epoch it must match. A placement written for an epoch that is not (yet) the
//!   word's fails the tag check; and an arm that read a word sees the placement written
//!   before that word's epoch was claimed, or a later one.
//! - The epoch has two bits, so a state word can leave and come back bit for bit across
//!   four links while an arm is between its reads and its CAS, with another entry live.
//!   An arm that lowered its deadline through the placement therefore reads it again
//!   after its CAS: if it moved, the arm checks its entry under the lock and links one
//!   (`Shared::recheck_lowered`). The second read is one load; the lock is taken only
//!   when the placement moved.
//! - An entry is only ever moved later by claiming a new epoch: moving it without one
//!   would let an arm that read the old placement lower the deadline below the new one
//!   with a CAS that still succeeds.
//! - The modulus is safe because the arm uses the placement only for a deadline less than
//!   [`Placement::REACH`] (3.5 minutes) below the state word's: the placement is never
//!   later than that (a field-derived placement is at or below the state word's deadline),
//!   so the wrapped distance cannot fake a deadline before the entry. A timeout work's
//!   entry may sit later, at its touch + idle; but that time only grows, so whatever
//!   deadline an arm sets, the work is due no earlier than the entry.

use std::ptr::NonNull;

use super::{Callback, Header, WorkInner, WorkRef};

const TAG_MASK: usize = 0b111;

/// A work's live entry's position, as the lock-free arm reads it (see "Placement" in
/// the module docs): 18 bits of granules and the entry's 2-bit epoch.
pub(crate) struct Placement;

impl Placement {
    /// Deadline units per granule, as a shift: 16 × 100 µs = 1.6 ms.
    const GRANULE_SHIFT: u32 = 4;
    const GRANULE_BITS: u32 = 18;
    const GRANULE_MASK: u64 = (1 << Self::GRANULE_BITS) - 1;
    const EPOCH_BITS: u32 = 2;
    /// How far below the state word's deadline (in units) an arm may use the placement:
    /// half the granules' modulus, less a margin for the two roundings.
    pub(crate) const REACH: u64 = ((1 << (Self::GRANULE_BITS - 1)) - 4) << Self::GRANULE_SHIFT;

    /// The placement of an entry of `epoch` placed for `deadline` (units).
    pub(crate) fn encode(deadline: u64, epoch: u8) -> u32 {
        let granule = deadline.div_ceil(1 << Self::GRANULE_SHIFT) & Self::GRANULE_MASK;
        ((granule as u32) << Self::EPOCH_BITS) | u32::from(epoch)
    }

    /// Whether the entry of `epoch` that `placement` describes looks at the work no later
    /// than `deadline` (units), for a deadline less than [`REACH`](Self::REACH) below
    /// the state word's.
    #[inline]
    pub(crate) fn serves(placement: u32, epoch: u8, deadline: u64) -> bool {
        if placement & ((1 << Self::EPOCH_BITS) - 1) != u32::from(epoch) {
            return false;
        }
        let placed = u64::from(placement >> Self::EPOCH_BITS);
        let at = deadline >> Self::GRANULE_SHIFT;
        at.wrapping_sub(placed) & Self::GRANULE_MASK < 1 << (Self::GRANULE_BITS - 1)
    }
}

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

    /// The same reference, tagged with `epoch`: an entry moved later claims a new one
    /// (see "Placement").
    pub(crate) fn retagged(self, epoch: u8) -> Entry {
        let tagged = self.tagged.map_addr(|addr| {
            // SAFETY: the untagged address is not null, and or-ing bits keeps it so.
            unsafe {
                std::num::NonZero::new_unchecked(
                    (addr.get() & !TAG_MASK) | (usize::from(epoch) & TAG_MASK),
                )
            }
        });
        std::mem::forget(self);
        Entry { tagged }
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

//! The slot arrays behind [`PerCid`](crate::PerCid): one slot per id, in buckets of
//! doubling size, allocated on first use and freed by a trim once every id they cover is
//! at or above the high water.
//!
//! Bucket `b` covers ids `2^b - 1 .. 2^(b+1) - 1`, so ids `0..n` need `log2(n + 1)`
//! buckets and never more than `2n + 1` slots. A bucket array is never moved: it is
//! linked (compare-exchange, by an owner of an id it covers) and unlinked (by a trim)
//! whole, so a slot's address is stable while its bucket is linked.
//!
//! # Who may reach a bucket
//!
//! - **An owner** reaches bucket `b` only through a pinned id it covers. A pinned id is
//!   owned, so the high water (highest owned id + 1) is above it, and a trim unlinks `b`
//!   only when the high water is at or below `b`'s first id, under the space lock that
//!   taking an id requires. So a bucket is never unlinked while an owner is inside it. An
//!   owner that takes an id in an unlinked range later finds the bucket null and links a
//!   fresh one.
//! - **A reader** (`for_each`) holds the storage's gate (`reader.rs`) for its whole pass,
//!   and a trim takes the gate before it unlinks anything, so the arrays a reader
//!   snapshotted stay linked until it is done.
//! - **A trim** unlinks under the space lock and frees the arrays after releasing it:
//!   once unlinked, nobody can reach them.
//!
//! # The owner's slot cache
//!
//! `with` finds its slot without the bucket arithmetic through a two-entry cache in the
//! thread's record of the space ([`SlotCache`]): per entry, a storage's serial number and
//! the address of that storage's slot of the record's `own` id (two entries, so that a
//! thread using two `PerCid`s of the space in turn finds both). An entry is filled only
//! under a guard of the record (so `own` is the thread's pinned id), and `acquire`, the
//! only code that gives `own` a new id or takes back one the thread had lost, empties
//! both. An entry is used only under a guard of the record too, and then it is valid:
//!
//! - **The id is the same.** `own` changes only in `acquire`, which emptied the cache.
//! - **The bucket is the same.** A trim unlinks the bucket of `own` only while `own` is
//!   owned by nobody. The thread has owned `own` without a break since the fill: the pin
//!   protocol frees a thread's id only when the thread is not pinned, and leaves its `cid`
//!   `NONE` until the thread's next first-level `enter()` takes the slow path to
//!   `acquire` (`pin.rs`); moving down and thread exit also go through `acquire` or end
//!   the record. So every id freed after the fill is followed by an `acquire` before the
//!   guard that uses the entry was made.
//! - **In a forked child** no trim runs (the space's scheduler is inert there), so no
//!   bucket is freed under a child thread's cached slot; a child's fresh ids above the
//!   high water are never in the bitmap a trim would judge by.
//! - **The storage is the same.** The key is a serial number no other storage has (an
//!   address could be reused by a storage made after this one was dropped), and the
//!   `PerCid` whose `with` uses the entry keeps its storage alive.
//!
//! The slot's own fields are described in `reader.rs`, whose protocol they implement.

use std::ptr::{self, NonNull};

use super::space::Thresholds;
use crate::sync::{AtomicPtr, AtomicU32, Ordering, UnsafeCell};

/// A thread's cached slots in up to two storages (see "The owner's slot cache" above), so
/// that a thread that uses two `PerCid`s of a space in turn finds both. Only the record's
/// thread touches it; std atomics (relaxed loads and stores are plain moves) only because
/// the record is shared with the scan, which never reads these fields.
#[derive(Debug)]
pub(crate) struct SlotCache {
    /// The latest entry filled.
    recent: CacheEntry,
    /// The entry filled before it.
    older: CacheEntry,
}

/// One entry of a [`SlotCache`].
#[derive(Debug)]
struct CacheEntry {
    /// The serial of the storage whose slot `slot` is; 0 (no storage's) when empty.
    storage: std::sync::atomic::AtomicU64,
    /// A `*const Slot<T>` of that storage's `T`.
    slot: std::sync::atomic::AtomicPtr<()>,
}

impl CacheEntry {
    const fn new() -> Self {
        CacheEntry {
            storage: std::sync::atomic::AtomicU64::new(0),
            slot: std::sync::atomic::AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The slot if this entry holds storage `serial`'s (see [`SlotCache::get`]).
    #[inline(always)]
    fn get<T>(&self, serial: u64) -> Option<NonNull<Slot<T>>> {
        if self.storage.load(std::sync::atomic::Ordering::Relaxed) != serial {
            return None;
        }
        let slot = self.slot.load(std::sync::atomic::Ordering::Relaxed);
        // SAFETY: a key that is a serial (never 0) was stored by `set`, after the slot's
        // address, which is not null; only this thread writes either field.
        Some(unsafe { NonNull::new_unchecked(slot.cast()) })
    }

    fn store(&self, serial: u64, slot: *mut ()) {
        self.slot.store(slot, std::sync::atomic::Ordering::Relaxed);
        self.storage
            .store(serial, std::sync::atomic::Ordering::Relaxed);
    }
}

impl SlotCache {
    pub(crate) fn new() -> Self {
        SlotCache {
            recent: CacheEntry::new(),
            older: CacheEntry::new(),
        }
    }

    /// Forgets both entries: the record's `own` is about to change, or it may have been
    /// freed since the entries were filled (`acquire`).
    pub(crate) fn clear(&self) {
        self.recent
            .storage
            .store(0, std::sync::atomic::Ordering::Relaxed);
        self.older
            .storage
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// The cached slot if an entry is storage `serial`'s.
    ///
    /// # Safety
    ///
    /// The caller holds a guard of this cache's record, and `serial` is the serial of a
    /// live `PerCid` storage of `T`s (serials are unique, so an entry found under it was
    /// filled with a slot of that storage). The slot is then the one of the guard's id,
    /// and stays linked while that guard lives (see the module docs).
    #[inline(always)]
    pub(super) unsafe fn get<T>(&self, serial: u64) -> Option<NonNull<Slot<T>>> {
        match self.recent.get(serial) {
            Some(slot) => Some(slot),
            None => self.older.get(serial),
        }
    }

    /// Caches `slot`, the slot of the record's `own` in storage `serial`, as the recent
    /// entry; the recent one becomes the older, and the older is forgotten.
    ///
    /// # Safety
    ///
    /// The caller holds a guard of this cache's record, and `slot` is the slot of its id in
    /// the storage numbered `serial`.
    pub(super) unsafe fn set<T>(&self, serial: u64, slot: NonNull<Slot<T>>) {
        let recent_storage = self
            .recent
            .storage
            .load(std::sync::atomic::Ordering::Relaxed);
        let recent_slot = self.recent.slot.load(std::sync::atomic::Ordering::Relaxed);
        self.older.store(recent_storage, recent_slot);
        self.recent.store(serial, slot.as_ptr().cast());
    }
}

/// One bucket per bit of an id: enough for every `usize` id.
pub(super) const BUCKETS: usize = usize::BITS as usize;

/// One id's storage.
pub(super) struct Slot<T> {
    /// The value, created lazily by the id's owner. Reached by the owner under its pinned
    /// id with `borrowed` set, by a reader that flagged the slot and saw it not borrowed,
    /// or by a trim while the id is owned by nobody (see `reader.rs`).
    pub(super) value: UnsafeCell<Option<T>>,
    /// 1 while the owner's `with` runs on this slot; only the id's owner writes it.
    pub(super) borrowed: AtomicU32,
    /// The reader's claim on the slot (`IDLE`, `FLAGGED`, `VISITING`); only a reader
    /// holding the gate writes it.
    pub(super) reading: AtomicU32,
    /// 1 while `value` holds a value, for [`PerCid::live`](crate::PerCid::live), which
    /// cannot read `value` beside its owner. Written by whoever changes `value`'s
    /// variant: the owner (a first value, `take`, `put`) or a trim.
    pub(super) filled: AtomicU32,
}

impl<T> Slot<T> {
    fn empty() -> Self {
        Slot {
            value: UnsafeCell::new(None),
            borrowed: AtomicU32::new(0),
            reading: AtomicU32::new(0),
            filled: AtomicU32::new(0),
        }
    }
}

/// The bucket and the offset in it that hold `id`.
fn bucket_of(id: usize) -> (usize, usize) {
    let position = id + 1;
    let bucket = (usize::BITS - 1 - position.leading_zeros()) as usize;
    (bucket, position - (1 << bucket))
}

/// The buckets that hold ids from `from` up to `to` (exclusive).
fn buckets_between(from: usize, to: usize) -> std::ops::Range<usize> {
    if to <= from {
        return 0..0;
    }
    bucket_of(from).0..bucket_of(to - 1).0 + 1
}

/// The first id bucket `bucket` covers.
fn first_id(bucket: usize) -> usize {
    (1usize << bucket) - 1
}

/// An unlinked bucket array, freed when dropped.
pub(super) struct Array<T> {
    base: NonNull<Slot<T>>,
    len: usize,
}

impl<T> Array<T> {
    /// Slots of this array from `offset` on.
    fn slots_from(&self, offset: usize) -> impl Iterator<Item = &Slot<T>> {
        // SAFETY: `base` points to `len` slots (see `Buckets::grow`), owned by this array.
        (offset..self.len).map(move |index| unsafe { &*self.base.as_ptr().add(index) })
    }
}

impl<T> Drop for Array<T> {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` came from `Box::into_raw` of a boxed slice in `grow`,
        // and the array was unlinked, so this is its only owner.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.base.as_ptr(), self.len)) });
    }
}

// SAFETY: an unlinked array is owned by whoever holds it; moving it moves the slots' `T`s.
unsafe impl<T: Send> Send for Array<T> {}

/// The arrays a reader may visit: a snapshot of the linked buckets, taken while holding
/// the gate (so none of them is unlinked before the reader lets go of it).
pub(super) struct Linked<T> {
    arrays: [(*mut Slot<T>, usize); BUCKETS],
}

impl<T> Linked<T> {
    /// Every slot of the snapshot, lowest id first.
    ///
    /// # Safety
    ///
    /// The caller holds the gate the snapshot was taken under.
    pub(super) unsafe fn slots(&self) -> impl Iterator<Item = &Slot<T>> + Clone {
        self.arrays
            .iter()
            .filter(|(base, _)| !base.is_null())
            .flat_map(|&(base, len)| {
                // SAFETY: a linked array of `len` slots, not unlinked while the caller
                // holds the gate (see the module docs).
                (0..len).map(move |index| unsafe { &*base.add(index) })
            })
    }
}

/// What a trim took out: the values of slots at or above the high water, and the arrays
/// wholly above it.
pub(super) struct Detached<T> {
    pub(super) values: Vec<T>,
    pub(super) arrays: Vec<Array<T>>,
    /// Slots looked at, for the count of a scan's work.
    pub(super) looked_at: usize,
}

/// The bucket arrays.
pub(super) struct Buckets<T> {
    buckets: [AtomicPtr<Slot<T>>; BUCKETS],
}

impl<T> Buckets<T> {
    pub(super) fn new() -> Self {
        Buckets {
            buckets: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
        }
    }

    /// The slot of `id`, linking its bucket if needed.
    ///
    /// # Safety
    ///
    /// The caller pins `id` (so its bucket is not unlinked while the reference lives).
    #[inline]
    pub(super) unsafe fn slot(&self, id: usize) -> &Slot<T> {
        let (bucket, offset) = bucket_of(id);
        let mut base = self.buckets[bucket].load(Ordering::Acquire);
        if base.is_null() {
            base = self.grow(bucket);
        }
        // SAFETY: bucket `b` holds `2^b` slots and `offset < 2^b`; it stays linked while
        // the caller pins `id` (see the module docs).
        unsafe { &*base.add(offset) }
    }

    /// The slot of `id` if its bucket is linked, without linking it.
    ///
    /// # Safety
    ///
    /// As for [`slot`](Self::slot).
    pub(super) unsafe fn linked_slot(&self, id: usize) -> Option<&Slot<T>> {
        let (bucket, offset) = bucket_of(id);
        let base = self.buckets[bucket].load(Ordering::Acquire);
        // SAFETY: as in `slot`.
        (!base.is_null()).then(|| unsafe { &*base.add(offset) })
    }

    #[cold]
    #[inline(never)]
    fn grow(&self, bucket: usize) -> *mut Slot<T> {
        let slots: Box<[Slot<T>]> = (0..1usize << bucket).map(|_| Slot::empty()).collect();
        let fresh = Box::into_raw(slots) as *mut Slot<T>;
        match self.buckets[bucket].compare_exchange(
            ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => fresh,
            Err(winner) => {
                // SAFETY: `fresh` came from `Box::into_raw` above with this length and was
                // never published.
                drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(fresh, 1 << bucket)) });
                winner
            }
        }
    }

    /// The linked arrays, for a reader holding the gate.
    pub(super) fn linked(&self) -> Linked<T> {
        let mut arrays = [(ptr::null_mut(), 0); BUCKETS];
        for (bucket, array) in arrays.iter_mut().enumerate() {
            *array = (self.buckets[bucket].load(Ordering::Acquire), 1 << bucket);
        }
        Linked { arrays }
    }

    /// Takes the values of every slot at or above `bounds.threshold` and unlinks every
    /// array wholly at or above it. Also returns the highest id at or above
    /// `bounds.high_water` (and below the threshold) whose slot keeps its value or whose
    /// array stays linked (starting at that id), and counts the slots it looked at.
    ///
    /// # Safety
    ///
    /// The caller holds the space lock (no id at or above `bounds.high_water` is owned,
    /// and none can be taken meanwhile) and the gate (no reader is inside the arrays).
    pub(super) unsafe fn detach_above(&self, bounds: Thresholds) -> (Detached<T>, Option<usize>) {
        let Thresholds {
            high_water,
            threshold,
            reach,
        } = bounds;
        let mut detached = Detached {
            values: Vec::new(),
            arrays: Vec::new(),
            looked_at: 0,
        };
        let mut highest_kept = None;
        // Only the arrays from the high water's to the reach's can hold anything to take
        // or free: a storage's 64 bucket words are not even read past them.
        for bucket in buckets_between(high_water, reach) {
            let base = self.buckets[bucket].load(Ordering::Acquire);
            let Some(base) = NonNull::new(base) else {
                continue;
            };
            let len = 1usize << bucket;
            let first = first_id(bucket);
            if first + len <= high_water {
                continue;
            }
            let whole = first >= threshold;
            if whole {
                self.buckets[bucket].store(ptr::null_mut(), Ordering::Relaxed);
            }
            let array = Array { base, len };
            let from = high_water.saturating_sub(first);
            for (id, slot) in (first + from..).zip(array.slots_from(from)) {
                detached.looked_at += 1;
                if id < threshold {
                    // Kept for the retention. Nobody owns the id: nothing writes `filled`.
                    if slot.filled.load(Ordering::Relaxed) != 0 {
                        highest_kept = Some(id);
                    }
                    continue;
                }
                // SAFETY: the slot's id is at or above the high water: nobody owns it and
                // no reader is inside (the caller's contract), so this is the only access.
                if let Some(value) = slot.value.with_mut(|value| unsafe { (*value).take() }) {
                    slot.filled.store(0, Ordering::Relaxed);
                    detached.values.push(value);
                }
            }
            if whole {
                detached.arrays.push(array);
            } else {
                // Still linked: not ours to free. One that starts at or above the high
                // water (kept for the retention) must stay below the reach, or no later
                // trim would look at it, and it would never be freed.
                if first >= high_water {
                    highest_kept = highest_kept.max(Some(first));
                }
                std::mem::forget(array);
            }
        }
        (detached, highest_kept)
    }

    /// The highest id in `from..to` whose slot holds a value, or at which a linked array
    /// starts (a trim with nothing to take reads this without the gate: `filled` and the
    /// bucket words are atomics).
    ///
    /// # Safety
    ///
    /// No array can be unlinked during the call (the caller holds the space lock).
    pub(super) unsafe fn highest_kept(&self, from: usize, to: usize) -> Option<usize> {
        let mut highest = None;
        for bucket in buckets_between(from, to) {
            let base = self.buckets[bucket].load(Ordering::Acquire);
            let Some(base) = NonNull::new(base) else {
                continue;
            };
            let first = first_id(bucket);
            if first >= from {
                highest = highest.max(Some(first));
            }
            let len = 1usize << bucket;
            for id in first.max(from)..(first + len).min(to) {
                // SAFETY: a linked array of `len` slots, kept linked (the caller's
                // contract); `id - first < len`.
                let slot = unsafe { &*base.as_ptr().add(id - first) };
                if slot.filled.load(Ordering::Relaxed) != 0 {
                    highest = highest.max(Some(id));
                }
            }
        }
        highest
    }

    /// The slots that hold a value, all below `reach`.
    ///
    /// # Safety
    ///
    /// No array can be unlinked during the call, and no slot at or above `reach` holds a
    /// value (`SpaceInner::with_arrays_steady`).
    pub(super) unsafe fn count_filled(&self, reach: usize) -> usize {
        let mut filled = 0;
        for bucket in buckets_between(0, reach) {
            let base = self.buckets[bucket].load(Ordering::Acquire);
            let Some(base) = NonNull::new(base) else {
                continue;
            };
            for index in 0..1usize << bucket {
                // SAFETY: a linked array of `2^bucket` slots, kept linked (the caller's
                // contract).
                let slot = unsafe { &*base.as_ptr().add(index) };
                filled += slot.filled.load(Ordering::Relaxed) as usize;
            }
        }
        filled
    }
}

impl<T> Drop for Buckets<T> {
    fn drop(&mut self) {
        for bucket in 0..BUCKETS {
            let base = self.buckets[bucket].swap(ptr::null_mut(), Ordering::Acquire);
            if let Some(base) = NonNull::new(base) {
                drop(Array {
                    base,
                    len: 1 << bucket,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_map_to_doubling_buckets() {
        assert_eq!(bucket_of(0), (0, 0));
        assert_eq!(bucket_of(1), (1, 0));
        assert_eq!(bucket_of(2), (1, 1));
        assert_eq!(bucket_of(3), (2, 0));
        assert_eq!(bucket_of(6), (2, 3));
        assert_eq!(bucket_of(7), (3, 0));
        assert_eq!(first_id(3), 7);
    }

    #[test]
    fn a_trim_unlinks_whole_arrays_above_the_high_water_only() {
        let buckets: Buckets<u64> = Buckets::new();
        for id in 0..64 {
            // SAFETY: single-threaded test: nothing else reaches the buckets.
            let slot = unsafe { buckets.slot(id) };
            slot.value
                .with_mut(|value| unsafe { *value = Some(id as u64) });
            slot.filled.store(1, Ordering::Relaxed);
        }
        let bounds = Thresholds {
            high_water: 5,
            threshold: 5,
            reach: 64,
        };
        // SAFETY: as above.
        let (detached, kept) = unsafe { buckets.detach_above(bounds) };
        assert_eq!(kept, None);
        let mut values = detached.values;
        values.sort_unstable();
        assert_eq!(values, (5..64).collect::<Vec<u64>>());
        // Buckets 3.. (ids 7..127) are wholly above 5; bucket 2 (ids 3..6) is kept.
        assert_eq!(detached.arrays.len(), 4);
        let linked = buckets.linked();
        // SAFETY: as above.
        let kept: Vec<Option<u64>> = unsafe { linked.slots() }
            .map(|slot| slot.value.with_mut(|value| unsafe { *value }))
            .collect();
        assert_eq!(
            kept,
            vec![Some(0), Some(1), Some(2), Some(3), Some(4), None, None]
        );
    }

    #[test]
    fn a_trim_with_a_retention_keeps_the_slots_below_its_threshold() {
        let buckets: Buckets<u64> = Buckets::new();
        for id in 0..20 {
            // SAFETY: single-threaded test: nothing else reaches the buckets.
            let slot = unsafe { buckets.slot(id) };
            slot.value
                .with_mut(|value| unsafe { *value = Some(id as u64) });
            slot.filled.store(1, Ordering::Relaxed);
        }
        let bounds = Thresholds {
            high_water: 2,
            threshold: 9,
            reach: 20,
        };
        // SAFETY: as above.
        let (detached, kept) = unsafe { buckets.detach_above(bounds) };
        let mut values = detached.values;
        values.sort_unstable();
        assert_eq!(values, (9..20).collect::<Vec<u64>>());
        assert_eq!(kept, Some(8));
        // Bucket 3 (ids 7..14) holds kept slots 7 and 8: linked; bucket 4 (15..30) freed.
        assert_eq!(detached.arrays.len(), 1);
        // Slots 2..9 were looked at and kept, 9..15 and 15..31 taken from.
        assert_eq!(detached.looked_at, 29);
        // SAFETY: as above.
        assert_eq!(unsafe { buckets.count_filled(20) }, 9);
        // An array kept linked above the high water counts as kept even if its slots are
        // empty, so the reach stays above it and a later trim frees it.
        let bounds = Thresholds {
            high_water: 2,
            threshold: 8,
            reach: 9,
        };
        // SAFETY: as above.
        let (detached, kept) = unsafe { buckets.detach_above(bounds) };
        assert_eq!(detached.values, [8]);
        assert_eq!(kept, Some(7));
        assert_eq!(buckets_between(0, 0), 0..0);
        assert_eq!(buckets_between(3, 7), 2..3);
        assert_eq!(buckets_between(0, usize::MAX), 0..BUCKETS);
    }
}

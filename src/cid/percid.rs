//! [`PerCid`]: one lazily created slot per concurrency id.
//!
//! Slots live in buckets of doubling size (bucket `b` holds ids `2^b - 1 .. 2^(b+1) - 1`),
//! allocated on first use and never moved, so a slot's address is stable while other
//! threads grow the array. A slot is reached only through a pinned [`Cid`](crate::Cid),
//! and ids are unique among live guards, so `with` hands out an exclusive `&mut T` without
//! a lock. The compaction scan trims values whose id is at or above the high water: such
//! an id is owned by nobody (high water = highest owned id + 1), so no guard can be using
//! it, and taking it again needs the space lock that the scan holds.

use std::ptr;
use std::sync::Arc;

use super::space::{SpaceInner, Trim};
use super::IdSpace;
use crate::scheduler::run::contain;
use crate::sync::{lock, AtomicPtr, AtomicUsize, Mutex, Ordering, UnsafeCell};

const BUCKETS: usize = usize::BITS as usize;

type Init<T> = Box<dyn Fn() -> T + Send + Sync>;
type Reclaim<T> = Box<dyn FnMut(&mut T) + Send>;

/// One id's storage. Tags: `O:` only the thread owning the id (pinned), or the scan
/// while nobody owns it; `A:` atomic, with its writers named.
struct Slot<T> {
    /// O: the value, created lazily.
    value: UnsafeCell<Option<T>>,
    /// A: set while a `with` runs on this slot; only the id's owner touches it.
    borrowed: AtomicUsize,
}

/// Tags: `I:` set at creation, read-only after; `A:` atomic; `M:` its own mutex.
struct Slots<T> {
    /// A: bucket arrays, allocated on first use (compare-exchange) and freed at drop.
    buckets: [AtomicPtr<Slot<T>>; BUCKETS],
    /// I: makes a slot's first value.
    init: Init<T>,
    /// M: the reclaim callback; run by the scan outside the space lock.
    on_reclaim: Mutex<Option<Reclaim<T>>>,
    /// A: slots holding a value; owners add, the scan's trim subtracts.
    live: AtomicUsize,
}

// SAFETY: a slot's value is only reached by the thread whose pinned id it is (ids are
// unique among live guards), or by the scan while that id is owned by nobody; moving a
// `T` between those threads needs `T: Send`.
unsafe impl<T: Send> Sync for Slots<T> {}
// SAFETY: as above; the buckets are owned heap arrays.
unsafe impl<T: Send> Send for Slots<T> {}

fn bucket_of(id: usize) -> (usize, usize) {
    let position = id + 1;
    let bucket = (usize::BITS - 1 - position.leading_zeros()) as usize;
    (bucket, position - (1 << bucket))
}

impl<T> Slots<T> {
    fn slot(&self, id: usize) -> &Slot<T> {
        let (bucket, offset) = bucket_of(id);
        let mut base = self.buckets[bucket].load(Ordering::Acquire);
        if base.is_null() {
            base = self.grow(bucket);
        }
        // SAFETY: bucket `b` holds `2^b` slots and `offset < 2^b`; buckets are freed only
        // when `Slots` drops.
        unsafe { &*base.add(offset) }
    }

    #[cold]
    fn grow(&self, bucket: usize) -> *mut Slot<T> {
        let slots: Box<[Slot<T>]> = (0..1usize << bucket)
            .map(|_| Slot {
                value: UnsafeCell::new(None),
                borrowed: AtomicUsize::new(0),
            })
            .collect();
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

    fn for_each_allocated(&self, from: usize, mut f: impl FnMut(&Slot<T>)) {
        for bucket in 0..BUCKETS {
            let base = self.buckets[bucket].load(Ordering::Acquire);
            if base.is_null() {
                continue;
            }
            let first_id = (1usize << bucket) - 1;
            for offset in 0..1usize << bucket {
                if first_id + offset >= from {
                    // SAFETY: as in `slot`.
                    f(unsafe { &*base.add(offset) });
                }
            }
        }
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        for bucket in 0..BUCKETS {
            let base = self.buckets[bucket].swap(ptr::null_mut(), Ordering::Acquire);
            if !base.is_null() {
                // SAFETY: published by `grow` from a boxed slice of this length.
                drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(base, 1 << bucket)) });
            }
        }
    }
}

impl<T: Send + 'static> Trim for Slots<T> {
    fn detach_above(self: Arc<Self>, high_water: usize) -> Option<Box<dyn FnOnce() + Send>> {
        let mut detached = Vec::new();
        self.for_each_allocated(high_water, |slot| {
            // SAFETY: the slot's id is at or above the high water, so no thread owns it,
            // no guard can reach it, and the caller holds the space lock that taking the
            // id again requires.
            if let Some(value) = slot.value.with_mut(|value| unsafe { (*value).take() }) {
                detached.push(value);
            }
        });
        if detached.is_empty() {
            return None;
        }
        self.live.fetch_sub(detached.len(), Ordering::Relaxed);
        Some(Box::new(move || {
            let mut on_reclaim = lock(&self.on_reclaim);
            for mut value in detached {
                if let Some(callback) = on_reclaim.as_mut() {
                    contain(
                        "a PerCid on_reclaim callback panicked; the slot is dropped",
                        || callback(&mut value),
                    );
                }
                contain("dropping a reclaimed PerCid slot panicked", move || {
                    drop(value)
                });
            }
        }))
    }
}

/// One value per concurrency id of an [`IdSpace`], created lazily; its memory follows the
/// live concurrency: slots above the space's high water are handed to the
/// [`on_reclaim`](Self::on_reclaim) callback and dropped by the compaction scan.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{IdSpace, PerCid, Scheduler};
///
/// let sched = Scheduler::manual();
/// let ids = IdSpace::new(&sched);
/// let counters: PerCid<u64> = PerCid::new(&ids, || 0);
/// counters.with(|n| *n += 1);
/// counters.with(|n| *n += 1);
/// assert_eq!(counters.with(|n| *n), 2);
/// assert_eq!(counters.live(), 1);
/// ```
pub struct PerCid<T: Send + 'static> {
    space: Arc<SpaceInner>,
    slots: Arc<Slots<T>>,
}

impl<T: Send + 'static> PerCid<T> {
    /// Creates the storage; `init` makes a slot's value the first time its id is used.
    /// (For a space made before a `fork()`, in the child, slots are never trimmed; see
    /// [`IdSpace::enter`].)
    pub fn new(ids: &IdSpace, init: impl Fn() -> T + Send + Sync + 'static) -> Self {
        let slots = Arc::new(Slots {
            buckets: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            init: Box::new(init),
            on_reclaim: Mutex::new(None),
            live: AtomicUsize::new(0),
        });
        let trim: Arc<dyn Trim> = slots.clone();
        ids.inner().register_trim(Arc::downgrade(&trim));
        PerCid {
            space: ids.inner().clone(),
            slots,
        }
    }

    /// Runs `f` with exclusive access to the calling thread's slot (pinning its id for the
    /// duration).
    ///
    /// # Panics
    ///
    /// If `f` calls `with` on the same `PerCid` (the same id would be borrowed twice, as
    /// with a `RefCell`). Other `PerCid`s, even of the same space, may be nested.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let cid = self.space.enter();
        let slot = self.slots.slot(cid.get());
        assert!(
            slot.borrowed.load(Ordering::Relaxed) == 0,
            "PerCid::with called re-entrantly on the same PerCid: this thread's slot is \
             already borrowed by an outer `with`; use the `&mut T` the outer closure has, or \
             keep the nested state in a separate PerCid"
        );
        slot.borrowed.store(1, Ordering::Relaxed);
        struct Unborrow<'a>(&'a AtomicUsize);
        impl Drop for Unborrow<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::Relaxed);
            }
        }
        let _unborrow = Unborrow(&slot.borrowed);
        slot.value.with_mut(|value| {
            // SAFETY: `cid` pins an id no other live guard has, and the scan only touches
            // slots of ids nobody owns, so this is the only reference to the slot.
            let value = unsafe { &mut *value };
            if value.is_none() {
                *value = Some((self.slots.init)());
                self.slots.live.fetch_add(1, Ordering::Relaxed);
            }
            f(value.as_mut().expect("initialised above"))
        })
    }

    /// Sets the callback that receives a slot's value before it is dropped by a trim.
    /// It runs on the compaction work's thread, outside the space's lock; a panic in it is
    /// caught and logged.
    pub fn on_reclaim(&self, callback: impl FnMut(&mut T) + Send + 'static) {
        *lock(&self.slots.on_reclaim) = Some(Box::new(callback));
    }

    /// Slots that currently hold a value.
    pub fn live(&self) -> usize {
        self.slots.live.load(Ordering::Relaxed)
    }
}

impl<T: Send + 'static> std::fmt::Debug for PerCid<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerCid")
            .field("live", &self.live())
            .finish()
    }
}

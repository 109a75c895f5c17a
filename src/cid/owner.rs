//! The owner's side of [`PerCid::with`](crate::PerCid::with): its straight line, its cold
//! paths, and the borrow that carries the guard between them. `percid.rs` has `with`
//! itself; the reader protocol whose owner half this is (steps B, L, E, N) is in
//! `reader.rs`, and the slot cache's argument in `slots.rs`.
//!
//! The outermost `with` of a thread in a space starts from `enter()`'s fast path
//! (`SpaceInner::enter_first_level`), so it knows three things without looking: the light
//! barrier is a compiler fence (the cached record's key says so); no `with` of the thread
//! on any `PerCid` of the space is in progress, so its slot is not borrowed and the
//! re-entrancy check is left to nested calls; and the thread's record is at hand, whose
//! slot cache gives the slot without the bucket lookup. What remains is B, L, the value,
//! E, N and the unpin. The borrow (`Borrow`) holds the guard, and every step off the
//! straight line (a cache miss, a flagged slot, a first value, a nested call) hands both
//! to a cold function that finishes the call, so no guard is alive across a call that
//! could unwind into `with`'s frame and the guard stays in registers.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use super::Cid;
use super::barrier;
use super::percid::PerCid;
use super::reader::IDLE;
use super::slots::{Slot, SlotCache};
use crate::sync::Ordering;

impl<T: Send + 'static> PerCid<T> {
    /// `with` inside another guard of the thread in this space (a `with` on another
    /// `PerCid`, a `Cid` it holds, or a `with` on this one, which panics), or off
    /// `enter()`'s fast path (see `enter_first_level`).
    #[cold]
    #[inline(never)]
    pub(super) fn with_nested_or_looked_up<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let cid = self.space.enter_uncached();
        // SAFETY: `cid` pins its id, and its cache is its record's.
        let slot = unsafe { self.slot(cid.slot_cache(), cid.get()) };
        // SAFETY: `cid` pins the slot's id, so the slot stays linked.
        let borrowed = unsafe { slot.as_ref() }.borrowed.load(Ordering::Relaxed);
        assert!(
            borrowed == 0,
            "PerCid::with called re-entrantly on the same PerCid: this thread's slot is \
             already borrowed by an outer `with` or SlotGuard; use the `&mut T` the outer \
             one has, keep the nested state in a separate PerCid, or use try_borrow, which \
             returns None here"
        );
        // SAFETY: `slot` is the slot of `cid`'s id.
        let borrow = unsafe { Borrow::<_, false>::start(cid, slot, self) };
        self.with_borrowed(borrow, f)
    }

    /// `with` on `enter()`'s fast path whose slot is not in the thread's cache: looks it up
    /// and caches it. `cid` is the thread's outermost guard in this space (see `with`).
    #[cold]
    #[inline(never)]
    pub(super) fn with_looked_up<R>(&self, cid: Cid<'_>, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: `cid` pins its id, and its cache is its record's.
        let slot = unsafe { self.slot(cid.slot_cache(), cid.get()) };
        // SAFETY: `slot` is the slot of `cid`'s id.
        let borrow = unsafe { Borrow::<_, true>::start(cid, slot, self) };
        self.with_borrowed(borrow, f)
    }

    /// The slot of `id`, from `cache` if it holds this storage's, else looked up in the
    /// buckets (linking its array if needed), noted in the storage's reach, and cached.
    ///
    /// # Safety
    ///
    /// The caller holds a guard that pins `id`, and `cache` is the cache of that guard's
    /// record (`None` for a transient id). The slot stays linked while the guard lives.
    pub(super) unsafe fn slot(&self, cache: Option<&SlotCache>, id: usize) -> NonNull<Slot<T>> {
        if let Some(cache) = cache {
            // SAFETY: the caller holds a guard of the cache's record, and `serial` is this
            // live storage's.
            if let Some(slot) = unsafe { cache.get(self.storage.reachable.serial) } {
                return slot;
            }
        }
        // Every slot reached, filled or not, and every array linked, lies below the
        // reach (`reach.rs`): the trims then need look no further, and free what is
        // there once it is above the high water. A cached slot was noted when it was
        // looked up, and its id has been owned without a break since (`slots.rs`), so no
        // trim lowered the reach below it.
        let reachable = &self.storage.reachable;
        if id >= reachable.reach.load(Ordering::Relaxed) {
            self.space.raise_reach(reachable, id);
        }
        // SAFETY: the caller pins `id`.
        let slot = NonNull::from(unsafe { self.storage.buckets.slot(id) });
        if let Some(cache) = cache {
            // SAFETY: the caller holds a guard of the cache's record, pinning `id`, and
            // `slot` is that id's slot in this storage.
            unsafe { cache.set(self.storage.reachable.serial, slot) };
        }
        slot
    }

    /// The rest of `with` once the slot is borrowed (B and the barrier done): L, then `f`
    /// on the value. The owner's fast path is straight-line; a flagged slot or a missing
    /// value hands the borrow, guard and all, to `with_borrowed_slow`, so that no guard
    /// is alive across a call that could unwind into this frame (its cleanup would keep
    /// the guard in memory rather than in registers).
    #[inline(always)]
    pub(super) fn with_borrowed<R, const ASYMMETRIC: bool>(
        &self,
        borrow: Borrow<'_, T, ASYMMETRIC>,
        f: impl FnOnce(&mut T) -> R,
    ) -> R {
        // SAFETY: `borrow` holds the guard that keeps the slot linked; it is dropped, or
        // handed on, only after the last use of this reference.
        let slot = unsafe { borrow.slot.as_ref() };
        // (L)
        if slot.reading.load(Ordering::Acquire) != IDLE {
            return self.with_borrowed_slow(borrow, true, f);
        }
        let ran = slot.value.with_mut(move |value| {
            // SAFETY: `borrow` holds a guard on an id no other live guard has and has
            // borrowed its slot, L saw no reader (a reader visits the slot only while it is
            // not borrowed: `reader.rs`), and a trim only takes values of ids nobody owns,
            // so this is the only reference to the value until `borrow` is dropped.
            match unsafe { &mut *value } {
                Some(value) => Ok((f(value), borrow)),
                // Out of this access first: the slow path makes its own.
                None => Err((borrow, f)),
            }
        });
        match ran {
            Ok((result, borrow)) => {
                // E only after the access to the value has ended.
                drop(borrow);
                result
            }
            Err((borrow, f)) => self.with_borrowed_slow(borrow, false, f),
        }
    }

    /// `with_borrowed` off its straight line: waits for the reader that flagged the slot
    /// (`flagged`: L saw the flag), makes the slot's first value if it has none, runs `f`.
    #[cold]
    #[inline(never)]
    fn with_borrowed_slow<R, const ASYMMETRIC: bool>(
        &self,
        borrow: Borrow<'_, T, ASYMMETRIC>,
        flagged: bool,
        f: impl FnOnce(&mut T) -> R,
    ) -> R {
        // SAFETY: as in `with_borrowed`.
        let slot = unsafe { borrow.slot.as_ref() };
        if flagged {
            self.storage.gate.wait_for_reader(slot);
        }
        let result = slot.value.with_mut(|value| {
            // SAFETY: as in `with_borrowed`; L saw no reader (in `wait_for_reader` if not
            // before).
            let value = unsafe { &mut *value };
            let value = match value {
                Some(value) => value,
                None => self.first_value(value, slot),
            };
            f(value)
        });
        drop(borrow);
        result
    }

    /// Makes the first value of `slot`, which the caller pins and borrows, `empty` being
    /// its value.
    #[cold]
    #[inline(never)]
    pub(super) fn first_value<'v>(&self, empty: &'v mut Option<T>, slot: &Slot<T>) -> &'v mut T {
        let value = (self.storage.init)();
        self.will_fill(slot);
        empty.insert(value)
    }

    /// `slot`, which the caller pins and borrows, is about to get a value: `live()` must
    /// count it. (Its id is below the storage's reach since the slot was looked up: the
    /// trims will find the value once the id is above the high water.)
    #[inline(always)]
    pub(super) fn will_fill(&self, slot: &Slot<T>) {
        slot.filled.store(1, Ordering::Relaxed);
    }
}

impl<T: Send + 'static> PerCid<T> {
    /// The straight line of `take` and `put`: `f` on the calling thread's slot and `arg`,
    /// as `with` runs its closure, with no `init`; `f` may fill the slot (calling
    /// `will_fill`) or empty it (clearing `filled`). `Err(arg)`, without calling `f`, where
    /// `with` would panic: the slot is borrowed already (an outer `with` or `SlotGuard` of
    /// this thread), or this thread's own `for_each` callback is visiting it. `f` runs no
    /// user code. (`arg` is passed through rather than captured, so that a value `put`
    /// moves stays in registers instead of going through the stack.)
    #[inline(always)]
    pub(super) fn lend<A, R>(&self, arg: A, f: impl Lender<T, A, R>) -> Result<R, A> {
        let Some(cid) = self.space.enter_first_level() else {
            return self.lend_nested_or_looked_up(arg, f);
        };
        let cached = match cid.slot_cache() {
            // SAFETY: `cid` is a guard of the cache's record, and `serial` is this live
            // storage's.
            Some(cache) => unsafe { cache.get(self.storage.reachable.serial) },
            None => None,
        };
        let Some(slot) = cached else {
            return self.lend_looked_up(cid, arg, f);
        };
        // The thread's outermost guard in this space: its slot is not borrowed (see `with`).
        // SAFETY: `slot` is the slot of `cid`'s id (the cache's contract).
        let borrow = unsafe { Borrow::<_, true>::start(cid, slot, self) };
        self.lend_borrowed(borrow, arg, f)
    }

    /// `lend` inside another guard of the thread in this space, or off `enter()`'s fast
    /// path.
    #[cold]
    #[inline(never)]
    fn lend_nested_or_looked_up<A, R>(&self, arg: A, f: impl Lender<T, A, R>) -> Result<R, A> {
        let cid = self.space.enter_uncached();
        // SAFETY: `cid` pins its id, and its cache is its record's.
        let slot = unsafe { self.slot(cid.slot_cache(), cid.get()) };
        // SAFETY: `cid` pins the slot's id, so the slot stays linked. Only this thread
        // writes its pinned slot's `borrowed`.
        if unsafe { slot.as_ref() }.borrowed.load(Ordering::Relaxed) != 0 {
            return Err(arg);
        }
        // SAFETY: `slot` is the slot of `cid`'s id.
        let borrow = unsafe { Borrow::<_, false>::start(cid, slot, self) };
        self.lend_borrowed(borrow, arg, f)
    }

    /// `lend` on `enter()`'s fast path whose slot is not in the thread's cache.
    #[cold]
    #[inline(never)]
    fn lend_looked_up<A, R>(&self, cid: Cid<'_>, arg: A, f: impl Lender<T, A, R>) -> Result<R, A> {
        // SAFETY: `cid` pins its id, and its cache is its record's.
        let slot = unsafe { self.slot(cid.slot_cache(), cid.get()) };
        // SAFETY: `slot` is the slot of `cid`'s id.
        let borrow = unsafe { Borrow::<_, true>::start(cid, slot, self) };
        self.lend_borrowed(borrow, arg, f)
    }

    /// The rest of `lend` once the slot is borrowed: L, then `f`.
    #[inline(always)]
    fn lend_borrowed<A, R, const ASYMMETRIC: bool>(
        &self,
        borrow: Borrow<'_, T, ASYMMETRIC>,
        arg: A,
        f: impl Lender<T, A, R>,
    ) -> Result<R, A> {
        let slot = borrow.slot();
        // (L)
        if slot.reading.load(Ordering::Acquire) != IDLE
            && !self.storage.gate.try_wait_for_reader(slot)
        {
            return Err(arg);
        }
        let result = slot.value.with_mut(|value| {
            // SAFETY: as in `with_borrowed`: the slot of a pinned id, borrowed, and L saw
            // no reader (in `try_wait_for_reader` if not before).
            f(unsafe { &mut *value }, slot, arg)
        });
        // E only after the access to the value has ended.
        drop(borrow);
        Ok(result)
    }
}

/// What `PerCid::lend` runs on the slot: its value, the slot, and the argument.
pub(super) trait Lender<T, A, R>: FnOnce(&mut Option<T>, &Slot<T>, A) -> R {}

impl<T, A, R, F: FnOnce(&mut Option<T>, &Slot<T>, A) -> R> Lender<T, A, R> for F {}

/// The owner's borrow of its slot, with the guard pinning the slot's id: B and the barrier
/// on start (L is `with_borrowed`'s); E, the barrier and N on drop, then the guard's drop
/// (see `reader.rs`). One value, so that the calls off `with`'s straight line can take it
/// over whole. `ASYMMETRIC`: the guard came from `enter()`'s fast path, where the light
/// barrier is a compiler fence (`enter_first_level`), so it need not read the barrier mode.
pub(super) struct Borrow<'a, T: Send + 'static, const ASYMMETRIC: bool> {
    /// Dropped last, by `drop` (E and N come first).
    cid: ManuallyDrop<Cid<'a>>,
    /// The slot of `cid`'s id, linked while `cid` lives.
    slot: NonNull<Slot<T>>,
    /// The slot's `PerCid` (the one `with` has at hand: no other address to compute).
    percid: &'a PerCid<T>,
}

/// The light barrier of a `Borrow`.
#[inline(always)]
fn light<const ASYMMETRIC: bool>() {
    if ASYMMETRIC {
        barrier::light_asymmetric();
    } else {
        barrier::light();
    }
}

impl<'a, T: Send + 'static, const ASYMMETRIC: bool> Borrow<'a, T, ASYMMETRIC> {
    /// The id of the borrowed slot.
    #[inline(always)]
    pub(super) fn id(&self) -> usize {
        self.cid.get()
    }

    /// The borrowed slot.
    #[inline(always)]
    pub(super) fn slot(&self) -> &Slot<T> {
        // SAFETY: `self.cid` pins the slot's id while `self` lives, so it stays linked.
        unsafe { self.slot.as_ref() }
    }

    /// Borrows `slot` (B and the barrier). The caller checks L next.
    ///
    /// # Safety
    ///
    /// `slot` is the slot of `cid`'s id in `percid`.
    #[inline(always)]
    pub(super) unsafe fn start(
        cid: Cid<'a>,
        slot: NonNull<Slot<T>>,
        percid: &'a PerCid<T>,
    ) -> Self {
        // (B)
        // SAFETY: `cid` pins the slot's id (the caller's contract), so it is linked.
        unsafe { slot.as_ref() }
            .borrowed
            .store(1, Ordering::Relaxed);
        light::<ASYMMETRIC>();
        Borrow {
            cid: ManuallyDrop::new(cid),
            slot,
            percid,
        }
    }
}

impl<T: Send + 'static, const ASYMMETRIC: bool> Drop for Borrow<'_, T, ASYMMETRIC> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `self.cid` still pins the slot's id (it is dropped last).
        let slot = unsafe { self.slot.as_ref() };
        // (E)
        slot.borrowed.store(0, Ordering::Release);
        light::<ASYMMETRIC>();
        // (N)
        if slot.reading.load(Ordering::Relaxed) != IDLE {
            // Takes a lock that ignores poisoning and notifies: it does not unwind (if it
            // ever did, the guard below would stay pinned, as a leaked guard does).
            self.percid.storage.gate.wake_reader();
        }
        // SAFETY: dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.cid) };
    }
}

//! What a pool needs from [`PerCid`]: the calling thread's slot as a one-value cache
//! ([`take`](PerCid::take), [`put`](PerCid::put)), and a borrow of it that lives in a
//! guard and never panics on nesting ([`try_borrow`](PerCid::try_borrow), [`SlotGuard`]).
//!
//! A cache pool (regex keeps one per `Regex`) hands out guards that must be `Send`
//! (iterators holding them are), so a guard cannot hold a [`Cid`](crate::Cid), which is
//! `!Send`. `take` moves the value out of the slot under one pin, and `put` moves one in
//! under another: in between the value is the caller's, in a guard of its own making, and
//! the slot is empty. Both run `with`'s straight line (`PerCid::lend`, in `owner.rs`):
//! the same pin, borrow and reader check, no lock, no read-modify-write, and no `init`.
//!
//! # Invariants
//!
//! - **No panic on nesting.** Where `with` would panic (the slot is borrowed by an outer
//!   `with` or `SlotGuard` of the same thread, or this thread's own `for_each` callback is
//!   visiting it), `take` returns `None`, `put` gives the value back, and `try_borrow`
//!   returns `None`, without touching the slot: a pool falls back to a value of its own.
//! - **The borrow protocol is `with`'s.** A `SlotGuard` is a `with` whose closure is the
//!   guard's life: it pins the id and holds the slot's borrow (B … E in `reader.rs`) until
//!   it drops, so `for_each` waits for it and trims never take its value, as for `with`.
//!   It is `!Send` (its pin is its thread's), and a leaked guard keeps its slot borrowed
//!   and its id pinned forever, as a leaked `Cid` does: a `for_each` then waits for ever.
//! - **Accounting.** A slot's `filled` word follows its value (`live()` counts it); a
//!   value taken out is the caller's and is no longer counted; `put` fills the slot as a
//!   first value does (raising the storage's reach, `reach.rs`), so the trims find it once
//!   its id is above the high water and hand it to `on_reclaim` exactly once.

use std::ops::{Deref, DerefMut};

use super::owner::Borrow;
use super::percid::PerCid;
use super::reader::IDLE;
use super::slots::Slot;
use crate::sync::{MutPtr, Ordering};

impl<T: Send + 'static> PerCid<T> {
    /// Takes the value out of the calling thread's slot, leaving it empty: `None` if it
    /// is empty. The slot is a one-value cache: this never calls `init`.
    ///
    /// One pin, as [`with`](Self::with): no lock and no atomic read-modify-write, except
    /// while a [`for_each`](Self::for_each) has yet to visit this very slot (then it
    /// waits for that visit). The value is the caller's until it is [`put`](Self::put)
    /// back, here or on any thread; [`live`](Self::live) does not count it meanwhile.
    ///
    /// Returns `None`, without touching the slot, where `with` would panic: inside a
    /// `with` or a [`SlotGuard`] of this thread on this `PerCid` (the slot is borrowed),
    /// or inside a `for_each` callback that is visiting this thread's slot.
    ///
    /// `take` and `put` move the value: keep `T` a word (box a large cache, as
    /// regex-automata's pool does) and the pair costs about three `with` calls (6.6 ns
    /// here); a 24-byte `Vec` moved through memory costs several times that.
    ///
    /// In per-CPU mode (see [`IdSpace`](crate::IdSpace#two-modes)) the slot is the one of
    /// the id the call borrows, the CPU's: a value taken stays out for as long as its
    /// taker keeps it, another thread on that CPU meanwhile finds the slot empty, and the
    /// later of two `put`s there finds it full. With many more threads than CPUs each
    /// holding a value between `take` and `put` (preempted in between), most values are
    /// made anew and dropped: where the value is used on one thread,
    /// [`try_borrow`](Self::try_borrow) keeps it in its slot, and a guard preempted inside
    /// keeps its slot while the others take a spare's.
    ///
    /// # Examples
    ///
    /// A pool whose guard is `Send`: it holds the value, not the slot.
    ///
    /// ```
    /// use nicework::{IdSpace, PerCid, Scheduler};
    ///
    /// struct Guard<'p> {
    ///     pool: &'p PerCid<Vec<u8>>,
    ///     cache: Option<Vec<u8>>,
    /// }
    /// impl Drop for Guard<'_> {
    ///     fn drop(&mut self) {
    ///         if let Some(cache) = self.cache.take() {
    ///             // A full slot (another guard of this thread came back first): drop it.
    ///             let _ = self.pool.put(cache);
    ///         }
    ///     }
    /// }
    /// fn get(pool: &PerCid<Vec<u8>>) -> Guard<'_> {
    ///     let cache = pool.take().unwrap_or_else(|| Vec::with_capacity(1024));
    ///     Guard { pool, cache: Some(cache) }
    /// }
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let pool: PerCid<Vec<u8>> = PerCid::new(&ids, Vec::new);
    /// let guard = get(&pool);
    /// std::thread::scope(|s| {
    ///     s.spawn(move || drop(guard)); // Send: the value goes back into that thread's slot
    /// });
    /// assert!(pool.take().is_none()); // this thread's slot is still empty
    /// ```
    #[inline]
    pub fn take(&self) -> Option<T> {
        self.lend((), |value: &mut Option<T>, slot: &Slot<T>, ()| {
            let taken = value.take();
            if taken.is_some() {
                slot.filled.store(0, Ordering::Relaxed);
            }
            taken
        })
        .ok()
        .flatten()
    }

    /// Puts `value` into the calling thread's slot if it is empty; gives it back as
    /// `Err(value)` if the slot holds a value already.
    ///
    /// One pin, as [`take`](Self::take). A value put into a slot is the `PerCid`'s like
    /// one `init` made: [`for_each`](Self::for_each) visits it, and once its id is above
    /// the high water (for the retention, if one is set) the compaction scan hands it to
    /// [`on_reclaim`](Self::on_reclaim), exactly once.
    ///
    /// # Errors
    ///
    /// `Err(value)`, the value given back untouched:
    /// - the slot holds a value (the pool's other guard came back first);
    /// - inside a `with` or a [`SlotGuard`] of this thread on this `PerCid` (the slot is
    ///   borrowed), or inside a `for_each` callback that is visiting this thread's slot.
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{IdSpace, PerCid, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let pool: PerCid<String> = PerCid::new(&ids, String::new);
    /// assert_eq!(pool.put("a".to_string()), Ok(()));
    /// assert_eq!(pool.put("b".to_string()), Err("b".to_string()));
    /// assert_eq!(pool.take().as_deref(), Some("a"));
    /// ```
    #[inline]
    pub fn put(&self, value: T) -> Result<(), T> {
        self.lend(
            value,
            |slot_value: &mut Option<T>, slot: &Slot<T>, value| {
                if slot_value.is_some() {
                    return Err(value);
                }
                self.will_fill(slot);
                *slot_value = Some(value);
                Ok(())
            },
        )
        .and_then(|placed| placed)
    }

    /// Borrows the calling thread's slot for as long as the returned guard lives, making
    /// its value with `init` if it has none; `None` if the slot is borrowed already.
    ///
    /// The guard is a `with` that outlives a closure: it derefs mutably to the value,
    /// is `!Send`, and holds the thread's id pinned and the slot borrowed until it is
    /// dropped; [`for_each`](Self::for_each) waits for it as it waits for a `with`, and
    /// trims never take its value. It never panics where `with` would: it returns `None`
    /// inside a `with` or another `SlotGuard` of this thread on this `PerCid`, and inside
    /// any `for_each` callback of this `PerCid` on this thread (the pass would wait for a
    /// guard kept past the callback), so a pool (an iterator that holds its cache across
    /// user code, say) falls back to a value of its own there.
    ///
    /// A `with` on this `PerCid` while a guard of the same thread lives panics, as a
    /// nested `with` does, and so does a `for_each` (it would wait for the guard); `take`
    /// and `put` return `None` and `Err`. Keep guards short: a guard kept for long keeps
    /// a `for_each` waiting, and a leaked one (`mem::forget`) keeps it waiting for ever.
    ///
    /// # Panics
    ///
    /// If `init` panics (the slot stays empty and is let go).
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{IdSpace, PerCid, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let scratch: PerCid<Vec<u8>> = PerCid::new(&ids, Vec::new);
    /// let mut outer = scratch.try_borrow().expect("not borrowed yet");
    /// outer.push(1);
    /// // Nested on the same thread: no panic, the caller uses a buffer of its own.
    /// assert!(scratch.try_borrow().is_none());
    /// drop(outer);
    /// assert_eq!(scratch.with(|buffer| buffer.len()), 1);
    /// ```
    pub fn try_borrow(&self) -> Option<SlotGuard<'_, T>> {
        if self.storage.gate.is_read_by_this_thread() {
            // Inside a `for_each` callback of this `PerCid`: a guard may outlive the
            // callback, and the pass would then wait for it, on its own thread, for ever
            // (a `with`, `take` or `put` there ends before the callback does).
            return None;
        }
        let cid = self.space.enter();
        // SAFETY: `cid` pins its id, and its cache is its record's.
        let slot = unsafe { self.slot(cid.slot_cache(), cid.get()) };
        // SAFETY: `cid` pins the slot's id, so the slot stays linked. Only this thread
        // writes its pinned slot's `borrowed`.
        if unsafe { slot.as_ref() }.borrowed.load(Ordering::Relaxed) != 0 {
            return None;
        }
        // SAFETY: `slot` is the slot of `cid`'s id.
        let borrow = unsafe { Borrow::<_, false>::start(cid, slot, self) };
        let slot = borrow.slot();
        // (L)
        if slot.reading.load(Ordering::Acquire) != IDLE
            && !self.storage.gate.try_wait_for_reader(slot)
        {
            return None;
        }
        slot.value.with_mut(|value| {
            // SAFETY: as in `with_borrowed`: the slot of a pinned id, borrowed, and L saw
            // no reader. (If `init` panics, `borrow` lets the slot go as it unwinds.)
            let value = unsafe { &mut *value };
            if value.is_none() {
                self.first_value(value, slot);
            }
        });
        let value = slot.value.get_mut();
        Some(SlotGuard { value, borrow })
    }
}

/// The calling thread's slot of a [`PerCid`], borrowed: see
/// [`PerCid::try_borrow`]. Derefs mutably to the value; `!Send`; lets the slot and the
/// thread's id go when dropped.
///
/// It cannot leave its thread (the id it pins is its thread's):
///
/// ```compile_fail
/// use nicework::{IdSpace, PerCid, Scheduler};
///
/// let sched = Scheduler::manual();
/// let ids = IdSpace::new(&sched);
/// let slots: PerCid<u64> = PerCid::new(&ids, || 0);
/// let guard = slots.try_borrow().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(move || drop(guard));
/// });
/// ```
pub struct SlotGuard<'a, T: Send + 'static> {
    /// The access to the slot's value, which always holds one. Declared first: it ends
    /// before the borrow lets the slot go.
    value: MutPtr<Option<T>>,
    /// The pin and the borrow (E, N and the unpin on drop).
    borrow: Borrow<'a, T, false>,
}

// SAFETY (for both impls below): the guard holds the slot's id pinned and the slot
// borrowed, a reader saw it not flagged (L) and trims take only values of ids nobody
// owns, so the guard's access is the only one (see `PerCid::try_borrow`). The slot holds
// a value from `try_borrow` on, and only this access could empty it.
impl<T: Send + 'static> Deref for SlotGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: see above; `&self` hands out `&T` only.
        let value: &Option<T> = unsafe { self.value.deref() };
        value
            .as_ref()
            .unwrap_or_else(|| unreachable!("a borrowed slot holds its value"))
    }
}

impl<T: Send + 'static> DerefMut for SlotGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: see above; `&mut self` is the only borrow of the guard.
        let value: &mut Option<T> = unsafe { self.value.deref() };
        value
            .as_mut()
            .unwrap_or_else(|| unreachable!("a borrowed slot holds its value"))
    }
}

impl<T: Send + 'static> std::fmt::Debug for SlotGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotGuard")
            .field("id", &self.borrow.id())
            .finish_non_exhaustive()
    }
}

//! [`PerCid`]: one lazily created slot per concurrency id, an owner's exclusive `with`, a
//! reader's `for_each` beside the owners, and memory that follows the live concurrency.
//!
//! The slot arrays are in `slots.rs` (who may reach a bucket, when a trim frees one, and
//! why the owner's slot cache stays right); the reader's protocol against owners and trims
//! is in `reader.rs`. This file puts them together:
//!
//! - `with` pins the calling thread's id, which no other live guard has, so it can hand
//!   out `&mut T` without a lock; the borrow is announced to readers as `reader.rs`
//!   describes, with no read-modify-write.
//! - `with`'s straight line and its cold paths are in `owner.rs`.
//! - `take`, `put` and `try_borrow` (`lending.rs`) are `with` in other shapes.
//! - The compaction scan calls [`Trim::trim`] after each scan, on the storages whose
//!   reach is above the high water (`reach.rs`) and those whose queue a reader filled:
//!   under the gate and the space lock it takes the values of slots at or above its
//!   threshold (the high water, or with a retention the highest high water of the last
//!   retention: `retention.rs`; owned by nobody either way) and unlinks the arrays wholly
//!   above it; after letting go of both it passes each value to `on_reclaim`, exactly
//!   once, drops it, and frees the arrays. A value taken by a trim is no longer in any
//!   slot, so no later `for_each` visits it.
//! - `live()` counts the slots whose `filled` word is set (their owners set and clear it
//!   as they fill and empty them, with plain stores) and the values a trim took that
//!   `on_reclaim` has not finished, under the space lock, where a trim moves values from
//!   one to the other.
//! - If the space's scheduler is gone, nothing scans: the thread-exit path trims instead
//!   (`SpaceInner::release_thread`), so memory still shrinks when threads go away.
//! - A trim never waits for a reader (`reader.rs`): it leaves its work to the reader
//!   holding the gate, whose `for_each` detaches after its pass and queues the values
//!   for the compaction work (`DeferredTrim`). `on_reclaim` never runs on a reader's
//!   or an owner's stack, which may be inside a `with` the callback needs.
//! - The values a trim took wait in the reclaim queue (`reclaimer.rs`): readers visit
//!   them there, one reclaimer at a time passes them to the callback, each exactly once.
//! - A trim inside its own thread's `on_reclaim` calls (a callback whose `with` made a
//!   late id during a thread exit) returns at once: it would pass the value that `with`
//!   just made straight back to the callback, for ever.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::handle::IdSpace;
use super::owner::Borrow;
use super::reach::Reachable;
use super::reader::{Gate, thread_tag};
use super::reclaimer::Reclaimer;
use super::registry;
use super::slots::Buckets;
use super::space::{Leftover, SpaceInner, Trim};
use crate::sync::{AtomicUsize, Mutex, Ordering, lock};

type Init<T> = Box<dyn Fn() -> T + Send + Sync>;

/// A serial number for a new storage: unique in the process (0 is never given out).
fn next_storage_serial() -> u64 {
    // A std atomic: it is not part of any modelled protocol.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Tags (the legend is in `sync`): `I:`, `A:`, `G:` the gate (see `slots.rs` and
/// `reader.rs`), `R:` the reclaimer's own lock.
pub(super) struct Storage<T> {
    /// G: the slot arrays.
    pub(super) buckets: Buckets<T>,
    /// G: excludes readers and trims; carries the reader protocol's wakeups.
    pub(super) gate: Gate,
    /// I: makes a slot's first value.
    pub(super) init: Init<T>,
    /// R: the reclaim callback and its queue.
    pub(super) reclaimer: Mutex<Reclaimer<T>>,
    /// A: values a trim took that are queued or in an `on_reclaim` call: a trim adds
    /// under the space lock; a reclaim subtracts after the callback and the drop, with
    /// release, so a reader of `live()` sees what the callback did.
    pub(super) reclaiming: AtomicUsize,
    /// S (the space lock): the storage's entry in the space's index (`reach.rs`).
    pub(super) reachable: Reachable,
}

// SAFETY: a slot's value is reached by the thread whose pinned id it is, by a reader
// that excluded that owner (`reader.rs`), or by a trim while the id is owned by nobody;
// moving a `T` between those threads needs `T: Send`. Readers get `&T` only through
// `PerCid::for_each`, which requires `T: Sync`.
unsafe impl<T: Send> Sync for Storage<T> {}
// SAFETY: as above; the arrays are owned heap memory.
unsafe impl<T: Send> Send for Storage<T> {}

impl<T: Send + 'static> Trim for Storage<T> {
    fn trim(&self, space: &SpaceInner) -> Leftover {
        let me = thread_tag();
        if lock(&self.reclaimer).drainer == me {
            // Inside this thread's own `on_reclaim` calls (a callback whose `with` made a
            // late id at a thread exit, whose release trims again): taking the value that
            // `with` just made would hand it to the callback again, for ever. A later trim
            // takes it.
            return Leftover::Later;
        }
        let leftover = self.detach(space);
        // Also when a reader holds the gate: values readers detached wait in the queue.
        self.drain(me);
        leftover
    }

    fn reachable(&self) -> &Reachable {
        &self.reachable
    }
}

impl<T> Storage<T> {
    /// Moves the values of the slots at or above the storage's threshold (the high water,
    /// or what its retention keeps: `SpaceInner::trim_locked`) into the queue and frees
    /// the arrays wholly above it; does nothing if a reader holds the gate (the trim is
    /// left to it).
    fn detach(&self, space: &SpaceInner) -> Leftover {
        // Without a retention the threshold is the high water, below the reach of every
        // storage a scan visits: there is always something to look at past it.
        if self.reachable.retention.load(Ordering::Relaxed) > 0 {
            let kept = space.keeps_everything(&self.reachable, |from, to| {
                // SAFETY: `keeps_everything` holds the space lock.
                unsafe { self.buckets.highest_kept(from, to) }
            });
            if let Some(kept) = kept {
                return kept;
            }
        }
        let (arrays, leftover) = {
            let Some(_hold) = self.gate.enter_trim() else {
                return Leftover::Deferred;
            };
            let (detached, leftover) = space.trim_locked(&self.reachable, |bounds| {
                // SAFETY: `trim_locked` holds the space lock, and `_hold` the gate.
                let (detached, highest_kept) = unsafe { self.buckets.detach_above(bounds) };
                // Counted under the space lock, with the slots' `filled` cleared, so
                // `live()` counts each value once.
                self.reclaiming
                    .fetch_add(detached.values.len(), Ordering::Relaxed);
                (detached, highest_kept)
            });
            space.count_trim_slots(detached.looked_at);
            // Queued before the gate is let go, so the next reader finds them there: a
            // value is never out of both the slots and the queue, except in a callback.
            lock(&self.reclaimer).queue.extend(detached.values);
            (detached.arrays, leftover)
        };
        // The arrays hold no values any more; freeing them runs no user code.
        drop(arrays);
        leftover
    }
}

/// One value per concurrency id of an [`IdSpace`], created lazily, whose memory follows
/// the live concurrency.
///
/// - [`with`](Self::with) gives the calling thread `&mut` access to its own slot, without
///   a lock or any atomic read-modify-write.
/// - [`for_each`](Self::for_each) visits every slot from any thread while the owners keep
///   working (for `T: Sync`): the sum of per-thread counters, a merge of histograms.
/// - [`take`](Self::take) and [`put`](Self::put) use the calling thread's slot as a
///   one-value cache, for pools whose guards must be `Send`; [`try_borrow`](Self::try_borrow)
///   is a `with` held in a [`SlotGuard`](crate::SlotGuard), which returns `None` where a
///   nested `with` would panic.
/// - Slots above the space's high water (ids nobody holds any more) are handed to
///   [`on_reclaim`](Self::on_reclaim) and dropped by the space's compaction scan, and
///   the slot arrays above it are freed: after the threads shrink from N to M, the
///   storage is back to about what M threads need. A [`retention`](Self::retention)
///   keeps them that much longer, so a value survives a short idle.
/// - `PerCid<T>` is `UnwindSafe` and `RefUnwindSafe` where `T` is: a panic inside `with`,
///   a guard's life or a callback leaves nicework's own state whole.
///
/// # Examples
///
/// Sharded counters, summed by a reader, with the slots of threads that went away folded
/// into a total so no increment is lost:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
/// use std::sync::Arc;
/// use nicework::{IdSpace, PerCid, Scheduler};
///
/// let sched = Scheduler::manual();
/// let ids = IdSpace::new(&sched);
/// let folded = Arc::new(AtomicU64::new(0));
/// let counters: PerCid<AtomicU64> = PerCid::with_reclaim(&ids, || AtomicU64::new(0), {
///     let folded = folded.clone();
///     move |slot: &mut AtomicU64| {
///         folded.fetch_add(*slot.get_mut(), Relaxed);
///     }
/// });
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| {
///             for _ in 0..1000 {
///                 counters.with(|n| *n.get_mut() += 1);
///             }
///         });
///     }
/// });
/// let mut total = folded.load(Relaxed);
/// counters.for_each(|n| total += n.load(Relaxed));
/// assert_eq!(total, 4000);
/// ```
///
/// An exclusive per-id cache:
///
/// ```
/// use nicework::{IdSpace, PerCid, Scheduler};
///
/// let sched = Scheduler::manual();
/// let ids = IdSpace::new(&sched);
/// let caches: PerCid<Vec<u64>> = PerCid::new(&ids, Vec::new);
/// caches.with(|cache| cache.push(1));
/// caches.with(|cache| cache.push(2));
/// assert_eq!(caches.with(|cache| cache.len()), 2);
/// assert_eq!(caches.live(), 1);
/// ```
pub struct PerCid<T: Send + 'static> {
    pub(super) space: Arc<SpaceInner>,
    pub(super) storage: Arc<Storage<T>>,
}

// A panic inside `with`, a `SlotGuard`'s life or a callback leaves nicework's own state
// whole: pins, borrows, the gate and the reclaim queue are restored by drops that run
// during the unwind, and every lock it takes ignores poisoning. What a panic can leave
// half-done is the user's value, as `f` left it, which is the caller's to judge through
// `T`: so `PerCid<T>` is as unwind-safe as `T`.
impl<T: Send + 'static + std::panic::UnwindSafe> std::panic::UnwindSafe for PerCid<T> {}
impl<T: Send + 'static + std::panic::RefUnwindSafe> std::panic::RefUnwindSafe for PerCid<T> {}

impl<T: Send + 'static> PerCid<T> {
    /// Creates the storage; `init` makes a slot's value the first time its id is used.
    /// (For a space made before a `fork()`, in the child, slots are never trimmed; see
    /// [`IdSpace::enter`].)
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{IdSpace, PerCid, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let buffers: PerCid<Vec<u8>> = PerCid::new(&ids, || Vec::with_capacity(4096));
    /// assert_eq!(buffers.with(|buffer| buffer.capacity()), 4096);
    /// ```
    pub fn new(ids: &IdSpace, init: impl Fn() -> T + Send + Sync + 'static) -> Self {
        let serial = next_storage_serial();
        let storage = Arc::new_cyclic(|me: &Weak<Storage<T>>| Storage {
            buckets: Buckets::new(),
            gate: Gate::new(),
            init: Box::new(init),
            reclaimer: Mutex::new(Reclaimer {
                callback: None,
                queue: Vec::new(),
                visited: Vec::new(),
                drainer: 0,
            }),
            reclaiming: AtomicUsize::new(0),
            reachable: Reachable::new(serial, me.clone() as Weak<dyn Trim>),
        });
        PerCid {
            space: ids.inner().clone(),
            storage,
        }
    }

    /// [`new`](Self::new) with the [`on_reclaim`](Self::on_reclaim) callback set from
    /// the start, so no slot can be trimmed before it is: the form to use when every
    /// slot's contents must be accounted for (counters folded into a total).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    /// use std::sync::Arc;
    /// use nicework::{IdSpace, PerCid, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let folded = Arc::new(AtomicU64::new(0));
    /// let sink = folded.clone();
    /// let counters = PerCid::with_reclaim(&ids, || 0u64, move |n: &mut u64| {
    ///     sink.fetch_add(*n, Relaxed);
    /// });
    /// counters.with(|n| *n += 5);
    /// ```
    pub fn with_reclaim(
        ids: &IdSpace,
        init: impl Fn() -> T + Send + Sync + 'static,
        on_reclaim: impl FnMut(&mut T) + Send + 'static,
    ) -> Self {
        let per_cid = PerCid::new(ids, init);
        per_cid.on_reclaim(on_reclaim);
        per_cid
    }

    /// Runs `f` with exclusive access to the calling thread's slot (pinning its id for the
    /// duration), creating the value with `init` on first use.
    ///
    /// Takes no lock and does no atomic read-modify-write, except the first time a slot
    /// gets a value, and except while a [`for_each`](Self::for_each) has yet to visit this
    /// very slot: then it waits for that visit to end.
    ///
    /// # Panics
    ///
    /// - If `f` calls `with` on the same `PerCid` (the same slot would be borrowed twice,
    ///   as with a `RefCell`), or a [`SlotGuard`](crate::SlotGuard) of this thread on it
    ///   lives. Other `PerCid`s, even of the same space, may be nested. Where nesting may
    ///   happen, [`try_borrow`](Self::try_borrow) returns `None` instead.
    /// - If it is called from inside a `for_each` callback of the same `PerCid` while that
    ///   callback visits the calling thread's own slot. In per-CPU mode (see
    ///   [`IdSpace`](crate::IdSpace#two-modes)) the slot `with` uses is the one of the id
    ///   it borrows, which may be any slot the callback visits: call `take`, `put` or
    ///   `try_borrow` there instead, which return `None` (or the value) in that case.
    ///
    /// A panic in `f` propagates, and leaves the slot's value as `f` left it.
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{IdSpace, PerCid, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let hits: PerCid<u64> = PerCid::new(&ids, || 0);
    /// hits.with(|n| *n += 1);
    /// assert_eq!(hits.with(|n| *n), 1);
    /// ```
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let Some(cid) = self.space.enter_first_level() else {
            return self.with_nested_or_looked_up(f);
        };
        let cached = match cid.slot_cache() {
            // SAFETY: `cid` is a guard of the cache's record, and `serial` is this live
            // storage's.
            Some(cache) => unsafe { cache.get(self.storage.reachable.serial) },
            None => None,
        };
        let Some(slot) = cached else {
            return self.with_looked_up(cid, f);
        };
        // The thread's outermost guard in this space: no `with` of this thread on any
        // `PerCid` of the space is in progress, so its slot is not borrowed. The guard came
        // from `enter()`'s fast path, where the light barrier is a compiler fence.
        // SAFETY: `slot` is the slot of `cid`'s id (the cache's contract).
        let borrow = unsafe { Borrow::<_, true>::start(cid, slot, self) };
        self.with_borrowed(borrow, f)
    }

    /// Calls `f` on every slot that holds a value, lowest id first, from any thread, while
    /// the owners keep calling [`with`](Self::with).
    ///
    /// It never sees a slot while its owner holds the `&mut T`: it waits for a `with` in
    /// progress on a slot before visiting it, and an owner that starts a `with` on a slot
    /// the reader has not visited yet waits for that visit (which is why the callback
    /// should be short). While the reader waits for one owner, no other owner waits for
    /// the reader, so owners may wait for each other inside `with`. A slot created during
    /// the call may or may not be visited; a slot trimmed by the compaction scan is never
    /// visited after its value was passed to [`on_reclaim`](Self::on_reclaim); values a
    /// trim took that wait for the callback are visited too, so a sum of the slots plus
    /// what `on_reclaim` folded misses nothing but the values the callback is being
    /// called with at that moment. A trim never waits for a `for_each`: one that comes
    /// during the call is left to it, and when the pass is over the calling thread takes
    /// the values above the high water out of their slots and frees the arrays (no user
    /// code); the compaction work passes them to `on_reclaim` at its next run (without a
    /// scheduler, the next thread exit's trim or the `PerCid`'s drop). Calls from several
    /// threads take turns.
    ///
    /// Like taking a read lock, calling it from inside `with` on *another* `PerCid`
    /// waits for that one's owners, and a `with` on another `PerCid` from inside the
    /// callback waits for that one's reader if it has flagged the slot: two threads
    /// nesting two `PerCid`s in opposite orders this way wait for each other, as with two
    /// `RwLock`s.
    ///
    /// # Panics
    ///
    /// Instead of waiting for its own thread:
    /// - from inside `with` on the same `PerCid`;
    /// - from inside a `for_each` callback of the same `PerCid`.
    ///
    /// (From inside `on_reclaim` it works; the slot being reclaimed is not visited.)
    ///
    /// A panic in `f` propagates after the owners waiting for the visit are released.
    ///
    /// # Cost
    ///
    /// The owners' side stays cheap because the reader pays: one
    /// `membarrier(PRIVATE_EXPEDITED)` per call, which interrupts each CPU running a
    /// thread of the process once (4–23 µs here with 4 owners running, against about
    /// 35 ns for `thread_local`'s `iter` over 4 counters, whose owners must use atomic
    /// adds). Sum statistics at reporting rates, not per request.
    ///
    /// In a `fork()`ed child, a `PerCid` made before the fork can block in `for_each`, or
    /// in `with` on a slot a vanished reader had flagged, if another thread of the parent
    /// was inside `for_each` at the fork (its locks and flags are copied, the thread is
    /// not). Make a new `PerCid` (and `IdSpace`) after the fork.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    /// use nicework::{IdSpace, PerCid, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let bytes: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    /// bytes.with(|n| *n.get_mut() += 512);
    /// let mut total = 0;
    /// bytes.for_each(|n| total += n.load(Relaxed));
    /// assert_eq!(total, 512);
    /// ```
    pub fn for_each(&self, f: impl FnMut(&T))
    where
        T: Sync,
    {
        self.refuse_inside_own_with();
        // Declared first, so it runs after `hold` let go of the gate, also on a panic.
        let _deferred = DeferredTrim { percid: self };
        let hold = self.storage.gate.enter_reader();
        let linked = self.storage.buckets.linked();
        let mut f = f;
        // SAFETY: `hold` holds the gate the snapshot was taken under.
        hold.read(unsafe { linked.slots() }, &mut f);
        // Still under the gate, so no value moves from a slot to the queue meanwhile.
        self.storage.visit_queued(&mut f);
    }

    /// Panics if the calling thread is inside `with` on this `PerCid`: a reader would
    /// wait for its own borrow.
    fn refuse_inside_own_with(&self) {
        let Some(id) = registry::pinned_id(&self.space) else {
            return;
        };
        // SAFETY: the thread pins `id`, so its bucket stays linked during this call.
        let Some(slot) = (unsafe { self.storage.buckets.linked_slot(id) }) else {
            return;
        };
        // Only this thread writes its pinned slot's `borrowed`.
        assert!(
            slot.borrowed.load(Ordering::Relaxed) == 0,
            "PerCid::for_each called from inside `with` on the same PerCid: it would wait \
             for this thread's own borrow; call it after `with` returns"
        );
    }

    /// Sets the callback that receives a slot's value before a trim drops it. It runs on
    /// the compaction work's thread (with [`Scheduler::manual`](crate::Scheduler::manual),
    /// the thread calling `advance()`), or, once the space's scheduler is gone, on a
    /// thread that is exiting; for values still waiting for it when the `PerCid` is
    /// dropped, on the dropping thread. Never at the end of a
    /// [`for_each`](Self::for_each) or inside `with`'s own machinery: a callback that
    /// folds into another `PerCid` through its `with` is safe unless you call `advance()`
    /// or drop this `PerCid` inside that `with`. It runs on one thread at a time (a trim that finds
    /// the callback busy leaves its values to the thread running it), outside every lock
    /// of the space and this `PerCid`; a panic in it is caught and logged, and the value
    /// is dropped. A `with` on this `PerCid` from inside it works, and the value it makes
    /// is trimmed later, not passed back at once.
    ///
    /// Every value trimmed after this call goes to the callback exactly once; a value
    /// trimmed before it may have been dropped without it. Set it before the first
    /// [`with`](Self::with), or use [`with_reclaim`](Self::with_reclaim). The values
    /// still in their slots when the `PerCid` is dropped are dropped without it.
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{IdSpace, PerCid, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let caches: PerCid<Vec<u8>> = PerCid::new(&ids, Vec::new);
    /// caches.on_reclaim(|cache| cache.clear());
    /// ```
    pub fn on_reclaim(&self, callback: impl FnMut(&mut T) + Send + 'static) {
        let replaced = lock(&self.storage.reclaimer)
            .callback
            .replace(Box::new(callback));
        // Outside the lock: the old callback's captures may call back in as they drop.
        drop(replaced);
    }

    /// Keeps slots above the high water for `retention` before trimming them: a value
    /// expensive to rebuild (a search cache, a connection) survives a short idle of its
    /// thread. A builder step: `PerCid::new(&ids, init).retention(d)`.
    ///
    /// A slot is trimmed only once it has stayed at or above the space's high water for
    /// all of the last `retention`, judged at each scan (so up to a scan period later);
    /// then it goes to [`on_reclaim`](Self::on_reclaim) exactly once, as without a
    /// retention. A thread that comes back within the retention and gets its old id (the
    /// lowest free one, so usually) finds its value; one that gets another id finds that
    /// slot's. The default, zero, trims at the first scan that finds a slot above the
    /// high water, and the space's promises about memory hold as stated; with a retention
    /// they hold once it has passed. While slots wait for their retention in a space whose
    /// ids are all released, the compaction work parks and a second work of the space
    /// wakes once, when the first of them may go, so an idle space still costs no scans.
    /// Once the space's scheduler is gone, a slot whose retention has passed is trimmed at
    /// the next thread exit, as slots without one are. The retention is judged on the
    /// scheduler's clock: under [`Scheduler::manual`](crate::Scheduler::manual), the
    /// virtual one, which stops when that scheduler is dropped (what is kept then stays
    /// until the `PerCid` is dropped).
    ///
    /// It applies from the next high-water drop: slots already above the high water when
    /// it is set may be trimmed at the next scan. Set it when the `PerCid` is made. Any
    /// duration is accepted: `Duration::MAX`, and anything past the scheduler's range of
    /// about 27 years, keeps slots until the `PerCid` is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{IdSpace, PerCid, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let ids = IdSpace::new(&sched);
    /// let caches: PerCid<Vec<u8>> =
    ///     PerCid::new(&ids, || Vec::with_capacity(4096)).retention(Duration::from_secs(1));
    /// caches.with(|cache| cache.push(1));
    /// ```
    #[must_use = "the builder step returns the PerCid"]
    pub fn retention(self, retention: Duration) -> Self {
        let nanos = u64::try_from(retention.as_nanos()).unwrap_or(u64::MAX);
        self.space.set_retention(&self.storage.reachable, nanos);
        self
    }

    /// Values not yet reclaimed: in a slot, or taken by a trim and not yet through
    /// `on_reclaim` and dropped. A value [`take`](Self::take)n out is the caller's, not
    /// counted until it is [`put`](Self::put) back. Once it has dropped to what the live
    /// threads hold, everything the callback did for the others is visible to the caller.
    ///
    /// It counts under the space's lock, in time proportional to the slots (twice the
    /// highest id in use at most): a figure for reports and tests, not for a hot path.
    pub fn live(&self) -> usize {
        // Under the space lock: a trim moves values from the slots to the queue under it,
        // so each is counted once, and no array is unlinked during the count.
        self.space
            .with_arrays_steady(&self.storage.reachable, |reach| {
                // SAFETY: `with_arrays_steady` keeps every linked array linked, and no slot at
                // or above `reach` holds a value.
                let filled = unsafe { self.storage.buckets.count_filled(reach) };
                filled + self.storage.reclaiming.load(Ordering::Acquire)
            })
    }
}

impl<T: Send + 'static> Drop for PerCid<T> {
    /// The storage leaves the space's index; its values are dropped with the storage
    /// (now, or after a trim that holds it ends).
    fn drop(&mut self) {
        self.space.forget_storage(&self.storage.reachable);
    }
}

impl<T> Drop for Storage<T> {
    /// Values a trim took are promised to `on_reclaim`, also if the `PerCid` goes first.
    fn drop(&mut self) {
        self.drain(thread_tag());
    }
}

/// After a `for_each` let go of the gate: the part of a trim left to it that runs no
/// user code. It detaches the values above the high water into the queue (where readers
/// still visit them) and frees the arrays, so a reader in a loop cannot starve the trims;
/// the compaction work passes the values to `on_reclaim` at its next run (without a
/// scheduler, the next thread exit's trim or the `PerCid`'s drop does). The callbacks
/// never run on the reader's stack, which may be inside a `with` the callback needs.
struct DeferredTrim<'p, T: Send + 'static> {
    percid: &'p PerCid<T>,
}

impl<T: Send + 'static> Drop for DeferredTrim<'_, T> {
    fn drop(&mut self) {
        let PerCid { space, storage } = self.percid;
        let kept = storage.gate.take_deferred_trim()
            && matches!(storage.detach(space), Leftover::RetainedUntil(_));
        let waiting = {
            let reclaimer = lock(&storage.reclaimer);
            !reclaimer.queue.is_empty() && reclaimer.drainer == 0
        };
        if waiting || kept {
            // The compaction work's next run passes them on (without a scheduler, the next
            // thread exit's trim or the `PerCid`'s drop does), and, if slots are kept for
            // the retention, sees that they are woken for.
            space.request_drain(&storage.reachable);
        }
    }
}

impl<T: Send + 'static> std::fmt::Debug for PerCid<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerCid")
            .field("live", &self.live())
            .finish()
    }
}

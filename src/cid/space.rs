//! `SpaceInner`, the state an [`IdSpace`](super::IdSpace) shares with its threads' records
//! and its `PerCid`s: the owned ids under the space's lock, entering it, and the
//! compaction scan.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::barrier;
use super::ids::IdSet;
use super::record::{MOVE, NO_ID, ThreadRec};
use crate::contain::contain;
use crate::sync::{AtomicUsize, Mutex, Ordering, lock};
use crate::{Next, Scheduler, Work};

/// A per-id storage that the scan trims above the high water (implemented by `PerCid`).
pub(crate) trait Trim: Send + Sync {
    /// Takes the values of slots at or above the high water out (reading it under the
    /// space lock with [`SpaceInner::at_high_water`]), hands them to the reclaim
    /// callback and frees what it can. Called without the space lock.
    fn trim(&self, space: &SpaceInner);
}

pub(crate) struct SpaceState {
    pub(super) ids: IdSet,
    pub(super) threads: Vec<Arc<ThreadRec>>,
    trims: Vec<Weak<dyn Trim>>,
}

/// One id space. Tags (the legend is in `sync`): `I:` set at build, read-only after; `S:`
/// guarded by `state`, the space's lock; `A:` atomic, with its writers named.
pub(crate) struct SpaceInner {
    /// I: the space's number in the threads' registries.
    pub(crate) serial: u64,
    /// S: the owned-id bitmap, the thread records and the per-id storages to trim.
    pub(super) state: Mutex<SpaceState>,
    /// A: mirrors of `state` for lock-free readers, written under the lock (`publish`).
    pub(super) held: AtomicUsize,
    /// A: as `held`.
    high_water: AtomicUsize,
    /// A: as `held`.
    pub(super) threads: AtomicUsize,
    /// I: the compaction work. Its closure holds a `Weak` to this space.
    pub(super) work: Work,
    /// I: the fork generation the space was made in: in a forked child its lock may have
    /// been held by a thread that is gone, so the child never takes it (see
    /// `in_forked_child`).
    fork_generation: u64,
    /// A (forked child only): ids handed out there, counted from the high water at the fork. A std
    /// atomic: it is never part of a loom model.
    child_ids: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for SpaceInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpaceInner")
            .field("held", &self.held.load(Ordering::Relaxed))
            .field("high_water", &self.high_water.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn next_serial() -> u64 {
    // Serial numbers only need to be unique within the process; std's atomic is fine in
    // loom builds too, since it is not part of any modelled protocol.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl SpaceInner {
    /// A space whose compaction work runs on `scheduler` every `period`, parked until
    /// the first id is taken.
    pub(crate) fn new(scheduler: &Scheduler, period: Duration) -> Arc<SpaceInner> {
        barrier::init();
        Arc::new_cyclic(|weak: &Weak<SpaceInner>| {
            let weak = weak.clone();
            let work = scheduler
                .every(period, move |_| match weak.upgrade() {
                    Some(space) => space.scan(),
                    None => Next::Stop,
                })
                .named("nicework.cid-compaction")
                // A scan a little late only compacts a little later: it shares the other
                // works' wakeups within a quarter of its period.
                .leeway(period / 4);
            // Parked until the first id is taken.
            work.cancel();
            SpaceInner {
                serial: next_serial(),
                state: Mutex::new(SpaceState {
                    ids: IdSet::default(),
                    threads: Vec::new(),
                    trims: Vec::new(),
                }),
                held: AtomicUsize::new(0),
                high_water: AtomicUsize::new(0),
                threads: AtomicUsize::new(0),
                work,
                fork_generation: crate::fork::generation(),
                child_ids: std::sync::atomic::AtomicUsize::new(0),
            }
        })
    }

    /// Whether this is a copy in a `fork()`ed child. There the lock may have been held at
    /// the fork by a thread that no longer exists, so every path that would take it
    /// takes a lock-free degraded path instead: the forking thread keeps its id, other
    /// threads get fresh ids above the high water at the fork (unique, never reused, not
    /// compacted: the compaction work lived on the parent's scheduler), and nothing is
    /// released. Slots of ids the parent's vanished threads held are never handed out.
    #[inline]
    pub(super) fn in_forked_child(&self) -> bool {
        crate::fork::is_forked_since(self.fork_generation)
    }

    /// A fresh id in a forked child (see `in_forked_child`).
    #[cold]
    pub(super) fn child_id(&self) -> usize {
        let above = self.high_water.load(Ordering::Relaxed);
        above
            + self
                .child_ids
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Mirrors `state` for lock-free readers, under the lock. If `held` shrinks, every
    /// thread whose id is now not below it gets `MOVE` in its `cid`, so that its next
    /// `enter()` takes the slow path and moves down (compaction) without the fast path
    /// reading `held`. That is O(threads) under the lock, paid only when `held` shrinks:
    /// a thread's exit, a scan that frees ids, a transient id's release (moving down
    /// frees one id and takes one, so `held` stays). Until the next shrink, every
    /// unmarked `cid` is below `held`: `acquire` keeps an id only below it and takes the
    /// lowest free one (below the new count), and `held` does not shrink unmarked.
    pub(super) fn publish(&self, state: &SpaceState) {
        let held = state.ids.owned();
        // Written only under the lock, so this reads the last value published.
        if held < self.held.load(Ordering::Relaxed) {
            for record in &state.threads {
                let cid = record.cid.load(Ordering::Relaxed);
                // Unmarked, owned (not `NO_ID`), not below `held`: mark it.
                if (held..MOVE).contains(&cid) {
                    record.cid.store(cid | MOVE, Ordering::Relaxed);
                }
            }
        }
        self.held.store(held, Ordering::Relaxed);
        self.high_water
            .store(state.ids.high_water(), Ordering::Relaxed);
    }

    pub(crate) fn add_thread(&self, record: Arc<ThreadRec>) {
        if self.in_forked_child() {
            // Only the scan reads the list, and it does not run in the child.
            return;
        }
        let mut state = lock(&self.state);
        state.threads.push(record);
        self.threads.store(state.threads.len(), Ordering::Relaxed);
    }

    /// Thread exit (or the drop of an orphaned record's last guard): the thread's id is
    /// free at once.
    pub(crate) fn release_thread(&self, record: &Arc<ThreadRec>) {
        if self.in_forked_child() {
            // Ids are not reused in a forked child (see `in_forked_child`).
            return;
        }
        let mut state = lock(&self.state);
        let id = record.cid.load(Ordering::Relaxed);
        if id != NO_ID {
            state.ids.release(id & !MOVE);
            record.cid.store(NO_ID, Ordering::Relaxed);
        }
        state.threads.retain(|other| !Arc::ptr_eq(other, record));
        self.threads.store(state.threads.len(), Ordering::Relaxed);
        self.publish(&state);
        shrink(&mut state.threads);
        drop(state);
        // Something changed: let the compaction work trim storage above the high water.
        self.work.touch();
        if self.work.scheduler_is_shut_down() {
            // Nothing scans any more: trim here, so memory still follows the threads.
            self.trim_all();
        }
    }

    /// Runs every live storage's trim, without the space lock (trims take it themselves,
    /// and run user callbacks).
    fn trim_all(&self) {
        let trims: Vec<Arc<dyn Trim>> = {
            let mut state = lock(&self.state);
            let mut live = Vec::with_capacity(state.trims.len());
            state.trims.retain(|trim| match trim.upgrade() {
                Some(trim) => {
                    live.push(trim);
                    true
                }
                None => false,
            });
            live
        };
        for trim in trims {
            trim.trim(self);
            // A trim's `on_reclaim` may have dropped the `PerCid`'s last handle: then its
            // slots' values are dropped here, and their destructors may panic.
            contain("dropping a PerCid from its trim panicked", move || {
                drop(trim)
            });
        }
    }

    /// Asks the compaction work to run within a scan period (its trims pass what readers
    /// detached to `on_reclaim`).
    pub(crate) fn request_trim(&self) {
        self.work.touch();
    }

    /// Runs `f` with the current high water, under the space lock: no id at or above it
    /// is owned, and none can be taken until `f` returns. `f` must not run user code.
    pub(crate) fn at_high_water<R>(&self, f: impl FnOnce(usize) -> R) -> R {
        let state = lock(&self.state);
        f(state.ids.high_water())
    }

    /// The slow path of `enter()`: the thread owns no id, or its `cid` carries `MOVE`
    /// (its id was not below the number of ids held when that shrank). Called pinned, by
    /// a first-level `enter()`. Keeps the id, without the mark, if it is below the number
    /// held now, else moves to the lowest free id. Every new id goes to `own` as well as
    /// to `cid` (see `ThreadRec::own`), and the thread's slot cache is emptied (see
    /// `slots.rs`).
    #[cold]
    #[inline(never)]
    pub(super) fn acquire(&self, record: &ThreadRec) -> usize {
        // `own` may change here, or have been freed since the thread cached its slots.
        record.slots.clear();
        if self.in_forked_child() {
            // Nothing moves here; a mark from before the fork only needs stripping (no
            // other thread writes `cid` in the child: the lock is never taken).
            let current = record.cid.load(Ordering::Relaxed);
            if current != NO_ID {
                record.cid.store(current & !MOVE, Ordering::Relaxed);
                return current & !MOVE;
            }
            let id = self.child_id();
            record.own.store(id, Ordering::Relaxed);
            record.cid.store(id, Ordering::Relaxed);
            return id;
        }
        let mut state = lock(&self.state);
        let current = record.cid.load(Ordering::Relaxed);
        if current != NO_ID {
            let current = current & !MOVE;
            if current < state.ids.owned() {
                // Marked when `held` shrank, and it grew back since: keep the id.
                record.cid.store(current, Ordering::Relaxed);
                return current;
            }
            // Compaction at the event, as the 6.19 rewrite does at schedule-in.
            state.ids.release(current);
        }
        let id = state.ids.take_lowest();
        record.own.store(id, Ordering::Relaxed);
        record.cid.store(id, Ordering::Relaxed);
        self.publish(&state);
        drop(state);
        if current == NO_ID {
            self.work.touch();
        }
        id
    }

    /// One compaction scan: revokes the ids of threads that did not enter since the
    /// previous scan, then trims per-id storage above the new high water.
    fn scan(&self) -> Next {
        let mut state = lock(&self.state);
        self.revoke_idle(&mut state);
        shrink(&mut state.threads);
        state.ids.shrink();
        self.publish(&state);
        let held = state.ids.owned();
        drop(state);
        self.trim_all();
        // Nothing held: nothing can go idle or shrink, so park until the next acquire.
        if held == 0 { Next::Park } else { Next::Again }
    }

    pub(crate) fn register_trim(&self, trim: Weak<dyn Trim>) {
        if self.in_forked_child() {
            // Trims run in the scan, which does not run in the child.
            return;
        }
        let mut state = lock(&self.state);
        if state.trims.len() == state.trims.capacity() {
            // Before the list grows, forget the storages of dropped `PerCid`s: each `Weak`
            // keeps its allocation, and nothing else prunes while no scan or exit trims.
            state.trims.retain(|trim| trim.strong_count() > 0);
        }
        state.trims.push(trim);
    }

    pub(crate) fn high_water(&self) -> usize {
        self.high_water.load(Ordering::Relaxed)
    }
}

/// Gives back a list's spare capacity once it is mostly unused, so the space's memory
/// follows its live threads (a list sized for a peak of 64 threads shrinks when 4 are
/// left) without reallocating at every thread that comes and goes.
fn shrink<T>(list: &mut Vec<T>) {
    let floor = list.len().max(4);
    if list.capacity() >= 4 * floor {
        list.shrink_to(floor);
    }
}

//! `SpaceInner`, the state an [`IdSpace`](super::IdSpace) shares with its threads' records
//! and its `PerCid`s: the owned ids under the space's lock, entering it, and the
//! compaction scan.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::barrier;
use super::cpu_ids::TableCell;
use super::cpus::CpuCount;
use super::ids::IdSet;
use super::mode::IdMode;
use super::reach::{FORGOTTEN, ReachIndex, Reachable};
use super::record::{CPU_MODE, MOVE, NO_ID, ORPHANED, ThreadRec};
use super::retention::HighWaterHistory;
use crate::contain::contain;
use crate::sync::{AtomicUsize, Mutex, Ordering, lock};
use crate::{Next, Scheduler, Work};

/// A per-id storage that the scan trims above the high water (implemented by `PerCid`).
pub(crate) trait Trim: Send + Sync {
    /// Takes the values of slots at or above its threshold out (with
    /// [`SpaceInner::trim_locked`]), hands them to the reclaim callback and frees what it
    /// can. Called without the space lock.
    fn trim(&self, space: &SpaceInner) -> Leftover;

    /// The storage's entry in the space's index.
    fn reachable(&self) -> &Reachable;
}

/// What a trim of one storage left for a later scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leftover {
    /// Nothing above the high water.
    Nothing,
    /// Values above the high water kept for the storage's retention, the first of which
    /// may be taken at this time (the scheduler's clock, in nanoseconds).
    RetainedUntil(u64),
    /// A reader held the storage's gate: the trim is left to it. After its pass it
    /// detaches what it can and asks for a drain if anything was queued or kept
    /// (`request_drain`); the compaction work comes back a period later as well.
    Deferred,
    /// The trim ran inside this thread's own `on_reclaim` calls and left its values: a
    /// later trim takes them.
    Later,
}

/// What the trims of a scan left for later, together.
#[derive(Debug, Default, Clone, Copy)]
struct Pending {
    /// The earliest moment a slot kept for a retention may go.
    kept_until: Option<u64>,
    /// A trim must run again soon (`Leftover::Deferred`, `Leftover::Later`).
    again: bool,
}

impl Pending {
    fn add(&mut self, leftover: Leftover) {
        match leftover {
            Leftover::Nothing => {}
            Leftover::RetainedUntil(until) => {
                self.kept_until = Some(self.kept_until.map_or(until, |kept| kept.min(until)));
            }
            // Something past the threshold waits: the reader will do it after its pass,
            // and the next scan makes sure. (A storage whose slots are all kept for a
            // retention is never left to a reader: its trim needs no gate.)
            Leftover::Deferred | Leftover::Later => self.again = true,
        }
    }
}

pub(crate) struct SpaceState {
    pub(super) ids: IdSet,
    pub(super) threads: Vec<Arc<ThreadRec>>,
    /// The storages whose slots may hold values, by reach (`reach.rs`).
    reach: ReachIndex,
    /// The high water's recent drops, for storages with a retention (`retention.rs`).
    history: HighWaterHistory,
    /// Storages whose queue a reader filled, whatever their reach (`request_drain`).
    drains: Vec<Weak<dyn Trim>>,
    /// Per-thread or per-CPU ids (`mode.rs`).
    pub(super) mode: IdMode,
    /// Mode switches since the space was made.
    pub(super) switches: u64,
    /// The CPUs counted at the last scan that needed them (`cpus.rs`).
    pub(super) cpus: CpuCount,
    /// A count of CPUs a test set, in place of the machine's.
    pub(super) cpus_set: Option<usize>,
    /// When `cpus` was read from the machine (the space's clock), if it was.
    pub(super) cpus_read_at: Option<u64>,
    /// The per-CPU table's take counts at the previous scan (`cpu_ids.rs`).
    pub(super) lent_seen: Vec<usize>,
    /// Ids lent past the per-CPU table's size, held by guards now.
    pub(super) lent_past_table: usize,
}

/// The bounds of a trim, under the space lock: ids at or above `high_water` are owned by
/// nobody, a trim takes the values at or above `threshold` (no lower), and no slot at or
/// above `reach` was reached since the last trim, nor any array linked for one
/// (`reach.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Thresholds {
    pub(crate) high_water: usize,
    pub(crate) threshold: usize,
    pub(crate) reach: usize,
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
    /// The work that trims slots kept for a retention once it passes, while no id is held
    /// (the compaction work is parked then: `scan`); made by the first scan that needs
    /// it, so a space whose `PerCid`s keep nothing has one work only. Its closure holds a
    /// `Weak` to this space. (A std `OnceLock`: loom models set no retention.)
    retention_work: std::sync::OnceLock<Work>,
    /// I: this space, for the retention work's closure.
    me: Weak<SpaceInner>,
    /// The per-CPU mode's table of ids (`cpu_ids.rs`), made under the lock at the first
    /// switch to it and kept for the space's life.
    pub(super) cpu_ids: TableCell,
    /// I: the compaction work's period.
    period: Duration,
    /// I: the fork generation the space was made in: in a forked child its lock may have
    /// been held by a thread that is gone, so the child never takes it (see
    /// `in_forked_child`).
    fork_generation: u64,
    /// A (forked child only): ids handed out there, counted from the high water at the fork. A std
    /// atomic: it is never part of a loom model.
    child_ids: std::sync::atomic::AtomicUsize,
    /// A (stats): storages the trims visited, for tests that count a scan's work. A std
    /// atomic: it is not part of any modelled protocol.
    trim_visits: std::sync::atomic::AtomicU64,
    /// A (stats): slots the trims looked at. As `trim_visits`.
    trim_slots: std::sync::atomic::AtomicU64,
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
            let for_scan = weak.clone();
            let work = scheduler
                .every(period, move |cx| match for_scan.upgrade() {
                    Some(space) => space.scan(cx.scheduler()),
                    None => Next::Stop,
                })
                .named("nicework.cid-compaction")
                // A scan a little late only compacts a little later: it shares the other
                // works' wakeups within a quarter of its period.
                .leeway(period / 4);
            // Parked until the first id is taken.
            work.cancel();
            let me = weak.clone();
            SpaceInner {
                serial: next_serial(),
                state: Mutex::new(SpaceState {
                    ids: IdSet::default(),
                    threads: Vec::new(),
                    reach: ReachIndex::default(),
                    history: HighWaterHistory::default(),
                    drains: Vec::new(),
                    mode: IdMode::PerThread,
                    switches: 0,
                    cpus: CpuCount::plain(1),
                    cpus_set: None,
                    cpus_read_at: None,
                    lent_seen: Vec::new(),
                    lent_past_table: 0,
                }),
                held: AtomicUsize::new(0),
                high_water: AtomicUsize::new(0),
                threads: AtomicUsize::new(0),
                work,
                retention_work: std::sync::OnceLock::new(),
                me,
                cpu_ids: TableCell::new(),
                period,
                fork_generation: crate::fork::generation(),
                child_ids: std::sync::atomic::AtomicUsize::new(0),
                trim_visits: std::sync::atomic::AtomicU64::new(0),
                trim_slots: std::sync::atomic::AtomicU64::new(0),
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
    pub(super) fn publish(&self, state: &mut SpaceState) {
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
        let high_water = state.ids.high_water();
        // Written only under the lock, so this reads the last value published.
        let before = self.high_water.load(Ordering::Relaxed);
        if high_water < before && state.history.is_recording() {
            state.history.record_drop(self.now_ns(), before);
        }
        self.high_water.store(high_water, Ordering::Relaxed);
    }

    /// The space's clock: its scheduler's, in nanoseconds.
    pub(super) fn now_ns(&self) -> u64 {
        self.work.shared().now_ns()
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
        if id != NO_ID && id != CPU_MODE {
            state.ids.release(id & !MOVE);
            record.cid.store(NO_ID, Ordering::Relaxed);
        }
        state.threads.retain(|other| !Arc::ptr_eq(other, record));
        self.threads.store(state.threads.len(), Ordering::Relaxed);
        if let Some(table) = self.cpu_ids.get_locked() {
            // The threads that borrow (an orphan that owns an id never does); those that
            // hold an id now need no spare.
            let borrowing = state
                .threads
                .iter()
                .filter(|other| other.cid_locked() == CPU_MODE)
                .count();
            let lent_past_table = state.lent_past_table;
            table.fit_locked(&mut state.ids, borrowing, lent_past_table);
        }
        self.publish(&mut state);
        shrink(&mut state.threads);
        drop(state);
        // Something changed: let the compaction work trim storage above the high water.
        self.wake_scan();
        if self.work.scheduler_is_shut_down() {
            // Nothing scans any more: trim here, so memory still follows the threads.
            self.trim_all();
        }
    }

    /// Runs the trims of the storages whose slots may hold values above the high water
    /// (`reach.rs`), without the space lock (trims take it themselves, and run user
    /// callbacks). Returns what they left for later.
    fn trim_all(&self) -> Pending {
        let trims = {
            let mut state = lock(&self.state);
            let high_water = state.ids.high_water();
            let mut trims = state.reach.above(high_water);
            for drain in std::mem::take(&mut state.drains) {
                if let Some(trim) = drain.upgrade() {
                    trim.reachable()
                        .drain_requested
                        .store(false, Ordering::Relaxed);
                    trims.push(trim);
                }
            }
            // Oldest storage first, whatever the index's order (serial numbers differ from
            // run to run, and loom needs the same steps in the same order each time), and a
            // storage both above the high water and with values to drain only once.
            trims.sort_unstable_by_key(|trim| trim.reachable().serial);
            trims.dedup_by_key(|trim| trim.reachable().serial);
            trims
        };
        let mut pending = Pending::default();
        for trim in trims {
            self.trim_visits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            pending.add(trim.trim(self));
            // A trim's `on_reclaim` may have dropped the `PerCid`'s last handle: then its
            // slots' values are dropped here, and their destructors may panic.
            contain("dropping a PerCid from its trim panicked", move || {
                drop(trim)
            });
        }
        pending
    }

    /// Makes the compaction work run within a scan period: arms it if it is parked
    /// (a touch during its run is never lost either).
    fn wake_scan(&self) {
        self.work.touch();
    }

    /// Asks the compaction work to visit `storage` within a scan period, whatever its
    /// reach: a reader detached values into its queue, which the work's trim passes to
    /// `on_reclaim`.
    pub(crate) fn request_drain(&self, storage: &Reachable) {
        if self.in_forked_child() {
            return;
        }
        if !storage.drain_requested.swap(true, Ordering::Relaxed) {
            lock(&self.state).drains.push(storage.storage.clone());
        }
        self.wake_scan();
    }

    /// A trim of `storage`: runs `detach` under the space lock with the storage's
    /// threshold (the current high water, or with a retention the highest high water of
    /// the last retention: `retention.rs`). No id at or above the high water is owned, and
    /// none can be taken until `detach` returns; it must not run user code. It returns
    /// what it detached and the highest id between the high water and the threshold
    /// whose slot still holds a value, and the storage's reach is lowered to match.
    pub(crate) fn trim_locked<D>(
        &self,
        storage: &Reachable,
        detach: impl FnOnce(Thresholds) -> (D, Option<usize>),
    ) -> (D, Leftover) {
        let mut state = lock(&self.state);
        let (bounds, now, retention) = self.bounds(&mut state, storage);
        let Thresholds {
            high_water, reach, ..
        } = bounds;
        let (detached, highest_kept) = detach(bounds);
        // Every value at or above the threshold is gone; below the high water any slot
        // may hold one.
        let below = reach.min(high_water);
        let lowered = highest_kept.map_or(below, |id| (id + 1).max(below));
        if reach == FORGOTTEN {
            return (detached, Leftover::Nothing);
        }
        state.reach.move_to(storage, lowered);
        let leftover = self.kept(&state, now, retention, high_water, lowered);
        (detached, leftover)
    }

    /// Before a trim takes the gate: `Some` if it would take and free nothing, because
    /// every slot `storage` may hold lies below its threshold (kept for the retention),
    /// with what it keeps. Then a reader holding the gate does not defer the trim, and
    /// an idle space need not come back for it before the retention passes.
    ///
    /// `highest_kept(from, to)` returns the highest id in `from..to` whose slot holds a
    /// value or whose array starts there; it runs under the space lock, which keeps every
    /// linked array linked, and must not run user code. The reach is lowered to it, so a
    /// storage whose kept slots were emptied is not woken for.
    pub(crate) fn keeps_everything(
        &self,
        storage: &Reachable,
        highest_kept: impl FnOnce(usize, usize) -> Option<usize>,
    ) -> Option<Leftover> {
        if self.in_forked_child() {
            return None;
        }
        let mut state = lock(&self.state);
        let (bounds, now, retention) = self.bounds(&mut state, storage);
        let Thresholds {
            high_water,
            threshold,
            reach,
        } = bounds;
        if reach == FORGOTTEN || threshold < reach {
            return None;
        }
        if reach <= high_water {
            return Some(Leftover::Nothing);
        }
        // Ids from the high water up are owned by nobody: no owner reaches their slots
        // without raising the reach again, under this lock.
        let lowered = highest_kept(high_water, reach).map_or(high_water, |id| id + 1);
        state.reach.move_to(storage, lowered);
        Some(self.kept(&state, now, retention, high_water, lowered))
    }

    /// A trim's bounds for `storage` now, with the time and its retention.
    fn bounds(&self, state: &mut SpaceState, storage: &Reachable) -> (Thresholds, u64, u64) {
        let high_water = state.ids.high_water();
        let retention = storage.retention.load(Ordering::Relaxed);
        let now = if retention == 0 { 0 } else { self.now_ns() };
        let threshold = state.history.threshold(now, retention, high_water);
        let reach = storage.reach.load(Ordering::Relaxed);
        let bounds = Thresholds {
            high_water,
            threshold,
            reach,
        };
        (bounds, now, retention)
    }

    /// What a storage whose reach is `reach` keeps above the high water after a trim:
    /// nothing, or slots the first of which (its highest) may go at the returned time.
    fn kept(
        &self,
        state: &SpaceState,
        now: u64,
        retention: u64,
        high_water: usize,
        reach: usize,
    ) -> Leftover {
        if reach <= high_water {
            return Leftover::Nothing;
        }
        match state.history.when_below(now, retention, reach - 1) {
            Some(until) => Leftover::RetainedUntil(until),
            None => Leftover::Nothing,
        }
    }

    /// An owner of `id` is about to give its slot of `storage` a value: raises the
    /// storage's reach above `id`, so the trims visit the storage once `id` is above the
    /// high water (`reach.rs`). The caller pins `id`.
    #[cold]
    #[inline(never)]
    pub(crate) fn raise_reach(&self, storage: &Reachable, id: usize) {
        if self.in_forked_child() {
            // Nothing trims in the child, and its lock may be held by a vanished thread.
            return;
        }
        let mut state = lock(&self.state);
        if id >= storage.reach.load(Ordering::Relaxed) {
            state.reach.move_to(storage, id + 1);
        }
    }

    /// A `PerCid` is dropped: its storage leaves the index.
    pub(crate) fn forget_storage(&self, storage: &Reachable) {
        if self.in_forked_child() {
            return;
        }
        let mut state = lock(&self.state);
        let reach = storage.reach.load(Ordering::Relaxed);
        state.reach.remove(storage.serial, reach);
        storage.reach.store(FORGOTTEN, Ordering::Relaxed);
    }

    /// A `PerCid` of the space keeps its slots above the high water for `retention`
    /// nanoseconds before they are trimmed.
    pub(crate) fn set_retention(&self, storage: &Reachable, retention: u64) {
        if self.in_forked_child() {
            storage.retention.store(retention, Ordering::Relaxed);
            return;
        }
        let mut state = lock(&self.state);
        state.history.note_retention(retention);
        storage.retention.store(retention, Ordering::Relaxed);
    }

    /// Runs `f` with `storage`'s reach while no trim can unlink a slot array: under the
    /// space lock, or in a forked child (where nothing trims, and the reach is not kept:
    /// `f` gets `FORGOTTEN`, which bounds nothing) without it. `f` must not run user code.
    pub(crate) fn with_arrays_steady<R>(
        &self,
        storage: &Reachable,
        f: impl FnOnce(usize) -> R,
    ) -> R {
        if self.in_forked_child() {
            return f(FORGOTTEN);
        }
        let _state = lock(&self.state);
        f(storage.reach.load(Ordering::Relaxed))
    }

    /// The slow path of `enter()`: the thread owns no id, or its `cid` carries `MOVE`
    /// (its id was not below the number of ids held when that shrank, or the space
    /// switched to per-CPU mode), or the per-CPU table had no free id. Called pinned, by a
    /// first-level `enter()`. In per-CPU mode, borrows an id (`mode.rs`). Otherwise keeps
    /// the id, without the mark, if it is below the number held now, else moves to the
    /// lowest free id. Every new id goes to `own` as well as to `cid` (see
    /// `ThreadRec::own`), and the thread's slot cache is emptied (see `slots.rs`).
    #[cold]
    #[inline(never)]
    pub(super) fn acquire(&self, record: &ThreadRec) -> usize {
        // `own` may change here, or have been freed since the thread cached its slots.
        record.slots.clear();
        if self.in_forked_child() {
            // Nothing moves here; a mark from before the fork only needs stripping (no
            // other thread writes `cid` in the child: the lock is never taken). A thread
            // in per-CPU mode that found no free id in the table owns one from now on.
            let current = record.cid.load(Ordering::Relaxed);
            if current != NO_ID && current != CPU_MODE {
                record.cid.store(current & !MOVE, Ordering::Relaxed);
                return current & !MOVE;
            }
            let id = self.child_id();
            record.own.store(id, Ordering::Relaxed);
            record.lent_epoch.store(usize::MAX, Ordering::Relaxed);
            record.cid.store(id, Ordering::Relaxed);
            return id;
        }
        let mut state = lock(&self.state);
        let mut current = record.cid.load(Ordering::Relaxed);
        if state.mode == IdMode::PerCpu && record.pin.load(Ordering::Relaxed) & ORPHANED == 0 {
            let id = self.lend_locked(&mut state, record, current);
            self.publish(&mut state);
            drop(state);
            self.wake_scan();
            return id;
        }
        if current == CPU_MODE {
            // Switched back to per-thread mode since it read `cid`.
            current = NO_ID;
        }
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
        // The slot cache will hold this id's slots: no later borrow of the same number
        // from the per-CPU table may take them for its own (`mode.rs`, `lent`).
        record.lent_epoch.store(usize::MAX, Ordering::Relaxed);
        record.cid.store(id, Ordering::Relaxed);
        self.publish(&mut state);
        drop(state);
        if current == NO_ID {
            self.wake_scan();
        }
        id
    }

    /// One compaction scan: revokes the ids of threads that did not enter since the
    /// previous scan, then trims per-id storage above the new high water.
    fn scan(&self, scheduler: &Scheduler) -> Next {
        let mut state = lock(&self.state);
        let active = self.revoke_idle(&mut state);
        self.choose_mode(&mut state, active);
        shrink(&mut state.threads);
        state.ids.shrink();
        self.publish(&mut state);
        let held = state.ids.owned();
        drop(state);
        let pending = self.trim_all();
        if held > 0 || pending.again {
            return Next::Again;
        }
        // Nothing held: nothing can go idle or shrink, so park until the next acquire.
        // Slots kept for a retention are the retention work's, which sleeps until the
        // first of them can go: an idle space wakes once for it, not once a period.
        if let Some(until) = pending.kept_until {
            let retention_work = self.retention_work.get_or_init(|| {
                let me = self.me.clone();
                scheduler
                    .work(move |_| match me.upgrade() {
                        Some(space) => space.trim_retained(),
                        None => Next::Stop,
                    })
                    .named("nicework.cid-retention")
                    .leeway(self.period / 4)
            });
            retention_work.schedule_within(self.nanos_until(until));
        }
        Next::Park
    }

    /// The retention work's run: trims what is due, then sleeps until the next slot kept
    /// for a retention can go, unless ids are held (then the compaction work scans every
    /// period and trims it).
    fn trim_retained(&self) -> Next {
        let pending = self.trim_all();
        if self.held.load(Ordering::Relaxed) > 0 {
            return Next::Park;
        }
        if pending.again {
            return Next::After(self.period);
        }
        match pending.kept_until {
            Some(until) => Next::After(self.nanos_until(until)),
            None => Next::Park,
        }
    }

    /// The time from now to `until` on the space's clock.
    fn nanos_until(&self, until: u64) -> Duration {
        Duration::from_nanos(until.saturating_sub(self.now_ns()))
    }

    /// Storages and slots the trims visited since the space was made.
    pub(crate) fn trim_visits(&self) -> (u64, u64) {
        (
            self.trim_visits.load(std::sync::atomic::Ordering::Relaxed),
            self.trim_slots.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// A trim looked at `slots` slots.
    pub(crate) fn count_trim_slots(&self, slots: usize) {
        self.trim_slots
            .fetch_add(slots as u64, std::sync::atomic::Ordering::Relaxed);
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

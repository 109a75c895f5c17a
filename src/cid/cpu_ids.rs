//! The per-CPU mode's ids: [`CpuIds`], a table of ids that the space owns and lends to
//! one outermost guard at a time, starting from the id of the CPU the guard's thread runs
//! on (the kernel 6.19's per-CPU cids, where user space cannot see preemption).
//!
//! # An entry
//!
//! Entry `i` is id `i`. Its word holds `HELD` (a guard holds the id), `RESERVED` (the
//! space owns the id in its bitmap for the table) and, above them, a count of the times
//! it was taken (wrapping), which the scan reads to see which ids were used lately.
//!
//! - **Take** (lock-free, any thread): a compare-and-swap from reserved and not held to
//!   held, with the count one higher. Acquire: what the previous holder wrote under the
//!   id (its `PerCid` slots) happens-before the new holder's use. A guard tries its CPU's
//!   id first, then the lowest reserved id that no guard holds: the spares in use are the
//!   lowest ones, so the ids held follow the number of guards alive beyond the CPUs.
//! - **Release** (the holder only, at its guard's drop): a load and a release store
//!   without `HELD`. Nobody else writes a held entry: takers and the scan only swap from
//!   values without `HELD`.
//! - **Reserve** (under the space lock): when no reserved id is free, the space takes a
//!   free id of the bitmap for the table, the lowest (as the kernel gives a CPU the lowest
//!   free cid), the CPU's threads try it first from then on, and the guard holds it
//!   at once. Beyond the table, the guard gets an id of the bitmap for its length alone
//!   (`SpaceInner::lend_id`).
//! - **Unreserve** (the scan, under the space lock): a reserved id that no guard holds
//!   and nobody took since the previous scan (in per-thread mode: any that no guard
//!   holds) goes back to the bitmap, by a compare-and-swap that fails if a taker got in
//!   first. So an id used by a guard preempted once stays reserved for one to two scan
//!   periods and is then freed: the ids held follow the CPUs plus the guards alive beyond
//!   them lately (promise 11).
//!
//! # The owners' slot cache
//!
//! A thread caches the `PerCid` slots of the last id it took (`slots.rs`). The cache is
//! valid while the id stayed owned since it was filled: the table's `epoch` counts the
//! unreserves, and a taker that finds another id than its last, or another epoch, empties
//! its cache. An unreserve bumps the epoch under the space lock before it releases the id,
//! and the id is reserved again under that lock before a taker's acquire swap can see it
//! reserved, so a taker of a re-reserved id reads the new epoch.

use super::cpus::CpuCount;
use super::ids::IdSet;
use crate::sync::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

/// A guard holds the id.
const HELD: usize = 1;
/// The space owns the id for the table.
const RESERVED: usize = 2;
/// One take, in the count above the flags.
const TAKE_ONE: usize = 4;

/// One id of the table, alone on its cache line: neighbouring ids are held by threads on
/// other CPUs.
#[derive(Debug)]
#[repr(align(128))]
struct Entry {
    /// A: `HELD`, `RESERVED` and the take count (see the module docs).
    word: AtomicUsize,
}

/// The per-CPU mode's table of ids. Tags as in `space.rs`.
#[derive(Debug)]
pub(crate) struct CpuIds {
    /// A: one entry per id below the table's size.
    entries: Box<[Entry]>,
    /// A (any taker, relaxed: a hint): for each CPU number (modulo the length), the id its
    /// threads took last, which they try first; at first, the CPU's position among the
    /// allowed CPUs.
    homes: Box<[AtomicU32]>,
    /// A (written under the space lock): one past the highest reserved entry.
    top: AtomicUsize,
    /// A (written under the space lock): the number of unreserves, for the owners' slot
    /// caches.
    epoch: AtomicUsize,
}

impl CpuIds {
    /// A table for `count`: room for twice the CPUs the machine has (and at least 16), so
    /// that a guard preempted on each CPU still leaves a spare without the lock.
    pub(crate) fn new(count: &CpuCount, machine_cpus: usize) -> CpuIds {
        let size = (2 * machine_cpus.max(count.cpus)).max(16);
        CpuIds {
            entries: (0..size)
                .map(|_| Entry {
                    word: AtomicUsize::new(0),
                })
                .collect(),
            homes: (0..count.positions.len().max(machine_cpus).max(1))
                .map(|cpu| AtomicU32::new(count.home(cpu) as u32))
                .collect(),
            top: AtomicUsize::new(0),
            epoch: AtomicUsize::new(0),
        }
    }

    /// The table's size: ids from it up are lent by the bitmap alone.
    #[inline]
    pub(crate) fn size(&self) -> usize {
        self.entries.len()
    }

    /// The id a thread on `cpu` tries first: the one the CPU's threads took last (at
    /// first, the CPU's position among the allowed ones). Below the table's size.
    #[inline]
    fn home(&self, cpu: usize) -> (usize, &AtomicU32) {
        let slot = &self.homes[if cpu < self.homes.len() {
            cpu
        } else {
            cpu % self.homes.len()
        }];
        let home = slot.load(Ordering::Relaxed) as usize;
        // A compare, not a division, on the straight line.
        (if home < self.size() { home } else { 0 }, slot)
    }

    /// Takes a reserved id that no guard holds, lock-free: `cpu`'s id, or if it is held or
    /// not reserved, the lowest. `None` if no reserved id is free (the lock path reserves
    /// one). Returns the id and the epoch (see the module
    /// docs).
    #[inline]
    pub(crate) fn take(&self, cpu: usize) -> Option<(usize, usize)> {
        let (home, slot) = self.home(cpu);
        let word = self.entries[home].word.load(Ordering::Relaxed);
        if word & (RESERVED | HELD) == RESERVED && self.try_take_word(home, word) {
            return Some((home, self.epoch.load(Ordering::Relaxed)));
        }
        self.take_spare(home, slot)
    }

    /// `take` once the CPU's last id was held or not reserved: the lowest reserved id that
    /// no guard holds, so that the spares in use at any moment are the lowest ones and the ids held
    /// follow the guards alive beyond the CPUs, not the CPUs they ran on.
    #[cold]
    #[inline(never)]
    fn take_spare(&self, home: usize, slot: &AtomicU32) -> Option<(usize, usize)> {
        let top = self.top.load(Ordering::Relaxed).min(self.size());
        let id = (0..top).find(|&id| id != home && self.try_take(id))?;
        if id < home {
            // The CPU's threads try this lower one first from now on: a CPU's id only
            // moves down, so the ids in use stay the lowest (a higher spare is for this
            // guard alone, and goes back once unused for a scan period).
            slot.store(id as u32, Ordering::Relaxed);
        }
        Some((id, self.epoch.load(Ordering::Relaxed)))
    }

    /// Takes entry `id` if it is reserved and not held.
    #[inline]
    fn try_take(&self, id: usize) -> bool {
        let word = self.entries[id].word.load(Ordering::Relaxed);
        word & (RESERVED | HELD) == RESERVED && self.try_take_word(id, word)
    }

    /// Takes entry `id`, whose word read `word` (reserved, not held), unless it changed.
    #[inline(always)]
    fn try_take_word(&self, id: usize, word: usize) -> bool {
        self.entries[id]
            .word
            .compare_exchange(
                word,
                word.wrapping_add(TAKE_ONE) | HELD,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The holder of `id`, below the table's size, lets it go.
    #[inline]
    pub(crate) fn release(&self, id: usize) {
        let entry = &self.entries[id];
        let word = entry.word.load(Ordering::Relaxed);
        debug_assert!(word & HELD != 0, "releasing an id no guard holds");
        // Release: what the holder wrote under the id happens-before the next taker's
        // acquire swap, and the scan's unreserve.
        entry.word.store(word & !HELD, Ordering::Release);
    }

    /// Under the space lock, when `take` found nothing: reserves a free id of `ids` for
    /// the table, `cpu`'s own id if it is free, else the lowest free one, held by the
    /// caller. `None` if every id of the table is owned. Returns the id and the epoch.
    pub(crate) fn reserve_locked(&self, ids: &mut IdSet, cpu: usize) -> Option<(usize, usize)> {
        let (_, slot) = self.home(cpu);
        let id = ids.take_lowest();
        if id >= self.size() {
            ids.release(id);
            return None;
        }
        slot.store(id as u32, Ordering::Relaxed);
        let entry = &self.entries[id];
        let word = entry.word.load(Ordering::Relaxed);
        debug_assert!(word & (RESERVED | HELD) == 0, "reserving a reserved id");
        // Relaxed: no other thread swaps an entry that is not reserved; the holder's
        // release store publishes it to the next taker.
        entry.word.store(
            word.wrapping_add(TAKE_ONE) | RESERVED | HELD,
            Ordering::Relaxed,
        );
        if id >= self.top.load(Ordering::Relaxed) {
            self.top.store(id + 1, Ordering::Relaxed);
        }
        Some((id, self.epoch.load(Ordering::Relaxed)))
    }

    /// Under the space lock, at a scan: gives back to `ids` the reserved ids that no guard
    /// holds and nobody took since the previous scan (`seen` keeps the take counts the
    /// scan saw), or, with `everything`, all that no guard holds; then those that no guard
    /// holds and are not below the number of ids owned (compaction: the guards that
    /// need them reserve lower ones). Returns how many are still reserved.
    pub(crate) fn unreserve_locked(
        &self,
        ids: &mut IdSet,
        seen: &mut Vec<usize>,
        everything: bool,
    ) -> usize {
        let top = self.top.load(Ordering::Relaxed);
        seen.resize(top.max(seen.len()), 0);
        let (mut reserved, mut new_top) = (0, 0);
        for (id, entry) in self.entries[..top].iter().enumerate() {
            let word = entry.word.load(Ordering::Acquire);
            if word & RESERVED == 0 {
                continue;
            }
            let takes = word / TAKE_ONE;
            let unused = word & HELD == 0 && (everything || takes == seen[id]);
            seen[id] = takes;
            if !(unused && self.unreserve(id, word, ids)) {
                reserved += 1;
                new_top = id + 1;
            }
        }
        let owned = ids.owned();
        for (id, entry) in self.entries[..new_top].iter().enumerate().skip(owned) {
            let word = entry.word.load(Ordering::Acquire);
            if word & (RESERVED | HELD) == RESERVED && self.unreserve(id, word, ids) {
                reserved -= 1;
            }
        }
        seen.truncate(self.lower_top(new_top));
        reserved
    }

    /// Under the space lock: sets `top` to one past the highest reserved entry below
    /// `below` (none is reserved from there up), and returns it.
    fn lower_top(&self, below: usize) -> usize {
        let top = self.entries[..below]
            .iter()
            .rposition(|entry| entry.word.load(Ordering::Relaxed) & RESERVED != 0)
            .map_or(0, |id| id + 1);
        self.top.store(top, Ordering::Relaxed);
        top
    }

    /// Under the space lock, when a thread leaves the space: gives back reserved ids that
    /// no guard holds, the highest first, until no more are free than the threads left
    /// that may borrow one next (`borrowing` threads borrow, and those that hold an id of
    /// the table or one of the `lent_past_table` need none now), so that the ids held
    /// never exceed the threads (as the kernel's `mm_cid` stays below them) and the last
    /// thread's exit leaves none but those of guards still alive.
    pub(crate) fn fit_locked(&self, ids: &mut IdSet, borrowing: usize, lent_past_table: usize) {
        let top = self.top.load(Ordering::Relaxed);
        let (mut free, mut held) = (0, 0);
        for entry in &self.entries[..top] {
            match entry.word.load(Ordering::Relaxed) & (RESERVED | HELD) {
                RESERVED => free += 1,
                word if word == RESERVED | HELD => held += 1,
                _ => {}
            }
        }
        let borrowers = borrowing.saturating_sub(held + lent_past_table);
        for id in (0..top).rev() {
            if free <= borrowers {
                break;
            }
            let word = self.entries[id].word.load(Ordering::Acquire);
            if word & (RESERVED | HELD) == RESERVED && self.unreserve(id, word, ids) {
                free -= 1;
            }
        }
        self.lower_top(top);
    }

    /// Under the space lock: gives entry `id`, whose word read `word` (reserved, not
    /// held), back to `ids`; `false` if a taker got in first.
    fn unreserve(&self, id: usize, word: usize, ids: &mut IdSet) -> bool {
        // Before the id is free: a taker of it, once reserved again, reads the new epoch
        // (see the module docs).
        self.epoch.store(
            self.epoch.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
        // AcqRel: the last holder's writes happen-before the trims of the id's slots; a
        // taker that got in first makes this fail.
        let unreserved = self.entries[id]
            .word
            .compare_exchange(word, word & !RESERVED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if unreserved {
            ids.release(id);
        }
        unreserved
    }

    /// Under the space lock: whether entry `id` is reserved (for `IdSpace::held`'s checks).
    #[cfg(test)]
    fn is_reserved(&self, id: usize) -> bool {
        self.entries[id].word.load(Ordering::Relaxed) & RESERVED != 0
    }
}

/// A space's table, made at the first switch to per-CPU mode and kept for the space's
/// life (a thread that read `CPU_MODE` may borrow from it after a switch back). Made and
/// published under the space lock; read without it by borrowers, which must see it whole:
/// a release store and acquire loads, which loom follows too.
#[derive(Debug)]
pub(crate) struct TableCell {
    /// A: null until the first switch, then a `Box<CpuIds>`'s pointer, never changed.
    table: AtomicPtr<CpuIds>,
}

impl TableCell {
    pub(crate) fn new() -> TableCell {
        TableCell {
            table: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The table, if a switch made it.
    #[inline(always)]
    pub(crate) fn get(&self) -> Option<&CpuIds> {
        let table = self.table.load(Ordering::Acquire);
        // SAFETY: a non-null pointer is a `Box<CpuIds>` made by `get_or_make_locked`, freed
        // only by this cell's drop, which `&self` excludes.
        unsafe { table.as_ref() }
    }

    /// The table, if a switch made it, for a caller that holds the space lock (under which
    /// the table is made): the lock orders the read, so it adds no step to a loom model.
    pub(crate) fn get_locked(&self) -> Option<&CpuIds> {
        // SAFETY (loom's `unsync_load`): the only store happens under the space lock, which
        // the caller holds, so none is concurrent with this load.
        #[cfg(all(loom, feature = "loom"))]
        let table = unsafe { self.table.unsync_load() };
        #[cfg(not(all(loom, feature = "loom")))]
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: as in `get`.
        unsafe { table.as_ref() }
    }

    /// The table, made by `make` if there is none. The caller holds the space lock, so
    /// no other maker runs at once.
    pub(crate) fn get_or_make_locked(&self, make: impl FnOnce() -> CpuIds) -> &CpuIds {
        if let Some(table) = self.get_locked() {
            return table;
        }
        let table = Box::into_raw(Box::new(make()));
        // Release: a borrower that loads the pointer sees the table's words as made.
        self.table.store(table, Ordering::Release);
        // SAFETY: just made from a `Box`, freed only by this cell's drop.
        unsafe { &*table }
    }
}

impl Drop for TableCell {
    fn drop(&mut self) {
        let table = self.table.load(Ordering::Acquire);
        if !table.is_null() {
            // SAFETY: made by `Box::into_raw` in `get_or_make_locked`, and this is the
            // cell's only drop; no borrower is left (they borrow the space).
            drop(unsafe { Box::from_raw(table) });
        }
    }
}

#[cfg(all(test, not(all(loom, feature = "loom"))))]
mod tests {
    use super::*;

    fn table(cpus: usize) -> CpuIds {
        CpuIds::new(&CpuCount::plain(cpus), cpus)
    }

    #[test]
    fn a_cpu_takes_the_id_its_threads_took_last_then_the_lowest() {
        let (table, mut ids) = (table(2), IdSet::default());
        assert_eq!(table.take(1), None, "nothing reserved yet");
        // Reserved lowest first, whichever CPU asks: dense.
        assert_eq!(table.reserve_locked(&mut ids, 1), Some((0, 0)));
        assert_eq!(table.reserve_locked(&mut ids, 0), Some((1, 0)));
        assert_eq!(table.reserve_locked(&mut ids, 1), Some((2, 0)));
        for id in 0..3 {
            table.release(id);
        }
        assert_eq!(table.take(1), Some((2, 0)), "CPU 1's last id");
        assert_eq!(table.take(1), Some((0, 0)), "then the lowest");
        assert_eq!(table.take(0), Some((1, 0)), "CPU 0's last id");
        assert_eq!(table.take(0), None);
        table.release(0);
        assert_eq!(table.take(1), Some((0, 0)), "CPU 1's last is now 0");
        assert_eq!(ids.owned(), 3);
    }

    #[test]
    fn ids_idle_for_a_scan_go_back_held_ones_stay() {
        let (table, mut ids, mut seen) = (table(2), IdSet::default(), Vec::new());
        for cpu in [0, 1, 0] {
            table.reserve_locked(&mut ids, cpu).unwrap();
        }
        table.release(0);
        table.release(2);
        // First look: everything was taken since (the scan had seen nothing).
        assert_eq!(table.unreserve_locked(&mut ids, &mut seen, false), 3);
        assert_eq!(table.take(0), Some((2, 0)), "CPU 0's last id");
        table.release(2);
        // Second: id 0 idle for a whole scan goes; then 2, free and not below the ids
        // still held (compaction); 1 is held.
        assert_eq!(table.unreserve_locked(&mut ids, &mut seen, false), 1);
        assert!(!table.is_reserved(0) && !table.is_reserved(2));
        assert_eq!(ids.owned(), 1);
        assert_eq!(table.take(0), None, "its last id went, and 1 is held");
        table.release(1);
        assert_eq!(table.take(0), Some((1, 2)), "the epoch moved");
        table.release(1);
        assert_eq!(table.unreserve_locked(&mut ids, &mut seen, true), 0);
        assert_eq!((ids.owned(), table.top.load(Ordering::Relaxed)), (0, 0));
    }

    #[test]
    fn cpus_past_the_table_start_within_it() {
        let (mut ids, machine) = (IdSet::default(), 1);
        let table = CpuIds::new(&CpuCount::plain(1_000), machine);
        for cpu in [0, 15, 16, 17, 999, 5_000] {
            let (id, _) = table
                .reserve_locked(&mut ids, cpu)
                .expect("an id of the table");
            assert!(id < table.size());
            table.release(id);
            let (id, _) = table.take(cpu).expect("the id just given back");
            assert!(id < table.size());
            table.release(id);
        }
    }

    #[test]
    fn past_the_table_the_bitmap_is_left_to_the_caller() {
        let (table, mut ids) = (table(1), IdSet::default());
        for expected in 0..table.size() {
            assert_eq!(
                table.reserve_locked(&mut ids, 0).map(|(id, _)| id),
                Some(expected)
            );
        }
        assert_eq!(table.reserve_locked(&mut ids, 0), None);
        assert_eq!(ids.owned(), table.size());
    }
}

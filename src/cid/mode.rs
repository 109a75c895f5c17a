//! The space's two modes and the switch between them: per-thread ids while threads are
//! few, per-CPU ids once they outnumber the CPUs (the kernel 6.19 `mm_cid` policy).
//!
//! # The policy
//!
//! At each scan, under the space lock, the scan counts the threads active since the
//! previous one (they entered, or are pinned) and, once two are, the CPUs the process may
//! run on (`cpus.rs`; read again at most once a second, since reading costs tens of
//! microseconds), and [`next_mode`] decides, with the kernel's hysteresis: per-CPU once the
//! active threads exceed the CPUs by a quarter (`cpus + cpus / 4`), per-thread again once
//! they are fewer than three quarters of them (`cpus - cpus / 4`). A count that hovers at
//! one threshold does not flip the mode at every scan.
//!
//! # Per-CPU mode
//!
//! A thread's `cid` reads `CPU_MODE` (it owns no id), which the fast path's one compare
//! already sends off the straight line. Its first-level `enter()` then borrows an id of
//! the space's table (`cpu_ids.rs`) with one compare-and-swap, its CPU's id first (the
//! one the CPU's threads took last; a CPU gets the lowest free id when it needs one, as
//! the kernel's per-CPU cids are), and
//! sets `LENT` in its pin word; nested guards return that id (`own`) as in per-thread
//! mode; the drop of the outermost guard sees `LENT` and gives the id back. A guard
//! preempted inside keeps its id, and the others take a spare: the ids held are bounded by
//! the CPUs plus the guards alive beyond them (promise 11). When no reserved id is free,
//! the lock path reserves the lowest (`lend_locked`), or past the table lends an id of the bitmap
//! for the guard's length alone.
//!
//! # The switch
//!
//! Both directions run under the space lock, at a scan, and free nothing by themselves,
//! so a thread held inside `with` keeps its id across either:
//!
//! - **To per-CPU**: each record without an id gets `CPU_MODE`; each record with one gets
//!   `MOVE` over it, the mark that compaction already uses. A marked id is never used
//!   without the lock, so a thread pinned on its id keeps it, and its next first-level
//!   `enter()` takes the lock path (`acquire`), which frees the id and borrows one of the
//!   table. Threads that do not enter again lose their ids to the scan's revoke, as idle
//!   threads always do. That is the transit state the kernel's task→CPU switch lacked at
//!   first: a thread is in exactly one of "owns an id" (marked), "owns none" and
//!   "borrows per guard", and only the lock moves it between them.
//! - **To per-thread**: each record with `CPU_MODE` gets `NO_ID`, so its next `enter()`
//!   takes an id under the lock. A thread that read `CPU_MODE` before the switch may still
//!   borrow from the table once; the table's ids are given back by the scans as their
//!   guards drop (in per-thread mode, every id no guard holds).
//!
//! A thread made visible to the space (its record added, under the lock) after a switch
//! reads `NO_ID` and takes the lock path, where the mode is read; one added before it is
//! among the records the switch rewrites. No thread is counted, or given an id, before the
//! space can see it (the kernel's stall with concurrent forks).
//!
//! In a `fork()`ed child the lock is never taken: the table's free ids are still borrowed
//! without it, and a thread that finds none takes a fresh id of its own, as every thread
//! of a child does (`SpaceInner::in_forked_child`).

use std::ptr::NonNull;

use super::cpu_ids::CpuIds;
use super::cpus::{self, CpuCount};
use super::record::{CPU_MODE, LENT, MOVE, NO_ID, ORPHANED, PINS, ThreadRec};
use super::space::{SpaceInner, SpaceState};
use crate::sync::{Ordering, lock};

/// How often a scan reads the CPUs again, at most (nanoseconds).
const RECOUNT_NS: u64 = 1_000_000_000;

/// How a space's threads get their ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdMode {
    /// Each thread owns an id between its guards (threads are few).
    PerThread,
    /// Each outermost guard borrows an id, its CPU's first (threads outnumber the CPUs).
    PerCpu,
}

/// The kernel 6.19 policy: the mode after a scan that saw `active` threads and counted
/// `cpus` CPUs, in `mode` before it.
pub(crate) fn next_mode(mode: IdMode, active: usize, cpus: usize) -> IdMode {
    let margin = cpus / 4;
    match mode {
        IdMode::PerThread if active > cpus + margin => IdMode::PerCpu,
        IdMode::PerCpu if active < cpus - margin => IdMode::PerThread,
        mode => mode,
    }
}

/// The number a thread starts from in the per-CPU table: its CPU's, or where the OS does not
/// say, one of its own (its record's address), so that each thread still starts from one id.
#[inline]
fn cpu_hint(record: &ThreadRec) -> usize {
    cpus::current().unwrap_or(record as *const ThreadRec as usize / 64)
}

impl SpaceInner {
    /// A first-level `enter()` of a thread in per-CPU mode (`cid` reads `CPU_MODE`):
    /// borrows an id of the table without the lock, or takes the lock path. Called pinned.
    #[inline(never)]
    pub(super) fn lend_id(&self, record: &ThreadRec) -> usize {
        if let Some(table) = self.table_seen_by(record) {
            if let Some((id, epoch)) = table.take(cpu_hint(record)) {
                lent(record, id, epoch);
                return id;
            }
        }
        self.acquire(record)
    }

    /// The space's table, as `record`'s thread saw it: once seen, from the record (a load
    /// of the thread's own line, and no shared load that a loom model would have to
    /// interleave at every borrow and give-back); the table never changes once made.
    #[inline(always)]
    fn table_seen_by(&self, record: &ThreadRec) -> Option<&CpuIds> {
        let seen = record.table.load(std::sync::atomic::Ordering::Relaxed);
        if !seen.is_null() {
            // SAFETY: `seen` is this space's table (a record belongs to one space), which
            // lives as long as the space, and `&self` borrows the space.
            return Some(unsafe { &*seen });
        }
        let table = self.cpu_ids.get()?;
        record.table.store(
            table as *const CpuIds as *mut CpuIds,
            std::sync::atomic::Ordering::Relaxed,
        );
        Some(table)
    }

    /// `acquire` under the lock in per-CPU mode, for a record that is not an orphan (an
    /// orphan keeps owning an id till its last guard drops): frees the id the thread owns,
    /// if any, and borrows one (see the module docs). `current` is the record's `cid`.
    pub(super) fn lend_locked(
        &self,
        state: &mut SpaceState,
        record: &ThreadRec,
        current: usize,
    ) -> usize {
        if current != NO_ID && current != CPU_MODE {
            // Its first-level enter: no guard of the thread uses the id.
            state.ids.release(current & !MOVE);
        }
        record.cid.store(CPU_MODE, Ordering::Relaxed);
        let table = self.cpu_ids.get_or_make_locked(|| state.make_cpu_table());
        record.table.store(
            table as *const CpuIds as *mut CpuIds,
            std::sync::atomic::Ordering::Relaxed,
        );
        let cpu = cpu_hint(record);
        let (id, epoch) = table
            .take(cpu)
            .or_else(|| table.reserve_locked(&mut state.ids, cpu))
            // Past the table: an id of the bitmap for this guard alone.
            .unwrap_or_else(|| {
                state.lent_past_table += 1;
                (state.ids.take_lowest(), usize::MAX)
            });
        lent(record, id, epoch);
        id
    }

    /// The drop of a thread's last guard left `left` in its pin word, with `LENT` or
    /// `ORPHANED` set: gives the borrowed id `id` back, then releases an orphan. The drop
    /// of a guard that borrowed an id of the table, the per-CPU mode's straight line, is
    /// a load and two stores here; the rest is out of line. Itself out of line, so that
    /// the drop of a guard, which per-thread mode inlines everywhere, stays as small as the
    /// one compare that leads here.
    #[inline(never)]
    pub(super) fn drop_last_flagged(&self, record: NonNull<ThreadRec>, left: usize, id: usize) {
        if left & PINS == LENT {
            // SAFETY: as in `Cid::drop`: the record lives until its last guard's drop
            // ends (this one).
            if let Some(table) = self.table_seen_by(unsafe { record.as_ref() }) {
                if id < table.size() {
                    table.release(id);
                    // SAFETY: as in `Cid::drop`: the record lives until its last guard's
                    // drop ends (this one), and only its thread writes `pin`.
                    unsafe { record.as_ref() }
                        .pin
                        .store(left & !LENT, Ordering::Relaxed);
                    return;
                }
            }
        }
        self.drop_last_flagged_slow(record, left, id);
    }

    /// `drop_last_flagged` off its straight line: an id lent past the table, or an orphan.
    #[cold]
    #[inline(never)]
    fn drop_last_flagged_slow(&self, record: NonNull<ThreadRec>, left: usize, id: usize) {
        if left & LENT != 0 {
            // SAFETY: as in `drop_last_flagged`.
            self.give_back_lent(unsafe { record.as_ref() }, id);
            // SAFETY: as in `drop_last_flagged`.
            unsafe { record.as_ref() }
                .pin
                .store(left & !LENT, Ordering::Relaxed);
        }
        if left & PINS & !LENT == ORPHANED {
            self.release_orphan(record);
        }
    }

    /// The outermost guard of `record`'s thread that borrowed `id` (per-CPU mode) drops.
    fn give_back_lent(&self, record: &ThreadRec, id: usize) {
        let table = self
            .table_seen_by(record)
            .expect("an id was lent, so the table exists");
        if id < table.size() {
            table.release(id);
        } else if !self.in_forked_child() {
            let mut state = lock(&self.state);
            state.ids.release(id);
            state.lent_past_table -= 1;
            self.publish(&mut state);
        }
    }

    /// At a scan, under the lock: counts the CPUs, picks the mode for `active` threads
    /// (switching if it changes), and gives back the table's ids that went idle.
    pub(super) fn choose_mode(&self, state: &mut SpaceState, active: usize) {
        // One thread never makes a switch, whatever the count: skip reading it.
        if active >= 2 || state.mode == IdMode::PerCpu {
            state.count_cpus(self.now_ns());
            let next = next_mode(state.mode, active, state.cpus.cpus);
            if next != state.mode {
                self.switch_locked(state, next);
            }
        }
        if let Some(table) = self.cpu_ids.get_locked() {
            let everything = state.mode == IdMode::PerThread;
            table.unreserve_locked(&mut state.ids, &mut state.lent_seen, everything);
        }
    }

    /// Switches to `to`, under the lock (see the module docs).
    pub(super) fn switch_locked(&self, state: &mut SpaceState, to: IdMode) {
        state.mode = to;
        state.switches += 1;
        if to == IdMode::PerCpu {
            self.cpu_ids.get_or_make_locked(|| state.make_cpu_table());
        }
        for record in &state.threads {
            let cid = record.cid_locked();
            // (An orphan made late, with no id yet, may get `CPU_MODE` too: `acquire`
            // gives an orphan an id of its own whatever its `cid` says.)
            let switched = match to {
                IdMode::PerCpu if cid == NO_ID => CPU_MODE,
                IdMode::PerCpu if cid < MOVE => cid | MOVE,
                IdMode::PerThread if cid == CPU_MODE => NO_ID,
                _ => continue,
            };
            record.cid.store(switched, Ordering::Relaxed);
        }
    }
}

impl SpaceInner {
    /// Counts `cpus` CPUs from the next scan on, in place of the machine's (`None`: the
    /// machine's again).
    pub(crate) fn count_cpus_as(&self, cpus: Option<usize>) {
        lock(&self.state).cpus_set = cpus.map(|cpus| cpus.max(1));
    }

    /// Switches to per-CPU mode (`true`) or per-thread mode now, as a scan that decided so
    /// would, for tests that place a switch at a chosen point. A no-op if the space is in
    /// that mode already, or in a forked child.
    pub(crate) fn switch_mode_now(&self, per_cpu: bool) {
        if self.in_forked_child() {
            return;
        }
        let to = if per_cpu {
            IdMode::PerCpu
        } else {
            IdMode::PerThread
        };
        let mut state = lock(&self.state);
        if state.mode != to {
            self.switch_locked(&mut state, to);
        }
    }

    /// Whether the space is in per-CPU mode, and how many times it switched.
    pub(crate) fn mode(&self) -> (bool, u64) {
        let state = lock(&self.state);
        (state.mode == IdMode::PerCpu, state.switches)
    }
}

impl SpaceState {
    /// Reads the CPUs counted (`cpus.rs`), or the count a test set.
    fn count_cpus(&mut self, now: u64) {
        match self.cpus_set {
            Some(cpus) => self.cpus = CpuCount::plain(cpus),
            // Reading takes tens of microseconds (cgroup files): at most once a second, so
            // a space scanning every 10 ms does not spend its scans on it.
            None if self
                .cpus_read_at
                .is_none_or(|at| now.saturating_sub(at) >= RECOUNT_NS) =>
            {
                self.cpus = CpuCount::read();
                self.cpus_read_at = Some(now);
            }
            None => {}
        }
    }

    /// The per-CPU table, made at the first switch to per-CPU mode.
    fn make_cpu_table(&self) -> CpuIds {
        CpuIds::new(&self.cpus, cpus::machine_cpus())
    }
}

/// `record`'s thread borrowed `id` in the table's `epoch` (`usize::MAX` past the table):
/// its outermost guard gives it back (`LENT`), its nested guards return it (`own`), and
/// its slot cache is emptied unless it holds the slots of this very id, owned without a
/// break since (`cpu_ids.rs`).
#[inline]
fn lent(record: &ThreadRec, id: usize, epoch: usize) {
    let pin = record.pin.load(Ordering::Relaxed);
    record.pin.store(pin | LENT, Ordering::Relaxed);
    if id != record.own.load(Ordering::Relaxed)
        || epoch != record.lent_epoch.load(Ordering::Relaxed)
        || epoch == usize::MAX
    {
        record.slots.clear();
        record.own.store(id, Ordering::Relaxed);
        record.lent_epoch.store(epoch, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_thresholds_with_hysteresis() {
        use IdMode::{PerCpu, PerThread};
        // 2 CPUs: per-CPU from 3 threads, back at 1.
        assert_eq!(next_mode(PerThread, 2, 2), PerThread);
        assert_eq!(next_mode(PerThread, 3, 2), PerCpu);
        assert_eq!(next_mode(PerCpu, 2, 2), PerCpu);
        assert_eq!(next_mode(PerCpu, 1, 2), PerThread);
        // 8 CPUs: per-CPU above 10, back below 6.
        assert_eq!(next_mode(PerThread, 10, 8), PerThread);
        assert_eq!(next_mode(PerThread, 11, 8), PerCpu);
        assert_eq!(next_mode(PerCpu, 6, 8), PerCpu);
        assert_eq!(next_mode(PerCpu, 5, 8), PerThread);
        // 1 CPU: per-CPU from 2 threads, back when none is active.
        assert_eq!(next_mode(PerThread, 2, 1), PerCpu);
        assert_eq!(next_mode(PerCpu, 1, 1), PerCpu);
        assert_eq!(next_mode(PerCpu, 0, 1), PerThread);
    }
}

//! The operations behind [`Work`](super::Work): arming (`schedule`, `reschedule`, `touch`,
//! the first arm of `every`), cancelling (`cancel`, `cancel_sync`, the handle's drop),
//! `flush`, and `disable`/`enable`. Each takes the core lock through the fork gate and
//! edits the state word by the ground rules in the [module docs](super).

use std::sync::Arc;
use std::time::Duration;

use super::core::{load, store, Cell, Core, Shared};
use super::run::{Executed, Taken};
use super::state::{
    State, CANCEL_WAITING, FIXED_PERIOD, ORPHANED, PENDING, REARM_REFUSED, RUNNING, STOPPED,
    YIELDED,
};
use super::{frames, waits, Scheduler};
use crate::clock::nanos;
use crate::sync::{load_ordered_after_seqcst_writes, wait, MutexGuard, Ordering};

/// Whether a cancel comes from a dropped handle, whose closure must then be freed by
/// whoever holds the last reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    Keep,
    Drop,
}

impl Shared {
    pub(crate) fn schedule(&self, cell: &Cell, delay: Duration) -> bool {
        if load(cell.header()).has(PENDING) {
            return false;
        }
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        if core.shutdown || state.has(PENDING) || state.refuses_arm() {
            return false;
        }
        self.set_period(cell, state, delay);
        state.clear(STOPPED);
        self.arm_after(&mut core, cell, &mut state, nanos(delay));
        store(cell.header(), state);
        true
    }

    pub(crate) fn reschedule(&self, cell: &Cell, delay: Duration) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        if core.shutdown || state.refuses_arm() {
            return false;
        }
        let was_pending = self.disarm(&mut core, &mut state);
        self.set_period(cell, state, delay);
        state.clear(STOPPED);
        self.arm_after(&mut core, cell, &mut state, nanos(delay));
        store(cell.header(), state);
        was_pending
    }

    fn set_period(&self, cell: &Cell, state: State, delay: Duration) {
        if !state.has(FIXED_PERIOD) {
            cell.header()
                .period_ns
                .store(nanos(delay), Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn touch(&self, cell: &Cell) {
        // The fast path: one SeqCst load (a plain load on x86). See the module docs.
        if load_ordered_after_seqcst_writes(&cell.header().state) & PENDING != 0 {
            return;
        }
        self.touch_slow(cell);
    }

    #[cold]
    fn touch_slow(&self, cell: &Cell) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        let mut state = load(cell.header());
        if core.shutdown || state.has(PENDING | STOPPED) || state.refuses_arm() {
            return;
        }
        let period = cell.header().period_ns.load(Ordering::Relaxed);
        self.arm_after(&mut core, cell, &mut state, period.max(self.slack_ns()));
        store(cell.header(), state);
    }

    pub(crate) fn cancel(&self, cell: &Cell) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        let was_pending = self.disarm(&mut core, &mut state);
        store(cell.header(), state);
        was_pending
    }

    pub(crate) fn cancel_sync(&self, cell: &Cell) -> bool {
        self.cancel_and_wait(cell, Release::Keep)
    }

    /// `cancel_sync`, and for a dropped handle the hand-over of the closure. Disarms,
    /// refuses re-arms while a run is in progress, and waits for that run unless waiting
    /// would wait for ourselves: the run is this thread's own (a callback cancelling or
    /// dropping its own work) or the wait would close a cycle of waiting callbacks. Then
    /// the run's own re-arm is refused instead and, for a dropped handle, the runner frees
    /// the closure after the callback returned.
    fn cancel_and_wait(&self, cell: &Cell, release: Release) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        let was_pending = self.disarm(&mut core, &mut state);
        if !state.has(RUNNING) {
            store(cell.header(), state);
            return was_pending;
        }
        let waiting = if frames::is_running_here(cell) {
            None
        } else {
            waits::begin_wait(cell).ok()
        };
        let Some(waiting) = waiting else {
            // Waiting would wait for ourselves: refuse the run's own re-arm instead.
            state.set(REARM_REFUSED);
            if release == Release::Drop {
                state.set(ORPHANED);
            }
            store(cell.header(), state);
            return was_pending;
        };
        // "disable, flush, enable", as the kernel's cancel_delayed_work_sync, with a
        // refusal of its own that `enable()` cannot lift.
        state.set(CANCEL_WAITING);
        store(cell.header(), state);
        let address = frames::address(cell);
        *core.cancel_waiters.entry(address).or_insert(0) += 1;
        core = self.wait_until_idle(core, cell);
        drop(waiting);
        if let Some(waiters) = core.cancel_waiters.get_mut(&address) {
            *waiters -= 1;
            if *waiters == 0 {
                core.cancel_waiters.remove(&address);
                let mut state = load(cell.header());
                state.clear(CANCEL_WAITING);
                store(cell.header(), state);
            }
        }
        drop(core);
        was_pending
    }

    fn wait_until_idle<'a>(
        &'a self,
        mut core: MutexGuard<'a, Core>,
        cell: &Cell,
    ) -> MutexGuard<'a, Core> {
        core.run_waiters += 1;
        while load(cell.header()).has(RUNNING) {
            core = wait(&self.run_done, core);
        }
        core.run_waiters -= 1;
        core
    }

    pub(crate) fn flush(self: &Arc<Self>, cell: &Cell) -> bool {
        if frames::is_running_here(cell) {
            return false;
        }
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let state = load(cell.header());
        if !state.has(PENDING | RUNNING) {
            return false;
        }
        // A flush covers the instance pending when it started, plus the increments of a
        // yielding work.
        let mut take_pending = state.has(PENDING);
        let mut ran_here = false;
        let mut flusher = None;
        loop {
            let mut state = load(cell.header());
            if state.has(RUNNING) {
                let Ok(waiting) = waits::begin_wait(cell) else {
                    // Waiting would close a wait cycle: as inside the own callback.
                    return ran_here;
                };
                // Lend this thread's priority to the worker running it, where allowed.
                core.lending.lend(frames::address(cell), || {
                    *flusher.get_or_insert_with(|| {
                        let nice = crate::priority::current_nice().unwrap_or(0);
                        (nice, crate::priority::current_is_idle())
                    })
                });
                core = self.wait_until_idle(core, cell);
                drop(waiting);
                continue;
            }
            if core.shutdown || !state.has(PENDING) || !(take_pending || state.has(YIELDED)) {
                return true;
            }
            take_pending = false;
            ran_here = true;
            let key = state.key();
            let deadline_ns = core.timers.deadline_ns(key);
            let taken = core.timers.remove(key).to_cell();
            state.clear_pending();
            state.set(RUNNING);
            store(cell.header(), state);
            core.lending.stats.helped += 1;
            let now = self.now_ns(&core);
            drop(core);
            let scheduler = Scheduler::uncounted(self.clone());
            let executed = self.execute(
                &scheduler,
                Taken {
                    cell: taken,
                    deadline_ns,
                    worker_slot: None,
                },
                now,
                None,
            );
            if executed == Executed::InForkedChild {
                return true;
            }
            core = self.lock();
        }
    }

    pub(crate) fn disable(&self, cell: &Cell) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        let was_pending = self.disarm(&mut core, &mut state);
        if !state.disable() {
            tracing::warn!(work = cell.name(), "disable() nesting saturated");
        }
        store(cell.header(), state);
        was_pending
    }

    pub(crate) fn enable(&self, cell: &Cell) {
        let Some(_core) = self.lock_unless_forked() else {
            return;
        };
        let mut state = load(cell.header());
        if state.enable() {
            store(cell.header(), state);
        }
    }

    /// The owning handle is being dropped.
    pub(crate) fn release(&self, cell: &Cell) {
        if self.is_forked_copy() {
            // The closure may be running in the parent's copy of a worker that does
            // not exist here: keep it (leaked) rather than free it under that run.
            std::mem::forget(cell.clone());
            return;
        }
        self.cancel_and_wait(cell, Release::Drop);
    }

    /// Arms a new work (`every`) for its first run.
    pub(crate) fn arm_new(&self, cell: &Cell, delay: Duration) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        let mut state = load(cell.header());
        self.arm_after(&mut core, cell, &mut state, nanos(delay));
        store(cell.header(), state);
    }
}

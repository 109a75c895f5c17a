//! The operations behind [`Work`](super::Work): arming (`schedule`, `reschedule`, `touch`,
//! the first arm of `every`), cancelling (`cancel`, `cancel_sync`, the handle's drop),
//! `flush`, and `disable`/`enable`. Each takes the core lock through the fork gate and
//! edits the state word by the ground rules in the [module docs](super).

use std::sync::Arc;
use std::time::Duration;

use super::core::{load, store, Core, Shared};
use super::handle::Handle;
use super::run::{leave_forked_child, Executed, Taken};
use super::state::{
    State, CANCEL_WAITING, FIXED_PERIOD, FLUSH_TAKEOVER, ORPHANED, PENDING, REARM_REFUSED, RUNNING,
    RUNNING_INCREMENT, STOPPED, YIELDED,
};
use super::WorkRef;
use super::{frames, waits};
use crate::clock::nanos;
use crate::sync::{load_ordered_after_seqcst_writes, wait, MutexGuard, Ordering};

/// Whether a cancel comes from a dropped handle, whose closure must then be freed by
/// whoever holds the last reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    Keep,
    Drop,
    /// A drop that waits for the run in progress even if that closes a wait cycle.
    DropAndWait,
}

impl Shared {
    pub(crate) fn schedule(&self, work: &WorkRef, delay: Duration) -> bool {
        if load(work.header()).has(PENDING) {
            return false;
        }
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(work.header());
        if core.shutdown || state.has(PENDING) || state.refuses_arm() {
            return false;
        }
        self.set_period(work, state, delay);
        state.clear(STOPPED);
        self.arm_after(&mut core, work, &mut state, nanos(delay));
        store(work.header(), state);
        true
    }

    pub(crate) fn reschedule(&self, work: &WorkRef, delay: Duration) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(work.header());
        if core.shutdown || state.refuses_arm() {
            return false;
        }
        let was_pending = self.disarm(&mut core, &mut state);
        self.set_period(work, state, delay);
        state.clear(STOPPED);
        self.arm_after(&mut core, work, &mut state, nanos(delay));
        store(work.header(), state);
        was_pending
    }

    fn set_period(&self, work: &WorkRef, state: State, delay: Duration) {
        if !state.has(FIXED_PERIOD) {
            work.header()
                .period_ns
                .store(nanos(delay), Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn touch(&self, work: &WorkRef) {
        // The fast path: one SeqCst load (a plain load on x86). See the module docs.
        if load_ordered_after_seqcst_writes(&work.header().state) & PENDING != 0 {
            return;
        }
        self.touch_slow(work);
    }

    #[cold]
    fn touch_slow(&self, work: &WorkRef) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        let mut state = load(work.header());
        if core.shutdown || state.has(PENDING | STOPPED) || state.refuses_arm() {
            return;
        }
        let period = work.header().period_ns.load(Ordering::Relaxed);
        self.arm_after(&mut core, work, &mut state, period.max(self.slack_ns()));
        store(work.header(), state);
    }

    pub(crate) fn cancel(&self, work: &WorkRef) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(work.header());
        let was_pending = self.disarm(&mut core, &mut state);
        store(work.header(), state);
        was_pending
    }

    pub(crate) fn cancel_sync(&self, work: &WorkRef) -> bool {
        self.cancel_and_wait(work, Release::Keep)
    }

    /// `cancel_sync`, and for a dropped handle the hand-over of the closure. Disarms,
    /// refuses re-arms while a run is in progress, and waits for that run unless waiting
    /// would wait for ourselves: the run is this thread's own (a callback cancelling or
    /// dropping its own work) or the wait would close a cycle of waiting callbacks. Then
    /// the run's own re-arm is refused instead and, for a dropped handle, the runner frees
    /// the closure after the callback returned.
    pub(super) fn cancel_and_wait(&self, work: &WorkRef, release: Release) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(work.header());
        let was_pending = self.disarm(&mut core, &mut state);
        // After a `cancel_sync` only `schedule`/`reschedule` arm the work again: `touch`
        // leaves it stopped, as after `Next::Stop`.
        state.set(STOPPED);
        if !state.has(RUNNING) {
            store(work.header(), state);
            return was_pending;
        }
        let waiting = if frames::is_running_here(work) {
            None
        } else if release == Release::DropAndWait {
            Some(waits::begin_wait_unchecked(work))
        } else {
            waits::begin_wait(work).ok()
        };
        let Some(waiting) = waiting else {
            // Waiting would wait for ourselves: refuse the run's own re-arm instead.
            state.set(REARM_REFUSED);
            if release != Release::Keep {
                state.set(ORPHANED);
            }
            store(work.header(), state);
            return was_pending;
        };
        // "disable, flush, enable", as the kernel's cancel_delayed_work_sync, with a
        // refusal of its own that `enable()` cannot lift.
        state.set(CANCEL_WAITING);
        store(work.header(), state);
        let address = frames::address(work);
        *core.cancel_waiters.entry(address).or_insert(0) += 1;
        core = self.wait_for_run(core, work);
        drop(waiting);
        if let Some(waiters) = core.cancel_waiters.get_mut(&address) {
            *waiters -= 1;
            if *waiters == 0 {
                core.cancel_waiters.remove(&address);
                let mut state = load(work.header());
                state.clear(CANCEL_WAITING);
                store(work.header(), state);
            }
        }
        drop(core);
        was_pending
    }

    /// Waits until the run in progress (`RUNNING` is set when this is called) has
    /// completed. A later run of the same work is not waited for: runs are counted under
    /// the core lock as they complete, and the run in progress is not counted yet.
    fn wait_for_run<'a>(
        &'a self,
        mut core: MutexGuard<'a, Core>,
        work: &WorkRef,
    ) -> MutexGuard<'a, Core> {
        let done_at = work.header().stats.runs() + 1;
        core.run_waiters += 1;
        while load(work.header()).has(RUNNING) && work.header().stats.runs() < done_at {
            core = wait(&self.run_done, core);
        }
        core.run_waiters -= 1;
        core
    }

    pub(crate) fn flush(self: &Arc<Self>, work: &WorkRef) -> bool {
        if frames::is_running_here(work) {
            return false;
        }
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let state = load(work.header());
        if !state.has(PENDING | RUNNING) {
            return false;
        }
        // A flush covers the instance pending when it started, plus the increments of a
        // yielding work. While it lasts, workers leave `Yield` increments to it
        // (`FLUSH_TAKEOVER`), so the takeover does not depend on who gets the lock first.
        let mut take_pending = state.has(PENDING);
        let mut waited = false;
        let mut ran_here = false;
        let mut flusher = None;
        set_flag(work, FLUSH_TAKEOVER);
        let flushed = loop {
            let mut state = load(work.header());
            // The run in progress when the flush started, and a `Yield` increment a worker
            // took before the takeover began, are waited for; a run that `Again`/`After`
            // armed once the flush had waited for or run its instance is not (a busy
            // self-re-arming work would never let `flush` return).
            if state.has(RUNNING) && (!(waited || ran_here) || state.has(RUNNING_INCREMENT)) {
                waited = true;
                let Ok(waiting) = waits::begin_wait(work) else {
                    // Waiting would close a wait cycle: as inside the own callback.
                    break ran_here;
                };
                // Lend this thread's priority to the worker running it, where allowed.
                core.lending.lend(frames::address(work), || {
                    *flusher.get_or_insert_with(|| {
                        let nice = crate::priority::current_nice().unwrap_or(0);
                        (nice, crate::priority::current_is_idle())
                    })
                });
                core = self.wait_for_run(core, work);
                drop(waiting);
                continue;
            }
            if core.shutdown
                || state.has(RUNNING)
                || !state.has(PENDING)
                || !(take_pending || state.has(YIELDED))
            {
                break true;
            }
            take_pending = false;
            ran_here = true;
            let key = state.key();
            let deadline_ns = core.timers.deadline_ns(key);
            let taken = core.timers.remove(key).to_cell();
            state.start_run();
            store(work.header(), state);
            core.lending.stats.helped += 1;
            let now = self.now_ns(&core);
            drop(core);
            let handle = Handle::new(self.clone());
            let executed = self.execute(
                handle.as_scheduler(),
                Taken {
                    work: taken,
                    deadline_ns,
                    worker_slot: None,
                },
                now,
                None,
            );
            if executed == Executed::InForkedChild {
                return leave_forked_child(true);
            }
            core = self.lock();
        };
        // Hand a left-over increment (one a worker skipped for us) back to the workers.
        let mut state = load(work.header());
        state.clear(FLUSH_TAKEOVER);
        store(work.header(), state);
        if state.has(PENDING) && !state.has(RUNNING) {
            core.timers.make_ready(state.key());
            let now = self.now_ns(&core);
            let deadline = core.timers.deadline_ns(state.key());
            self.kick(&mut core, deadline, now);
        }
        flushed
    }

    pub(crate) fn disable(&self, work: &WorkRef) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(work.header());
        let was_pending = self.disarm(&mut core, &mut state);
        if !state.disable() {
            tracing::warn!(work = work.name(), "disable() nesting saturated");
        }
        store(work.header(), state);
        was_pending
    }

    pub(crate) fn enable(&self, work: &WorkRef) {
        let Some(_core) = self.lock_unless_forked() else {
            return;
        };
        let mut state = load(work.header());
        if state.enable() {
            store(work.header(), state);
        }
    }

    /// The owning handle is being dropped.
    pub(crate) fn release(&self, work: &WorkRef) {
        if self.is_forked_copy() {
            // The closure may be running in the parent's copy of a worker that does
            // not exist here: keep it (leaked) rather than free it under that run.
            std::mem::forget(work.clone());
            return;
        }
        self.cancel_and_wait(work, Release::Drop);
    }

    /// Arms a new work (`every`) for its first run.
    pub(crate) fn arm_new(&self, work: &WorkRef, delay: Duration) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        let mut state = load(work.header());
        self.arm_after(&mut core, work, &mut state, nanos(delay));
        store(work.header(), state);
    }
}

/// Sets `flag` in `work`'s state word (under the core lock).
fn set_flag(work: &WorkRef, flag: u64) {
    let mut state = load(work.header());
    state.set(flag);
    store(work.header(), state);
}

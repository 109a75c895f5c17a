//! Cancelling: `cancel` (one CAS), `cancel_sync` and the handle's drop (disarm, refuse
//! re-arms and wait for a run in progress, or refuse the run's own re-arm where the wait
//! would wait for ourselves), and `disable`/`enable`.

use super::WorkRef;
use crate::scheduler::shared::Shared;
use crate::scheduler::wait::cycles::WaitCycle;
use crate::scheduler::wait::{cycles as waits, frames};
use crate::scheduler::work::state::{
    CANCEL_WAITING, DISABLE_MAX, DISABLED, ORPHANED, PENDING, QUEUED, REARM_REFUSED, RUNNING,
    STOPPED,
};

/// Whether a cancel comes from a dropped handle, whose closure must then be freed by
/// whoever ends the work's last run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    Keep,
    Drop,
    /// A drop that waits for the run in progress even if that closes a wait cycle.
    DropAndWait,
}

impl Shared {
    pub(crate) fn cancel(&self, work: &WorkRef) -> bool {
        if self.is_forked_copy() {
            return false;
        }
        work.header()
            .state
            .update(|old| {
                old.has(PENDING).then(|| {
                    let mut new = old;
                    new.disarm();
                    new
                })
            })
            .is_some()
    }

    pub(crate) fn cancel_sync(&self, work: &WorkRef) -> bool {
        self.cancel_and_wait(work, Release::Keep).0
    }

    /// `cancel_sync`, and for a dropped handle the hand-over of the closure. Disarms,
    /// refuses re-arms while a run is in progress, and waits for that run unless waiting
    /// would wait for ourselves: the run is this thread's own (a callback cancelling or
    /// dropping its own work) or the wait would close a cycle of waiting callbacks. Then
    /// the run's own re-arm is refused instead and, for a dropped handle, the runner frees
    /// the closure after the callback returned.
    ///
    /// Returns whether it was pending, and (for a dropped handle) whether the caller must
    /// drop the closure: no run is in progress and none can start.
    pub(super) fn cancel_and_wait(&self, work: &WorkRef, release: Release) -> (bool, bool) {
        let Some(mut core) = self.lock_unless_forked() else {
            return (false, false);
        };
        let released = release != Release::Keep;
        if released && work.header().state.load().has(ORPHANED) {
            // Released before (`drop_waiting`, then the handle's own drop).
            return (false, false);
        }
        if released {
            // Nobody can call `enable` any more; the count must not outlive the work (a
            // later work may get the same address).
            core.disable_counts.remove(&frames::address(work));
        }
        // RUNNING only changes under the core lock (a take sets it, a completion clears
        // it), so what is decided here about the run in progress holds until the wait
        // below releases the lock.
        let running = work.header().state.load().has(RUNNING);
        let waiting = if !running {
            None
        } else if frames::is_running_here(work) {
            Some(Err(WaitCycle::own()))
        } else if release == Release::DropAndWait {
            Some(Ok(waits::begin_wait_unchecked(work)))
        } else {
            Some(waits::begin_wait(work))
        };
        // One CAS disarms and refuses: a lock-free arm racing this call either lands
        // before it (and is disarmed here) or fails its CAS and finds the refusal. After a
        // `cancel_sync` only `schedule`/`reschedule` arm the work again: `touch` leaves it
        // stopped, as after `Next::Stop`.
        let (old, _) = work
            .header()
            .state
            .update(|old| {
                debug_assert_eq!(old.has(RUNNING), running, "RUNNING moved under the lock");
                let mut new = old;
                new.disarm();
                new.set(STOPPED);
                match &waiting {
                    // "disable, flush, enable", as the kernel's cancel_delayed_work_sync,
                    // with a refusal of its own that `enable()` cannot lift. A dropped
                    // handle's work is orphaned once the wait is over.
                    Some(Ok(_)) => new.set(CANCEL_WAITING),
                    // Waiting would wait for ourselves: the run's own re-arm is refused
                    // instead, and a dropped handle leaves the closure to the runner.
                    Some(Err(_)) => new.set(REARM_REFUSED),
                    None => {}
                }
                if released && !matches!(waiting, Some(Ok(_))) {
                    new.set(ORPHANED);
                }
                Some(new)
            })
            .expect("the edit always applies");
        let was_pending = old.has(PENDING);
        if released && old.has(QUEUED) {
            // Nothing arms it again: its entry is garbage.
            self.note_stale(&mut core, 1);
        }
        let waiting = match waiting {
            None => return (was_pending, released),
            Some(Err(cycle)) => {
                drop(core);
                cycle.report();
                return (was_pending, false);
            }
            Some(Ok(waiting)) => waiting,
        };
        let address = frames::address(work);
        *core.cancel_waiters.entry(address).or_insert(0) += 1;
        // Lend this thread's priority to the worker running it, where allowed, as `flush`
        // does: a nice-0 thread dropping a work must not wait on a starved nice-19 run.
        let lent = core.lending.lend_from_current_thread(address);
        core = self.wait_for_run(core, work);
        drop(waiting);
        let last_waiter = match core.cancel_waiters.get_mut(&address) {
            Some(waiters) => {
                *waiters -= 1;
                *waiters == 0
            }
            None => false,
        };
        if last_waiter {
            core.cancel_waiters.remove(&address);
        }
        // One CAS again: a dropped handle's work goes from "refused while waiting" to
        // "orphaned" with no word in between that accepts an arm.
        work.header().state.update(|old| {
            let mut new = old;
            if last_waiter {
                new.clear(CANCEL_WAITING);
            }
            if released {
                // The run ended and re-arms stayed refused: nothing runs it again.
                new.set(ORPHANED);
            }
            Some(new)
        });
        drop(core);
        if let Err(failure) = lent {
            failure.log();
        }
        (was_pending, released)
    }

    pub(crate) fn disable(&self, work: &WorkRef) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let count = core
            .disable_counts
            .entry(frames::address(work))
            .or_insert(0);
        let saturated = *count == DISABLE_MAX;
        if !saturated {
            *count += 1;
        }
        let (old, _) = work
            .header()
            .state
            .update(|old| {
                let mut new = old.with(DISABLED);
                new.disarm();
                Some(new)
            })
            .expect("the edit always applies");
        drop(core);
        if saturated {
            // Outside the lock: a subscriber is user code and may call into the scheduler.
            tracing::warn!(work = work.name(), "disable() nesting saturated");
        }
        old.has(PENDING)
    }

    pub(crate) fn enable(&self, work: &WorkRef) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        let address = frames::address(work);
        let Some(count) = core.disable_counts.get_mut(&address) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            core.disable_counts.remove(&address);
            work.header()
                .state
                .update(|old| Some(old.without(DISABLED)));
        }
    }

    /// The owning handle is being dropped; returns whether the caller must drop the
    /// closure (else it is leaked in a forked child, or the runner drops it).
    pub(crate) fn release(&self, work: &WorkRef) -> bool {
        if self.is_forked_copy() {
            // The closure may be running in the parent's copy of a worker that does
            // not exist here: keep it (leaked) rather than free it under that run.
            std::mem::forget(work.clone());
            return false;
        }
        self.cancel_and_wait(work, Release::Drop).1
    }
}

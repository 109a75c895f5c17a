//! Cancelling: `cancel` (one CAS), `cancel_sync` and the handle's drop (disarm, refuse
//! re-arms and wait for a run in progress, or refuse the run's own re-arm where the wait
//! would wait for ourselves), and `disable`/`enable`.

use super::WorkRef;
use crate::scheduler::shared::{Core, Shared};
use crate::scheduler::wait::cycles::WaitCycle;
use crate::scheduler::wait::{cycles as waits, frames};
use crate::scheduler::work::state::{DISABLE_MAX, Refusal};

/// Whether a cancel comes from a dropped handle, whose closure must then be freed by
/// whoever ends the work's last run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    Keep,
    Drop,
    /// A drop that waits for the run in progress even if that closes a wait cycle.
    DropAndWait,
}

/// Who waits for the run in progress: a blocked thread (it may close a wait cycle, and it
/// lends its priority), or a future (`cancel_async`, `drop_async`), which blocks no thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiter {
    Thread,
    Async,
}

/// What [`Shared::begin_cancel`] decided about the run in progress.
pub(crate) enum CancelStart {
    /// No run in progress. For a released handle the caller drops the closure when
    /// `drop_closure` says so.
    Done {
        was_pending: bool,
        drop_closure: bool,
    },
    /// Waiting would wait for ourselves (the own run, or a cycle of waits): the run's own
    /// re-arm is refused instead, and a released handle leaves the closure to the runner.
    Refused { was_pending: bool, cycle: WaitCycle },
    /// Counted as a cancel waiter of the run in progress; a thread also holds its edge in
    /// the wait graph.
    Waiting {
        was_pending: bool,
        thread_wait: Option<waits::Waiting>,
    },
}

// === `impl Shared`, this file's part: `cancel`, `cancel_sync` and the handle's release,
// `disable`/`enable`. ===
impl Shared {
    pub(crate) fn cancel(&self, work: &WorkRef) -> bool {
        if self.is_forked_copy() {
            return false;
        }
        work.header().state.update(|old| old.cancelled()).is_some()
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
        match self.begin_cancel(&mut core, work, release, Waiter::Thread) {
            CancelStart::Done {
                was_pending,
                drop_closure,
            } => (was_pending, drop_closure),
            CancelStart::Refused { was_pending, cycle } => {
                drop(core);
                cycle.report();
                (was_pending, false)
            }
            CancelStart::Waiting {
                was_pending,
                thread_wait,
            } => {
                // Lend this thread's priority to the worker running it, where allowed, as
                // `flush` does: a nice-0 thread dropping a work must not wait on a starved
                // nice-19 run.
                let lent = core.lending.lend_from_current_thread(frames::address(work));
                core = self.wait_for_run(core, work);
                drop(thread_wait);
                self.end_cancel_wait(&mut core, work, released);
                drop(core);
                if let Err(failure) = lent {
                    failure.log();
                }
                (was_pending, released)
            }
        }
    }

    /// The first half of `cancel_sync`, drop, `cancel_async` and `drop_async`, under the
    /// core lock: disarms, refuses re-arms, and decides whether the caller waits for a run
    /// in progress (then it is counted in `cancel_waiters`, and ends its wait with
    /// [`end_cancel_wait`](Self::end_cancel_wait)).
    pub(crate) fn begin_cancel(
        &self,
        core: &mut Core,
        work: &WorkRef,
        release: Release,
        waiter: Waiter,
    ) -> CancelStart {
        let released = release != Release::Keep;
        if released && work.header().state.load().is_orphaned() {
            // Released before (`drop_waiting`, then the handle's own drop).
            return CancelStart::Done {
                was_pending: false,
                drop_closure: false,
            };
        }
        if released {
            // Nobody can call `enable` any more; the count must not outlive the work (a
            // later work may get the same address).
            core.disable_counts.remove(&frames::address(work));
        }
        // RUNNING only changes under the core lock (a take sets it, a completion clears
        // it), so what is decided here about the run in progress holds until the wait
        // releases the lock.
        let running = work.header().state.load().is_running();
        let waiting = if !running {
            None
        } else if frames::is_running_here(work) {
            Some(Err(WaitCycle::own()))
        } else if waiter == Waiter::Async {
            // A future blocks no thread, so its wait closes no cycle and has no edge.
            Some(Ok(None))
        } else if release == Release::DropAndWait {
            Some(Ok(Some(waits::begin_wait_unchecked(work))))
        } else {
            Some(waits::begin_wait(work).map(Some))
        };
        // One CAS disarms and refuses: a lock-free arm racing this call either lands
        // before it (and is disarmed here) or fails its CAS and finds the refusal. After a
        // `cancel_sync` only `schedule`/`reschedule` arm the work again: `touch` leaves it
        // stopped, as after `Next::Stop`.
        let (old, _) = work
            .header()
            .state
            .update(|old| {
                debug_assert_eq!(old.is_running(), running, "RUNNING moved under the lock");
                let refusal = match &waiting {
                    // A dropped handle's work is orphaned once the wait is over.
                    Some(Ok(_)) => Refusal::WhileWaiting,
                    // Waiting would wait for ourselves: a dropped handle leaves the
                    // closure to the runner.
                    Some(Err(_)) => Refusal::OwnRearm,
                    None => Refusal::None,
                };
                let orphan = released && refusal != Refusal::WhileWaiting;
                Some(old.cancelled_sync(refusal, orphan))
            })
            .expect("the edit always applies");
        let was_pending = old.is_pending();
        if released && old.has_live_entry() {
            // Nothing arms it again: its entry is garbage.
            self.note_stale(core, 1);
        }
        match waiting {
            None => CancelStart::Done {
                was_pending,
                drop_closure: released,
            },
            Some(Err(cycle)) => CancelStart::Refused { was_pending, cycle },
            Some(Ok(thread_wait)) => {
                *core
                    .cancel_waiters
                    .entry(frames::address(work))
                    .or_insert(0) += 1;
                CancelStart::Waiting {
                    was_pending,
                    thread_wait,
                }
            }
        }
    }

    /// Ends a wait that [`begin_cancel`](Self::begin_cancel) began, once the run it waited
    /// for is over (or, `run_over` false, a future that leaves before): the last waiter
    /// lifts `CANCEL_WAITING`, and a released handle's work is orphaned. A waiter that
    /// leaves while the run goes on hands its refusal to the run (`REARM_REFUSED`: the
    /// run's own re-arm is refused), and a released work's closure to the runner.
    pub(crate) fn end_cancel_wait(&self, core: &mut Core, work: &WorkRef, released: bool) {
        let address = frames::address(work);
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
        // A released work's run ended and re-arms stayed refused (or the run still
        // refuses its own): nothing runs it again.
        work.header()
            .state
            .update(|old| Some(old.cancel_wait_ended(last_waiter, released)));
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
            .update(|old| Some(old.disabled()))
            .expect("the edit always applies");
        drop(core);
        if saturated {
            // Outside the lock: a subscriber is user code and may call into the scheduler.
            tracing::warn!(work = work.name(), "disable() nesting saturated");
        }
        old.is_pending()
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
            work.header().state.update(|old| Some(old.enabled()));
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

//! `flush`: run a pending work now on the caller, or wait for a running one (lending the
//! caller's priority to its worker where the process may), taking over `Yield`
//! increments; `try_flush`, the same without ever waiting (a running work is left to its
//! runner); and the wait for the end of a run in
//! progress, which `cancel_sync`, drop and `flush` share. [`Work::flush`](crate::Work::flush)
//! and [`Work::try_flush`](crate::Work::try_flush) are the thin wrappers in `work::handle`.

use std::sync::Arc;

use crate::scheduler::handle::Handle;
use crate::scheduler::shared::{CoreGuard, Shared};
use crate::scheduler::wait::{cycles as waits, frames};
use crate::scheduler::work::run::{Executed, Taken, leave_forked_child};

use crate::scheduler::WorkRef;
use crate::sync::load_ordered_after_seqcst_writes;

/// Whether a flush may wait for a run in progress (`flush`) or never does (`try_flush`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    Wait,
    Never,
}

// === `impl Shared`, this file's part: `flush` and `try_flush`: taking a pending run over
// on the caller, waiting for a running one, and a `Yield` work's increments. ===
impl Shared {
    /// Waits until the run in progress (`RUNNING` is set when this is called) has
    /// completed. A later run of the same work is not waited for: runs are counted under
    /// the core lock as they complete, and the run in progress is not counted yet.
    pub(crate) fn wait_for_run<'a>(
        &'a self,
        mut core: CoreGuard<'a>,
        work: &WorkRef,
    ) -> CoreGuard<'a> {
        let done_at = work.header().stats.runs() + 1;
        core.run_waiters += 1;
        while work.header().state.load().is_running() && work.header().stats.runs() < done_at {
            core = core.wait(&self.run_done);
        }
        core.run_waiters -= 1;
        core
    }

    pub(crate) fn flush(self: &Arc<Self>, work: &WorkRef, waiting: Waiting) -> bool {
        if frames::is_running_here(work) {
            return false;
        }
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let state = work.header().state.load();
        if !state.is_pending_or_running() || (waiting == Waiting::Never && state.is_running()) {
            return false;
        }
        // A flush covers the instance pending when it started, plus the increments of a
        // yielding work. While it lasts, workers leave `Yield` increments to it
        // (`FLUSH_TAKEOVER`), so the takeover does not depend on who gets the lock first.
        let mut take_pending = state.is_pending();
        let mut waited = false;
        let mut ran_here = false;
        let mut flusher = None;
        // Found under the lock, logged once it is released: a subscriber is user code.
        let mut cycle = None;
        let mut lend_failure = None;
        work.header()
            .state
            .update(|old| Some(old.taken_over_by_a_flush()));
        let flushed = loop {
            let state = work.header().state.load();
            // The run in progress when the flush started, and a `Yield` increment a worker
            // took before the takeover began, are waited for; a run that `Again`/`After`
            // armed once the flush had waited for or run its instance is not (a busy
            // self-re-arming work would never let `flush` return).
            if state.is_running() && (!(waited || ran_here) || state.runs_an_increment()) {
                if waiting == Waiting::Never {
                    // A worker holds it (an increment it took before the takeover): help
                    // no further.
                    break ran_here;
                }
                waited = true;
                let waiting = match waits::begin_wait(work) {
                    Ok(waiting) => waiting,
                    Err(found) => {
                        // Waiting would close a wait cycle: as inside the own callback.
                        cycle = Some(found);
                        break ran_here;
                    }
                };
                // Lend this thread's priority to the worker running it, where allowed.
                let lent = core.lending.lend(frames::address(work), || {
                    *flusher.get_or_insert_with(|| {
                        let nice = crate::priority::current_nice().unwrap_or(0);
                        (nice, crate::priority::current_is_idle())
                    })
                });
                if let Err(failure) = lent {
                    lend_failure.get_or_insert(failure);
                }
                core = self.wait_for_run(core, work);
                drop(waiting);
                continue;
            }
            if core.shutdown
                || state.is_running()
                || !state.is_pending()
                || !(take_pending || state.is_yield_increment())
            {
                break waited || ran_here;
            }
            let mut running = state;
            running.start_run();
            if !work.header().state.cas(state, running) {
                continue;
            }
            if state.has_live_entry() {
                // Its entry stays behind, stale.
                self.note_stale(&mut core, 1);
            }
            take_pending = false;
            ran_here = true;
            let deadline_ns = crate::scheduler::work::state::units_to_ns(state.deadline());
            let touch_stamp = load_ordered_after_seqcst_writes(&work.header().period_or_touch);
            if state.is_timeout() {
                self.taking_timeout_run(touch_stamp);
            }
            core.lending.stats.helped += 1;
            let now = self.now_ns();
            drop(core);
            let handle = Handle::new(self.clone());
            let executed = self.execute(
                handle.as_scheduler(),
                Taken {
                    work: work.clone(),
                    deadline_ns,
                    touch_stamp,
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
        // Hand a left-over increment (one a worker skipped for us) back to the workers:
        // it has no live entry, so `commit` links one.
        let now = self.now_ns();
        self.commit(&mut core, work, now, |old| Some(old.flush_takeover_ended()));
        drop(core);
        if let Some(cycle) = cycle {
            cycle.report();
        }
        if let Some(failure) = lend_failure {
            failure.log();
        }
        flushed
    }
}

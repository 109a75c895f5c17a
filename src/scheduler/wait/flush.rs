//! `flush`: run a pending work now on the caller, or wait for a running one (lending the
//! caller's priority to its worker where the process may), taking over `Yield`
//! increments; `try_flush`, the same without ever waiting (a running work is left to its
//! runner); the `Work` methods that call them; and the wait for the end of a run in
//! progress, which `cancel_sync`, drop and `flush` share.

use std::sync::Arc;

use crate::scheduler::handle::Handle;
use crate::scheduler::shared::{CoreGuard, Shared};
use crate::scheduler::wait::{cycles as waits, frames};
use crate::scheduler::work::run::{Executed, Taken, leave_forked_child};

use crate::scheduler::{Work, WorkRef};
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

impl Work {
    /// Makes the work's current instance finish now, lending the caller's priority to it
    /// (the kernel's `flush_work_at_nice`). Returns `true` if it ran or waited for an
    /// instance, `false` if the work was idle.
    ///
    /// - **Pending, not started:** it runs now on the calling thread, at the caller's
    ///   priority, and `flush` returns when it finished.
    /// - **Running on a worker:** `flush` waits for that run. Where the process may raise
    ///   the worker ([`Scheduler::raise_limit`](crate::Scheduler::raise_limit) is `Some`: `CAP_SYS_NICE` or
    ///   `RLIMIT_NICE`) the worker is raised to the caller's nice (at most to the limit)
    ///   for the rest of that run and puts itself back afterwards. Without that right it
    ///   only waits: the library never lowers a thread it could not raise back.
    /// - **Incremental:** a work that returns [`Next::Yield`](crate::Next::Yield) is taken over: the flusher
    ///   runs the remaining increments itself, so a long cleanup never crawls at nice 19
    ///   while someone waits for it. The instance ends when an increment returns anything
    ///   but `Yield`; a work that yields for ever (a poller) never ends one, so its flush
    ///   returns only once it is cancelled or disabled from another thread. Poll with
    ///   `Again`/`After` instead.
    ///
    /// [`Scheduler::metrics`](crate::Scheduler::metrics) counts which of these happened (`lending`).
    ///
    /// Called from inside the work's own callback it returns `false` and changes nothing;
    /// so does a flush whose wait would close a cycle of callbacks waiting for each other
    /// (see [Waiting from inside callbacks](Self#waiting-from-inside-callbacks)).
    /// Instances armed by `Again`/`After` during the flush are not waited for: a
    /// self-re-arming work would otherwise never let `flush` return.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let work = sched.every(Duration::from_secs(3600), |_| Next::Park);
    /// assert!(work.flush()); // ran now, on this thread
    /// assert_eq!(work.stats().runs, 1);
    /// assert!(!work.flush()); // parked: nothing to flush
    /// ```
    pub fn flush(&self) -> bool {
        self.shared().flush(self.inner(), Waiting::Wait)
    }

    /// Helps without waiting: a pending work runs now on the caller, as
    /// [`flush`](Self::flush) runs it (with the increments of a `Next::Yield` work, for as
    /// long as no worker holds one), and `true` is returned; a work that is running
    /// anywhere, or idle, returns `false` at once. It never waits for any state, on any
    /// thread: it only takes the scheduler's lock, which nothing holds across a callback.
    ///
    /// This is what a writer that finds a full write log calls (moka's pattern): if the
    /// drain is due, the writer runs it at its own priority instead of waiting for a
    /// nice-19 worker; if the worker is draining already, the writer goes on. A reader
    /// that must never block can call it too.
    ///
    /// `false` also from inside the work's own callback, after shutdown, and in a
    /// `fork()`ed child.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let sched = Scheduler::manual();
    /// let drain = sched.work(|_| Next::Park);
    /// assert!(!drain.try_flush()); // idle: nothing to help with
    /// drain.schedule(Duration::from_secs(1));
    /// assert!(drain.try_flush()); // pending: ran here, now
    /// assert_eq!(drain.stats().runs, 1);
    /// ```
    pub fn try_flush(&self) -> bool {
        self.shared().flush(self.inner(), Waiting::Never)
    }
}

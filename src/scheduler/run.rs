//! A work's runs: taking a due work off the ready list, executing its callback unlocked
//! and inside `catch_unwind`, completing it (applying its [`Next`]), and manual time's
//! `advance`, which runs due works on the caller.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backoff::Backoff;
use super::core::{load, store, Core, Shared};
use super::state::{
    State, FLUSH_TAKEOVER, ORPHANED, PENDING, POISONED, REARM_REFUSED, RUNNING, RUNNING_INCREMENT,
    STOPPED, YIELDED,
};
use super::WorkRef;
use super::{frames, Ctx, Next, Scheduler};
use crate::clock::nanos;
use crate::sync::{fence, Ordering};

/// A run that was taken off the ready list and must now be executed.
pub(crate) struct Taken {
    pub(crate) work: WorkRef,
    pub(crate) deadline_ns: u64,
    /// The worker's lending slot, when a worker runs it.
    pub(crate) worker_slot: Option<usize>,
}

/// How [`Shared::execute`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Executed {
    /// The run was completed under the lock; the caller may go on.
    Completed,
    /// The callback called `fork()` and this is the child: the caller must leave at once
    /// without taking the lock or touching the timer (see `fork`).
    InForkedChild,
}

impl Shared {
    /// Takes the first due work that is not running elsewhere. A due work that is still
    /// running stays detached and is put back when its run completes.
    pub(crate) fn take_ready(&self, core: &mut Core) -> Option<Taken> {
        while let Some(key) = core.timers.pop_ready() {
            let header = core.timers.value(key).header();
            let mut state = load(header);
            // Still running: detached, put back when the run completes. A `Yield`
            // increment a flusher takes over: detached, the flusher takes it (or puts it
            // back when it stops).
            if state.has(RUNNING) || (state.has(FLUSH_TAKEOVER) && state.has(YIELDED)) {
                continue;
            }
            let deadline_ns = core.timers.deadline_ns(key);
            let work = core.timers.remove(key).to_cell();
            state.start_run();
            store(work.header(), state);
            return Some(Taken {
                work,
                deadline_ns,
                worker_slot: None,
            });
        }
        None
    }

    /// Runs a taken work on the calling thread and completes it. A worker passes its
    /// back-off, which decides how soon a `Yield` runs again.
    pub(crate) fn execute(
        self: &Arc<Self>,
        scheduler: &Scheduler,
        taken: Taken,
        started_ns: u64,
        backoff: Option<&mut Backoff>,
    ) -> Executed {
        // Pairs with touch()'s SeqCst load; see the module docs.
        fence(Ordering::SeqCst);
        let Taken {
            work,
            deadline_ns,
            worker_slot,
        } = taken;
        let outcome = {
            let name = work.name();
            let span = tracing::info_span!("nicework.run", work = name);
            let _entered = span.enter();
            let header = work.header();
            let mut cx = Ctx {
                scheduler,
                work: &*work,
                deadline_ns,
                started_ns,
                runs: header.stats.runs() + 1,
            };
            let _frame = frames::enter(&work);
            let clock = Instant::now();
            // SAFETY: we set RUNNING when this run was taken, and only `complete` below
            // clears it.
            let outcome = catch_unwind(AssertUnwindSafe(|| unsafe { work.call(&mut cx) }));
            if self.is_forked_copy() {
                // `fork()` inside the callback (or inside one it flushed), and this is the
                // child: nothing of this run is recorded, completed or logged.
                drop(_frame);
                if let Err(payload) = outcome {
                    std::mem::forget(payload);
                }
                std::mem::forget(work);
                return Executed::InForkedChild;
            }
            let busy = clock.elapsed();
            let lateness = started_ns.saturating_sub(deadline_ns);
            header.stats.record(
                started_ns,
                busy,
                lateness,
                matches!(outcome, Ok(Next::Park)),
            );
            match outcome {
                Ok(next) => Some(next),
                Err(payload) => {
                    tracing::error!(
                        work = name,
                        panic = panic_message(payload.as_ref()),
                        "work panicked; it is poisoned and will not run again"
                    );
                    drop_payload(payload);
                    None
                }
            }
        };

        let yield_delay_ns = match (outcome, backoff) {
            (Some(Next::Yield), Some(backoff)) => backoff.after_yield(),
            _ => 0,
        };
        self.complete(work, outcome, worker_slot, yield_delay_ns);
        Executed::Completed
    }

    fn complete(
        &self,
        work: WorkRef,
        next: Option<Next>,
        worker_slot: Option<usize>,
        yield_delay_ns: u64,
    ) {
        let mut core = self.lock();
        if let Some(restore) = worker_slot.and_then(|slot| core.lending.finish(slot)) {
            // Under the lock, before any waiter is told: when `flush` returns, the worker
            // is back at its own priority, and no flusher can raise it in between.
            restore.apply();
        }
        let header = work.header();
        let mut state = load(header);
        state.clear(RUNNING | RUNNING_INCREMENT);
        // Counted under the lock, together with clearing RUNNING: a waiter that saw the
        // run in progress knows it ended when the count moved (see `wait_for_run`).
        header.stats.count_run();
        match next {
            None => {
                state.set(POISONED);
                self.disarm(&mut core, &mut state);
            }
            Some(next) if !state.refuses_arm() && !core.shutdown => {
                self.apply_next(&mut core, &work, &mut state, next, yield_delay_ns);
            }
            Some(_) => {}
        }
        if state.has(PENDING) {
            // An instance that came due while we ran was detached; it may run now.
            core.timers.make_ready(state.key());
            let now = self.now_ns(&core);
            let deadline = core.timers.deadline_ns(state.key());
            self.kick(&mut core, deadline, now);
        }
        state.clear(REARM_REFUSED);
        store(header, state);
        if core.run_waiters > 0 {
            self.run_done.notify_all();
        }
        if yield_delay_ns > 0 {
            core.deferred_yields += 1;
        }
        if state.has(ORPHANED) {
            // The handle is gone: ours is the last reference, and the closure's destructor
            // is user code, so it runs after the lock is released.
            drop(core);
            drop_contained(work);
        } else {
            // Not the last reference (the handle is alive), so nothing user-visible runs.
            drop(work);
            drop(core);
        }
    }

    fn apply_next(
        &self,
        core: &mut Core,
        work: &WorkRef,
        state: &mut State,
        next: Next,
        yield_delay_ns: u64,
    ) {
        let slack = self.slack_ns();
        match next {
            Next::Park => {}
            Next::Stop => {
                self.disarm(core, state);
                state.set(STOPPED);
            }
            Next::Again | Next::After(_) if state.has(PENDING) => {}
            Next::Again => {
                let period = work.header().period_ns.load(Ordering::Relaxed);
                self.arm_after(core, work, state, period.max(slack));
            }
            Next::After(delay) => self.arm_after(core, work, state, nanos(delay).max(slack)),
            Next::Yield => {
                self.disarm(core, state);
                let now = self.now_ns(core);
                self.arm(core, work, state, now.saturating_add(yield_delay_ns), now);
                state.set(YIELDED);
            }
        }
    }

    /// Moves virtual time forward by `by`, running every due work on the caller in
    /// deadline order; returns the number of runs.
    pub(crate) fn advance(self: &Arc<Self>, scheduler: &Scheduler, by: Duration) -> usize {
        let Some(mut core) = self.lock_unless_forked() else {
            return 0;
        };
        let target = core.virtual_now_ns.saturating_add(nanos(by));
        let mut runs = 0;
        loop {
            core.timers.expire(target);
            let Some(taken) = self.take_ready(&mut core) else {
                break;
            };
            core.virtual_now_ns = core.virtual_now_ns.max(taken.deadline_ns);
            let now = core.virtual_now_ns;
            drop(core);
            let executed = self.execute(scheduler, taken, now, None);
            runs += 1;
            if executed == Executed::InForkedChild {
                return leave_forked_child(runs);
            }
            core = self.lock();
        }
        core.virtual_now_ns = core.virtual_now_ns.max(target);
        runs
    }
}

/// The unwinding that carries a `fork()`ed child out of a callback (see
/// [`leave_forked_child`]); never seen outside nicework.
struct LeavingForkedChild;

/// After `fork()` inside a callback, in the child: returns `value` to a caller that is not
/// itself running a callback (a user thread in `flush` or `advance`). Inside a callback
/// (a callback that flushed the forking work) it unwinds out of that outer callback to the
/// `execute` that runs it, which stops there: the child runs nothing more of nicework's,
/// including the rest of the outer callback.
pub(crate) fn leave_forked_child<T>(value: T) -> T {
    if !frames::in_callback() {
        value
    } else {
        std::panic::resume_unwind(Box::new(LeavingForkedChild))
    }
}

/// Drops a caught panic's payload. Its destructor is user code and may panic in turn; that
/// second payload is leaked, not dropped, so no panic ever escapes (a third level could
/// otherwise recurse without end).
pub(crate) fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(second) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        tracing::error!(
            panic = panic_message(second.as_ref()),
            "a panic payload panicked while being dropped; the second payload is leaked"
        );
        std::mem::forget(second);
    }
}

/// Runs user code (a destructor, a callback) so that a panic in it is reported as `what`
/// and contained, never propagated into nicework or the caller; its payload is dropped
/// contained too.
pub(crate) fn contain(what: &str, f: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
        tracing::error!(panic = panic_message(payload.as_ref()), "{what}");
        drop_payload(payload);
    }
}

/// Drops the last reference to a work, whose closure's destructor is user code.
pub(crate) fn drop_contained(work: WorkRef) {
    contain("a work's closure panicked while being dropped", move || {
        drop(work)
    });
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
}

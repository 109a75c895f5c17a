//! A work's runs: taking a due work off the ready list, executing its callback unlocked
//! and inside `catch_unwind`, completing it (applying its [`Next`]), and manual time's
//! `advance`, which runs due works on the caller.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::WorkRef;
use super::{Ctx, Next};
use crate::clock::nanos;
use crate::contain::{drop_payload, panic_message};
use crate::scheduler::Scheduler;
use crate::scheduler::backoff::Backoff;
use crate::scheduler::shared::{Core, Shared};
use crate::scheduler::wait::frames;
use crate::scheduler::work::entry::{Entry, Placement};
use crate::scheduler::work::state::{State, now_units, units_ceil, units_to_ns};
use crate::sync::{Ordering, fence, load_ordered_after_seqcst_writes};

/// A run that was taken and must now be executed.
pub(crate) struct Taken {
    pub(crate) work: WorkRef,
    pub(crate) deadline_ns: u64,
    /// A timeout work's touch stamp when the run was taken: a later one is a touch
    /// during the run.
    pub(crate) touch_stamp: u64,
    /// The worker's lending slot, when a worker runs it.
    pub(crate) worker_slot: Option<usize>,
}

/// What a completion knows besides the word and the callback's decision.
#[derive(Debug, Clone, Copy)]
struct RunEnd {
    /// The time of the completion.
    now_ns: u64,
    /// The scheduler shut down during the run.
    shutdown: bool,
    /// The period `Again` and a touched `Park` re-arm for, claimed (see `claim_period`).
    period: u64,
    /// How long a `Yield` waits (0: at once).
    yield_delay_ns: u64,
    /// A `once` work: its one run leaves nothing armed.
    once: bool,
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

/// What a timer entry means now (see the ground rules in `state`).
enum Class {
    /// Not the live entry, or its work is no longer armed (or is running, or left to a
    /// flusher: the completion or the flush links a new one): drop it.
    Stale,
    /// Armed, and due at this deadline (units), which is still ahead, with its window's
    /// end (see `leeway`). With an epoch: the deadline moved later than the entry's
    /// placement, and the entry, placed again at it, must be tagged with this new epoch
    /// (see "Placement" in `entry`).
    Wait(u64, u64, Option<u8>),
    /// Armed and due: the state word it was judged on (a take must CAS from it), the
    /// deadline, its window's end, and a timeout work's touch stamp.
    Due(State, u64, u64, u64),
}

/// `entry`, tagged with `epoch` if [`Class::Wait`] named a new one.
fn retag(entry: Entry, epoch: Option<u8>) -> Entry {
    match epoch {
        Some(epoch) => entry.retagged(epoch),
        None => entry,
    }
}

// === `impl Shared`, this file's part: a run's life: classify an entry, take, execute,
// complete; manual time's `advance`. ===
impl Shared {
    /// Judges `entry` at `now` (units). Clears `QUEUED` when the live entry goes stale,
    /// and sets `FIRING` before reading a timeout work's touch stamp.
    fn classify(&self, entry: &Entry, now: u64) -> Class {
        let header = entry.header();
        loop {
            let mut state = header.state.load();
            if !state.is_live_entry(entry.epoch()) {
                return Class::Stale;
            }
            if !state.is_pending() {
                if header.state.cas(state, state.without_entry()) {
                    return Class::Stale;
                }
                continue;
            }
            let mut due = state.deadline();
            let mut stamp = 0;
            if state.is_timeout() {
                if !state.is_firing() {
                    let firing = state.firing();
                    if !header.state.cas(state, firing) {
                        continue;
                    }
                    state = firing;
                }
                stamp = load_ordered_after_seqcst_writes(&header.period_or_touch);
                due = due.max(self.touch_due(stamp, entry.work().period_ns()));
            }
            let end = self.window_end(header, state, due, || entry.work().period_ns());
            if due > now {
                if header.stats.placement() == Placement::encode(due, state.epoch()) {
                    return Class::Wait(due, end, None);
                }
                // Placed again later: a lock-free arm that read the placement being left
                // must fail its CAS.
                let mut moved = state;
                let epoch = moved.claim_entry();
                header.stats.set_placement(Placement::encode(due, epoch));
                if !header.state.cas(state, moved) {
                    continue;
                }
                return Class::Wait(due, end, Some(epoch));
            }
            if state.is_running() || state.is_left_to_a_flusher() {
                if header.state.cas(state, state.without_entry()) {
                    return Class::Stale;
                }
                continue;
            }
            return Class::Due(state, due, end, stamp);
        }
    }

    /// Moves what is due at `now_ns` from the wheel to the ready queue, dropping stale
    /// entries and placing postponed ones again.
    pub(crate) fn expire(&self, core: &mut Core, now_ns: u64) {
        // Before any decision, so the stamps it reads have their tick's successor.
        self.touch_tick.refresh(now_ns, || self.now_ns());
        let now = now_units(now_ns);
        core.wheel
            .expire(now, |entry| match self.classify(&entry, now) {
                Class::Stale => None,
                Class::Wait(due, end, epoch) => Some((retag(entry, epoch), due, end)),
                Class::Due(_, due, end, _) => Some((entry, due, end)),
            });
    }

    /// Takes the first ready work that is due and not running elsewhere. A due work that
    /// is still running loses its entry and gets a new one when its run completes.
    pub(crate) fn take_ready(&self, core: &mut Core, now_ns: u64) -> Option<Taken> {
        self.take_ready_skipping(core, now_ns, |_| false, &mut Vec::new())
    }

    /// [`take_ready`](Self::take_ready), setting aside the ready entries of the works that
    /// `skip` names (by address), with the deadlines they were placed for, for the caller
    /// to put back: a hosted `run_due` runs each work at most once per call, and the next
    /// call runs them.
    pub(crate) fn take_ready_skipping(
        &self,
        core: &mut Core,
        now_ns: u64,
        skip: impl Fn(usize) -> bool,
        set_aside: &mut Vec<(Entry, u64)>,
    ) -> Option<Taken> {
        let now = now_units(now_ns);
        while let Some((placed, entry)) = core.wheel.pop_ready() {
            if skip(entry.address()) {
                // Whatever it is due for now: it was set due after `now_ns`, by this
                // caller's own run of it.
                set_aside.push((entry, placed));
                continue;
            }
            loop {
                match self.classify(&entry, now) {
                    Class::Stale => break,
                    Class::Wait(due, end, epoch) => {
                        core.wheel.defer(retag(entry, epoch), due, end);
                        break;
                    }
                    Class::Due(_, due, end, _) if due > placed => {
                        // Moved later (lock-free) since it was queued: still due, but
                        // behind works due before it. Queue it again in its place.
                        core.wheel.insert(entry, due, end, now);
                        break;
                    }
                    Class::Due(state, due, _, touch_stamp) => {
                        let mut running = state;
                        running.start_run();
                        if !entry.header().state.cas(state, running) {
                            continue;
                        }
                        return Some(Taken {
                            work: entry.into_work(),
                            deadline_ns: units_to_ns(due),
                            touch_stamp,
                            worker_slot: None,
                        });
                    }
                }
            }
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
            touch_stamp,
            worker_slot,
        } = taken;
        let outcome = {
            let name = work.name();
            // DEBUG: a span per run is noise at scale unless asked for. The fields are
            // only computed when a subscriber enables the span.
            let span = tracing::debug_span!(
                "nicework.run",
                work = name,
                deadline = ?self.instant_at(deadline_ns),
                lateness = ?Duration::from_nanos(started_ns.saturating_sub(deadline_ns)),
            );
            let _entered = span.enter();
            let header = work.header();
            let mut cx = Ctx {
                scheduler,
                work: &*work,
                deadline_ns,
                started_ns,
                runs: header.stats.runs() + 1,
            };
            let frame = frames::Frame::running(&work);
            let entered = frame.enter();
            let clock = Instant::now();
            // SAFETY: we set RUNNING when this run was taken, and only `complete` below
            // clears it.
            let outcome = catch_unwind(AssertUnwindSafe(|| unsafe { work.call(&mut cx) }));
            if self.is_forked_copy() {
                // `fork()` inside the callback (or inside one it flushed), and this is the
                // child: nothing of this run is recorded, completed or logged.
                drop(entered);
                if let Err(payload) = outcome {
                    std::mem::forget(payload);
                }
                std::mem::forget(work);
                return Executed::InForkedChild;
            }
            let busy = clock.elapsed();
            let lateness = started_ns.saturating_sub(deadline_ns);
            header.stats.record(started_ns, busy, lateness);
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
        self.complete(work, outcome, worker_slot, yield_delay_ns, touch_stamp);
        Executed::Completed
    }

    fn complete(
        &self,
        work: WorkRef,
        next: Option<Next>,
        worker_slot: Option<usize>,
        yield_delay_ns: u64,
        touch_stamp: u64,
    ) {
        let mut core = self.lock();
        // Under the lock, before any waiter is told: when `flush` returns, the worker is
        // back at its own priority, and no flusher can raise it in between. A failure is
        // logged once the lock is released.
        let restore_failure = worker_slot
            .and_then(|slot| core.lending.finish(slot))
            .and_then(|restore| restore.apply().err());
        let header = work.header();
        // Counted under the lock, together with clearing RUNNING: a waiter that saw the
        // run in progress knows it ended when the count moved (see `wait_for_run`).
        header.stats.count_run(next == Some(Next::Park));
        let once = work.is_once();
        if once {
            // Before RUNNING is cleared: no arm can slip in between the run and the
            // refusal of every later one.
            // SAFETY: this thread holds RUNNING for the run that just called the closure.
            unsafe { work.mark_consumed() };
        }
        let now = self.now_ns();
        let shutdown = core.shutdown;
        // A worker loops back to the structure right after this (see `kick`).
        core.completing_on_worker = worker_slot.is_some();
        // `Again`, and a `Park` after a touch during the run, re-arm for the period: it is
        // claimed, so that the word this completion decides on keeps it (see the ground
        // rules in `state`), and the completion's CAS releases the claim.
        // `TOUCHED_IN_RUN` is only set under the core lock, which this holds, so a `Park`
        // that needs no period claims none.
        let touched = header.state.load().was_touched_during_run();
        let (period, claimed) = match next {
            Some(Next::Again) if !shutdown => self.claim_period(&work),
            Some(Next::Park) if touched && !shutdown => self.claim_period(&work),
            _ => (0, false),
        };
        let ending = RunEnd {
            now_ns: now,
            shutdown,
            period,
            yield_delay_ns,
            once,
        };
        let (_, state) = self
            .commit(&mut core, &work, now, |old| {
                let new = self.after_run(old, next, &ending);
                Some(if claimed {
                    new.without_period_claim()
                } else {
                    new
                })
            })
            .expect("the edit always applies");
        if state.is_timeout() && !state.is_pending() && !state.refuses_touch() && !shutdown {
            self.rearm_for_a_touch_during_the_run(&mut core, &work, now, touch_stamp);
        }
        core.completing_on_worker = false;
        let state = if state.detached_life_is_over() {
            // A detached work that parked, stopped, panicked or was refused a re-arm:
            // nothing can arm it again, so its life ends with this run.
            header
                .state
                .update(|old| Some(old.orphaned()))
                .expect("the edit always applies")
                .1
        } else {
            state
        };
        if core.run_waiters > 0 {
            self.run_done.notify_all();
        }
        core.run_ended(work.address());
        if yield_delay_ns > 0 {
            core.deferred_yields += 1;
        }
        if next.is_none() {
            core.panics += 1;
        }
        drop(core);
        if let Some(failure) = restore_failure {
            failure.log();
        }
        if state.is_orphaned() {
            // The handle is gone and left the closure to us; its destructor is user
            // code, so it runs after the lock is released.
            self.end_life(&work);
        }
        drop(work);
    }

    /// The word a run's completion leaves, from `old`: the run ended, and the callback's
    /// decision applied unless re-arms are refused (a `cancel_sync` or drop during the
    /// run) or the scheduler shut down during it (an instance armed meanwhile would
    /// never run: the drain is over). `next` is `None` for a panic. A `once` work's one
    /// run leaves nothing armed.
    fn after_run(&self, old: State, next: Option<Next>, ending: &RunEnd) -> State {
        let RunEnd {
            now_ns,
            shutdown,
            period,
            yield_delay_ns,
            once,
        } = *ending;
        let ended = old.run_ended();
        let new = match next {
            None => ended.poisoned(),
            Some(_) if shutdown => ended.disarmed(),
            Some(_) if old.refuses_arm() => ended,
            Some(next) => {
                let new = self.apply_next(ended, next, now_ns, period, yield_delay_ns);
                if next == Next::Park && old.was_touched_during_run() && !new.is_pending() {
                    // A touch during the run, and the callback parked: armed for its
                    // period, as if the touch had come just after.
                    new.armed(Shared::deadline_after(now_ns, period.max(self.slack_ns())))
                } else {
                    new
                }
            }
        };
        if once { new.disarmed() } else { new }
    }

    /// The callback's decision, applied to the word of a run that ended.
    fn apply_next(
        &self,
        state: State,
        next: Next,
        now_ns: u64,
        period_ns: u64,
        yield_delay_ns: u64,
    ) -> State {
        let slack = self.slack_ns();
        match next {
            Next::Park => state,
            // An instance armed during the run (a `schedule` from any thread, or from the
            // callback itself) runs after this one, as `schedule` promises: `Stop` declines
            // the callback's own re-arm, as `Park` does, and leaves that arm standing, as
            // one made just after the run would.
            Next::Stop if state.is_pending() => state,
            Next::Stop => state.stopped(),
            Next::Again | Next::After(_) | Next::At(_) if state.is_pending() => state,
            Next::Again => state.armed(Shared::deadline_after(now_ns, period_ns.max(slack))),
            Next::After(delay) => {
                state.armed(Shared::deadline_after(now_ns, nanos(delay).max(slack)))
            }
            Next::At(instant) => {
                let at = units_ceil(self.ns_at(instant));
                state.armed(at.max(Shared::deadline_after(now_ns, slack)))
            }
            Next::Yield => {
                state.armed_for_an_increment(Shared::deadline_after(now_ns, yield_delay_ns))
            }
        }
    }

    /// A timeout work's touch during its run is never lost: read after `RUNNING` was
    /// cleared (the mirror of `touch_timeout`), a stamp newer than the one the run was
    /// taken with arms the work for touch + idle, as a touch just after the run would:
    /// now + idle, and never earlier than the touch's own stamp + idle (a stamp read
    /// before the run began but stored during it would otherwise make the work due again
    /// at once).
    fn rearm_for_a_touch_during_the_run(
        &self,
        core: &mut Core,
        work: &WorkRef,
        now_ns: u64,
        touch_stamp: u64,
    ) {
        let stamp = load_ordered_after_seqcst_writes(&work.header().period_or_touch);
        if stamp <= touch_stamp {
            return;
        }
        let idle = work.period_ns();
        let due = self
            .touch_due(stamp, idle)
            .max(Shared::deadline_after(now_ns, idle));
        self.commit(core, work, now_ns, |old| {
            if old.is_pending_or_running() || old.refuses_touch() {
                return None;
            }
            Some(old.armed(due))
        });
    }

    /// Moves virtual time forward by `by`, running every due work on the caller in
    /// deadline order; returns the number of runs.
    pub(crate) fn advance(self: &Arc<Self>, scheduler: &Scheduler, by: Duration) -> usize {
        let Some(mut core) = self.lock_unless_forked() else {
            return 0;
        };
        let start = self.virtual_now_ns.load(Ordering::Acquire);
        let target = start.saturating_add(nanos(by));
        let mut runs = 0;
        loop {
            self.expire(&mut core, target);
            let Some(taken) = self.take_ready(&mut core, target) else {
                break;
            };
            let now = self
                .virtual_now_ns
                .load(Ordering::Acquire)
                .max(taken.deadline_ns);
            self.virtual_now_ns.store(now, Ordering::Release);
            drop(core);
            let executed = self.execute(scheduler, taken, now, None);
            runs += 1;
            if executed == Executed::InForkedChild {
                return leave_forked_child(runs);
            }
            core = self.lock();
        }
        let now = self.virtual_now_ns.load(Ordering::Acquire).max(target);
        self.virtual_now_ns.store(now, Ordering::Release);
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

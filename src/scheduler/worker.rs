//! The worker thread loop (leader/follower over one timer).
//!
//! Each worker, with the core lock held:
//! 1. moves everything due from the wheel to the ready list;
//! 2. takes the first ready work that is not running elsewhere and runs it unlocked;
//! 3. else, if no worker is blocked on the timer, becomes the *poller*: programs the
//!    timer for the earliest end of an armed window (or disarms it when nothing is
//!    armed), marks itself blocked and sleeps on it;
//! 4. else sleeps on the `idle` condition variable as a follower.
//!
//! A worker that is not the poller may still place entries (judging due ones can put
//! them back into the wheel); it then brings the poller's wakeup forward if needed, so
//! the timerfd is never programmed later than the wheel's next slot.
//!
//! With every work parked the poller's timerfd is disarmed and followers wait on the
//! condvar: zero wakeups per second. Arming from another thread either notifies an idle
//! follower (due now) or re-programs the timerfd if the new window's end is earlier than
//! the programmed wakeup (see `Shared::kick`). Wakeups follow the ends of the windows
//! (see `leeway`): one per run of a lone periodic work, and one for every group of works
//! whose windows overlap, with one worker or many (`benches/work.rs`, `per-run` and
//! `coalesced`).
//!
//! # Handing on
//!
//! A worker that takes a run leaves behind the rest: due works on the ready queue, and a
//! timer nobody watches while it runs. It hands them to an idle follower (or, for due
//! works, wakes the blocked poller) only when the run may hold them up: when the work
//! never ran before, or when its longest run so far would end past the earliest end of
//! what is left plus two slacks (a window's end in the wheel lies one slack before the
//! latest start the leeway allows, and the slack is the tolerance past that). Otherwise
//! it runs them itself when the run ends, and a group of due works costs one wakeup
//! however many workers there are. An arm from another thread during the run still wakes
//! a follower to watch (`kick`). A run longer than any of its work's runs before holds up
//! the others until it ends; every later run of that work is handed on around.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::mpsc::Sender;

use crate::Error;
use crate::clock::sleeper::SleeperReader;
use crate::scheduler::backoff::Backoff;
use crate::scheduler::handle::Handle;
use crate::scheduler::shared::{Core, Shared};
use crate::scheduler::work::run::{Executed, Taken};
use crate::scheduler::work::state::DEADLINE_UNIT_NS;
use crate::sync::thread_local;

thread_local! {
    /// The scheduler this thread is a worker of, so shutdown never joins itself.
    // loom's thread_local! has no `const { }` form, and this must build with both.
    #[allow(clippy::missing_const_for_thread_local)]
    static WORKER_OF: Cell<usize> = Cell::new(0);
}

/// Whether the current thread is one of `shared`'s workers.
pub(crate) fn is_worker_of(shared: &Shared) -> bool {
    // `try_with`: a `Scheduler` may be dropped in a thread-local destructor that runs
    // after this one's; no thread that is past its thread-locals is a worker.
    WORKER_OF
        .try_with(|of| of.get() == shared as *const Shared as usize)
        .unwrap_or(false)
}

/// Whether a run about to start may hold up what its worker leaves behind (see "Handing
/// on"): something is left, and the work never ran, or its longest run would end past
/// the earliest end of the rest plus two slacks.
fn run_may_hold_up(shared: &Shared, core: &Core, taken: &Taken, now_ns: u64) -> bool {
    let refresh = shared.touch_tick.next_refresh_ns();
    if core.wheel.len() == 0 && refresh.is_none() {
        return false;
    }
    let stats = &taken.work.header().stats;
    if stats.runs() == 0 {
        return true;
    }
    let held_until = now_ns
        .saturating_add(stats.busy_max_ns())
        .saturating_sub(2 * shared.config.slack_ns);
    refresh.is_some_and(|at| at < held_until)
        || core.wheel.has_end_before(held_until / DEADLINE_UNIT_NS)
}

pub(crate) fn main(
    shared: Arc<Shared>,
    reader: SleeperReader,
    started: Sender<Result<crate::priority::Tid, Error>>,
) {
    let priority = shared.config.priority;
    if let Err(source) = priority.apply_to_current_thread() {
        let _ = started.send(Err(Error::Priority { priority, source }));
        return;
    }
    WORKER_OF.with(|of| of.set(Arc::as_ptr(&shared) as usize));
    let slot = shared.lock().lending.register_current_worker();
    let mut backoff = Backoff::new(shared.config.back_off);
    let _ = started.send(Ok(crate::priority::current_tid()));
    drop(started);

    let handle = Handle::new(shared.clone());
    let scheduler = handle.as_scheduler();
    let mut core = shared.lock();
    loop {
        if core.shutdown {
            break;
        }
        let now = shared.now_ns();
        shared.clock.observe_coarse_lag(now);
        shared.expire(&mut core, now);
        let taken = shared.take_ready(&mut core, now);
        if core.poller_blocked {
            // Judging entries may have placed some earlier than the blocked poller's
            // wakeup (a ready entry whose work was re-armed later goes back into the
            // wheel): bring its wakeup forward, or nobody looks at them in time.
            shared.wake_poller_by(&mut core, now);
        }
        if let Some(mut taken) = taken {
            taken.worker_slot = Some(slot);
            core.lending
                .start(slot, crate::scheduler::wait::frames::address(&taken.work));
            // Hand on what this worker leaves behind if this run may hold it past it
            // (see "Handing on" in the module docs): more due works go to an idle
            // follower (or wake the poller), and a follower watches the timer while
            // nobody does.
            if run_may_hold_up(&shared, &core, &taken, now) {
                if core.wheel.has_ready() {
                    if core.idle_workers > 0 {
                        shared.idle.notify_one();
                    } else if core.poller_blocked {
                        shared.program(&mut core, Some(now), now);
                    }
                } else if !core.poller_blocked && core.idle_workers > 0 {
                    shared.idle.notify_one();
                }
            }
            drop(core);
            if shared.execute(scheduler, taken, now, Some(&mut backoff)) == Executed::InForkedChild
            {
                // `fork()` inside the callback and this is the child's only thread: it
                // runs nothing more, never reads the parent's timerfd and takes no lock
                // (see `fork`). Returning ends the thread.
                return;
            }
            core = shared.lock();
            continue;
        }
        if !core.poller_blocked {
            let wake = shared.next_wake_ns(&core, now);
            shared.program(&mut core, wake, now);
            core.poller_blocked = true;
            drop(core);
            reader.wait();
            core = shared.lock();
            core.poller_blocked = false;
            core.programmed_ns = None;
            continue;
        }
        core.idle_workers += 1;
        core = core.wait(&shared.idle);
        shared.wakeups.follower_woke();
        core.idle_workers -= 1;
    }
    // Leave the poller role to another exiting worker.
    drop(core);
    shared.idle.notify_all();
}

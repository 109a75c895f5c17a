//! The worker thread loop (leader/follower over one timer).
//!
//! Each worker, with the core lock held:
//! 1. moves everything due from the wheel to the ready list;
//! 2. takes the first ready work that is not running elsewhere and runs it unlocked;
//! 3. else, if no worker is blocked on the timer, becomes the *poller*: programs the
//!    timer for the earliest end of an armed window (or disarms it when nothing is
//!    armed), marks itself blocked and sleeps on it;
//! 4. else, where there is a standby's timer and nobody sleeps on it, sleeps on it as the
//!    *standby* (see `standby`);
//! 5. else sleeps on the `idle` condition variable as a follower.
//!
//! A worker that is not the poller may still place entries (judging due ones can put
//! them back into the wheel); it then brings the poller's wakeup forward if needed, so
//! the timerfd is never programmed later than the wheel's next slot.
//!
//! With every work parked the poller's timerfd is disarmed, the standby's too, and
//! followers wait on the condvar: zero wakeups per second. Arming from another thread either notifies an idle
//! follower (due now) or re-programs the timerfd if the new window's end is earlier than
//! the programmed wakeup (see `Shared::kick`). Wakeups follow the ends of the windows
//! (see `leeway`): one per run of a lone periodic work, and one for every group of works
//! whose windows overlap, with one worker or many (`benches/work.rs`, `per-run` and
//! `coalesced`).
//!
//! # Handing on
//!
//! A worker that takes a run leaves behind the rest: due works on the ready queue, and a
//! timer nobody watches while it runs. Where there is a standby (see `standby`: Linux,
//! two workers or more) it sets the standby's watch for the earliest end of the rest
//! (or now, if that passed) plus two slacks, and runs the rest itself when its run ends
//! in time; the standby wakes only when it does not. So a group of due works costs one
//! wakeup however many workers there are, and no due work waits for a busy worker more
//! than two slacks past its window's end, or past the time the worker took its run. Without
//! a standby it hands the rest to an idle follower at once (or, for due works, wakes the
//! blocked poller), as a worker of the portable build does.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::mpsc::Sender;

use crate::Error;
use crate::clock::sleeper::SleeperReader;
use crate::scheduler::backoff::Backoff;
use crate::scheduler::handle::Handle;
use crate::scheduler::shared::Shared;
use crate::scheduler::work::run::Executed;
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

pub(crate) fn main(
    shared: Arc<Shared>,
    reader: SleeperReader,
    watch_reader: Option<SleeperReader>,
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
            // Hand on what this worker leaves behind (see "Handing on" in the module
            // docs): the standby watches it, or an idle follower takes the due works or
            // the timer at once.
            let left = shared.watch_for_the_rest(&core, now);
            if let Some(at) = left.filter(|_| !core.poller_blocked || core.wheel.has_ready()) {
                let watched = shared.watch_until(&mut core, at, now, true);
                if watched {
                    // The standby wakes only if this worker is still busy by then.
                } else if core.wheel.has_ready() {
                    if core.idle_workers > 0 {
                        shared.idle.notify_one();
                    } else if core.poller_blocked {
                        shared.program(&mut core, Some(now), now);
                    }
                } else if core.idle_workers > 0 {
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
        // Someone blocks on the main timer from here on (this worker, or the poller):
        // the standby need not watch.
        Shared::disarm_watch(&mut core);
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
        if let Some(watch_reader) = watch_reader.as_ref().filter(|_| !core.standby_waiting) {
            core.standby_waiting = true;
            drop(core);
            watch_reader.wait();
            core = shared.lock();
            core.standby_waiting = false;
            Shared::disarm_watch(&mut core);
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

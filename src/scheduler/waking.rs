//! Which wakeup a scheduler asks for, under its core lock: a worker kicked to look at a
//! new entry by the end of its window, the timerfd programmed for the earliest window end
//! (`Wheel::next_wake`), and a host told when to call `run_due` (`host_wake_ns`).
//! `impl Shared` continues here from `shared.rs`; the ground rules are in the
//! [module docs](super).

use super::shared::{Core, NO_HOST_WAKE, Shared};
use crate::sync::Ordering;

impl Shared {
    /// Makes sure some worker (or a hosted scheduler's host) will look at a new entry
    /// by the end of its window, `deadline_ns` (see `leeway`), which it may not know
    /// about yet.
    pub(super) fn kick(&self, core: &mut Core, deadline_ns: u64, now_ns: u64) {
        if core.shutdown || core.sleeper.is_none() {
            return;
        }
        if self.config.hosted {
            let wake_ns = self.wake_for(deadline_ns, now_ns);
            if core.programmed_ns.is_none_or(|at| wake_ns < at) {
                self.program(core, Some(wake_ns), now_ns);
                Self::tell_host(core);
            }
            return;
        }
        if deadline_ns <= now_ns && self.wake_idle_worker(core) {
            return;
        }
        if !core.poller_blocked {
            // Nobody watches the timer: the workers are busy, or the one that watched
            // took a run (see `worker`). For the re-arm of a run a worker is completing,
            // that worker looks at the structure first when it releases the lock. Else
            // the standby's watch covers the new window (see `standby`), or an idle
            // follower becomes the watcher; with neither, the next worker to finish
            // looks at the structure first.
            if !core.completing_on_worker
                && !self.watch_until(
                    core,
                    deadline_ns.saturating_add(2 * self.config.slack_ns),
                    now_ns,
                    false,
                )
                && core.idle_workers > 0
            {
                self.idle.notify_one();
            }
            return;
        }
        let wake_ns = self.wake_for(deadline_ns, now_ns);
        if core.programmed_ns.is_none_or(|at| wake_ns < at) {
            self.program(core, Some(wake_ns), now_ns);
        }
    }

    /// When to wake for `deadline_ns`: now if it passed, else rounded up to the slack,
    /// so neighbouring deadlines share the wakeup.
    fn wake_for(&self, deadline_ns: u64, now_ns: u64) -> u64 {
        if deadline_ns <= now_ns {
            now_ns
        } else {
            deadline_ns
                .div_ceil(self.slack_ns())
                .saturating_mul(self.slack_ns())
        }
    }

    /// Brings the blocked poller's wakeup forward to the wheel's next slot if that is
    /// earlier than what the timerfd is programmed for.
    pub(super) fn wake_poller_by(&self, core: &mut Core, now_ns: u64) {
        if let Some(wake_ns) = self.next_wake_ns(core, now_ns) {
            if core.programmed_ns.is_none_or(|at| wake_ns < at) {
                self.program(core, Some(wake_ns), now_ns);
            }
        }
    }

    /// Sets the timer for the next wake the structure asks for now, also when that is
    /// later than the one set (an entry's window grew): for the blocked poller, or a
    /// hosted scheduler's host. A worker that is not blocked sets it when it next sleeps;
    /// meanwhile a standby's watch (see `standby`) follows an earlier end.
    pub(crate) fn follow_next_wake(&self, core: &mut Core, now_ns: u64) {
        if core.shutdown || core.sleeper.is_none() {
            return;
        }
        if !(self.config.hosted || core.poller_blocked) {
            // A worker is busy: a standby watching for it watches the new window too.
            if core.watch_ns.is_some() {
                if let Some(at) = self.watch_for_the_rest(core, now_ns) {
                    self.watch_until(core, at, now_ns, false);
                }
            }
            return;
        }
        let wake_ns = self.next_wake_ns(core, now_ns);
        let earlier = wake_ns.is_some_and(|at| core.programmed_ns.is_none_or(|set| at < set));
        self.program(core, wake_ns, now_ns);
        if earlier && self.config.hosted {
            Self::tell_host(core);
        }
    }

    /// Tells a hosted scheduler's host that its next wake moved earlier: its descriptor
    /// turns readable, and its waker is woken once the lock is released.
    fn tell_host(core: &mut Core) {
        if let Some(sleeper) = &core.sleeper {
            sleeper.signal_host();
        }
        if let Some(waker) = &core.host_waker {
            core.owed_wakes.push(waker.clone());
        }
    }

    /// Programs the timerfd for `wake_ns` (or disarms it), skipping the system call when
    /// it is already set so.
    pub(crate) fn program(&self, core: &mut Core, wake_ns: Option<u64>, now_ns: u64) {
        if core.programmed_ns == wake_ns {
            return;
        }
        self.reprogram(core, wake_ns, now_ns);
    }

    /// [`program`](Self::program) even when the timer is set so already (a hosted
    /// `run_due` drained its expiry, so only a new programming makes it readable again).
    ///
    /// A hosted scheduler's `host_wake_ns` moves with the timer, in the order that keeps
    /// `run_due`'s lock-free test sound: a readable descriptor always comes with a
    /// `host_wake_ns` that is not in the future, so `run_due` drains it. An earlier wake
    /// is published before the timer is set, a later one (or none) after.
    pub(crate) fn reprogram(&self, core: &mut Core, wake_ns: Option<u64>, now_ns: u64) {
        let Some(sleeper) = core.sleeper.as_mut() else {
            return;
        };
        let published = wake_ns.unwrap_or(NO_HOST_WAKE);
        let earlier = self.config.hosted && published < self.host_wake_ns.load(Ordering::Relaxed);
        if earlier {
            self.host_wake_ns.store(published, Ordering::Release);
        }
        match wake_ns {
            Some(at) => sleeper.program(at.saturating_sub(now_ns)),
            None => sleeper.disarm(),
        }
        core.programmed_ns = wake_ns;
        if self.config.hosted && !earlier {
            self.host_wake_ns.store(published, Ordering::Release);
        }
    }
}

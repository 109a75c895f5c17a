//! The standby: an idle worker that sleeps on a timer of its own, so that a worker busy
//! with a run can leave the rest to it without waking it.
//!
//! # Why
//!
//! A worker that takes a run leaves behind the works due after it, and the timer, which
//! nobody watches while it runs. Waking an idle worker to watch them costs a wakeup per
//! run, and works that share a wakeup by their leeway (see `leeway`) would then cost two
//! per group with two workers. Not waking one would let a run that blocks (on I/O, or on
//! another work's run) hold up every other work until it ends, however many workers
//! there are.
//!
//! # How
//!
//! With two workers or more on Linux, the first worker to go idle while no other stands
//! by sleeps on the *watch*, a second timerfd, instead of the idle condition variable. A
//! worker that takes a run while something else is armed and nobody is blocked on the
//! main timer sets the watch for the earliest end of what is left plus two slacks (the
//! latest start the leeway allows, plus the slack's tolerance; see `leeway`), or for now
//! plus two slacks when that end passed already (a worker that woke late is busy, not
//! stuck), and keeps it ahead of the works it gets through while it runs them. When the
//! run (or the group of runs) ends in time, the worker blocks on the main timer and
//! disarms the watch: a timerfd that is disarmed wakes no reader, so the standby sleeps
//! on. When it does not, the watch fires, and the standby takes the due works, or the
//! main timer, over. So a group of due works costs one wakeup however many workers there
//! are, and a due work never waits for a busy worker past its window.
//!
//! A work due now (a zero delay, a `Yield`) from another thread fires the watch at once,
//! as it notifies a follower on the condition variable.
//!
//! The portable worker has no standby: a condition variable's timed wait cannot be
//! disarmed without waking its sleeper, so a worker that takes a run wakes a follower
//! to watch when anything else is armed, as every worker did before the standby: two
//! wakeups per group of due works with two workers.
//!
//! Every field is the core's (`L:`): `watch`, `standby_waiting`, `watch_ns`.

use crate::scheduler::shared::{Core, Shared};

// === `impl Shared`, this file's part: the standby worker and its watch. ===
impl Shared {
    /// Wakes an idle worker for a work due now: a follower on the condition variable, or
    /// the standby (its watch fires at once). Returns whether there was one.
    pub(crate) fn wake_idle_worker(&self, core: &mut Core) -> bool {
        if core.idle_workers > 0 {
            self.idle.notify_one();
            return true;
        }
        self.watch_until(core, 0, 0, false)
    }

    /// Sets the standby's watch to fire by `at_ns` (scheduler time, `now_ns` now), if a
    /// standby waits: earlier than it is set; and, with `postpone`, later when it is about
    /// to fire (within a slack, not yet passed) for works that the busy worker got
    /// through since. Only the busy worker postpones, with the watch for all it leaves
    /// behind (`watch_for_the_rest`): a watch for one new window must never move it past
    /// the works it was set for. Returns whether a standby waits.
    pub(crate) fn watch_until(
        &self,
        core: &mut Core,
        at_ns: u64,
        now_ns: u64,
        postpone: bool,
    ) -> bool {
        if !core.standby_waiting {
            return false;
        }
        let slack = self.config.slack_ns;
        let set = match core.watch_ns {
            None => true,
            Some(set) => {
                at_ns < set
                    || (postpone
                        && now_ns < set
                        && set <= now_ns.saturating_add(slack)
                        && at_ns > set)
            }
        };
        if set {
            if let Some(watch) = core.watch.as_mut() {
                watch.program(at_ns.saturating_sub(now_ns));
                core.watch_ns = Some(at_ns);
            }
        }
        true
    }

    /// The watch for what a worker leaves behind as it takes a run at `now_ns`: the
    /// earliest end of what is left, or now if that passed already, plus two slacks.
    /// `None` when nothing is left.
    ///
    /// Not earlier than now + two slacks: a worker that woke late (its timer's latency,
    /// a CPU it waited for) is busy, not stuck, and the standby can do nothing for works
    /// that are overdue already that the busy worker does not do within those slacks.
    pub(crate) fn watch_for_the_rest(&self, core: &Core, now_ns: u64) -> Option<u64> {
        let wheel = core
            .wheel
            .first_end()
            .map(crate::scheduler::work::state::units_to_ns);
        [wheel, self.touch_tick.next_refresh_ns()]
            .into_iter()
            .flatten()
            .min()
            .map(|end| end.max(now_ns).saturating_add(2 * self.config.slack_ns))
    }

    /// Disarms the watch: a worker blocks on the main timer, or the standby woke.
    pub(crate) fn disarm_watch(core: &mut Core) {
        if core.watch_ns.take().is_some() {
            if let Some(watch) = core.watch.as_mut() {
                watch.disarm();
            }
        }
    }

    /// Wakes the standby so it sees the shutdown.
    pub(crate) fn wake_standby_for_shutdown(core: &mut Core) {
        if let Some(watch) = core.watch.as_mut() {
            watch.program(1);
            core.watch_ns = Some(0);
        }
    }
}

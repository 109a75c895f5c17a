//! The state a scheduler shares with its works and workers: `Shared`, its `Core` under the
//! one lock, the lock gate, arming and timerfd programming, and shutdown. The ground
//! rules are in the [module docs](super).
//!
//! `impl Shared` is this file's and that of each file below, each opening its part with a
//! banner that says what it adds:
//! - `waking.rs`: which wakeup the scheduler asks for (kicking a worker, programming the
//!   timerfd, telling a host);
//! - `work/arming.rs`: `schedule`, `reschedule`, `schedule_within`, `touch`, `detach`,
//!   the period rule;
//! - `work/cancel.rs`: `cancel`, `cancel_sync`, the handle's release, `disable`/`enable`;
//! - `work/run.rs`: a run's life (classify, take, execute, complete) and `advance`;
//! - `work/timeout.rs`: a timeout's touch and due time, and the touch tick's scheduler
//!   side;
//! - `work/listing.rs`: the list of live works;
//! - `work/stats.rs`: statistics snapshots;
//! - `wait/flush.rs`: `flush` and `try_flush`;
//! - `wait/futures.rs`: the waits of `cancel_async` and `drop_async`.

use std::collections::{HashMap, HashSet};
use std::task::Waker;
use std::time::Instant;

use super::WorkRef;
use crate::Priority;
use crate::clock::Clock;
use crate::clock::sleeper::Sleeper;
use crate::clock::touch_tick::TouchTick;
use crate::scheduler::lock::{OwedWakes, WakingGuard};
use crate::scheduler::wait::lending::Lending;
use crate::scheduler::wakeups::WorkerWakeups;
use crate::scheduler::work::Header;
use crate::scheduler::work::entry::{Entry, Placement};
use crate::scheduler::work::listed_slots::ListedSlots;
use crate::scheduler::work::state::{DEADLINE_UNIT_NS, State, units_ceil};
use crate::sync::{AtomicU64, AtomicUsize, Condvar, Mutex, Ordering, lock};
use crate::wheel::{ReadyOrder, Wheel};

/// Delays at least this many times the coarse clock's margin are timed with the coarse
/// clock (so its extra lateness is at most 1 % of the delay); shorter ones read the full
/// clock.
const COARSE_DELAY_FACTOR: u64 = 100;

/// `Shared::host_wake_ns` when nothing is armed.
pub(crate) const NO_HOST_WAKE: u64 = u64::MAX;

/// Stale timer entries tolerated beyond half the structure before a sweep.
const SWEEP_FLOOR: usize = 1024;

/// Settings fixed at build time. I: set by `build()`, read-only after.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// I: the worker threads' name prefix.
    pub(super) name: String,
    /// I: the workers' priority.
    pub(super) priority: Priority,
    /// I: how many worker threads (0 for `manual()`).
    pub(super) workers: usize,
    /// I: the coalescing window, after clamping.
    pub(super) slack_ns: u64,
    /// I: whether workers back off between `Yield` increments.
    pub(super) back_off: bool,
    /// I: a hosted scheduler (`build_hosted`): no workers, the host's `Driver` runs
    /// the works, and the timerfd is the host's to poll.
    pub(super) hosted: bool,
}

/// Everything the one core lock guards: every field is `L:` (the guard tags are in
/// `sync`'s legend).
#[derive(Debug)]
pub(crate) struct Core {
    /// L: the timer entries (see `state` for which are live).
    pub(super) wheel: Wheel<Entry>,
    /// L: set once, by the last owning handle's drop; nothing is armed after.
    pub(super) shutdown: bool,
    /// L: workers sleeping on `Shared::idle` as followers.
    pub(super) idle_workers: usize,
    /// L: threads sleeping on `Shared::run_done` for the end of a run.
    pub(super) run_waiters: usize,
    /// L: a worker is blocked in the timerfd `read` (the poller).
    pub(super) poller_blocked: bool,
    /// L: the deadline the timerfd is programmed for, if any.
    pub(super) programmed_ns: Option<u64>,
    /// L: the timerfd (`None` for `manual()`).
    pub(super) sleeper: Option<Sleeper>,
    /// L: the standby's timer (see `standby`): Linux schedulers with two workers or more.
    pub(super) watch: Option<Sleeper>,
    /// L: a worker sleeps on `watch` as the standby.
    pub(super) standby_waiting: bool,
    /// L: when `watch` is set to fire, if it is.
    pub(super) watch_ns: Option<u64>,
    /// L: which worker runs what, and the priority lent to it.
    pub(super) lending: Lending,
    /// L: `Yield` increments deferred because every CPU was busy (see `backoff`).
    pub(super) deferred_yields: u64,
    /// L: callbacks that panicked (each poisoned its work).
    pub(super) panics: u64,
    /// L: a worker is completing a run: what it arms now it looks at itself as soon as it
    /// releases the lock, so `kick` wakes no follower for it.
    pub(super) completing_on_worker: bool,
    /// L: how many `cancel_sync`/drop calls wait for each running work (by address); a
    /// work is in here exactly while its state has `CANCEL_WAITING`.
    pub(super) cancel_waiters: HashMap<usize, usize>,
    /// L: timer entries made stale since the last sweep (an estimate: stale entries also
    /// leave on their own when their tick comes). See [`Shared::note_stale`].
    pub(super) stale_entries: usize,
    /// L: the disable count of each work whose state has `DISABLED` (by address).
    pub(super) disable_counts: HashMap<usize, u64>,
    /// L: a hosted scheduler's waker (`Driver::set_waker`).
    pub(super) host_waker: Option<Waker>,
    /// L: the wakers of futures (`cancel_async`, `drop_async`) waiting for the end of a
    /// run, by the running work's address; a run's completion moves its own to
    /// `owed_wakes`.
    pub(crate) run_wakers: Vec<RunWaker>,
    /// L: wakes owed (to the host's waker, to futures whose run ended), made by
    /// the [`CoreGuard`]'s drop once the lock is released: a waker is user code.
    pub(crate) owed_wakes: Vec<Waker>,
}

/// A future's waker, waiting for the end of the run of the work at `work`.
#[derive(Debug)]
pub(crate) struct RunWaker {
    pub(crate) work: usize,
    /// Tells one future's registration from another's, so a re-poll replaces it.
    pub(crate) id: usize,
    pub(crate) waker: Waker,
}

/// The core lock's guard: it wakes the owed wakers after releasing the lock (see
/// [`lock`](crate::scheduler::lock)).
pub(crate) type CoreGuard<'a> = WakingGuard<'a, Core>;

impl OwedWakes for Core {
    fn take_owed_wakes(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.owed_wakes)
    }

    #[inline]
    fn owes_wakes(&self) -> bool {
        !self.owed_wakes.is_empty()
    }
}

impl Core {
    /// Moves the wakers waiting for the end of `work`'s run to the owed wakes.
    pub(crate) fn run_ended(&mut self, work: usize) {
        if self.run_wakers.is_empty() {
            return;
        }
        let mut index = 0;
        while index < self.run_wakers.len() {
            if self.run_wakers[index].work == work {
                let ended = self.run_wakers.swap_remove(index);
                self.owed_wakes.push(ended.waker);
            } else {
                index += 1;
            }
        }
    }
}

/// A scheduler's shared state, one per scheduler, reached through `Arc` by its handles,
/// its works and its workers. Each field is tagged with what guards it (`I:`, `L:`, `A:`,
/// `T:`; see the legend in `sync`).
pub(crate) struct Shared {
    /// The core lock and what it guards.
    pub(super) core: Mutex<Core>,
    /// L (waited on with the core lock): signalled by a run's completion when
    /// `Core::run_waiters` is not zero.
    pub(super) run_done: Condvar,
    /// L (waited on with the core lock): wakes follower workers.
    pub(super) idle: Condvar,
    /// I: the time source.
    pub(super) clock: Clock,
    /// A (written under the core lock by `advance`, read anywhere): the manual clock;
    /// unused by real schedulers.
    pub(super) virtual_now_ns: AtomicU64,
    /// I: the build settings.
    pub(super) config: Config,
    /// A: owning `Scheduler` handles; `Clone` adds, `Drop` subtracts, and the one that
    /// reaches zero shuts down.
    pub(super) handles: AtomicUsize,
    /// T: the worker threads to join at shutdown; filled by `build()`.
    pub(super) threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// T: the workers' ids and wakeup count.
    pub(crate) wakeups: WorkerWakeups,
    /// A/T: the tick long timeouts' touches read (see `clock::touch_tick`).
    pub(crate) touch_tick: TouchTick,
    /// A: the machine's contention as callbacks read it (see `contention`).
    pub(crate) contention: crate::scheduler::contention::ContentionCache,
    /// A (written under the core lock, read by a hosted scheduler's `Driver` without
    /// it): the time the host is told to look at the works next, `NO_HOST_WAKE` for
    /// none. Never later than the earliest end of an armed window rounded up to the slack:
    /// every locked arm that moves it earlier lowers it (`kick`), a lock-free arm only
    /// moves a deadline later, and `run_due` recomputes it.
    pub(super) host_wake_ns: AtomicU64,
    /// T: the live works, for `Scheduler::works` (see `listing`).
    pub(crate) registry: std::sync::Mutex<ListedSlots<Header>>,
    /// A (loom models only): this manual scheduler stamps long timeouts with ticks, on its
    /// virtual clock (see `hooks::stamp_with_ticks_for_loom`).
    #[cfg(all(loom, feature = "loom"))]
    pub(crate) manual_ticks: std::sync::atomic::AtomicBool,
    /// I: the fork generation this scheduler was made in (see `fork`).
    fork_generation: u64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("manual", &self.clock.is_manual())
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn new(
        config: Config,
        sleeper: Option<Sleeper>,
        watch: Option<Sleeper>,
        raise_limit: Option<i32>,
    ) -> Self {
        let manual = sleeper.is_none();
        let wakeups = WorkerWakeups::new(sleeper.as_ref());
        Shared {
            core: Mutex::new(Core {
                wheel: Wheel::new(
                    config.slack_ns / DEADLINE_UNIT_NS,
                    if manual {
                        ReadyOrder::ByDeadline
                    } else {
                        ReadyOrder::ByEnd
                    },
                ),
                shutdown: false,
                idle_workers: 0,
                run_waiters: 0,
                poller_blocked: false,
                programmed_ns: None,
                sleeper,
                watch,
                standby_waiting: false,
                watch_ns: None,
                lending: Lending::new(raise_limit),
                deferred_yields: 0,
                panics: 0,
                completing_on_worker: false,
                cancel_waiters: HashMap::new(),
                disable_counts: HashMap::new(),
                stale_entries: 0,
                host_waker: None,
                run_wakers: Vec::new(),
                owed_wakes: Vec::new(),
            }),
            run_done: Condvar::new(),
            idle: Condvar::new(),
            clock: Clock::new(manual),
            virtual_now_ns: AtomicU64::new(0),
            config,
            handles: AtomicUsize::new(1),
            threads: std::sync::Mutex::new(Vec::new()),
            wakeups,
            touch_tick: TouchTick::new(0),
            contention: Default::default(),
            host_wake_ns: AtomicU64::new(NO_HOST_WAKE),
            registry: std::sync::Mutex::new(ListedSlots::new()),
            #[cfg(all(loom, feature = "loom"))]
            manual_ticks: std::sync::atomic::AtomicBool::new(false),
            fork_generation: crate::fork::generation(),
        }
    }

    /// Whether this is a copy in a `fork()`ed child: then nothing may take the lock (see
    /// `fork`).
    #[inline]
    pub(crate) fn is_forked_copy(&self) -> bool {
        crate::fork::is_forked_since(self.fork_generation)
    }

    /// The core lock, for workers and the paths they run (which never exist in a forked
    /// child). Entry points callable from user threads use `lock_unless_forked`.
    pub(crate) fn lock(&self) -> CoreGuard<'_> {
        CoreGuard::new(lock(&self.core))
    }

    /// The core lock, or `None` in a `fork()`ed child, where the lock may have been held
    /// at the fork by a thread that no longer exists and the scheduler is inert (see
    /// `fork`). Every operation a user thread can call takes the lock through this.
    pub(crate) fn lock_unless_forked(&self) -> Option<CoreGuard<'_>> {
        (!self.is_forked_copy()).then(|| self.lock())
    }

    /// Whether worker `tid` runs with a flusher's priority now (see `lending`).
    pub(super) fn is_lent_to(&self, tid: crate::priority::Tid) -> bool {
        self.lock().lending.is_lent_to(tid)
    }

    /// The scheduler's time, read in full.
    pub(crate) fn now_ns(&self) -> u64 {
        if self.clock.is_manual() {
            self.virtual_now_ns.load(Ordering::Acquire)
        } else {
            self.clock.real_now_ns()
        }
    }

    /// Whether `now + delay_ns` is timed with the coarse clock: a real scheduler and a
    /// delay of at least `COARSE_DELAY_FACTOR` margins (see `clock`).
    #[inline]
    pub(super) fn coarse_for(&self, delay_ns: u64) -> bool {
        !self.clock.is_manual() && delay_ns / COARSE_DELAY_FACTOR >= self.clock.coarse_margin_ns()
    }

    /// A time for computing `now + delay_ns` on a lock-free path: never earlier than
    /// the true time, read from the coarse clock where its lateness is small against the
    /// delay (see `clock`).
    #[inline]
    pub(super) fn now_for_delay(&self, delay_ns: u64) -> u64 {
        if self.coarse_for(delay_ns) {
            self.clock.coarse_upper_ns()
        } else {
            self.now_ns()
        }
    }

    /// A time for `now + delay_ns` that is never later than the true time (the lower
    /// counterpart of [`now_for_delay`](Self::now_for_delay)).
    #[inline]
    pub(super) fn now_lower_for_delay(&self, delay_ns: u64) -> u64 {
        if self.coarse_for(delay_ns) {
            self.clock.coarse_lower_ns()
        } else {
            self.now_ns()
        }
    }

    /// The next time the structure or the touch tick must be looked at (ns).
    pub(crate) fn next_wake_ns(&self, core: &Core, now_ns: u64) -> Option<u64> {
        let timers = core
            .wheel
            .next_wake(crate::scheduler::work::state::now_units(now_ns))
            .map(crate::scheduler::work::state::units_to_ns);
        match (timers, self.touch_tick.next_refresh_ns()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn instant_at(&self, ns: u64) -> Instant {
        self.clock.instant_at(ns)
    }

    /// The scheduler time of `instant` (0 before the scheduler's start, saturating far
    /// in the future).
    pub(crate) fn ns_at(&self, instant: Instant) -> u64 {
        crate::clock::nanos(instant.saturating_duration_since(self.clock.epoch()))
    }

    pub(super) fn slack_ns(&self) -> u64 {
        self.config.slack_ns
    }

    // === arming, under the core lock ===

    /// Applies `edit` to `work`'s state word with a CAS loop, as [`StateCell::update`](crate::scheduler::work::state::StateCell::update), and links a
    /// new timer entry when the result is armed and needs one (no live entry, or a
    /// deadline earlier than the live entry's). `now_ns` is the caller's reading of the
    /// clock. Returns the old and new words, or `None` if `edit` declined.
    pub(super) fn commit(
        &self,
        core: &mut Core,
        work: &WorkRef,
        now_ns: u64,
        edit: impl FnMut(State) -> Option<State>,
    ) -> Option<(State, State)> {
        self.commit_at(core, work, now_ns, true, edit)
    }

    /// [`commit`](Self::commit) with a `now_ns` that is either the full clock (`exact`) or
    /// the coarse clock's upper bound, which a long delay's arm reads (see
    /// [`now_for_delay`](Self::now_for_delay)). The upper bound places the entry and
    /// judges "due now" safely (it is never early, and the deadline lies a long delay
    /// past it); only programming the timer earlier, which counts from now, reads the
    /// full clock then.
    pub(super) fn commit_at(
        &self,
        core: &mut Core,
        work: &WorkRef,
        now_ns: u64,
        exact: bool,
        mut edit: impl FnMut(State) -> Option<State>,
    ) -> Option<(State, State)> {
        loop {
            let old = work.header().state.load();
            let mut new = edit(old)?;
            if core.shutdown {
                // Nothing is armed after shutdown: its drain is over, so an arm now would
                // stay pending for ever. Every locked arm passes here, and a lock-free arm
                // needs a live entry, which no work has once the drain is done.
                new.disarm();
            }
            // Due now: a new entry on the ready queue, since the live one (if any) may
            // wait for a later tick.
            let due_now = new.is_pending()
                && new.deadline() <= crate::scheduler::work::state::now_units(now_ns)
                && old != new;
            let epoch = (old.needs_entry(new) || due_now).then(|| new.claim_entry());
            if let Some(epoch) = epoch {
                // Before the CAS that makes the entry live (see "Placement" in `entry`).
                work.header()
                    .stats
                    .set_placement(Placement::encode(new.deadline(), epoch));
            }
            if old != new && !work.header().state.cas(old, new) {
                continue;
            }
            if let Some(epoch) = epoch {
                if old.has_live_entry() {
                    self.note_stale(core, 1);
                }
                let deadline = new.deadline();
                let end = self.window_end(work.header(), new, deadline, || work.period_ns());
                core.wheel.insert(
                    Entry::new(work, epoch),
                    deadline,
                    end,
                    crate::scheduler::work::state::now_units(now_ns),
                );
                let end_ns = crate::scheduler::work::state::units_to_ns(end);
                // `kick` counts a new timer setting from now; it sets one only for a
                // wakeup earlier than the one set, never one at or past it.
                let kick_now = if exact || core.programmed_ns.is_some_and(|at| at <= end_ns) {
                    now_ns
                } else {
                    self.now_ns()
                };
                self.kick(core, end_ns, kick_now);
            }
            return Some((old, new));
        }
    }

    /// Counts `count` timer entries that just went stale (their work was released, taken
    /// by a flush, or given an earlier entry). Entries are removed lazily, so a work
    /// dropped with a far deadline would otherwise keep its allocation until then; once
    /// stale entries may be half the structure, a sweep removes them all. A sweep costs
    /// one pass over the entries and happens at most once per that many stale ones, so
    /// the cost per entry is constant, and the structure never holds more than about
    /// twice the armed works.
    pub(super) fn note_stale(&self, core: &mut Core, count: usize) {
        core.stale_entries += count;
        if core.stale_entries <= core.wheel.len() / 2 + SWEEP_FLOOR {
            return;
        }
        core.stale_entries = 0;
        // A work keeps one entry: the first in processing order that looks live. Its
        // epoch may match a stale entry's too (epochs wrap), but the first is never
        // placed later than the live one, so keeping it never delays the work.
        let mut kept = HashSet::new();
        core.wheel.retain(|entry| {
            let header = entry.header();
            loop {
                let state = header.state.load();
                if !state.is_live_entry(entry.epoch()) {
                    return false;
                }
                if state.is_pending() {
                    return kept.insert(entry.address());
                }
                // Live but disarmed (cancelled): drop it, and with it the claim.
                if header.state.cas(state, state.without_entry()) {
                    return false;
                }
            }
        });
    }

    /// The works armed now: live entries whose work is pending.
    pub(super) fn count_armed(&self, core: &Core) -> usize {
        let mut armed = HashSet::new();
        core.wheel.for_each(|entry| {
            let state = entry.header().state.load();
            if state.is_live_entry(entry.epoch()) && state.is_pending() {
                armed.insert(entry.address());
            }
        });
        armed.len()
    }

    /// The deadline, in units, `delay_ns` from `now_ns`: rounded up (never early),
    /// except that a zero delay is due at once (rounded down), so that it runs at the next
    /// opportunity and not at the next tick.
    pub(super) fn deadline_after(now_ns: u64, delay_ns: u64) -> u64 {
        if delay_ns == 0 {
            now_ns / DEADLINE_UNIT_NS
        } else {
            units_ceil(now_ns.saturating_add(delay_ns))
        }
    }

    // === shutdown ===

    /// Whether the scheduler shut down (or this is its copy in a forked child, where it
    /// runs nothing).
    pub(crate) fn is_shut_down(&self) -> bool {
        self.lock_unless_forked().is_none_or(|core| core.shutdown)
    }

    /// Cancels every armed work and wakes every worker so it exits.
    pub(crate) fn shutdown(&self) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        core.shutdown = true;
        let entries = core.wheel.drain();
        let ended = Self::disarm_drained(&entries);
        self.idle.notify_all();
        Self::wake_standby_for_shutdown(&mut core);
        if self.config.hosted {
            // Nothing is ever due again: the descriptor is disarmed (which also clears
            // an expiry not yet drained) and the host's waker is told once.
            self.reprogram(&mut core, None, 0);
            if let Some(waker) = core.host_waker.take() {
                core.owed_wakes.push(waker);
            }
        } else if let Some(sleeper) = core.sleeper.as_mut() {
            // Wakes the blocked poller, which sees the shutdown and exits.
            sleeper.program(1);
        }
        core.programmed_ns = None;
        drop(core);
        // Closures are user code: dropped outside the lock, contained.
        for work in ended {
            self.end_life(&work);
        }
        // Every remaining closure was dropped or is kept by its handle, so dropping the
        // entries runs no user code.
        drop(entries);
    }

    /// Disarms the works of timer entries taken out at shutdown (the wheel's, or the
    /// ones a hosted `run_due` held back for its next call); returns the detached works
    /// whose life ends with the scheduler, for the caller to end with no lock held (a
    /// running one's ends when its run completes, with its re-arm refused).
    pub(crate) fn disarm_drained<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Vec<WorkRef> {
        let mut ended = Vec::new();
        for entry in entries {
            let (old, new) = entry
                .header()
                .state
                .update(|state| Some(state.drained()))
                .expect("the edit always applies");
            if new.is_orphaned() && !old.is_orphaned() {
                ended.push(entry.work_ref());
            }
        }
        ended
    }
}

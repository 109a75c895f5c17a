//! The state a scheduler shares with its works and workers: `Shared`, its `Core` under the
//! one lock, the lock gate, arming and timerfd programming, and shutdown. The ground
//! rules are in the [module docs](super).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::lending::Lending;
use super::state::{State, PENDING};
use super::{Callback, Header, WorkInner, WorkRef};
use crate::clock::timerfd::TimerSource;
use crate::clock::Clock;
use crate::sync::{lock, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};
use crate::timer::Timers;
use crate::Priority;

/// What a timer entry stores: a non-owning pointer to the armed work.
///
/// Arming and cancelling are the hot operations, so they do no reference counting. This
/// is sound because of the invariant in the module docs: while a work has a timer entry,
/// its owning handle (which holds an `Arc`) is alive. Every path that lets go of the
/// handle removes the entry first, under the core lock: drop (`cancel_and_wait` disarms
/// before it waits or marks the work `ORPHANED`, and an orphaned work refuses every
/// re-arm), and shutdown (which drains all entries). A run takes
/// its own counted reference ([`ArmedRef::to_cell`]) while the handle is still alive.
pub(crate) struct ArmedRef(*const WorkInner<dyn Callback>);

// SAFETY: it points at a `Send + Sync` work and is only dereferenced under the core lock
// while the invariant above keeps the work alive.
unsafe impl Send for ArmedRef {}

impl ArmedRef {
    pub(super) fn new(work: &WorkRef) -> Self {
        ArmedRef(Arc::as_ptr(work))
    }

    pub(super) fn header(&self) -> &Header {
        // SAFETY: the entry exists, so the work is alive (see the type's docs).
        unsafe { (*self.0).header() }
    }

    /// A counted reference for running the work.
    pub(super) fn to_cell(&self) -> WorkRef {
        // SAFETY: the pointer came from `Arc::as_ptr` of a live `Arc` (the handle's, kept
        // alive by the invariant), so adding a strong count and adopting it is sound.
        unsafe {
            Arc::increment_strong_count(self.0);
            Arc::from_raw(self.0)
        }
    }
}

impl std::fmt::Debug for ArmedRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ArmedRef").field(&self.0).finish()
    }
}

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
}

/// Everything the one core lock guards. Tags, as in `kernel/workqueue.c`:
/// `L:` read and written only under the core lock (every field here is `L:`).
#[derive(Debug)]
pub(crate) struct Core {
    /// L: every armed work's timer entry.
    pub(super) timers: Timers<ArmedRef>,
    /// L: the manual clock (`advance` moves it); unused by real schedulers.
    pub(super) virtual_now_ns: u64,
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
    pub(super) timer: Option<TimerSource>,
    /// L: which worker runs what, and the priority lent to it.
    pub(super) lending: Lending,
    /// L: `Yield` increments deferred because every CPU was busy (see `backoff`).
    pub(super) deferred_yields: u64,
    /// L: how many `cancel_sync`/drop calls wait for each running work (by address); a
    /// work is in here exactly while its state has `CANCEL_WAITING`.
    pub(super) cancel_waiters: HashMap<usize, usize>,
}

/// A scheduler's shared state, one per scheduler, reached through `Arc` by its handles,
/// its works and its workers. Tags: `I:` set at build and read-only after; `L:` guarded
/// by the core lock; `A:` atomic, with its writers named; `T:` guarded by its own std
/// mutex, never taken together with the core lock.
pub(crate) struct Shared {
    /// The core lock and what it guards.
    pub(super) core: Mutex<Core>,
    /// L (waited on with the core lock): signalled by a run's completion when
    /// `Core::run_waiters` is not zero.
    pub(super) run_done: Condvar,
    /// L (waited on with the core lock): wakes follower workers.
    pub(super) idle: Condvar,
    /// I: the time source (its virtual time is `Core::virtual_now_ns`).
    pub(super) clock: Clock,
    /// I: the build settings.
    pub(super) config: Config,
    /// A: owning `Scheduler` handles; `Clone` adds, `Drop` subtracts, and the one that
    /// reaches zero shuts down.
    pub(super) handles: AtomicUsize,
    /// T: the worker threads to join at shutdown; filled by `build()`.
    pub(super) threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// T: the workers' kernel thread ids; filled by `build()`.
    pub(super) worker_tids: std::sync::Mutex<Vec<libc::pid_t>>,
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

pub(super) fn load(header: &Header) -> State {
    State(header.state.load(Ordering::Relaxed))
}

pub(super) fn store(header: &Header, state: State) {
    header.state.store(state.0, Ordering::Release);
}

impl Shared {
    pub(crate) fn new(
        config: Config,
        timer: Option<TimerSource>,
        raise_limit: Option<i32>,
    ) -> Self {
        let manual = timer.is_none();
        Shared {
            core: Mutex::new(Core {
                timers: Timers::new(config.slack_ns),
                virtual_now_ns: 0,
                shutdown: false,
                idle_workers: 0,
                run_waiters: 0,
                poller_blocked: false,
                programmed_ns: None,
                timer,
                lending: Lending::new(raise_limit),
                deferred_yields: 0,
                cancel_waiters: HashMap::new(),
            }),
            run_done: Condvar::new(),
            idle: Condvar::new(),
            clock: Clock::new(manual),
            config,
            handles: AtomicUsize::new(1),
            threads: std::sync::Mutex::new(Vec::new()),
            worker_tids: std::sync::Mutex::new(Vec::new()),
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
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }

    /// The core lock, or `None` in a `fork()`ed child, where the lock may have been held
    /// at the fork by a thread that no longer exists and the scheduler is inert (see
    /// `fork`). Every operation a user thread can call takes the lock through this.
    pub(crate) fn lock_unless_forked(&self) -> Option<MutexGuard<'_, Core>> {
        (!self.is_forked_copy()).then(|| self.lock())
    }

    /// Whether worker `tid` runs with a flusher's priority now (see `lending`).
    pub(super) fn is_lent_to(&self, tid: libc::pid_t) -> bool {
        self.lock().lending.is_lent_to(tid)
    }

    pub(crate) fn now_ns(&self, core: &Core) -> u64 {
        if self.clock.is_manual() {
            core.virtual_now_ns
        } else {
            self.clock.real_now_ns()
        }
    }

    pub(crate) fn instant_at(&self, ns: u64) -> Instant {
        self.clock.instant_at(ns)
    }

    pub(super) fn slack_ns(&self) -> u64 {
        self.config.slack_ns
    }

    // === arming, under the core lock ===

    /// Arms for `deadline_ns`; `now_ns` is the caller's reading of the clock (reading it
    /// costs more than the rest of an arm on some machines, so it is read once per call).
    pub(super) fn arm(
        &self,
        core: &mut Core,
        work: &WorkRef,
        state: &mut State,
        deadline_ns: u64,
        now_ns: u64,
    ) {
        let key = core.timers.arm(ArmedRef::new(work), deadline_ns, now_ns);
        state.set_pending(key);
        self.kick(core, deadline_ns, now_ns);
    }

    pub(super) fn arm_after(
        &self,
        core: &mut Core,
        work: &WorkRef,
        state: &mut State,
        delay_ns: u64,
    ) {
        let now = self.now_ns(core);
        self.arm(core, work, state, now.saturating_add(delay_ns), now);
    }

    /// Removes the work's timer entry, if any.
    pub(super) fn disarm(&self, core: &mut Core, state: &mut State) -> bool {
        if !state.has(PENDING) {
            return false;
        }
        core.timers.remove(state.key());
        state.clear_pending();
        true
    }

    /// Makes sure some worker will look at a deadline it may not know about yet.
    pub(super) fn kick(&self, core: &mut Core, deadline_ns: u64, now_ns: u64) {
        if core.shutdown || core.timer.is_none() {
            return;
        }
        if deadline_ns <= now_ns && core.idle_workers > 0 {
            self.idle.notify_one();
            return;
        }
        if !core.poller_blocked {
            // Every worker is busy; the next one to finish looks at the structure first.
            return;
        }
        let wake_ns = if deadline_ns <= now_ns {
            now_ns
        } else {
            deadline_ns
                .div_ceil(self.slack_ns())
                .saturating_mul(self.slack_ns())
        };
        if core.programmed_ns.is_none_or(|at| wake_ns < at) {
            self.program(core, Some(wake_ns), now_ns);
        }
    }

    /// Programs the timerfd for `wake_ns` (or disarms it), skipping the system call when
    /// it is already set so.
    pub(crate) fn program(&self, core: &mut Core, wake_ns: Option<u64>, now_ns: u64) {
        if core.programmed_ns == wake_ns {
            return;
        }
        if let Some(timer) = core.timer.as_mut() {
            match wake_ns {
                Some(at) => timer.program(at.saturating_sub(now_ns)),
                None => timer.disarm(),
            }
            core.programmed_ns = wake_ns;
        }
    }

    // === shutdown ===

    /// Cancels every armed work and wakes every worker so it exits.
    pub(crate) fn shutdown(&self) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        core.shutdown = true;
        for armed in core.timers.drain() {
            let mut state = load(armed.header());
            state.clear_pending();
            store(armed.header(), state);
        }
        self.idle.notify_all();
        if let Some(timer) = core.timer.as_mut() {
            timer.program(1);
        }
        core.programmed_ns = None;
    }
}

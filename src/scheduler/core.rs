//! The state a scheduler shares with its works and workers: `Shared`, its `Core` under the
//! one lock, the lock gate, arming and timerfd programming, and shutdown. The ground
//! rules are in the [module docs](super).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::lending::Lending;
use super::state::{State, PENDING};
use super::{Header, RunCell};
use crate::clock::timerfd::TimerSource;
use crate::clock::Clock;
use crate::sync::{lock, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};
use crate::timer::Timers;
use crate::Priority;

pub(crate) type Cell = Arc<dyn RunCell>;

/// What a timer entry stores: a non-owning pointer to the armed work.
///
/// Arming and cancelling are the hot operations, so they do no reference counting. This
/// is sound because of the invariant in the module docs: while a work has a timer entry,
/// its owning handle (which holds an `Arc`) is alive. Every path that lets go of the
/// handle removes the entry first, under the core lock: drop (`cancel_and_wait` disarms
/// before it waits or marks the work `ORPHANED`, and an orphaned work refuses every
/// re-arm), and shutdown (which drains all entries). A run takes
/// its own counted reference ([`ArmedRef::to_cell`]) while the handle is still alive.
pub(crate) struct ArmedRef(*const dyn RunCell);

// SAFETY: it points at a `Send + Sync` cell and is only dereferenced under the core lock
// while the invariant above keeps the cell alive.
unsafe impl Send for ArmedRef {}

impl ArmedRef {
    pub(super) fn new(cell: &Cell) -> Self {
        ArmedRef(Arc::as_ptr(cell))
    }

    pub(super) fn header(&self) -> &Header {
        // SAFETY: the entry exists, so the cell is alive (see the type's docs).
        unsafe { (*self.0).header() }
    }

    /// A counted reference for running the work.
    pub(super) fn to_cell(&self) -> Cell {
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

/// Settings fixed at build time.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) name: String,
    pub(crate) priority: Priority,
    pub(crate) workers: usize,
    pub(crate) slack_ns: u64,
    pub(crate) back_off: bool,
}

#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) timers: Timers<ArmedRef>,
    pub(super) virtual_now_ns: u64,
    pub(crate) shutdown: bool,
    pub(crate) idle_workers: usize,
    pub(super) run_waiters: usize,
    pub(crate) poller_blocked: bool,
    pub(crate) programmed_ns: Option<u64>,
    pub(crate) timer: Option<TimerSource>,
    pub(crate) lending: Lending,
    /// `Yield` increments deferred because every CPU was busy (see `backoff`).
    pub(crate) deferred_yields: u64,
    /// How many `cancel_sync`/drop calls wait for each running work (by address); a work
    /// is in here exactly while its state has `CANCEL_WAITING`.
    pub(super) cancel_waiters: HashMap<usize, usize>,
}

pub(crate) struct Shared {
    pub(crate) core: Mutex<Core>,
    pub(super) run_done: Condvar,
    pub(crate) idle: Condvar,
    pub(crate) clock: Clock,
    pub(crate) config: Config,
    pub(crate) handles: AtomicUsize,
    pub(crate) threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub(crate) worker_tids: std::sync::Mutex<Vec<libc::pid_t>>,
    /// The fork generation this scheduler was made in (see `fork`).
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
        cell: &Cell,
        state: &mut State,
        deadline_ns: u64,
        now_ns: u64,
    ) {
        let key = core.timers.arm(ArmedRef::new(cell), deadline_ns, now_ns);
        state.set_pending(key);
        self.kick(core, deadline_ns, now_ns);
    }

    pub(super) fn arm_after(&self, core: &mut Core, cell: &Cell, state: &mut State, delay_ns: u64) {
        let now = self.now_ns(core);
        self.arm(core, cell, state, now.saturating_add(delay_ns), now);
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

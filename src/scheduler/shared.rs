//! The state a scheduler shares with its works and workers, and the work state machine.
//!
//! # Ground rules
//!
//! - One lock (`core`) covers the timer structure, every work's state word (writes only),
//!   the programmed timerfd deadline and the worker bookkeeping. User callbacks never run
//!   under it, and nothing that can call back into user code (a closure's destructor)
//!   runs under it either, except dropping an `Arc` that is provably not the last one.
//! - A run is *taken* under the lock (entry removed, `PENDING` cleared, `RUNNING` set),
//!   executed unlocked, and *completed* under the lock (`RUNNING` cleared, the callback's
//!   `Next` applied unless re-arms are refused). Waiters for the end of a run
//!   (`cancel_sync`, `flush`) sleep on `run_done`, signalled by every completion that has
//!   waiters.
//! - Between take and call there is a `SeqCst` fence. `touch()`'s lock-free fast path is a
//!   `SeqCst` load of the state word, so a touch that still finds the work pending is
//!   covered by a run that sees every `SeqCst` write (or read-modify-write) the toucher
//!   made before it: the touch is never lost to a run that missed its data.
//! - Reference counting of the cell: the owning handle holds one `Arc` and the running
//!   thread one while it runs; a timer entry holds a non-owning [`ArmedRef`], valid
//!   because an entry never outlives the handle. The handle's drop disarms and waits
//!   until no run is in progress. Where that wait could never end (the run is the
//!   dropping thread's own, or its callback waits for the dropping callback: a wait
//!   cycle, see `work::waits`) it marks the work `ORPHANED` instead, so the runner drops
//!   the last reference after the callback returned, outside the lock.
//! - After shutdown (the last `Scheduler` handle dropped) nothing is armed again: arming
//!   calls return `false`, runs already in progress finish, and their re-arm is refused.

use std::any::Any;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backoff::Backoff;
use super::lending::Lending;
use crate::driver::timerfd::TimerSource;
use crate::driver::{nanos, Clock};
use crate::sync::{
    fence, load_ordered_after_seqcst_writes, lock, wait, AtomicUsize, Condvar, Mutex, MutexGuard,
    Ordering,
};
use crate::timer::Timers;
use crate::work::state::{
    State, CANCEL_WAITING, FIXED_PERIOD, ORPHANED, PENDING, POISONED, REARM_REFUSED, RUNNING,
    STOPPED, YIELDED,
};
use crate::work::waits;
use crate::work::{frames, Ctx, Header, Next, RunCell};
use crate::{Priority, Scheduler};

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
    fn new(cell: &Cell) -> Self {
        ArmedRef(Arc::as_ptr(cell))
    }

    fn header(&self) -> &Header {
        // SAFETY: the entry exists, so the cell is alive (see the type's docs).
        unsafe { (*self.0).header() }
    }

    /// A counted reference for running the work.
    fn to_cell(&self) -> Cell {
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
    virtual_now_ns: u64,
    pub(crate) shutdown: bool,
    pub(crate) idle_workers: usize,
    run_waiters: usize,
    pub(crate) poller_blocked: bool,
    pub(crate) programmed_ns: Option<u64>,
    pub(crate) timer: Option<TimerSource>,
    pub(crate) lending: Lending,
    /// `Yield` increments deferred because every CPU was busy (see `backoff`).
    pub(crate) deferred_yields: u64,
    /// How many `cancel_sync`/drop calls wait for each running work (by address); a work
    /// is in here exactly while its state has `CANCEL_WAITING`.
    cancel_waiters: HashMap<usize, usize>,
}

pub(crate) struct Shared {
    pub(crate) core: Mutex<Core>,
    run_done: Condvar,
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

/// A run that was taken off the ready list and must now be executed.
pub(crate) struct Taken {
    pub(crate) cell: Cell,
    pub(crate) deadline_ns: u64,
    /// The worker's lending slot, when a worker runs it.
    pub(crate) worker_slot: Option<usize>,
}

/// Whether a cancel comes from a dropped handle, whose closure must then be freed by
/// whoever holds the last reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    Keep,
    Drop,
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

fn load(header: &Header) -> State {
    State(header.state.load(Ordering::Relaxed))
}

fn store(header: &Header, state: State) {
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
            fork_generation: super::fork::generation(),
        }
    }

    /// Whether this is a copy in a `fork()`ed child: then nothing may take the lock (see
    /// `fork`).
    #[inline]
    pub(crate) fn is_forked_copy(&self) -> bool {
        super::fork::is_forked_since(self.fork_generation)
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

    fn slack_ns(&self) -> u64 {
        self.config.slack_ns
    }

    // === arming, under the core lock ===

    /// Arms for `deadline_ns`; `now_ns` is the caller's reading of the clock (reading it
    /// costs more than the rest of an arm on some machines, so it is read once per call).
    fn arm(&self, core: &mut Core, cell: &Cell, state: &mut State, deadline_ns: u64, now_ns: u64) {
        let key = core.timers.arm(ArmedRef::new(cell), deadline_ns, now_ns);
        state.set_pending(key);
        self.kick(core, deadline_ns, now_ns);
    }

    fn arm_after(&self, core: &mut Core, cell: &Cell, state: &mut State, delay_ns: u64) {
        let now = self.now_ns(core);
        self.arm(core, cell, state, now.saturating_add(delay_ns), now);
    }

    /// Removes the work's timer entry, if any.
    fn disarm(&self, core: &mut Core, state: &mut State) -> bool {
        if !state.has(PENDING) {
            return false;
        }
        core.timers.remove(state.key());
        state.clear_pending();
        true
    }

    /// Makes sure some worker will look at a deadline it may not know about yet.
    fn kick(&self, core: &mut Core, deadline_ns: u64, now_ns: u64) {
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

    // === taking, executing and completing runs ===

    /// Takes the first due work that is not running elsewhere. A due work that is still
    /// running stays detached and is put back when its run completes.
    pub(crate) fn take_ready(&self, core: &mut Core) -> Option<Taken> {
        while let Some(key) = core.timers.pop_ready() {
            let header = core.timers.value(key).header();
            let mut state = load(header);
            if state.has(RUNNING) {
                continue;
            }
            let deadline_ns = core.timers.deadline_ns(key);
            let cell = core.timers.remove(key).to_cell();
            state.clear_pending();
            state.set(RUNNING);
            store(cell.header(), state);
            return Some(Taken {
                cell,
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
            cell,
            deadline_ns,
            worker_slot,
        } = taken;
        let outcome = {
            let name = cell.name();
            let span = tracing::info_span!("nicework.run", work = name);
            let _entered = span.enter();
            let header = cell.header();
            let mut cx = Ctx {
                scheduler,
                cell: &*cell,
                deadline_ns,
                started_ns,
                runs: header.stats.runs() + 1,
            };
            let _frame = frames::enter(&cell);
            let clock = Instant::now();
            // SAFETY: we set RUNNING when this run was taken, and only `complete` below
            // clears it.
            let outcome = catch_unwind(AssertUnwindSafe(|| unsafe { cell.call(&mut cx) }));
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
        if self.is_forked_copy() {
            // `fork()` inside the callback, and this is the child: the lock may be held by
            // a thread that does not exist here, and the timer belongs to the parent.
            // Leave without completing; the caller stops too (see `fork`).
            std::mem::forget(cell);
            return Executed::InForkedChild;
        }
        let yield_delay_ns = match (outcome, backoff) {
            (Some(Next::Yield), Some(backoff)) => backoff.after_yield(),
            _ => 0,
        };
        self.complete(cell, outcome, worker_slot, yield_delay_ns);
        Executed::Completed
    }

    fn complete(
        &self,
        cell: Cell,
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
        let header = cell.header();
        let mut state = load(header);
        state.clear(RUNNING);
        match next {
            None => {
                state.set(POISONED);
                self.disarm(&mut core, &mut state);
            }
            Some(next) if !state.refuses_arm() && !core.shutdown => {
                self.apply_next(&mut core, &cell, &mut state, next, yield_delay_ns);
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
            drop_contained(cell);
        } else {
            // Not the last reference (the handle is alive), so nothing user-visible runs.
            drop(cell);
            drop(core);
        }
    }

    fn apply_next(
        &self,
        core: &mut Core,
        cell: &Cell,
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
                let period = cell.header().period_ns.load(Ordering::Relaxed);
                self.arm_after(core, cell, state, period.max(slack));
            }
            Next::After(delay) => self.arm_after(core, cell, state, nanos(delay).max(slack)),
            Next::Yield => {
                self.disarm(core, state);
                let now = self.now_ns(core);
                self.arm(core, cell, state, now.saturating_add(yield_delay_ns), now);
                state.set(YIELDED);
            }
        }
    }

    // === the operations behind `Work` ===

    pub(crate) fn schedule(&self, cell: &Cell, delay: Duration) -> bool {
        if load(cell.header()).has(PENDING) {
            return false;
        }
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        if core.shutdown || state.has(PENDING) || state.refuses_arm() {
            return false;
        }
        self.set_period(cell, state, delay);
        state.clear(STOPPED);
        self.arm_after(&mut core, cell, &mut state, nanos(delay));
        store(cell.header(), state);
        true
    }

    pub(crate) fn reschedule(&self, cell: &Cell, delay: Duration) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        if core.shutdown || state.refuses_arm() {
            return false;
        }
        let was_pending = self.disarm(&mut core, &mut state);
        self.set_period(cell, state, delay);
        state.clear(STOPPED);
        self.arm_after(&mut core, cell, &mut state, nanos(delay));
        store(cell.header(), state);
        was_pending
    }

    fn set_period(&self, cell: &Cell, state: State, delay: Duration) {
        if !state.has(FIXED_PERIOD) {
            cell.header()
                .period_ns
                .store(nanos(delay), Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn touch(&self, cell: &Cell) {
        // The fast path: one SeqCst load (a plain load on x86). See the module docs.
        if load_ordered_after_seqcst_writes(&cell.header().state) & PENDING != 0 {
            return;
        }
        self.touch_slow(cell);
    }

    #[cold]
    fn touch_slow(&self, cell: &Cell) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        let mut state = load(cell.header());
        if core.shutdown || state.has(PENDING | STOPPED) || state.refuses_arm() {
            return;
        }
        let period = cell.header().period_ns.load(Ordering::Relaxed);
        self.arm_after(&mut core, cell, &mut state, period.max(self.slack_ns()));
        store(cell.header(), state);
    }

    pub(crate) fn cancel(&self, cell: &Cell) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        let was_pending = self.disarm(&mut core, &mut state);
        store(cell.header(), state);
        was_pending
    }

    pub(crate) fn cancel_sync(&self, cell: &Cell) -> bool {
        self.cancel_and_wait(cell, Release::Keep)
    }

    /// `cancel_sync`, and for a dropped handle the hand-over of the closure. Disarms,
    /// refuses re-arms while a run is in progress, and waits for that run unless waiting
    /// would wait for ourselves: the run is this thread's own (a callback cancelling or
    /// dropping its own work) or the wait would close a cycle of waiting callbacks. Then
    /// the run's own re-arm is refused instead and, for a dropped handle, the runner frees
    /// the closure after the callback returned.
    fn cancel_and_wait(&self, cell: &Cell, release: Release) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        let was_pending = self.disarm(&mut core, &mut state);
        if !state.has(RUNNING) {
            store(cell.header(), state);
            return was_pending;
        }
        let waiting = if frames::is_running_here(cell) {
            None
        } else {
            waits::begin_wait(cell).ok()
        };
        let Some(waiting) = waiting else {
            // Waiting would wait for ourselves: refuse the run's own re-arm instead.
            state.set(REARM_REFUSED);
            if release == Release::Drop {
                state.set(ORPHANED);
            }
            store(cell.header(), state);
            return was_pending;
        };
        // "disable, flush, enable", as the kernel's cancel_delayed_work_sync, with a
        // refusal of its own that `enable()` cannot lift.
        state.set(CANCEL_WAITING);
        store(cell.header(), state);
        let address = frames::address(cell);
        *core.cancel_waiters.entry(address).or_insert(0) += 1;
        core = self.wait_until_idle(core, cell);
        drop(waiting);
        if let Some(waiters) = core.cancel_waiters.get_mut(&address) {
            *waiters -= 1;
            if *waiters == 0 {
                core.cancel_waiters.remove(&address);
                let mut state = load(cell.header());
                state.clear(CANCEL_WAITING);
                store(cell.header(), state);
            }
        }
        drop(core);
        was_pending
    }

    fn wait_until_idle<'a>(
        &'a self,
        mut core: MutexGuard<'a, Core>,
        cell: &Cell,
    ) -> MutexGuard<'a, Core> {
        core.run_waiters += 1;
        while load(cell.header()).has(RUNNING) {
            core = wait(&self.run_done, core);
        }
        core.run_waiters -= 1;
        core
    }

    pub(crate) fn flush(self: &Arc<Self>, cell: &Cell) -> bool {
        if frames::is_running_here(cell) {
            return false;
        }
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let state = load(cell.header());
        if !state.has(PENDING | RUNNING) {
            return false;
        }
        // A flush covers the instance pending when it started, plus the increments of a
        // yielding work.
        let mut take_pending = state.has(PENDING);
        let mut ran_here = false;
        let mut flusher = None;
        loop {
            let mut state = load(cell.header());
            if state.has(RUNNING) {
                let Ok(waiting) = waits::begin_wait(cell) else {
                    // Waiting would close a wait cycle: as inside the own callback.
                    return ran_here;
                };
                // Lend this thread's priority to the worker running it, where allowed.
                core.lending.lend(frames::address(cell), || {
                    *flusher.get_or_insert_with(|| {
                        let nice = crate::priority::current_nice().unwrap_or(0);
                        (nice, crate::priority::current_is_idle())
                    })
                });
                core = self.wait_until_idle(core, cell);
                drop(waiting);
                continue;
            }
            if core.shutdown || !state.has(PENDING) || !(take_pending || state.has(YIELDED)) {
                return true;
            }
            take_pending = false;
            ran_here = true;
            let key = state.key();
            let deadline_ns = core.timers.deadline_ns(key);
            let taken = core.timers.remove(key).to_cell();
            state.clear_pending();
            state.set(RUNNING);
            store(cell.header(), state);
            core.lending.stats.helped += 1;
            let now = self.now_ns(&core);
            drop(core);
            let scheduler = Scheduler::uncounted(self.clone());
            let executed = self.execute(
                &scheduler,
                Taken {
                    cell: taken,
                    deadline_ns,
                    worker_slot: None,
                },
                now,
                None,
            );
            if executed == Executed::InForkedChild {
                return true;
            }
            core = self.lock();
        }
    }

    pub(crate) fn disable(&self, cell: &Cell) -> bool {
        let Some(mut core) = self.lock_unless_forked() else {
            return false;
        };
        let mut state = load(cell.header());
        let was_pending = self.disarm(&mut core, &mut state);
        if !state.disable() {
            tracing::warn!(work = cell.name(), "disable() nesting saturated");
        }
        store(cell.header(), state);
        was_pending
    }

    pub(crate) fn enable(&self, cell: &Cell) {
        let Some(_core) = self.lock_unless_forked() else {
            return;
        };
        let mut state = load(cell.header());
        if state.enable() {
            store(cell.header(), state);
        }
    }

    /// The owning handle is being dropped.
    pub(crate) fn release(&self, cell: &Cell) {
        if self.is_forked_copy() {
            // The closure may be running in the parent's copy of a worker that does
            // not exist here: keep it (leaked) rather than free it under that run.
            std::mem::forget(cell.clone());
            return;
        }
        self.cancel_and_wait(cell, Release::Drop);
    }

    /// Arms a new work (`every`) for its first run.
    pub(crate) fn arm_new(&self, cell: &Cell, delay: Duration) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        if core.shutdown {
            return;
        }
        let mut state = load(cell.header());
        self.arm_after(&mut core, cell, &mut state, nanos(delay));
        store(cell.header(), state);
    }

    // === manual time ===

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
                return runs;
            }
            core = self.lock();
        }
        core.virtual_now_ns = core.virtual_now_ns.max(target);
        runs
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

/// Drops the last reference to a work, whose closure's destructor is user code: a panic
/// there is reported and contained, never propagated into nicework or the caller.
pub(crate) fn drop_contained(cell: Cell) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(cell))) {
        tracing::error!(
            panic = panic_message(payload.as_ref()),
            "a work's closure panicked while being dropped"
        );
        drop_payload(payload);
    }
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
}

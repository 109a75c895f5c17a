#![cfg(loom)]
//! The arming matrix: every lock-free arming call against every call that refuses
//! re-arms or waits for a run, each while a run of the work is in progress, as loom
//! models on the manual scheduler (loom's `Condvar` ignores timeouts, so a real
//! scheduler's timerfd is never used). Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release
//! --test arming_matrix`.
//!
//! # The cells
//!
//! Rows (`Arm`): `schedule`, `reschedule`, `schedule_within` and `cancel` on a
//! `work()`, `touch` on an `every()` work, and `touch` on a `timeout()` work. Columns
//! (`Against`): `cancel_sync`, `disable`, the drop of the `Work`, `flush`, and the
//! shutdown (the last `Scheduler` handle dropped). The `matrix!` table lists the 30
//! cells, each a `#[test]` named `<row>_against_<column>`; a constant check at the end
//! makes sure the table holds every cell once and names each test for its cell.
//!
//! Every cell has three threads: main drives the run, thread A makes the row's call,
//! thread B the column's. Before they start the work is pending for `PERIOD` with a live
//! timer entry and the clock stands at `HALF`. The row's call uses `LONG`, a deadline
//! past the entry's, so `schedule`/`reschedule` take the lock-free CAS of `arm_fast`
//! whenever the work has a live entry. The run is a `flush()` of the pending work on main,
//! except where the column needs `advance` (see below). It may take the instance before
//! or after A's call; loom explores both.
//!
//! Taking a run consumes the work's entry (`start_run` clears `QUEUED`), so with nothing
//! else every arm racing the run would take the lock. In the `cancel_sync`, `disable` and
//! shutdown columns the callback therefore re-arms its own work with `schedule(LONG)`
//! during its run: that links a fresh entry and makes `LONG` the period of a `work()` (a
//! lock-free arm of a `work()` must not change its period), so A's `schedule`/`reschedule` are lock-free
//! while the run is in progress, and it is one more of the callback's own re-arms that
//! the column must refuse. The callback counts its runs (`started` on entry, `finished`
//! just before it returns) and returns `Next::Again` (the callback's own re-arm, covered
//! by the promises), except in the flush column (below).
//!
//! # The properties, column by column
//!
//! - **`cancel_sync`** (B): every arm made while it is in progress is refused, arms made
//!   before it are disarmed, it returns once the running instance finished, and the
//!   callback does not run again. Checked where the order is certain: B saw the run begun
//!   before calling it (`started`), and A's call completed before the callback returned
//!   (A reads `finished` after its call). Then A's call came before the run completed,
//!   which `cancel_sync` either waited for or came after, so the work must end disarmed
//!   and never run again; and B must not see it running once `cancel_sync` returned.
//!   A flag that B sets after `cancel_sync` returned does not do: an arm that lands after
//!   `cancel_sync`'s last step but before B stores the flag is legitimate, yet reads the
//!   flag unset (tried with the refusal made atomic: the locked `schedule_within` row
//!   then fails).
//! - **`disable`** (B, never enabled): after joining the work is never pending, a later
//!   `schedule` is refused, `advance` runs nothing, and no run began after `disable`
//!   returned: B reads whether it is running and then the run count, and at the end at
//!   most that one run in progress has been added.
//! - **drop** (A arms through its `Arc<Work>` and drops it, B drops its own; whoever drops
//!   last runs `Work::drop`, which is `cancel_sync` and then frees the closure). The run
//!   is an `advance` on main, which holds no `Work`: a `flush` through a clone would keep
//!   the work alive until it returned, and the drop could never overlap the run. Checked:
//!   when `Work::drop` returns the closure has been dropped, exactly once (a captured
//!   `Guard` counts), no callback began after it returned, and afterwards nothing is armed
//!   (the metrics count no armed work) and `advance` runs nothing.
//! - **`flush`** (B; the run is an `advance` on main, racing the flush for the
//!   instance): flush refuses nothing, so no arm may be lost. The callback returns `Park`
//!   here: with `Again` the work would be pending after every run and a lost arm would
//!   not show. Checked: a `true` return means the instance finished (also when A's
//!   lock-free `cancel` lands after flush found the work pending and before its take:
//!   flush then ran nothing and returns `false`), a `false` one that nothing was left to
//!   flush (it had finished, or A's `cancel` removed it); the work is
//!   pending exactly when the metrics count a live entry for it; an arm A made once the
//!   run had begun (A reads `started` first) is either still pending or ran again; and a
//!   pending work runs when `advance` reaches its deadline. Whether `flush` waited is not
//!   observable from outside, so "true when it waited" is checked through `finished`.
//! - **shutdown** (B drops the only `Scheduler` handle; the run is main's `flush`, which
//!   needs none): afterwards the work is not pending, and `schedule`, `reschedule`,
//!   `schedule_within`, `cancel` and `flush` all return `false`, and `touch` arms nothing.
//!
//! # Beyond the matrix
//!
//! - `shutdown_against_a_flush_taking_over_yield_increments`: the shutdown in the middle
//!   of a flush that takes over `Yield` increments, with a worker (`advance`) that leaves
//!   the pending increment to the flush first (dropping its entry, so the shutdown's drain
//!   does not see it).
//! - `{schedule,reschedule}_against_cancel_sync_from_the_own_callback`: `cancel_sync` on
//!   the work from inside its own callback, which does not wait and refuses re-arms until
//!   the run completes (`REARM_REFUSED`); an arm that completed before the callback
//!   returned must not survive.

use std::sync::{Arc, Weak};
use std::time::Duration;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::thread;
use nicework::{Ctx, Next, Scheduler, Work};

/// The first deadline, and the period of `every`/`timeout` works.
const PERIOD: Duration = Duration::from_millis(1);
/// Where the clock stands when the threads start.
const HALF: Duration = Duration::from_micros(500);
/// The racing arm's delay: its deadline is past the live entry's, so it may take the
/// lock-free path.
const LONG: Duration = Duration::from_millis(4);
/// Far enough for anything armed to come due.
const FAR: Duration = Duration::from_millis(100);

/// The rows: every lock-free arming call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    Schedule,
    Reschedule,
    ScheduleWithin,
    Cancel,
    Touch,
    TimeoutTouch,
}

/// The columns: every call that refuses re-arms or waits for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Against {
    CancelSync,
    Disable,
    Drop,
    Flush,
    Shutdown,
}

impl Arm {
    const ALL: [Arm; 6] = [
        Arm::Schedule,
        Arm::Reschedule,
        Arm::ScheduleWithin,
        Arm::Cancel,
        Arm::Touch,
        Arm::TimeoutTouch,
    ];

    const fn snake(self) -> &'static str {
        match self {
            Arm::Schedule => "schedule",
            Arm::Reschedule => "reschedule",
            Arm::ScheduleWithin => "schedule_within",
            Arm::Cancel => "cancel",
            Arm::Touch => "touch",
            Arm::TimeoutTouch => "timeout_touch",
        }
    }

    /// Makes the row's work, pending for `PERIOD` with a live timer entry.
    fn make<F>(self, sched: &Scheduler, f: F) -> Work
    where
        F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
    {
        match self {
            Arm::Touch => sched.every(PERIOD, f),
            Arm::TimeoutTouch => sched.timeout(PERIOD, f),
            _ => {
                let work = sched.work(f);
                assert!(work.schedule(PERIOD));
                work
            }
        }
    }

    /// Makes the call; returns whether it armed an instance, as far as its return value
    /// tells (`reschedule` and `touch` arm whenever they are not refused).
    fn call(self, work: &Work) -> Called {
        match self {
            Arm::Schedule => Called::armed(work.schedule(LONG)),
            Arm::Reschedule => {
                work.reschedule(LONG);
                Called::armed(true)
            }
            Arm::ScheduleWithin => Called::armed(work.schedule_within(LONG)),
            Arm::Cancel => Called {
                armed: false,
                cancelled: work.cancel(),
            },
            Arm::Touch | Arm::TimeoutTouch => {
                work.touch();
                Called::armed(true)
            }
        }
    }
}

/// What the arming call reported.
#[derive(Debug, Clone, Copy)]
struct Called {
    armed: bool,
    /// `cancel` disarmed a pending instance.
    cancelled: bool,
}

impl Called {
    fn armed(armed: bool) -> Called {
        Called {
            armed,
            cancelled: false,
        }
    }
}

impl Against {
    const ALL: [Against; 5] = [
        Against::CancelSync,
        Against::Disable,
        Against::Drop,
        Against::Flush,
        Against::Shutdown,
    ];

    const fn snake(self) -> &'static str {
        match self {
            Against::CancelSync => "cancel_sync",
            Against::Disable => "disable",
            Against::Drop => "drop",
            Against::Flush => "flush",
            Against::Shutdown => "shutdown",
        }
    }

    /// What the callback returns.
    fn next(self) -> Next {
        match self {
            Against::Flush => Next::Park,
            _ => Next::Again,
        }
    }

    /// Whether the callback re-arms its own work with `schedule(LONG)` during its run.
    fn self_arm(self) -> bool {
        matches!(
            self,
            Against::CancelSync | Against::Disable | Against::Shutdown
        )
    }
}

/// What the threads and the callback observe, in loom atomics.
struct Probe {
    /// Callbacks begun.
    started: AtomicUsize,
    /// Callbacks about to return.
    finished: AtomicUsize,
    /// The closure's destructor ran (counted by [`Guard`]).
    closure_drops: AtomicUsize,
    /// `Work::drop` returned.
    dropped: AtomicBool,
    /// A callback began after `Work::drop` returned (recorded, not asserted: a panic in
    /// the callback is caught and poisons the work).
    ran_after_drop: AtomicBool,
}

/// Captured by the closure: counts its drop.
struct Guard(Arc<Probe>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.closure_drops.fetch_add(1, SeqCst);
    }
}

struct Setup {
    sched: Scheduler,
    work: Arc<Work>,
    probe: Arc<Probe>,
}

/// The row's work with the column's callback, pending for `PERIOD` with a live entry,
/// the clock at `HALF`.
fn setup(arm: Arm, against: Against) -> Setup {
    let sched = Scheduler::manual();
    let probe = Arc::new(Probe {
        started: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        closure_drops: AtomicUsize::new(0),
        dropped: AtomicBool::new(false),
        ran_after_drop: AtomicBool::new(false),
    });
    let guard = Guard(probe.clone());
    let (next, self_arm, watch_drop) =
        (against.next(), against.self_arm(), against == Against::Drop);
    let work = Arc::new_cyclic(|me: &Weak<Work>| {
        let me = me.clone();
        arm.make(&sched, move |_: &mut Ctx<'_>| {
            let probe = &guard.0;
            if watch_drop && probe.dropped.load(SeqCst) {
                probe.ran_after_drop.store(true, SeqCst);
            }
            probe.started.fetch_add(1, SeqCst);
            if self_arm {
                if let Some(me) = me.upgrade() {
                    me.schedule(LONG);
                }
            }
            probe.finished.fetch_add(1, SeqCst);
            next
        })
    });
    assert_eq!(sched.advance(HALF), 0);
    Setup { sched, work, probe }
}

fn run(arm: Arm, against: Against) {
    match against {
        Against::CancelSync => against_cancel_sync(arm),
        Against::Disable => against_disable(arm),
        Against::Drop => against_drop(arm),
        Against::Flush => against_flush(arm),
        Against::Shutdown => against_shutdown(arm),
    }
}

fn against_cancel_sync(arm: Arm) {
    loom::model(move || {
        let Setup { sched, work, probe } = setup(arm, Against::CancelSync);
        let arming = {
            let (work, probe) = (work.clone(), probe.clone());
            thread::spawn(move || {
                arm.call(&work);
                // The call completed before the run's callback returned, so before the
                // run completed.
                probe.finished.load(SeqCst) == 0
            })
        };
        let cancelling = {
            let (work, probe) = (work.clone(), probe.clone());
            thread::spawn(move || {
                // The run began before cancel_sync was called.
                let during_run = probe.started.load(SeqCst) > 0;
                work.cancel_sync();
                if during_run {
                    assert!(
                        !work.is_running(),
                        "cancel_sync returned while the run was in progress"
                    );
                }
                during_run
            })
        };
        work.flush();
        let before_end = arming.join().unwrap();
        let during_run = cancelling.join().unwrap();
        if during_run && before_end {
            assert!(
                !work.is_pending(),
                "armed after cancel_sync returned, by an arm made before it returned ({arm:?}, or \
                 the callback's own)"
            );
            assert_eq!(sched.advance(FAR), 0, "ran after cancel_sync returned");
        }
    });
}

fn against_disable(arm: Arm) {
    loom::model(move || {
        let Setup { sched, work, probe } = setup(arm, Against::Disable);
        let arming = {
            let work = work.clone();
            thread::spawn(move || {
                arm.call(&work);
            })
        };
        let disabling = {
            let (work, probe) = (work.clone(), probe.clone());
            thread::spawn(move || {
                work.disable();
                // A run taken before disable returned may still begin its callback.
                let running = work.is_running();
                (running, probe.started.load(SeqCst))
            })
        };
        work.flush();
        arming.join().unwrap();
        let (running, started) = disabling.join().unwrap();
        assert!(!work.is_pending(), "armed while disabled ({arm:?})");
        assert!(
            probe.started.load(SeqCst) <= started + usize::from(running),
            "a run began after disable returned"
        );
        assert!(!work.schedule(PERIOD), "a disabled work was armed");
        assert_eq!(sched.advance(FAR), 0, "a disabled work ran");
    });
}

/// Gives up one `Arc<Work>`; the last one runs `Work::drop`.
fn release(work: Arc<Work>, probe: &Probe) {
    if let Some(work) = Arc::into_inner(work) {
        drop(work);
        assert_eq!(
            probe.closure_drops.load(SeqCst),
            1,
            "Work::drop returned with the closure alive"
        );
        probe.dropped.store(true, SeqCst);
    }
}

fn against_drop(arm: Arm) {
    loom::model(move || {
        let Setup { sched, work, probe } = setup(arm, Against::Drop);
        let arming = {
            let (work, probe) = (work.clone(), probe.clone());
            thread::spawn(move || {
                arm.call(&work);
                release(work, &probe);
            })
        };
        let dropping = {
            let probe = probe.clone();
            thread::spawn(move || release(work, &probe))
        };
        // The run: `advance` holds no `Work`, so the last drop may overlap it.
        sched.advance(HALF);
        arming.join().unwrap();
        dropping.join().unwrap();
        assert_eq!(probe.closure_drops.load(SeqCst), 1, "closure drops");
        assert!(
            !probe.ran_after_drop.load(SeqCst),
            "the callback began after Work::drop returned"
        );
        // Checked before anything could run it: a run now would call a dropped closure.
        assert_eq!(sched.metrics().armed, 0, "armed after Work::drop returned");
        assert_eq!(sched.advance(FAR), 0, "ran after the work was dropped");
    });
}

fn against_flush(arm: Arm) {
    loom::model(move || {
        let Setup { sched, work, probe } = setup(arm, Against::Flush);
        let arming = {
            let (work, probe) = (work.clone(), probe.clone());
            thread::spawn(move || {
                // The run had begun: this call applies to the next instance.
                let during_run = probe.started.load(SeqCst) > 0;
                let called = arm.call(&work);
                (during_run && called.armed, called.cancelled)
            })
        };
        let flushing = {
            let (work, probe) = (work.clone(), probe.clone());
            thread::spawn(move || {
                let flushed = work.flush();
                (flushed, probe.finished.load(SeqCst))
            })
        };
        // The run: `advance` races the flush for the pending instance.
        sched.advance(HALF);
        let (armed_during_run, cancelled) = arming.join().unwrap();
        let (flushed, finished) = flushing.join().unwrap();
        // True only if it ran the instance or waited for it, also when a lock-free
        // `cancel` disarmed the instance after flush found it pending and before it
        // took it (flush then ran nothing and returns false).
        assert!(
            !flushed || finished >= 1,
            "flush returned true before the instance finished"
        );
        assert!(
            flushed || finished >= 1 || cancelled,
            "flush returned false on a work that was pending or running"
        );
        let pending = work.is_pending();
        assert_eq!(
            sched.metrics().armed,
            usize::from(pending),
            "pending={pending} but the live entries say otherwise"
        );
        if armed_during_run {
            assert!(
                pending || probe.finished.load(SeqCst) >= 2,
                "an arm made during the run was lost ({arm:?})"
            );
        }
        if pending {
            let before = probe.finished.load(SeqCst);
            assert!(sched.advance(FAR) >= 1, "pending but never runs");
            assert!(probe.finished.load(SeqCst) > before);
        }
    });
}

/// After shutdown: nothing armed, and nothing arms it.
fn assert_inert(work: &Work) {
    assert!(!work.is_pending(), "armed after shutdown");
    assert!(!work.schedule(PERIOD), "schedule after shutdown");
    assert!(!work.reschedule(PERIOD), "reschedule after shutdown");
    assert!(
        !work.schedule_within(PERIOD),
        "schedule_within after shutdown"
    );
    work.touch();
    assert!(!work.cancel(), "cancel after shutdown found it pending");
    assert!(!work.flush(), "flush after shutdown");
    assert!(!work.is_pending(), "armed after shutdown");
}

fn against_shutdown(arm: Arm) {
    loom::model(move || {
        let Setup { sched, work, .. } = setup(arm, Against::Shutdown);
        let arming = {
            let work = work.clone();
            thread::spawn(move || {
                arm.call(&work);
            })
        };
        // The only handle: dropping it shuts the scheduler down.
        let shutting_down = thread::spawn(move || drop(sched));
        work.flush();
        arming.join().unwrap();
        shutting_down.join().unwrap();
        assert_inert(&work);
    });
}

/// Not a cell of the matrix: a flush that takes over a work's `Yield` increments, a
/// worker (`advance`) that leaves the pending increment to it (dropping its entry), and
/// the shutdown right after, all on two threads.
#[test]
fn shutdown_against_a_flush_taking_over_yield_increments() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let work = Arc::new(sched.work(move |_| {
            if r.fetch_add(1, SeqCst) == 0 {
                Next::Yield
            } else {
                Next::Park
            }
        }));
        assert!(work.schedule(PERIOD));
        let shutting_down = thread::spawn(move || {
            sched.advance(PERIOD);
            drop(sched);
        });
        work.flush();
        shutting_down.join().unwrap();
        assert_inert(&work);
    });
}

/// Not a cell of the matrix: `cancel_sync` called from inside the work's own callback,
/// which cannot wait for itself and refuses the rest of the run's re-arms instead, against
/// a lock-free arm on another thread. The callback links a fresh entry first (so that the
/// arm may be lock-free during the run), then cancels itself, and returns `Again`. An arm
/// that completed before the callback returned was either disarmed by that `cancel_sync`
/// or made while its refusal stood: the work ends disarmed.
fn against_cancel_sync_from_the_own_callback(arm: Arm) {
    loom::model(move || {
        let sched = Scheduler::manual();
        let finished = Arc::new(AtomicUsize::new(0));
        let f = finished.clone();
        let work = Arc::new_cyclic(|me: &Weak<Work>| {
            let me = me.clone();
            arm.make(&sched, move |_: &mut Ctx<'_>| {
                if let Some(me) = me.upgrade() {
                    me.schedule(LONG);
                    me.cancel_sync();
                }
                f.fetch_add(1, SeqCst);
                Next::Again
            })
        });
        assert_eq!(sched.advance(HALF), 0);
        let arming = {
            let (work, finished) = (work.clone(), finished.clone());
            thread::spawn(move || {
                arm.call(&work);
                finished.load(SeqCst) == 0
            })
        };
        assert!(work.flush());
        if arming.join().unwrap() {
            assert!(
                !work.is_pending(),
                "armed after the callback cancelled itself, by an arm made before it \
                 returned ({arm:?})"
            );
            assert_eq!(sched.advance(FAR), 0);
        }
    });
}

#[test]
fn schedule_against_cancel_sync_from_the_own_callback() {
    against_cancel_sync_from_the_own_callback(Arm::Schedule);
}

#[test]
fn reschedule_against_cancel_sync_from_the_own_callback() {
    against_cancel_sync_from_the_own_callback(Arm::Reschedule);
}

macro_rules! matrix {
    ($($name:ident: $arm:ident against $against:ident;)*) => {
        /// Every cell, with its test's name.
        const CELLS: &[(Arm, Against, &str)] =
            &[$((Arm::$arm, Against::$against, stringify!($name))),*];

        $(
            #[test]
            fn $name() {
                run(Arm::$arm, Against::$against);
            }
        )*
    };
}

matrix! {
    schedule_against_cancel_sync: Schedule against CancelSync;
    schedule_against_disable: Schedule against Disable;
    schedule_against_drop: Schedule against Drop;
    schedule_against_flush: Schedule against Flush;
    schedule_against_shutdown: Schedule against Shutdown;
    reschedule_against_cancel_sync: Reschedule against CancelSync;
    reschedule_against_disable: Reschedule against Disable;
    reschedule_against_drop: Reschedule against Drop;
    reschedule_against_flush: Reschedule against Flush;
    reschedule_against_shutdown: Reschedule against Shutdown;
    schedule_within_against_cancel_sync: ScheduleWithin against CancelSync;
    schedule_within_against_disable: ScheduleWithin against Disable;
    schedule_within_against_drop: ScheduleWithin against Drop;
    schedule_within_against_flush: ScheduleWithin against Flush;
    schedule_within_against_shutdown: ScheduleWithin against Shutdown;
    cancel_against_cancel_sync: Cancel against CancelSync;
    cancel_against_disable: Cancel against Disable;
    cancel_against_drop: Cancel against Drop;
    cancel_against_flush: Cancel against Flush;
    cancel_against_shutdown: Cancel against Shutdown;
    touch_against_cancel_sync: Touch against CancelSync;
    touch_against_disable: Touch against Disable;
    touch_against_drop: Touch against Drop;
    touch_against_flush: Touch against Flush;
    touch_against_shutdown: Touch against Shutdown;
    timeout_touch_against_cancel_sync: TimeoutTouch against CancelSync;
    timeout_touch_against_disable: TimeoutTouch against Disable;
    timeout_touch_against_drop: TimeoutTouch against Drop;
    timeout_touch_against_flush: TimeoutTouch against Flush;
    timeout_touch_against_shutdown: TimeoutTouch against Shutdown;
}

/// Whether `name` is `<arm>_against_<against>`.
const fn named_for(name: &str, arm: Arm, against: Against) -> bool {
    let (name, arm, against) = (
        name.as_bytes(),
        arm.snake().as_bytes(),
        against.snake().as_bytes(),
    );
    let middle = b"_against_";
    if name.len() != arm.len() + middle.len() + against.len() {
        return false;
    }
    let mut i = 0;
    while i < name.len() {
        let expected = if i < arm.len() {
            arm[i]
        } else if i < arm.len() + middle.len() {
            middle[i - arm.len()]
        } else {
            against[i - arm.len() - middle.len()]
        };
        if name[i] != expected {
            return false;
        }
        i += 1;
    }
    true
}

// The table is the whole matrix, each cell once, each test named for its cell.
const _: () = {
    assert!(CELLS.len() == Arm::ALL.len() * Against::ALL.len());
    let mut seen = 0u64;
    let mut i = 0;
    while i < CELLS.len() {
        let (arm, against, name) = CELLS[i];
        let bit = 1u64 << (arm as u32 * Against::ALL.len() as u32 + against as u32);
        assert!(seen & bit == 0, "a cell is listed twice");
        assert!(
            named_for(name, arm, against),
            "a test is not named for its cell"
        );
        seen |= bit;
        i += 1;
    }
    assert!(seen == (1u64 << CELLS.len()) - 1);
};

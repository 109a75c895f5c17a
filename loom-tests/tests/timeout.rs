#![cfg(loom)]
//! Loom models of idle timeouts and of the lock-free arming paths, on the manual
//! scheduler. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release`.

use std::sync::Arc;
use std::time::Duration;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;
use nicework::{Next, Scheduler};

const IDLE: Duration = Duration::from_millis(10);
const HALF: Duration = Duration::from_millis(5);

/// A touch racing the fire that finds the work postponed: if the touch completed before
/// the run was taken (the toucher saw it neither running nor run after its touch), the
/// callback must not run at the first deadline (it was touched within `idle`); in every
/// interleaving the work runs in the end, at the latest one idle after the touch.
#[test]
fn touch_against_the_fire_that_re_arms() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let touched = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicUsize::new(0));
        let (t, r) = (touched.clone(), runs.clone());
        let work = Arc::new(sched.timeout(IDLE, move |_| {
            assert!(
                !t.load(Ordering::SeqCst),
                "ran although a touch completed within the idle"
            );
            r.fetch_add(1, Ordering::SeqCst);
            Next::Park
        }));
        sched.advance(HALF);
        let toucher = {
            let (work, touched, runs) = (work.clone(), touched.clone(), runs.clone());
            thread::spawn(move || {
                work.touch();
                if !work.is_running() && runs.load(Ordering::SeqCst) == 0 {
                    touched.store(true, Ordering::SeqCst);
                }
            })
        };
        sched.advance(HALF); // the fire at IDLE races the touch at HALF
        toucher.join().unwrap();
        // A postponed work runs at HALF + IDLE; one that ran before the touch completed
        // was touched during or after its run, and runs again one idle after it.
        touched.store(false, Ordering::SeqCst);
        sched.advance(IDLE * 2);
        let runs = runs.load(Ordering::SeqCst);
        assert!((1..=2).contains(&runs), "{runs} runs");
        assert!(!work.is_pending());
    });
}

/// A touch racing a run that returns `Park`: a touch that began once the run had been
/// taken (the virtual clock already reads the deadline) is never lost: the work ends
/// armed.
#[test]
fn touch_against_a_run_that_parks() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let work = Arc::new(sched.timeout(IDLE, move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            Next::Park
        }));
        let start = sched.now();
        let toucher = {
            let (work, sched) = (work.clone(), sched.clone());
            thread::spawn(move || {
                // `advance` moves the virtual clock to the deadline once it took the run.
                let started_after_take = sched.now() >= start + IDLE;
                work.touch();
                started_after_take
            })
        };
        sched.advance(IDLE);
        let started_after_take = toucher.join().unwrap();
        if started_after_take {
            assert!(work.is_pending(), "the touch during the run was lost");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    });
}

/// The lock-free `reschedule` racing `cancel`: linearizable. Whichever comes second
/// wins, and the return values say which that was.
#[test]
fn lock_free_reschedule_against_cancel() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let work = Arc::new(sched.work(|_| Next::Park));
        assert!(!work.reschedule(IDLE)); // links the entry the fast path then reuses
        let canceller = {
            let work = work.clone();
            thread::spawn(move || work.cancel())
        };
        let was_pending = work.reschedule(IDLE * 2);
        let cancelled = canceller.join().unwrap();
        assert!(cancelled, "the work was pending whichever came first");
        // Reschedule first: it saw the first arm and the cancel then disarmed it.
        // Cancel first: the reschedule found it idle and armed it again.
        assert_eq!(work.is_pending(), !was_pending);
        let ran = sched.advance(IDLE * 3);
        assert_eq!(ran, usize::from(!was_pending));
    });
}

/// The lock-free `reschedule` racing `cancel_sync` (which holds the core lock and
/// refuses re-arms while it works): linearizable too, and once `cancel_sync` returned
/// a reschedule that it saw as pending never runs.
#[test]
fn lock_free_reschedule_against_cancel_sync() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let work = Arc::new(sched.work(|_| Next::Park));
        assert!(work.schedule(IDLE));
        let canceller = {
            let work = work.clone();
            thread::spawn(move || work.cancel_sync())
        };
        let was_pending = work.reschedule(IDLE * 2);
        assert!(canceller.join().unwrap());
        assert_eq!(work.is_pending(), !was_pending);
        assert_eq!(sched.advance(IDLE * 3), usize::from(!was_pending));
    });
}

/// A timeout's lock-free touch racing `cancel_sync`: after `cancel_sync` returned the
/// work is not running, and a touch may only have postponed it, never armed it (a
/// cancelled work is stopped: only `schedule` re-arms it).
#[test]
fn timeout_touch_against_cancel_sync() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let work = Arc::new(sched.timeout(IDLE, move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            Next::Park
        }));
        let toucher = {
            let work = work.clone();
            thread::spawn(move || work.touch())
        };
        assert!(work.cancel_sync());
        toucher.join().unwrap();
        assert!(!work.is_pending());
        assert_eq!(sched.advance(IDLE * 3), 0);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    });
}

/// A touch of a tick-stamped timeout (idle 1 s: its touch stores the scheduler's touch
/// tick instead of a time) racing an `advance` that refreshes the tick and judges the
/// work. A touch that completed before the run began (the toucher saw no run) holds the
/// run back to at least its own time + idle, whichever tick it read and whenever the
/// refresh published the next one; and the work runs in the end. (Judging a stamp by
/// its own tick's time instead of the next one's fails here.)
#[test]
fn touch_against_a_tick_refresh_and_the_decision() {
    const TICK_IDLE: Duration = Duration::from_secs(1);
    loom::model(|| {
        let sched = Scheduler::manual();
        nicework::hooks::stamp_with_ticks_for_loom(&sched);
        // Run start times; a std mutex, held for no loom operation.
        let ran_at = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = ran_at.clone();
        let work = Arc::new(sched.timeout(TICK_IDLE, move |cx| {
            record.lock().unwrap().push(cx.scheduler().now());
            Next::Park
        }));
        // A first touch wakes the refresher, due 1/16 of the idle later.
        sched.advance(Duration::from_millis(850));
        work.touch();
        sched.advance(Duration::from_millis(50));
        let toucher = {
            let (work, sched) = (work.clone(), sched.clone());
            thread::spawn(move || {
                let at = sched.now();
                work.touch();
                let before_any_run = !work.is_running() && work.stats().runs == 0;
                (at, before_any_run)
            })
        };
        // The refresh (due at 912.5 ms) and the deadline (1 s) race the touch at 900 ms.
        sched.advance(Duration::from_millis(100));
        let (touched_at, before_any_run) = toucher.join().unwrap();
        sched.advance(TICK_IDLE * 3);
        let ran_at = ran_at.lock().unwrap().clone();
        assert!(!ran_at.is_empty(), "the work never ran");
        if before_any_run {
            assert!(
                ran_at[0] >= touched_at + TICK_IDLE,
                "ran {:?} after a touch that returned before the run, within the idle",
                ran_at[0] - touched_at
            );
        }
    });
}

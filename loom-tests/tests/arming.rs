#![cfg(loom)]
//! Loom models of the arming API a pool needs: `detach` against shutdown, and a touch
//! against a run that returns `After` (the touch never overrides the callback's decision). Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release`.

use std::sync::Arc;
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use nicework::{Next, Scheduler};

const PERIOD: Duration = Duration::from_millis(1);

/// Counts how many times the closure it lives in was dropped.
struct Drops(Arc<AtomicUsize>);

impl Drop for Drops {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// `detach` racing the scheduler's shutdown (its last handle dropped on another thread)
/// while the work is armed: the closure is freed exactly once, by whichever ends the
/// work's life, and never before `detach` gave the handle up.
#[test]
fn detach_against_shutdown_frees_the_closure_exactly_once() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let drops = Arc::new(AtomicUsize::new(0));
        let guard = Drops(drops.clone());
        let work = sched.every(PERIOD, move |_| {
            let _keep = &guard;
            Next::Again
        });
        let shutdown = thread::spawn(move || drop(sched));
        work.detach();
        shutdown.join().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    });
}

/// `detach` racing a run that returns `Stop` on another thread: freed exactly once.
#[test]
fn detach_against_a_run_that_stops() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let drops = Arc::new(AtomicUsize::new(0));
        let guard = Drops(drops.clone());
        let work = sched.every(PERIOD, move |_| {
            let _keep = &guard;
            Next::Stop
        });
        let runner = {
            let sched = sched.clone();
            thread::spawn(move || sched.advance(PERIOD))
        };
        work.detach();
        runner.join().unwrap();
        sched.advance(PERIOD * 10);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    });
}

/// A touch racing a run that returns `After(5 periods)`: the callback's decision stands.
/// Whatever the interleaving, the work ends armed no sooner than `After` asked (a touch
/// before the run was taken finds it pending and changes nothing; one during the run
/// only marks it; one after it finds it pending again).
#[test]
fn touch_against_a_run_that_returns_after() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let start = sched.now();
        let work = Arc::new(sched.every(PERIOD, |_| Next::After(PERIOD * 5)));
        let toucher = {
            let work = work.clone();
            thread::spawn(move || work.touch())
        };
        assert_eq!(sched.advance(PERIOD), 1);
        toucher.join().unwrap();
        assert_eq!(work.deadline(), Some(start + PERIOD * 6));
    });
}

/// Two threads arm a `work()` at once with different delays, one of them on the
/// lock-free path (the work has a live entry placed no later than either deadline, and
/// its period is that arm's delay): the period left is the delay of the arm whose
/// deadline stands, whichever wins. Fails when the locked arm stores the period after
/// its CAS without holding lock-free arms off (`PERIOD_CHANGING`).
#[test]
fn racing_arms_leave_the_period_of_the_deadline_that_stands() {
    const SHORT: Duration = Duration::from_millis(10);
    const LONG: Duration = Duration::from_millis(50);
    loom::model(|| {
        let sched = Scheduler::manual();
        let work = Arc::new(sched.work(|_| Next::Park));
        // A live entry at SHORT and the period LONG: a re-arm for LONG is one CAS, a
        // re-arm for SHORT changes the period and takes the lock.
        assert!(!work.reschedule(SHORT));
        assert!(work.reschedule(LONG));
        let start = sched.now();
        let long = {
            let work = work.clone();
            thread::spawn(move || work.reschedule(LONG))
        };
        work.reschedule(SHORT);
        long.join().unwrap();
        let due = work.deadline().expect("pending") - start;
        let period = work.period();
        if period == LONG {
            assert_eq!(
                due, LONG,
                "the period of the long arm, the deadline of the short one"
            );
        } else {
            assert_eq!(period, SHORT);
            assert_eq!(
                due, SHORT,
                "the period of the short arm, the deadline of the long one"
            );
        }
    });
}

//! What a `flush` waits for, and what it returns:
//!
//! - it waits for the run in progress when it was called (and `Yield` increments it takes
//!   over), never for a run that `Again` armed meanwhile, even when another thread takes
//!   that run before the flusher is back on a CPU. Otherwise a busy self-re-arming work
//!   could hold a flush for ever;
//! - racing `cancel` and re-arms (lock-free and locked), it returns true exactly when it
//!   ran the work, for a work that parks and for one that yields.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{FAR, Rng};
use nicework::{Next, Scheduler};

#[test]
fn flush_does_not_wait_for_a_run_that_again_armed_during_it() {
    for round in 0..20 {
        let sched = Scheduler::manual();
        let runs = Arc::new(AtomicU64::new(0));
        let flush_returned = Arc::new(AtomicBool::new(false));
        let held_up = Arc::new(AtomicBool::new(false));
        let work = {
            let (runs, flush_returned, held_up) =
                (runs.clone(), flush_returned.clone(), held_up.clone());
            let waiter = sched.clone();
            Arc::new(sched.every(Duration::from_millis(1), move |_| {
                match runs.fetch_add(1, Ordering::SeqCst) {
                    // The run the flush is called in: it ends once the flusher waits.
                    0 => assert!(common::eventually(|| waiter.metrics().lending.waited > 0)),
                    // The run `Again` armed: it ends once the flush returned. If the flush
                    // waited for it, this times out instead.
                    1 => {
                        let start = Instant::now();
                        while !flush_returned.load(Ordering::SeqCst) {
                            if start.elapsed() > common::EVENTUALLY {
                                held_up.store(true, Ordering::SeqCst);
                                break;
                            }
                            std::thread::yield_now();
                        }
                    }
                    _ => {}
                }
                Next::Again
            }))
        };
        let driver = {
            let sched = sched.clone();
            std::thread::spawn(move || sched.advance(Duration::from_millis(2)))
        };
        assert!(common::eventually(|| work.is_running()));
        assert!(work.flush());
        flush_returned.store(true, Ordering::SeqCst);
        driver.join().unwrap();
        assert!(
            !held_up.load(Ordering::SeqCst),
            "round {round}: the flush waited for the run that Again armed during it"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

/// On a manual scheduler nothing but `flush` runs the work, and one thread flushes: so
/// `flush()` is true exactly when the callback ran during it. Other threads cancel it and
/// re-arm it (lock-free and locked) all the while; the callback returns `next`.
fn flush_is_true_exactly_when_it_ran(next: Next) {
    let sched = Scheduler::manual();
    let runs = Arc::new(AtomicU64::new(0));
    let counter = runs.clone();
    let work = sched.work(move |_| {
        counter.fetch_add(1, SeqCst);
        next
    });
    work.schedule(FAR); // a live entry: reschedules are lock-free
    let stop = AtomicBool::new(false);
    let (wrong, flushes) = thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(SeqCst) {
                work.cancel();
            }
        });
        s.spawn(|| {
            let mut rng = Rng(99);
            while !stop.load(SeqCst) {
                match rng.next() % 3 {
                    0 => work.reschedule(FAR),
                    1 => work.schedule(FAR),
                    _ => work.reschedule(Duration::ZERO), // locked
                };
            }
        });
        let (mut wrong, mut flushes) = (Vec::new(), 0);
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(700) {
            let before = runs.load(SeqCst);
            let flushed = work.flush();
            let ran = runs.load(SeqCst) > before;
            flushes += 1;
            if flushed != ran {
                wrong.push((flushed, ran));
            }
        }
        stop.store(true, SeqCst);
        (wrong, flushes)
    });
    work.cancel_sync();
    assert!(runs.load(SeqCst) > 0);
    assert!(
        wrong.is_empty(),
        "{} of {flushes} flushes returned what they did not do, first (returned, ran): {:?}",
        wrong.len(),
        wrong.first()
    );
}

#[test]
fn flush_racing_cancel_and_rearms_is_true_exactly_when_it_ran_a_parking_work() {
    flush_is_true_exactly_when_it_ran(Next::Park);
}

#[test]
fn flush_racing_cancel_and_rearms_is_true_exactly_when_it_ran_a_yielding_work() {
    flush_is_true_exactly_when_it_ran(Next::Yield);
}

#![cfg(loom)]
//! Loom models of the waits that block no thread: `drop_async` and `cancel_async` against
//! a run that completes (and re-arms) on another thread driving the manual scheduler. The
//! future is polled by hand with a waker that counts; dropping it early is a variant.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::thread;
use nicework::{Next, Scheduler};

const PERIOD: Duration = Duration::from_millis(1);

/// Counts its drops: the closure's captures are freed exactly once.
struct Freed(Arc<AtomicUsize>);

impl Drop for Freed {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// A due work that re-arms, run by another thread, while this one calls `drop_async` and
/// either polls the future to the end or drops it after one poll. In every interleaving
/// the closure is freed exactly once; a future that resolved had it freed already, and
/// the work never runs after the call.
fn drop_async_against_a_completing_run(poll_to_the_end: bool) {
    loom::model(move || {
        let sched = Scheduler::manual();
        let freed = Arc::new(AtomicUsize::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let (captured, counted) = (Freed(freed.clone()), runs.clone());
        let work = sched.every(PERIOD, move |_| {
            let _keep = &captured;
            counted.fetch_add(1, SeqCst);
            Next::Again
        });
        let runner = advance_on_a_thread(&sched);
        let waker = Waker::from(Arc::new(Noop));
        let mut cx = Context::from_waker(&waker);
        let mut dropped = Box::pin(work.drop_async());
        let runs_at_call = runs.load(SeqCst);
        if poll_to_the_end {
            while dropped.as_mut().poll(&mut cx) == Poll::Pending {
                thread::yield_now();
            }
            assert_eq!(
                freed.load(SeqCst),
                1,
                "resolved before the closure was freed"
            );
        } else {
            let _ = dropped.as_mut().poll(&mut cx);
            drop(dropped);
        }
        runner.join().unwrap();
        sched.advance(PERIOD * 10);
        assert_eq!(freed.load(SeqCst), 1, "freed exactly once");
        assert!(
            runs.load(SeqCst) <= runs_at_call + 1,
            "ran again after drop_async"
        );
        assert!(runs.load(SeqCst) <= 1);
    });
}

/// A loom thread that advances `sched` by one period.
fn advance_on_a_thread(sched: &Scheduler) -> thread::JoinHandle<()> {
    let sched = sched.clone();
    thread::spawn(move || {
        sched.advance(PERIOD);
    })
}

#[test]
fn drop_async_polled_to_the_end_against_a_completing_run() {
    drop_async_against_a_completing_run(true);
}

#[test]
fn drop_async_dropped_early_against_a_completing_run() {
    drop_async_against_a_completing_run(false);
}

/// `cancel_async` against a run that re-arms: once the future resolved, the work is
/// disarmed and never runs again; dropped early, the run's own re-arm is still refused.
fn cancel_async_against_a_run_that_rearms(poll_to_the_end: bool) {
    loom::model(move || {
        let sched = Scheduler::manual();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let work = Arc::new(sched.every(PERIOD, move |_| {
            counted.fetch_add(1, SeqCst);
            Next::Again
        }));
        let runner = advance_on_a_thread(&sched);
        let waker = Waker::from(Arc::new(Noop));
        let mut cx = Context::from_waker(&waker);
        let mut cancelled = Box::pin(work.cancel_async());
        if poll_to_the_end {
            while cancelled.as_mut().poll(&mut cx) == Poll::Pending {
                thread::yield_now();
            }
            assert!(!work.is_running());
        } else {
            let _ = cancelled.as_mut().poll(&mut cx);
        }
        drop(cancelled);
        let runs_after = runs.load(SeqCst);
        runner.join().unwrap();
        sched.advance(PERIOD * 10);
        assert!(!work.is_pending() && !work.is_running());
        assert!(runs.load(SeqCst) <= 1);
        if poll_to_the_end {
            assert_eq!(
                runs.load(SeqCst),
                runs_after,
                "ran after the future resolved"
            );
        }
    });
}

#[test]
fn cancel_async_polled_to_the_end_against_a_run_that_rearms() {
    cancel_async_against_a_run_that_rearms(true);
}

#[test]
fn cancel_async_dropped_early_against_a_run_that_rearms() {
    cancel_async_against_a_run_that_rearms(false);
}

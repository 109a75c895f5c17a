//! `Scheduler::once`: a one-shot job runs at most once, its closure is freed by that run
//! (or unrun, when the work goes first), and nothing arms it again.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::{drop_flag, eventually};
use nicework::{Scheduler, Work};

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);

/// Every arming call on a spent `once` is refused, and a touch arms nothing.
fn assert_spent(work: &Work) {
    assert!(!work.schedule(Duration::ZERO), "schedule after the run");
    assert!(!work.reschedule(MS), "reschedule after the run");
    assert!(!work.schedule_within(MS), "schedule_within after the run");
    work.touch();
    assert!(!work.is_pending(), "a touch armed a spent once");
    assert_eq!(work.deadline(), None);
}

#[test]
fn a_once_runs_once_then_frees_its_closure_and_refuses_every_arm() {
    let sched = Scheduler::manual();
    let runs = Arc::new(AtomicUsize::new(0));
    let (flag, dropped) = drop_flag();
    let counter = runs.clone();
    let work = sched.once(5 * MS, move |_| {
        let _flag = &flag;
        counter.fetch_add(1, SeqCst);
    });
    assert!(work.is_pending());
    assert_eq!(sched.advance(4 * MS), 0, "not before its deadline");
    assert!(!dropped.load(SeqCst));
    assert_eq!(sched.advance(2 * MS), 1);
    assert_eq!(runs.load(SeqCst), 1);
    assert!(dropped.load(SeqCst), "the run freed the closure");
    assert_spent(&work);
    assert_eq!(sched.advance(HOUR), 0);
    assert_eq!(runs.load(SeqCst), 1);
    assert!(!work.flush(), "nothing to flush");
    assert!(!work.try_flush());
    assert_eq!(work.stats().runs, 1);
    assert!(!work.is_poisoned());
}

#[test]
fn a_once_dropped_or_cancelled_before_its_run_frees_the_closure_without_running() {
    let sched = Scheduler::manual();
    let runs = Arc::new(AtomicUsize::new(0));
    let (flag, dropped) = drop_flag();
    let counter = runs.clone();
    let work = sched.once(HOUR, move |_| {
        let _flag = &flag;
        counter.fetch_add(1, SeqCst);
    });
    drop(work);
    assert!(dropped.load(SeqCst));
    assert_eq!(sched.advance(2 * HOUR), 0);
    assert_eq!(runs.load(SeqCst), 0);

    // Cancelled, it is a work like any other until it runs: armed again, it runs once.
    let counter = runs.clone();
    let work = sched.once(HOUR, move |_| {
        counter.fetch_add(1, SeqCst);
    });
    assert!(work.cancel());
    assert_eq!(sched.advance(2 * HOUR), 0);
    assert!(work.schedule(MS));
    assert_eq!(sched.advance(2 * MS), 1);
    assert_eq!(runs.load(SeqCst), 1);
    assert_spent(&work);
}

#[test]
fn a_detached_once_runs_once_and_is_freed_on_a_real_scheduler() {
    let sched = Scheduler::new().unwrap();
    let (flag, dropped) = drop_flag();
    let (ran_tx, ran_rx) = mpsc::channel();
    sched
        .once(MS, move |_| {
            let _flag = &flag;
            ran_tx.send(()).unwrap();
        })
        .detach();
    ran_rx
        .recv_timeout(common::EVENTUALLY)
        .expect("the detached once ran");
    assert!(eventually(|| dropped.load(SeqCst)), "freed after its run");
    assert!(ran_rx.try_recv().is_err(), "ran once");

    // Detached and never due: freed at shutdown, unrun.
    let (flag, dropped) = drop_flag();
    sched
        .once(HOUR, move |_| {
            let _flag = &flag;
            unreachable!("never due");
        })
        .detach();
    drop(sched);
    assert!(dropped.load(SeqCst));
}

#[test]
fn arms_during_its_run_from_inside_and_outside_never_make_a_second_run() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    for _ in 0..50 {
        let runs = Arc::new(AtomicUsize::new(0));
        let slot: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
        let (started_tx, started_rx) = mpsc::channel();
        let (finish_tx, finish_rx) = mpsc::channel::<()>();
        let (counter, own) = (runs.clone(), slot.clone());
        let work = sched.once(Duration::ZERO, move |cx| {
            counter.fetch_add(1, SeqCst);
            // Its own handle, re-armed from inside the run.
            if let Some(work) = own.lock().unwrap().as_ref() {
                work.schedule(Duration::ZERO);
                work.reschedule(MS);
            }
            cx.scheduler(); // the run may look at its scheduler
            started_tx.send(()).unwrap();
            finish_rx.recv().unwrap();
        });
        *slot.lock().unwrap() = Some(work);
        started_rx.recv_timeout(common::EVENTUALLY).unwrap();
        // From outside, during the run: these arm a next instance of an ordinary work.
        {
            let guard = slot.lock().unwrap();
            let work = guard.as_ref().unwrap();
            work.schedule(Duration::ZERO);
            work.touch();
        }
        finish_tx.send(()).unwrap();
        let work = slot.lock().unwrap().take().unwrap();
        assert!(eventually(|| !work.is_running()));
        assert!(
            !work.is_pending(),
            "an arm made during its run was left pending"
        );
        assert_spent(&work);
        assert_eq!(runs.load(SeqCst), 1);
        assert_eq!(work.stats().runs, 1);
    }
}

#[test]
fn flush_runs_a_pending_once_on_the_caller_and_cancel_sync_waits_for_a_running_one() {
    let sched = Scheduler::new().unwrap();
    let (tx, rx) = mpsc::channel();
    let work = sched.once(HOUR, move |_| tx.send(std::thread::current().id()).unwrap());
    assert!(work.flush());
    assert_eq!(rx.recv().unwrap(), std::thread::current().id());
    assert_spent(&work);

    let (started_tx, started_rx) = mpsc::channel();
    let (finish_tx, finish_rx) = mpsc::channel::<()>();
    let (flag, dropped) = drop_flag();
    let work = sched.once(Duration::ZERO, move |_| {
        let _flag = &flag;
        started_tx.send(()).unwrap();
        finish_rx.recv().unwrap();
    });
    started_rx.recv_timeout(common::EVENTUALLY).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            // Lets the run go once cancel_sync is waiting (or has returned).
            std::thread::sleep(10 * MS);
            finish_tx.send(()).unwrap();
        });
        assert!(!work.cancel_sync(), "nothing was pending");
        assert!(!work.is_running(), "cancel_sync waited for the run");
    });
    assert!(dropped.load(SeqCst));
    assert_spent(&work);
}

#[test]
fn a_panicking_once_is_poisoned_frees_its_captures_and_leaves_the_others_running() {
    let sched = Scheduler::manual();
    common::quiet_panics_starting_with("once panics");
    let (flag, dropped) = drop_flag();
    let work = sched.once(MS, move |_| {
        let _flag = flag;
        panic!("once panics");
    });
    let other = sched.once(MS, |_| {});
    assert_eq!(sched.advance(2 * MS), 2);
    assert!(work.is_poisoned());
    assert!(
        dropped.load(SeqCst),
        "its captures were dropped by the unwind"
    );
    assert_spent(&work);
    assert_eq!(other.stats().runs, 1);
}

#[test]
fn a_once_whose_scheduler_shut_down_never_runs_and_its_drop_frees_the_closure() {
    let sched = Scheduler::new().unwrap();
    let (flag, dropped) = drop_flag();
    let work = sched.once(10 * MS, move |_| {
        let _flag = &flag;
        unreachable!("its scheduler shut down first");
    });
    drop(sched);
    common::assert_inert(&work);
    assert!(!dropped.load(SeqCst), "the handle still holds it");
    drop(work);
    assert!(dropped.load(SeqCst));
}

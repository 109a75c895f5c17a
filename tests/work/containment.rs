//! Containment is total: a panic whose payload panics again when dropped, the same inside
//! `flush` on the caller's thread and inside `advance`, and a closure whose `Drop` panics
//! are all caught. The work is poisoned, never left marked running, every later call on
//! it returns, and the worker and the other works carry on.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nicework::{Next, Scheduler, Work};

/// A panic payload (or a capture) whose destructor panics.
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("a destructor that panics");
    }
}

fn panics_with_a_panicking_payload(sched: &Scheduler) -> Work {
    sched.work(|_| std::panic::panic_any(PanicsOnDrop))
}

/// A work that counts its runs every millisecond: the proof that the worker lives on.
fn probe(sched: &Scheduler) -> (Work, Arc<AtomicU64>) {
    let runs = Arc::new(AtomicU64::new(0));
    let counter = runs.clone();
    let work = sched.every(Duration::from_millis(1), move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        Next::Again
    });
    (work, runs)
}

fn assert_inert_and_poisoned(work: &Work) {
    assert!(work.is_poisoned());
    assert!(!work.is_running(), "a poisoned work is left marked running");
    assert!(!work.schedule(Duration::ZERO));
    assert!(!work.flush());
    assert!(!work.cancel_sync());
}

#[test]
fn a_panic_whose_payload_panics_on_drop_is_contained_on_a_worker() {
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let (probe, runs) = probe(&sched);
    let work = panics_with_a_panicking_payload(&sched);
    assert!(work.schedule(Duration::ZERO));
    assert!(common::eventually(
        || work.is_poisoned() && !work.is_running()
    ));
    // The only worker survived: the probe keeps running after the panic.
    let after = runs.load(Ordering::SeqCst);
    assert!(common::eventually(
        || runs.load(Ordering::SeqCst) > after + 20
    ));
    assert_inert_and_poisoned(&work);
    drop(work); // returns: the work is not "running" forever
    drop(probe);
}

#[test]
fn a_panic_whose_payload_panics_on_drop_is_contained_in_flush_on_the_caller() {
    let sched = Scheduler::manual();
    let work = panics_with_a_panicking_payload(&sched);
    assert!(work.schedule(Duration::from_secs(60)));
    // Pending and not started: the flush runs it here, and nothing unwinds into us.
    assert!(work.flush());
    assert_inert_and_poisoned(&work);
    // The scheduler still runs the other works.
    let (_probe, runs) = probe(&sched);
    sched.advance(Duration::from_millis(3));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[test]
fn a_panic_whose_payload_panics_on_drop_is_contained_in_advance() {
    let sched = Scheduler::manual();
    let (_probe, runs) = probe(&sched);
    let work = panics_with_a_panicking_payload(&sched);
    assert!(work.schedule(Duration::from_millis(1)));
    assert_eq!(sched.advance(Duration::from_millis(2)), 3);
    assert_inert_and_poisoned(&work);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[test]
fn a_closure_whose_drop_panics_is_contained_when_its_handle_drops() {
    let sched = Scheduler::manual();
    let capture = PanicsOnDrop;
    let work = sched.every(Duration::from_millis(1), move |_| {
        let _keep = &capture;
        Next::Again
    });
    assert_eq!(sched.advance(Duration::from_millis(1)), 1);
    drop(work); // the closure's destructor panics inside; nothing unwinds here
    let (_probe, runs) = probe(&sched);
    sched.advance(Duration::from_millis(2));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[test]
fn a_closure_whose_drop_panics_is_contained_when_freed_by_the_worker() {
    // The handle is dropped inside the work's own callback, so the worker frees the
    // closure after the run, and its destructor panics there.
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let (probe, runs) = probe(&sched);
    let slot: Arc<std::sync::Mutex<Option<Work>>> = Arc::default();
    let capture = PanicsOnDrop;
    let own = slot.clone();
    let work = sched.work(move |_| {
        let _keep = &capture;
        drop(own.lock().unwrap().take());
        Next::Again
    });
    assert!(work.schedule(Duration::ZERO));
    *slot.lock().unwrap() = Some(work);
    assert!(common::eventually(|| slot.lock().unwrap().is_none()));
    let after = runs.load(Ordering::SeqCst);
    assert!(common::eventually(
        || runs.load(Ordering::SeqCst) > after + 20
    ));
    drop(probe);
    drop(sched); // joins the worker: it is alive and answers
}

#[test]
fn a_closure_whose_drop_panics_is_contained_when_the_handle_outlives_the_scheduler() {
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let capture = PanicsOnDrop;
    let work = sched.every(Duration::from_secs(60), move |_| {
        let _keep = &capture;
        Next::Again
    });
    drop(sched);
    drop(work);
}

#[test]
fn metrics_count_every_caught_panic_once() {
    common::quiet_panics_starting_with("counted panic");
    let sched = Scheduler::manual();
    let panicking: Vec<_> = (0..3)
        .map(|i| {
            sched.every(Duration::from_millis(1), move |_| {
                panic!("counted panic {i}")
            })
        })
        .collect();
    let fine = sched.every(Duration::from_millis(1), |_| Next::Again);
    sched.advance(Duration::from_millis(10));
    assert!(panicking.iter().all(|w| w.is_poisoned()));
    assert_eq!(
        sched.metrics().panics,
        3,
        "each poisoned work panicked once"
    );
    assert!(fine.stats().runs >= 9);
    // On a real scheduler, through flush on the caller too.
    let real = Scheduler::new().unwrap();
    let work = real.work(|_| panic!("counted panic on the caller"));
    work.schedule(Duration::from_secs(3600));
    assert!(work.flush());
    assert_eq!(real.metrics().panics, 1);
}

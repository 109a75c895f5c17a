//! Containment is total: a panic whose payload panics again when dropped, the same inside
//! `flush` on the caller's thread and inside `advance`, and a closure whose `Drop` panics
//! are all caught. The work is poisoned, never left marked running, every later call on
//! it returns, and the worker and the other works carry on. Also payloads whose
//! destructors panic several levels deep, and panicking closure destructors wherever they
//! run.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Asserts that `sched`'s worker still runs a fresh work (its thread did not die).
fn assert_runs_a_work(sched: &Scheduler) {
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let w = sched.work(move |_| {
        r.store(true, Ordering::SeqCst);
        Next::Park
    });
    w.schedule(Duration::ZERO);
    let start = Instant::now();
    while !ran.load(Ordering::SeqCst) {
        assert!(start.elapsed() < Duration::from_secs(10), "worker died");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A payload whose Drop panics with a payload whose Drop panics with ... `depth` levels.
struct Bomb(u32);
impl Drop for Bomb {
    fn drop(&mut self) {
        if self.0 > 0 {
            std::panic::panic_any(Bomb(self.0 - 1));
        }
    }
}

/// A closure capture whose Drop panics with a Bomb payload.
struct DropBomb(u32);
impl Drop for DropBomb {
    fn drop(&mut self) {
        std::panic::panic_any(Bomb(self.0));
    }
}

/// Keeps the planted `Bomb` panics out of the output. Only those: the hook is the whole
/// binary's, and a test failing after it was installed must still print its message.
fn quiet() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<Bomb>() {
                previous(info);
            }
        }));
    });
}

#[test]
fn payloads_that_panic_on_drop_levels_deep_are_contained() {
    quiet();
    let sched = Scheduler::new().unwrap();
    for depth in 0..5 {
        let w = sched.work(move |_| std::panic::panic_any(Bomb(depth)));
        w.schedule(Duration::ZERO);
        let start = Instant::now();
        while !w.is_poisoned() {
            assert!(start.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!w.is_running());
        // flush on the caller thread
        let w2 = sched.work(move |_| std::panic::panic_any(Bomb(depth)));
        w2.schedule(Duration::from_secs(100));
        assert!(w2.flush());
        assert!(w2.is_poisoned() && !w2.is_running());
        assert!(!w2.flush());
        w2.cancel_sync();
    }
    // the worker still runs works
    assert_runs_a_work(&sched);
}

#[test]
fn closure_destructors_that_panic_are_contained_wherever_they_run() {
    quiet();
    let sched = Scheduler::builder().workers(2).build().unwrap();
    // 1. drop(work) on the caller
    let b = DropBomb(3);
    let w = sched.work(move |_| {
        let _ = &b;
        Next::Park
    });
    drop(w);
    // 2. dropped from inside another work's callback while it runs on the other worker
    let running = Arc::new(AtomicBool::new(false));
    let bomb = DropBomb(3);
    let r = running.clone();
    let victim = sched.work(move |_| {
        let _ = &bomb;
        r.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        Next::Again
    });
    victim.schedule(Duration::ZERO);
    let holder = Arc::new(Mutex::new(Some(victim)));
    let done = Arc::new(AtomicBool::new(false));
    let (h, r, d) = (holder.clone(), running.clone(), done.clone());
    let killer = sched.work(move |_| {
        while !r.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(h.lock().unwrap().take());
        d.store(true, Ordering::SeqCst);
        Next::Park
    });
    killer.schedule(Duration::ZERO);
    let start = Instant::now();
    while !done.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "killer never finished"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // 3. self-drop on the worker (freed after the run, on the worker)
    let bomb = DropBomb(3);
    let me: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
    let m = me.clone();
    let selfdrop = sched.work(move |_| {
        let _ = &bomb;
        drop(m.lock().unwrap().take());
        Next::Again
    });
    selfdrop.schedule(Duration::ZERO);
    *me.lock().unwrap() = Some(selfdrop);
    std::thread::sleep(Duration::from_millis(200));
    // 4. after shutdown
    let bomb = DropBomb(3);
    let late = sched.work(move |_| {
        let _ = &bomb;
        Next::Park
    });
    let s2 = sched.clone();
    drop(sched);
    drop(s2);
    drop(late);
    // still alive: a fresh scheduler works
    let sched = Scheduler::new().unwrap();
    assert_runs_a_work(&sched);
}

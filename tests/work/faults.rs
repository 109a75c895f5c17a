//! Faults: the scheduler dropped while works are armed, running and being flushed, and
//! callbacks that panic, block, or drop other works' handles. No test asserts a time:
//! "the others keep their schedule" is shown by making the misbehaving callback wait
//! for the others to have run.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::{EVENTUALLY, drop_flag, eventually};
use nicework::{Next, Scheduler, Work};

/// A periodic work counting its runs.
fn probe(sched: &Scheduler) -> (Work, Arc<AtomicU64>) {
    let runs = Arc::new(AtomicU64::new(0));
    let counter = runs.clone();
    let work = sched.every(Duration::from_millis(2), move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        Next::Again
    });
    (work, runs)
}

#[test]
fn dropping_the_scheduler_while_works_are_armed_running_and_flushed() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    // Armed far in the future.
    let (armed_flag_owner, armed_freed) = drop_flag();
    let armed = sched.work(move |_| {
        let _keep = &armed_flag_owner;
        Next::Park
    });
    armed.schedule(Duration::from_secs(3600));
    // Running when the drop starts: it waits for a signal, then asks to run again.
    let (running_started_tx, running_started) = mpsc::channel();
    let (release_tx, release) = mpsc::channel::<()>();
    let (running_flag_owner, running_freed) = drop_flag();
    let running = sched.work(move |_| {
        let _keep = &running_flag_owner;
        running_started_tx.send(()).unwrap();
        let _ = release.recv_timeout(EVENTUALLY);
        Next::Again
    });
    running.schedule(Duration::ZERO);
    running_started.recv_timeout(EVENTUALLY).unwrap();
    // Being flushed from another thread: a long incremental work.
    let increments = Arc::new(AtomicU64::new(0));
    let on_flusher = Arc::new(AtomicU64::new(0));
    let (counter, flusher_counter) = (increments.clone(), on_flusher.clone());
    let (flushed_flag_owner, flushed_freed) = drop_flag();
    let flushed = Arc::new(sched.work(move |_| {
        let _keep = &flushed_flag_owner;
        std::thread::sleep(Duration::from_micros(200));
        counter.fetch_add(1, Ordering::SeqCst);
        let on_worker = std::thread::current()
            .name()
            .is_some_and(|name| name.starts_with("nicework"));
        if !on_worker {
            flusher_counter.fetch_add(1, Ordering::SeqCst);
        }
        Next::Yield
    }));
    flushed.schedule(Duration::ZERO);
    let flusher = {
        let flushed = flushed.clone();
        std::thread::spawn(move || flushed.flush())
    };
    // The flush is under way (it took increments on itself) before the drop starts: a
    // flusher thread that had not yet called `flush` would find the scheduler shut down.
    assert!(eventually(|| {
        increments.load(Ordering::SeqCst) > 5 && on_flusher.load(Ordering::SeqCst) > 0
    }));

    // Drop the scheduler on another thread; it must wait for the running callback only.
    let (dropped_tx, dropped) = mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(sched);
        dropped_tx.send(()).unwrap();
    });
    // The flusher returns: shutdown refuses the yielded re-arms it would take over.
    assert!(
        flusher.join().unwrap(),
        "the flush ran or waited for an instance"
    );
    release_tx.send(()).unwrap();
    dropped
        .recv_timeout(EVENTUALLY)
        .expect("dropping the scheduler hung");
    dropper.join().unwrap();

    // Surviving handles are inert.
    let flushed = Arc::try_unwrap(flushed).unwrap();
    for work in [&armed, &running, &flushed] {
        common::assert_inert(work);
    }
    let settled = increments.load(Ordering::SeqCst);
    // Nothing leaks: every closure is freed with its handle.
    drop((armed, running, flushed));
    assert!(armed_freed.load(Ordering::SeqCst));
    assert!(running_freed.load(Ordering::SeqCst));
    assert!(flushed_freed.load(Ordering::SeqCst));
    assert_eq!(increments.load(Ordering::SeqCst), settled);
}

#[test]
fn a_work_that_panics_on_every_run_leaves_the_others_on_schedule() {
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let (probe, probe_runs) = probe(&sched);
    let attempts = Arc::new(AtomicU64::new(0));
    let counter = attempts.clone();
    let panicky = sched.every(Duration::from_millis(1), move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        panic!("fails every time");
    });
    // A fresh panicking work per round, so the worker catches many panics.
    let mut poisoned = vec![panicky];
    for _ in 0..20 {
        let counter = attempts.clone();
        let work = sched.work(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            panic!("fails every time");
        });
        work.schedule(Duration::ZERO);
        poisoned.push(work);
    }
    let before = probe_runs.load(Ordering::SeqCst);
    assert!(eventually(|| poisoned.iter().all(Work::is_poisoned)));
    assert!(eventually(
        || probe_runs.load(Ordering::SeqCst) >= before + 20
    ));
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        21,
        "a poisoned work never runs again"
    );
    assert!(!probe.is_poisoned());
}

#[test]
fn a_blocking_callback_holds_one_worker_and_the_others_keep_running() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let (_probe, probe_runs) = probe(&sched);
    let seen = probe_runs.clone();
    let (done_tx, done) = mpsc::channel();
    let blocker = sched.work(move |_| {
        // Blocks until the probe ran 50 more times on the other worker.
        let start = seen.load(Ordering::SeqCst);
        let others_ran = eventually(|| seen.load(Ordering::SeqCst) >= start + 50);
        done_tx.send(others_ran).unwrap();
        Next::Park
    });
    blocker.schedule(Duration::ZERO);
    assert!(
        done.recv_timeout(EVENTUALLY * 2).unwrap(),
        "the probe stalled while one callback blocked"
    );
}

#[test]
fn a_callback_that_drops_other_works_handles_cancels_them_and_the_rest_carry_on() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let (_probe, probe_runs) = probe(&sched);
    let victim_runs = Arc::new(AtomicU64::new(0));
    let mut freed = Vec::new();
    let victims: Vec<Work> = (0..8)
        .map(|_| {
            let counter = victim_runs.clone();
            let (flag, was_freed) = drop_flag();
            freed.push(was_freed);
            sched.every(Duration::from_millis(1), move |_| {
                let _keep = &flag;
                counter.fetch_add(1, Ordering::SeqCst);
                Next::Again
            })
        })
        .collect();
    assert!(eventually(|| victim_runs.load(Ordering::SeqCst) > 20));
    let handles = Arc::new(Mutex::new(Some(victims)));
    let held = handles.clone();
    let (dropped_tx, dropped) = mpsc::channel();
    let killer = sched.work(move |_| {
        // cancel_sync of each: waits for a victim running on the other worker.
        drop(held.lock().unwrap().take());
        dropped_tx.send(()).unwrap();
        Next::Park
    });
    killer.schedule(Duration::ZERO);
    dropped.recv_timeout(EVENTUALLY).unwrap();
    assert!(
        freed.iter().all(|f| f.load(Ordering::SeqCst)),
        "every victim's closure was freed"
    );
    let after = victim_runs.load(Ordering::SeqCst);
    let probe_before = probe_runs.load(Ordering::SeqCst);
    assert!(eventually(
        || probe_runs.load(Ordering::SeqCst) >= probe_before + 20
    ));
    assert_eq!(
        victim_runs.load(Ordering::SeqCst),
        after,
        "a dropped work ran again"
    );
}

//! Shutdown, the last `Scheduler` handle dropped, leaves every work inert:
//!
//! - shutdown racing arms, touches, flushes of a yielding work, cancels and detaches
//!   leaves every work inert and frees every detached closure;
//! - after shutdown during a `flush` that took over `Yield` increments from a worker, the
//!   work is inert;
//! - a manual scheduler's shutdown ends a flush that takes over `Yield` increments, and
//!   leaves the work inert.
//!
//! Race tests repeat rounds and fail if any round broke the promise; waits are for
//! states, bounded, and nothing asserts a timing. The takeover from a worker waits for the
//! flusher's thread to sleep (its state in `/proc`): that test is Linux's.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use common::{BOUND, FAR, Rng, assert_no_round_broke, drop_flag};
use nicework::{Next, Scheduler, Work};

// The takeover from a worker waits for the flusher's state in `/proc`: Linux's.
#[cfg(target_os = "linux")]
use common::{rounds, spin_until_eventually, thread_state};
#[cfg(target_os = "linux")]
use std::sync::atomic::AtomicI32;
#[cfg(target_os = "linux")]
use std::time::Instant;

/// Everything that must hold of `work` once its scheduler is gone and nothing runs.
fn inertness_violations(work: &Work) -> Vec<&'static str> {
    let mut wrong = Vec::new();
    if work.is_pending() {
        wrong.push("pending");
    }
    if work.is_running() {
        wrong.push("running");
    }
    if work.schedule(Duration::ZERO) || work.is_pending() {
        wrong.push("schedule armed it");
    }
    if work.reschedule(FAR) || work.is_pending() {
        wrong.push("reschedule armed it");
    }
    if work.schedule_within(Duration::from_millis(1)) || work.is_pending() {
        wrong.push("schedule_within armed it");
    }
    work.touch();
    if work.is_pending() {
        wrong.push("touch armed it");
    }
    if work.flush() {
        wrong.push("flush returned true");
    }
    if work.cancel() {
        wrong.push("cancel returned true");
    }
    if work.cancel_sync() {
        wrong.push("cancel_sync returned true");
    }
    wrong
}

/// One round: works of every kind (one yielding, one re-arming with `Again`, a timeout, a
/// long runner, and detached ones) hammered by threads that arm, touch, flush and cancel,
/// while the only `Scheduler` handle is dropped. Returns what was wrong afterwards.
fn shutdown_race_round(seed: u64) -> Vec<&'static str> {
    let sched = common::normal_priority_builder()
        .workers(2)
        .back_off(false)
        .build()
        .unwrap();
    let works: Vec<Work> = vec![
        sched.work(|_| {
            common::counted::spin(Duration::from_micros(50));
            Next::Yield
        }),
        sched.every(Duration::from_micros(100), |_| Next::Again),
        sched.timeout(Duration::from_micros(200), |_| Next::Park),
        sched.work(|_| {
            common::counted::spin(Duration::from_micros(300));
            Next::After(Duration::ZERO)
        }),
    ];
    for work in &works {
        work.schedule(Duration::ZERO);
    }
    let mut freed = Vec::new();
    for i in 0..3 {
        let (flag, was_freed) = drop_flag();
        let work = sched.work(move |_| {
            let _keep = &flag;
            common::counted::spin(Duration::from_micros(20 * i));
            Next::Yield
        });
        work.schedule(Duration::ZERO);
        freed.push(was_freed);
        if i == 0 {
            work.detach();
        } else {
            // Detached by another thread, around the shutdown.
            let (tx, rx) = mpsc::channel::<Work>();
            thread::spawn(move || {
                if let Ok(work) = rx.recv() {
                    work.detach();
                }
            });
            tx.send(work).unwrap();
        }
    }
    let stop = AtomicBool::new(false);
    let started = AtomicUsize::new(0);
    thread::scope(|s| {
        for t in 0..3u64 {
            let (works, stop, started) = (&works, &stop, &started);
            s.spawn(move || {
                let mut rng = Rng(seed.wrapping_mul(31).wrapping_add(t + 1) | 1);
                started.fetch_add(1, SeqCst);
                while !stop.load(SeqCst) {
                    let work = &works[(rng.next() % works.len() as u64) as usize];
                    match (rng.next() % 8, t) {
                        (_, 0) => {
                            work.flush();
                        }
                        (0 | 1, _) => {
                            work.reschedule(Duration::from_micros(rng.next() % 300));
                        }
                        (2, _) => {
                            work.schedule(Duration::ZERO);
                        }
                        (3, _) => {
                            work.schedule_within(Duration::from_micros(rng.next() % 300));
                        }
                        (4 | 5, _) => work.touch(),
                        (6, _) => {
                            work.cancel();
                        }
                        _ => {
                            work.cancel_sync();
                            work.schedule(Duration::ZERO);
                        }
                    }
                }
            });
        }
        common::spin_until(BOUND, || started.load(SeqCst) == 3);
        thread::sleep(Duration::from_micros(seed % 2_000));
        drop(sched);
        // A little more racing after the shutdown, then quiet.
        thread::sleep(Duration::from_micros(200));
        stop.store(true, SeqCst);
    });
    let mut wrong = Vec::new();
    for work in &works {
        wrong.extend(inertness_violations(work));
    }
    if !common::spin_until(BOUND, || freed.iter().all(|f| f.load(SeqCst))) {
        wrong.push("a detached closure was never freed");
    }
    wrong
}

#[test]
fn shutdown_racing_arms_touches_flushes_cancels_and_detaches_leaves_every_work_inert() {
    let rounds = 60;
    let mut seen = BTreeMap::new();
    let mut broke = 0;
    for round in 0..rounds {
        let wrong = shutdown_race_round(0x9e37_79b9 ^ (round as u64 * 7919));
        broke += usize::from(!wrong.is_empty());
        for what in wrong {
            *seen.entry(what).or_insert(0usize) += 1;
        }
    }
    assert_no_round_broke(
        "after shutdown nothing is armed",
        broke,
        rounds,
        &format!("({seen:?})"),
    );
}

/// A flush that runs a yielding work's increments for ever on a manual scheduler: the
/// last handle dropped from another thread ends it, and leaves the work inert.
#[test]
fn shutdown_of_a_manual_scheduler_ends_a_flush_taking_over_yield_increments() {
    for round in 0..50u64 {
        let sched = Scheduler::manual();
        let increments = Arc::new(AtomicU64::new(0));
        let counter = increments.clone();
        let work = Arc::new(sched.work(move |_| {
            counter.fetch_add(1, SeqCst);
            common::counted::spin(Duration::from_micros(20));
            Next::Yield
        }));
        work.schedule(Duration::ZERO);
        let flusher = {
            let work = work.clone();
            thread::spawn(move || work.flush())
        };
        common::spin_until(BOUND, || increments.load(SeqCst) > round % 7);
        drop(sched);
        let done = common::spin_until(BOUND, || flusher.is_finished());
        assert!(
            done,
            "the flush never returned after shutdown (round {round})"
        );
        assert!(flusher.join().unwrap());
        let wrong = inertness_violations(&work);
        assert!(
            wrong.is_empty(),
            "after shutdown (round {round}): {wrong:?}"
        );
    }
}

/// One round: a work that yields after ~300 µs of busy work per increment, on a worker;
/// a flush from another thread during an increment (it waits for that increment, then
/// takes the next ones over); and the last scheduler handle dropped the moment that
/// increment ended, before the flusher took the next one. Returns what was wrong with the
/// work after the flush returned and the scheduler was gone.
#[cfg(target_os = "linux")]
fn shutdown_during_a_yield_takeover() -> Vec<&'static str> {
    let sched = Scheduler::builder()
        .workers(1)
        .back_off(false)
        .build()
        .unwrap();
    let flusher_tid = Arc::new(AtomicI32::new(0));
    let on_flusher = Arc::new(AtomicBool::new(false));
    let increments = Arc::new(AtomicU64::new(0));
    let work = {
        let (flusher_tid, on_flusher, increments) =
            (flusher_tid.clone(), on_flusher.clone(), increments.clone());
        Arc::new(sched.work(move |_| {
            if common::gettid() == flusher_tid.load(SeqCst) {
                on_flusher.store(true, SeqCst);
            }
            let start = Instant::now();
            while start.elapsed() < Duration::from_micros(300) {
                std::hint::spin_loop();
            }
            increments.fetch_add(1, SeqCst);
            Next::Yield
        }))
    };
    assert!(work.schedule(Duration::ZERO));
    assert!(
        spin_until_eventually(|| increments.load(SeqCst) >= 1),
        "the worker never ran an increment"
    );
    let flusher = {
        let (work, flusher_tid) = (work.clone(), flusher_tid.clone());
        thread::spawn(move || {
            flusher_tid.store(common::gettid(), SeqCst);
            work.flush()
        })
    };
    // The flusher sleeps in `flush`, waiting for the worker's increment in progress (or,
    // if it came between two increments, it took the next one over at once).
    assert!(
        spin_until_eventually(|| {
            let tid = flusher_tid.load(SeqCst);
            on_flusher.load(SeqCst) || (tid != 0 && thread_state(tid) == Some('S'))
        }),
        "the flush never began"
    );
    // The moment that increment ends, the next one is pending for the flusher: shut down.
    spin_until_eventually(|| !work.is_running());
    drop(sched);
    flusher.join().unwrap();

    let mut wrong = Vec::new();
    if work.is_pending() {
        wrong.push("pending");
    }
    if work.flush() {
        wrong.push("flush() returned true");
    }
    if work.cancel() {
        wrong.push("cancel() returned true");
    }
    if work.reschedule(FAR) || work.is_pending() {
        wrong.push("reschedule armed it");
    }
    work.cancel();
    if work.schedule(FAR) || work.is_pending() {
        wrong.push("schedule armed it");
    }
    work.cancel();
    wrong
}

#[cfg(target_os = "linux")]
#[test]
fn shutdown_during_a_flush_that_took_over_yield_increments_leaves_the_work_inert() {
    let total = rounds(200);
    let mut seen = std::collections::BTreeMap::new();
    let mut broke = 0;
    for _ in 0..total {
        let wrong = shutdown_during_a_yield_takeover();
        if !wrong.is_empty() {
            broke += 1;
        }
        for what in wrong {
            *seen.entry(what).or_insert(0usize) += 1;
        }
    }
    assert_no_round_broke(
        "a work is inert after shutdown during a Yield takeover",
        broke,
        total,
        &format!("(after the flush returned and the scheduler was gone: {seen:?})"),
    );
}

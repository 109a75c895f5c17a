//! Wait cycles: callbacks that `flush`, `cancel_sync` or drop each other's works. Each
//! would wait for the other's run to end; nicework breaks the cycle. The call that would
//! close it does not wait and behaves as inside the own callback, and a `tracing`
//! warning names both works. Real worker threads; every wait is bounded by
//! `common::EVENTUALLY`, so a deadlock fails instead of hanging.
//!
//! A process-wide subscriber collects the warnings, so these tests share one binary.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use nicework::{Next, Scheduler, Work};

fn warnings() -> &'static std::sync::Mutex<Vec<String>> {
    &common::events::captured().warnings
}

/// The cycle warnings that name both `a` and `b`.
fn cycle_warnings_naming(a: &str, b: &str) -> usize {
    warnings()
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.contains("wait cycle") && w.contains(a) && w.contains(b))
        .count()
}

// === the scenario ===

/// What one callback does to the other work.
#[derive(Clone, Copy)]
enum Action {
    Flush,
    CancelSync,
    Drop,
}

/// Handles that callbacks reach each other through; the slot holds the only one.
type Slot = Arc<Mutex<Option<Arc<Work>>>>;

struct Ring {
    works: Vec<Slot>,
    /// Runs that returned (the cycle did not hang them).
    finished: Arc<AtomicUsize>,
    /// What each call on the other work returned (flush/cancel_sync), by work index.
    returned: Arc<Mutex<Vec<Option<bool>>>>,
    /// Set when each work's closure was freed.
    freed: Vec<Arc<AtomicBool>>,
}

/// `n` works on `scheds[i % scheds.len()]`, all due at once; work `i`'s callback waits
/// until all `n` are running (so they run on `n` threads at once), then applies `action`
/// to work `i + 1` (mod n), so the waits form one cycle through all of them.
fn ring(scheds: &[&Scheduler], n: usize, action: Action, tag: &str) -> Ring {
    let works: Vec<Slot> = (0..n).map(|_| Arc::new(Mutex::new(None))).collect();
    let all_running = Arc::new(Barrier::new(n));
    let finished = Arc::new(AtomicUsize::new(0));
    let returned = Arc::new(Mutex::new(vec![None; n]));
    let mut freed = Vec::new();
    let mut made = Vec::new();
    for i in 0..n {
        let (flag, was_freed) = common::drop_flag();
        freed.push(was_freed);
        let next = works[(i + 1) % n].clone();
        let (all_running, finished, returned) =
            (all_running.clone(), finished.clone(), returned.clone());
        let sched = scheds[i % scheds.len()];
        let work = sched
            .work(move |_| {
                let _keep = &flag;
                all_running.wait();
                // Clone (or, to drop it, take) the other handle out of its slot, so the
                // slot's lock is not held while waiting (a cycle of the test's own making).
                let result = match action {
                    Action::Flush | Action::CancelSync => {
                        let other = next.lock().unwrap().clone();
                        other.map(|other| match action {
                            Action::Flush => other.flush(),
                            _ => other.cancel_sync(),
                        })
                    }
                    Action::Drop => {
                        let other = next.lock().unwrap().take();
                        drop(other);
                        None
                    }
                };
                returned.lock().unwrap()[i] = result;
                finished.fetch_add(1, Ordering::SeqCst);
                match action {
                    // One run each: a second run would wait at the barrier for ever.
                    Action::Flush => Next::Park,
                    // The cancel or drop refuses this re-arm (checked by the tests).
                    Action::CancelSync | Action::Drop => Next::Again,
                }
            })
            .named(format!("{tag}-{i}"));
        made.push(work);
    }
    for (i, work) in made.into_iter().enumerate() {
        *works[i].lock().unwrap() = Some(Arc::new(work));
    }
    Ring {
        works,
        finished,
        returned,
        freed,
    }
}

impl Ring {
    fn arm_all(&self) {
        for slot in &self.works {
            if let Some(work) = slot.lock().unwrap().as_ref() {
                assert!(work.schedule(Duration::ZERO));
            }
        }
    }
}

fn sched(workers: usize) -> Scheduler {
    Scheduler::builder().workers(workers).build().unwrap()
}

#[test]
fn two_works_that_flush_each_other_on_two_workers_do_not_deadlock() {
    warnings();
    let sched = sched(2);
    let ring = ring(&[&sched], 2, Action::Flush, "flush-pair");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 2),
        "two works flushing each other deadlocked"
    );
    let returned = ring.returned.lock().unwrap().clone();
    // One flush waited for the other run (true); the one that would have closed the
    // cycle did not wait and returned false, as inside its own callback.
    let mut sorted: Vec<bool> = returned.iter().map(|r| r.unwrap()).collect();
    sorted.sort();
    assert_eq!(sorted, vec![false, true], "returned: {returned:?}");
    assert_eq!(cycle_warnings_naming("flush-pair-0", "flush-pair-1"), 1);
}

#[test]
fn two_works_that_cancel_sync_each_other_do_not_deadlock_and_neither_rearms() {
    warnings();
    let sched = sched(2);
    let ring = ring(&[&sched], 2, Action::CancelSync, "cancel-pair");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 2),
        "two works cancelling each other deadlocked"
    );
    // Both were cancelled during their runs, so both `Next::Again` were refused: once
    // neither runs, neither is pending (a re-arm is applied as the run completes).
    let works: Vec<Arc<Work>> = ring
        .works
        .iter()
        .map(|slot| slot.lock().unwrap().clone().unwrap())
        .collect();
    assert!(common::eventually(|| works.iter().all(|w| !w.is_running())));
    assert!(
        works.iter().all(|w| !w.is_pending()),
        "a cancelled work re-armed"
    );
    assert_eq!(
        ring.finished.load(Ordering::SeqCst),
        2,
        "a cancelled work ran again"
    );
    let returned = ring.returned.lock().unwrap().clone();
    assert!(
        returned.iter().all(Option::is_some),
        "returned: {returned:?}"
    );
    assert_eq!(cycle_warnings_naming("cancel-pair-0", "cancel-pair-1"), 1);
}

#[test]
fn two_works_that_drop_each_other_free_both_closures_after_their_runs() {
    warnings();
    let sched = sched(2);
    let ring = ring(&[&sched], 2, Action::Drop, "drop-pair");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 2),
        "two works dropping each other deadlocked"
    );
    assert!(common::eventually(|| ring
        .freed
        .iter()
        .all(|f| f.load(Ordering::SeqCst))));
    assert_eq!(sched.metrics().armed, 0);
    assert_eq!(cycle_warnings_naming("drop-pair-0", "drop-pair-1"), 1);
}

#[test]
fn a_cycle_through_three_works_is_broken_once() {
    warnings();
    let sched = sched(3);
    let ring = ring(&[&sched], 3, Action::Flush, "flush-three");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 3),
        "three works flushing in a ring deadlocked"
    );
    let returned = ring.returned.lock().unwrap().clone();
    let refused = returned.iter().filter(|r| **r == Some(false)).count();
    assert_eq!(refused, 1, "returned: {returned:?}");
}

#[test]
fn a_cycle_across_two_schedulers_is_broken() {
    warnings();
    let (first, second) = (sched(1), sched(1));
    let ring = ring(&[&first, &second], 2, Action::Flush, "flush-across");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 2),
        "two works on two schedulers flushing each other deadlocked"
    );
    let returned = ring.returned.lock().unwrap().clone();
    let mut sorted: Vec<bool> = returned.iter().map(|r| r.unwrap()).collect();
    sorted.sort();
    assert_eq!(sorted, vec![false, true], "returned: {returned:?}");
}

#[test]
fn a_chain_that_is_not_a_cycle_still_waits() {
    // A flushes B while B runs and waits for a signal that arrives from outside: no cycle,
    // so A's flush waits and returns true once B finished.
    warnings();
    let sched = sched(2);
    let b_started = Arc::new(Barrier::new(2));
    let release_b = Arc::new(Barrier::new(2));
    let b_runs = Arc::new(AtomicUsize::new(0));
    let b = {
        let (b_started, release_b, b_runs) = (b_started.clone(), release_b.clone(), b_runs.clone());
        Arc::new(sched.work(move |_| {
            b_started.wait();
            release_b.wait();
            b_runs.fetch_add(1, Ordering::SeqCst);
            Next::Park
        }))
    };
    let flushed = Arc::new(Mutex::new(None));
    let a = {
        let (b, flushed) = (b.clone(), flushed.clone());
        sched.work(move |_| {
            *flushed.lock().unwrap() = Some((b.flush(), b.stats().runs));
            Next::Park
        })
    };
    assert!(b.schedule(Duration::ZERO));
    b_started.wait();
    assert!(a.schedule(Duration::ZERO));
    // A is now running or about to; B is held until we release it.
    assert!(common::eventually(|| a.is_running()));
    release_b.wait();
    assert!(common::eventually(|| flushed.lock().unwrap().is_some()));
    assert_eq!(*flushed.lock().unwrap(), Some((true, 1)));
    assert_eq!(b_runs.load(Ordering::SeqCst), 1);
}

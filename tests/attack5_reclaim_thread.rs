//! Attack round 5: where on_reclaim runs.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nicework::{IdSpace, PerCid, Scheduler, MIN_SCAN_PERIOD};

/// The manual scheduler runs the scan on the thread calling `advance()`, and `advance()`
/// inside `with` is supported (`percid_gate_cycles::advance_inside_with_finishes_beside_a_reader`).
/// on_reclaim then runs inside that `with`: a callback folding into `totals` through
/// `totals.with` is re-entrant there, panics (contained) and the value is lost.
#[test]
fn on_reclaim_runs_inside_with_when_advance_is_called_there() {
    let sched = Scheduler::manual();
    let ids = IdSpace::builder()
        .scan_period(MIN_SCAN_PERIOD)
        .build(&sched);
    let totals: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 0));
    let counters: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, {
        let totals = totals.clone();
        move |n: &mut u64| totals.with(|t| *t += *n)
    }));
    // Main holds id 0 in both.
    totals.with(|_| ());
    counters.with(|n| *n += 1);
    const N: u64 = 8;
    let hs: Vec<_> = (0..N)
        .map(|_| {
            let c = counters.clone();
            let bar = Arc::new(());
            std::thread::spawn(move || {
                let _ = bar;
                c.with(|n| *n += 1)
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    // A reporter that holds its own total while it advances the clock.
    totals.with(|_| {
        sched.advance(MIN_SCAN_PERIOD * 3);
    });
    sched.advance(MIN_SCAN_PERIOD * 3);
    let mut sum = 0;
    counters.for_each(|n| sum += *n);
    totals.for_each(|n| sum += *n);
    assert_eq!(
        sum,
        N + 1,
        "increments lost: on_reclaim ran inside totals.with"
    );
}

/// The same through the PerCid's drop: values a reader detached wait in the queue when
/// the scheduler is gone, and the drop passes them to on_reclaim on the dropping thread,
/// here inside `totals.with`.
#[test]
fn on_reclaim_runs_inside_with_when_the_percid_is_dropped_there() {
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::builder()
        .scan_period(MIN_SCAN_PERIOD)
        .build(&sched);
    let total = Arc::new(AtomicU64::new(0));
    let totals: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, {
        let total = total.clone();
        move |n: &mut u64| {
            total.fetch_add(*n, Ordering::SeqCst);
        }
    }));
    let counters: PerCid<u64> = PerCid::with_reclaim(&ids, || 0, {
        let totals = totals.clone();
        move |n: &mut u64| totals.with(|t| *t += *n)
    });
    totals.with(|_| ()); // main: id 0
    drop(sched);
    // A thread with id 1 counts, then blocks in its with until a reader holds the gate.
    let (inside_tx, inside_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let c = &counters;
        let t = s.spawn(move || {
            c.with(|n| {
                *n += 1;
            });
            inside_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        });
        inside_rx.recv().unwrap();
        // Reader holds the gate while the thread exits (its exit trims: left to the reader).
        let mut once = true;
        counters.for_each(|_| {
            if std::mem::take(&mut once) {
                go_tx.send(()).unwrap();
                t_join_wait(&t);
            }
        });
    });
    // The value is queued now (the reader detached it), no scheduler to pass it on.
    let mut queued = 0;
    counters.for_each(|n| queued += *n);
    assert_eq!(queued, 1, "expected the value in the queue (visited)");
    totals.with(|_| drop(counters));
    let mut sum = total.load(Ordering::SeqCst);
    totals.for_each(|n| sum += *n);
    assert_eq!(
        sum, 1,
        "the queued value was lost: on_reclaim ran inside totals.with at the drop"
    );
}

fn t_join_wait(t: &std::thread::ScopedJoinHandle<'_, ()>) {
    assert!(common::eventually(|| t.is_finished()));
}

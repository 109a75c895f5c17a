//! A reader in a loop beside a drainer: when readers held the whole reclaim queue out
//! while visiting it, the drainer found it empty, and the queue grew without bound.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nicework::{IdSpace, PerCid, Scheduler};

use common::counted::{Counted, Counting, env, spin};

/// Threads come and go (each makes a fresh value above the high water once it exits) beside
/// one reader in a loop whose callback costs a few microseconds. The scan's trim is left
/// to the reader (it holds the gate), and its drain finds the queue empty whenever the
/// reader has taken it out to visit it: the longer the queue, the longer it is out.
#[test]
fn queued_values_stay_bounded_beside_a_reader_in_a_loop() {
    let counting = Counting::new();
    let cost = Duration::from_micros(env("PERCID_QUEUE_COST_US", 50));
    let secs = env("PERCID_QUEUE_SECS", 2);
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::builder()
        .scan_period(nicework::MIN_SCAN_PERIOD)
        .build(&sched);
    let folded = Arc::new(AtomicU64::new(0));
    let reclaims = Arc::new(AtomicUsize::new(0));
    let counters: Arc<PerCid<Counted>> = Arc::new(PerCid::with_reclaim(&ids, counting.init(), {
        let folded = folded.clone();
        let reclaims = reclaims.clone();
        move |c: &mut Counted| {
            folded.fetch_add(*c.n.get_mut(), Ordering::SeqCst);
            reclaims.fetch_add(1, Ordering::SeqCst);
        }
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (counters, stop) = (counters.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                counters.for_each(|c| {
                    let _ = c.n.load(Ordering::Relaxed);
                    spin(cost);
                });
            }
        })
    };
    // Churn: 8 threads at a time hold distinct ids, then exit; between rounds, a scan
    // (10 ms) trims them above the high water.
    let start = Instant::now();
    let mut increments = 0u64;
    let mut samples = Vec::new();
    let mut next_sample = Duration::from_secs(1);
    while start.elapsed() < Duration::from_secs(secs) {
        let bar = Arc::new(std::sync::Barrier::new(8));
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let c = counters.clone();
                let bar = bar.clone();
                std::thread::spawn(move || {
                    c.with(|n| *n.n.get_mut() += 1);
                    bar.wait();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        increments += 8;
        // Let a scan trim the slots and pass them on (`live()` counts queued values too).
        assert!(
            common::eventually(|| counters.live() == 0),
            "the reclaim queue never drained beside a reader in a loop"
        );
        if start.elapsed() >= next_sample {
            next_sample += Duration::from_secs(1);
            samples.push((
                counting.alive(),
                counting.created(),
                reclaims.load(Ordering::SeqCst),
            ));
        }
    }
    eprintln!("per second (alive, created, reclaimed): {samples:?}");
    let alive_with_reader = counting.alive();
    let reclaimed_with_reader = reclaims.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    // Quiescence: the next scans drain the queue.
    let ok = common::eventually(|| reclaims.load(Ordering::SeqCst) == counting.created());
    let mut sum = folded.load(Ordering::SeqCst);
    counters.for_each(|c| sum += c.n.load(Ordering::SeqCst));
    eprintln!(
        "at the end with the reader: alive={alive_with_reader} reclaimed={reclaimed_with_reader} \
         created={}; after it stopped: reclaimed={} sum={sum} increments={increments}",
        counting.created(),
        reclaims.load(Ordering::SeqCst)
    );
    assert!(ok);
    assert_eq!(sum, increments);
    assert!(
        alive_with_reader < 200,
        "beside a reader in a loop, {alive_with_reader} trimmed values (4 KiB each) were \
         still waiting in the reclaim queue (live() == 0 all along)"
    );
    drop(sched);
}

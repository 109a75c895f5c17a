//! The reclaim queue that readers visit: a reader takes one value at a time out of it, so
//! a drainer can pass the others on meanwhile.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use nicework::{IdSpace, PerCid, Scheduler};

use common::counted::{Counted, Counting, spin};

/// A reader in a loop whose callback costs a few microseconds per value. The compaction
/// work's trim finds the gate held (deferred) and the queue empty (the reader took it out
/// to visit it), so it passes nothing on; the queue only grows.
#[test]
fn a_reader_visiting_the_queue_does_not_starve_the_drainer() {
    let counting = Counting::new();
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
            *c.n.get_mut() = 0;
            reclaims.fetch_add(1, Ordering::SeqCst);
        }
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let max_visited = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (counters, stop, max_visited) = (counters.clone(), stop.clone(), max_visited.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut visited = 0;
                counters.for_each(|c| {
                    let _ = c.n.load(Ordering::Relaxed);
                    spin(Duration::from_micros(5));
                    visited += 1;
                });
                max_visited.fetch_max(visited, Ordering::Relaxed);
            }
        })
    };
    const ROUNDS: u64 = 400;
    const PER: u64 = 16;
    for _ in 0..ROUNDS {
        let bar = Arc::new(std::sync::Barrier::new(PER as usize));
        let hs: Vec<_> = (0..PER)
            .map(|_| {
                let c = counters.clone();
                let bar = bar.clone();
                std::thread::spawn(move || {
                    c.with(|n| *n.n.get_mut() += 1);
                    c.with(|_| ()); // keep using
                    bar.wait();
                    c.with(|_| ());
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
    let live_ok = common::eventually(|| counters.live() == 0);
    let drained = common::eventually(|| counting.alive() <= 2);
    let alive = counting.alive();
    let recl = reclaims.load(Ordering::SeqCst);
    let live = counters.live();
    stop.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    let created = counting.created();
    eprintln!(
        "created={created} live()={live} alive instances={alive} reclaims={recl} max visited per pass={}",
        max_visited.load(Ordering::SeqCst)
    );
    assert!(live_ok, "live() stuck at {live}");
    assert!(
        drained,
        "beside a reader in a loop, {alive} values (4 KiB each) stay queued while live()==0; \
         only {recl} of {} reached on_reclaim after 20 s",
        ROUNDS * PER
    );
    // Quiescence: the reader stopped; the queue drains at the next scan.
    assert!(common::eventually(
        || reclaims.load(Ordering::SeqCst) == counting.created()
    ));
    let mut sum = folded.load(Ordering::SeqCst);
    counters.for_each(|c| sum += c.n.load(Ordering::SeqCst));
    assert_eq!(sum, ROUNDS * PER);
    drop(sched);
}

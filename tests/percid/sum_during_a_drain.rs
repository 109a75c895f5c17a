//! Values a drainer took out of the reclaim queue but has not passed on yet: it takes one
//! at a time, so a sum during a drain misses only the value in the callback (it used to
//! take the whole queue, and a sum missed all of it).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use nicework::{IdSpace, MIN_SCAN_PERIOD, PerCid, Scheduler};

/// for_each docs: "a sum of the slots plus what on_reclaim folded misses nothing but the
/// values the callback is being called with at that moment". While the drainer's callback
/// runs on the first value of its batch, the rest of the batch is in no slot, not in the
/// queue, and not folded: a sum misses all of them.
#[test]
fn a_sum_during_a_drain_misses_at_most_the_value_in_the_callback() {
    let sched = Scheduler::manual();
    let ids = IdSpace::builder()
        .scan_period(MIN_SCAN_PERIOD)
        .build(&sched);
    let folded = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (in_tx, in_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let p: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, {
        let (folded, calls) = (folded.clone(), calls.clone());
        move |n: &mut u64| {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                in_tx.send(()).unwrap();
                go_rx.lock().unwrap().recv().unwrap();
            }
            folded.fetch_add(*n, Ordering::SeqCst);
        }
    }));
    const N: u64 = 8;
    let bar = Arc::new(std::sync::Barrier::new(N as usize));
    let hs: Vec<_> = (0..N)
        .map(|_| {
            let (p, bar) = (p.clone(), bar.clone());
            std::thread::spawn(move || {
                p.with(|n| *n += 1);
                bar.wait(); // N distinct ids
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let drainer = {
        let sched = sched.clone();
        std::thread::spawn(move || {
            sched.advance(MIN_SCAN_PERIOD * 3);
        })
    };
    in_rx.recv().unwrap(); // the callback runs on the first value
    let mut sum = folded.load(Ordering::SeqCst);
    p.for_each(|n| sum += *n);
    go_tx.send(()).unwrap();
    drainer.join().unwrap();
    let mut after = folded.load(Ordering::SeqCst);
    p.for_each(|n| after += *n);
    assert_eq!(after, N);
    assert!(
        sum >= N - 1,
        "sum during the drain was {sum}: it missed {} values, only 1 is in the callback",
        N - sum
    );
}

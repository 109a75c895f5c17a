//! Exactly-once and no double count with readers that panic while visiting
//! queued values, two readers, the scheduler dropped mid-way and the PerCid dropped while
//! values are queued.

use crate::common;

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use nicework::{IdSpace, MIN_SCAN_PERIOD, PerCid, Scheduler};

struct Val {
    id: u64,
    n: AtomicU64,
    reclaimed: AtomicBool,
    dropped: Arc<AtomicUsize>,
    dropped_unreclaimed: Arc<AtomicUsize>,
}
impl Drop for Val {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
        if !self.reclaimed.load(Ordering::SeqCst) {
            self.dropped_unreclaimed.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn run(drop_sched_at: Option<usize>, panicky: bool) {
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::builder()
        .scan_period(MIN_SCAN_PERIOD)
        .build(&sched);
    let mut sched = Some(sched);
    let next = Arc::new(AtomicU64::new(1));
    let dropped = Arc::new(AtomicUsize::new(0));
    let dropped_unreclaimed = Arc::new(AtomicUsize::new(0));
    let reclaimed: Arc<Mutex<HashSet<u64>>> = Arc::new(Mutex::new(HashSet::new()));
    let folded = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicUsize::new(0));
    let p: Arc<PerCid<Val>> = Arc::new(PerCid::with_reclaim(
        &ids,
        {
            let (next, dropped) = (next.clone(), dropped.clone());
            let dropped_unreclaimed = dropped_unreclaimed.clone();
            move || Val {
                id: next.fetch_add(1, Ordering::SeqCst),
                n: AtomicU64::new(0),
                reclaimed: AtomicBool::new(false),
                dropped: dropped.clone(),
                dropped_unreclaimed: dropped_unreclaimed.clone(),
            }
        },
        {
            let (reclaimed, folded, bad) = (reclaimed.clone(), folded.clone(), bad.clone());
            move |v: &mut Val| {
                if !reclaimed.lock().unwrap().insert(v.id) {
                    bad.fetch_add(1, Ordering::SeqCst);
                }
                v.reclaimed.store(true, Ordering::SeqCst);
                folded.fetch_add(*v.n.get_mut(), Ordering::SeqCst);
            }
        },
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let visited_after = Arc::new(AtomicUsize::new(0));
    let double = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (p, stop, va, folded, double) = (
                p.clone(),
                stop.clone(),
                visited_after.clone(),
                folded.clone(),
                double.clone(),
            );
            std::thread::spawn(move || {
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let mut seen = HashSet::new();
                    let mut i = 0;
                    let _f = folded.load(Ordering::SeqCst);
                    let res = catch_unwind(AssertUnwindSafe(|| {
                        p.for_each(|v| {
                            i += 1;
                            if v.reclaimed.load(Ordering::SeqCst) {
                                va.fetch_add(1, Ordering::SeqCst);
                            }
                            if !seen.insert(v.id) {
                                double.fetch_add(1, Ordering::SeqCst);
                            }
                            if panicky && r == 0 && k % 7 == 0 && i == 3 {
                                panic!("reader panics mid-visit");
                            }
                        })
                    }));
                    let _ = res;
                }
            })
        })
        .collect();
    let mut increments = 0u64;
    for round in 0..150usize {
        if Some(round) == drop_sched_at {
            drop(sched.take());
        }
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        p.with(|v| *v.n.get_mut() += 1);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        increments += 20;
    }
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.join().unwrap();
    }
    if sched.is_some() {
        assert!(common::eventually(|| p.live() == 0));
    }
    let mut sum = folded.load(Ordering::SeqCst);
    p.for_each(|v| sum += v.n.load(Ordering::SeqCst));
    assert_eq!(sum, increments, "live + folded at quiescence");
    assert_eq!(
        visited_after.load(Ordering::SeqCst),
        0,
        "visited after on_reclaim"
    );
    assert_eq!(
        double.load(Ordering::SeqCst),
        0,
        "visited twice in one pass"
    );
    // Drop the PerCid (values may be queued: the drop passes them on): every value made is
    // reclaimed exactly once, or was still in a slot and dropped without the callback.
    let made = next.load(Ordering::SeqCst) - 1;
    drop(p);
    let rec = reclaimed.lock().unwrap().len() as u64;
    let in_slots = dropped_unreclaimed.load(Ordering::SeqCst) as u64;
    assert_eq!(bad.load(Ordering::SeqCst), 0, "on_reclaim twice");
    assert_eq!(
        dropped.load(Ordering::SeqCst) as u64,
        made,
        "every value dropped once"
    );
    assert_eq!(
        rec + in_slots,
        made,
        "reclaimed {rec} + in slots {in_slots} != made {made}"
    );
    assert!(
        folded.load(Ordering::SeqCst) <= increments,
        "folded more than was added"
    );
    drop(sched);
}

#[test]
fn mix_with_scheduler() {
    run(None, false);
}
#[test]
fn mix_with_scheduler_panicky_reader() {
    run(None, true);
}
#[test]
fn mix_scheduler_dropped_midway() {
    run(Some(60), true);
}
#[test]
fn mix_without_scheduler() {
    run(Some(0), true);
}

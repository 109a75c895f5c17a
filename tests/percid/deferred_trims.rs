//! Trims left to a reader, the reclaim queue, and the reader's U / re-flag step.
//!
//! A trim that finds a reader holding the gate is left to it: the reader detaches the
//! values into the reclaim queue (still visited by readers) and the compaction work passes
//! them to `on_reclaim`, never the reader's stack, which may be inside the `with` the
//! callback needs. Running the callbacks on the reader's stack would lose folds, and a
//! trim inside its own thread's callbacks would loop for ever.

use crate::common;

use std::panic::resume_unwind;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use common::EVENTUALLY;
use common::percid::finishes;
use nicework::{IdSpace, PerCid, Scheduler};

/// on_reclaim folds the reclaimed count into the reclaiming thread's own slot of the same
/// PerCid (a natural "keep the count" pattern). Once the scheduler is gone the trim runs in
/// the exit hook: the `with` takes a late-orphan id, whose release trims again. That nested
/// trim queued the new value for the outer drainer, which called on_reclaim again, for
/// ever; it now returns at once.
#[test]
fn on_reclaim_folding_into_its_own_percid_at_thread_exit_terminates() {
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::new(&sched);
    let calls = Arc::new(AtomicUsize::new(0));
    let me: Arc<OnceLock<Weak<PerCid<u64>>>> = Arc::new(OnceLock::new());
    let counters: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, {
        let me = me.clone();
        let calls = calls.clone();
        move |n: &mut u64| {
            if calls.fetch_add(1, Ordering::SeqCst) > 1_000_000 {
                return; // stop the spin so the process can go on
            }
            if let Some(p) = me.get().and_then(Weak::upgrade) {
                let v = std::mem::take(n);
                p.with(|mine| *mine += v);
            }
        }
    }));
    me.set(Arc::downgrade(&counters)).unwrap();
    // Main holds id 0 for the whole test.
    counters.with(|n| *n += 0);
    drop(sched);
    let c = counters.clone();
    finishes(
        "exit with on_reclaim folding into its own PerCid",
        move || {
            c.with(|n| *n += 7);
        },
    );
    let calls = calls.load(Ordering::SeqCst);
    assert!(
        calls <= 2,
        "on_reclaim ran {calls} times for one exiting thread (a spin)"
    );
}

/// The folding pattern of the existing tests (counters' on_reclaim folds into `totals.with`)
/// and a reader that sums counters into its own totals slot (`for_each` inside `with` on
/// another PerCid: documented as allowed). When a trim left to that reader ran its callbacks
/// at the end of its `for_each`, still inside `totals.with`, the callback's `totals.with`
/// panicked (re-entrant) and the reclaimed count was lost. Now the value waits in the queue,
/// visited by readers, until the compaction work's next run folds it.
#[test]
fn a_trim_left_to_a_reader_inside_with_keeps_the_value_visible_then_folds_it() {
    use std::time::Duration;
    let sched = Scheduler::manual();
    let ids = IdSpace::builder()
        .scan_period(nicework::MIN_SCAN_PERIOD)
        .build(&sched);
    let (total, totals, counters) = common::percid::fold_pair(&ids);
    totals.with(|_| {}); // main: id 0
    let c = counters.clone();
    std::thread::spawn(move || c.with(|n| *n += 7))
        .join()
        .unwrap(); // id 1, released
    let mut advanced = false;
    totals.with(|_mine| {
        counters.for_each(|_| {
            if !advanced {
                advanced = true;
                // The scan: counters' trim finds this reader holding the gate: deferred.
                sched.advance(Duration::from_millis(50));
            }
        });
    });
    // The value waits in the queue (visited by readers) for the compaction work.
    let mut sum = total.load(Ordering::SeqCst);
    counters.for_each(|n| sum += *n);
    totals.for_each(|n| sum += *n);
    assert_eq!(sum, 7, "a value queued by a deferred trim is still visited");
    // Its next run passes it on (here, outside any `with`): folded into `totals`.
    sched.advance(Duration::from_millis(50));
    assert_eq!(counters.live(), 0);
    let mut sum = total.load(Ordering::SeqCst);
    counters.for_each(|n| sum += *n);
    totals.for_each(|n| sum += *n);
    assert_eq!(
        sum, 7,
        "live + folded once the compaction work passed the value on"
    );
}

/// The same without any advance(): a threaded scheduler, a reader summing counters inside
/// its own totals slot in a loop, and threads that count once and exit.
#[test]
fn a_reader_inside_with_loses_no_fold_of_the_trims_left_to_it() {
    // The subject is the folds, and the scans run beside this spinning reader.
    let sched = common::normal_priority_builder().build().unwrap();
    let ids = IdSpace::builder()
        .scan_period(nicework::MIN_SCAN_PERIOD)
        .build(&sched);
    let (total, totals, counters) = common::percid::fold_pair(&ids);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (totals, counters, stop) = (totals.clone(), counters.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                totals.with(|_| counters.for_each(|_| {}));
            }
        })
    };
    const N: u64 = 200;
    for _ in 0..N {
        let c = counters.clone();
        std::thread::spawn(move || c.with(|n| *n += 1))
            .join()
            .unwrap();
    }
    // Quiescence: let the scans trim what the exited threads left.
    let ok = common::eventually(|| counters.live() <= 2);
    stop.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    assert!(ok, "counters never shrank");
    let sum = || {
        let mut sum = total.load(Ordering::SeqCst);
        counters.for_each(|n| sum += *n);
        totals.for_each(|n| sum += *n);
        sum
    };
    common::eventually(|| sum() == N);
    assert_eq!(sum(), N, "live + folded: increments lost to deferred trims");
    drop(sched);
}

/// Two readers in tight loops on the same PerCid (a deferred trim can be handed from one to
/// the other at every pass), threads that count and exit, after the scheduler is gone (the
/// exits trim) and with it: memory shrinks to what live threads hold and every increment is
/// live or folded, exactly once.
fn two_readers_in_loops(with_scheduler: bool) {
    // The subject is the folds, and the scans run beside these spinning readers.
    let sched = common::normal_priority_builder().build().unwrap();
    let ids = IdSpace::builder()
        .scan_period(nicework::MIN_SCAN_PERIOD)
        .build(&sched);
    let folded = Arc::new(AtomicU64::new(0));
    let reclaims = Arc::new(AtomicUsize::new(0));
    let other: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 0));
    let with_other = with_scheduler;
    let counters: Arc<PerCid<AtomicU64>> =
        Arc::new(PerCid::with_reclaim(&ids, || AtomicU64::new(0), {
            let folded = folded.clone();
            let reclaims = reclaims.clone();
            let other = other.clone();
            move |n: &mut AtomicU64| {
                folded.fetch_add(*n.get_mut(), Ordering::SeqCst);
                *n.get_mut() = 0;
                reclaims.fetch_add(1, Ordering::SeqCst);
                if with_other {
                    other.with(|o| *o += 1);
                }
            }
        }));
    // Without a scheduler, a reader thread that enters the space from on_reclaim would keep
    // its id (nothing revokes it) and pin the high water; only fold there.
    if !with_scheduler {
        drop(sched);
    } else {
        std::mem::forget(sched.clone());
        drop(sched);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (counters, stop) = (counters.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut passes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    counters.for_each(|n| {
                        let _ = n.load(Ordering::Relaxed);
                    });
                    passes += 1;
                }
                passes
            })
        })
        .collect();
    const ROUNDS: u64 = 50;
    const PER: u64 = 4;
    for _ in 0..ROUNDS {
        let hs: Vec<_> = (0..PER)
            .map(|_| {
                let c = counters.clone();
                std::thread::spawn(move || {
                    for _ in 0..10 {
                        c.with(|n| *n.get_mut() += 1);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
    // Readers still in their loops: their slots never existed (they only read). With a
    // scheduler the compaction work passes every value on meanwhile.
    let shrank = !with_scheduler || common::eventually(|| counters.live() == 0);
    let live_at = counters.live();
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.join().unwrap();
    }
    assert!(
        shrank,
        "live() stuck at {live_at} beside two readers in loops"
    );
    if !with_scheduler {
        // Without one, trims the readers were left wait in the queue (still visited) for
        // the next thread exit's trim.
        let mut sum = folded.load(Ordering::SeqCst);
        counters.for_each(|n| sum += n.load(Ordering::SeqCst));
        assert_eq!(sum, ROUNDS * PER * 10, "queued values are visited");
        let c = counters.clone();
        std::thread::spawn(move || c.with(|_| ())).join().unwrap();
        assert_eq!(
            counters.live(),
            0,
            "the next exit's trim passed the queue on"
        );
    }
    let mut sum = folded.load(Ordering::SeqCst);
    counters.for_each(|n| sum += n.load(Ordering::SeqCst));
    assert_eq!(sum, ROUNDS * PER * 10);
}

#[test]
fn two_readers_in_loops_without_scheduler() {
    two_readers_in_loops(false);
}

#[test]
fn two_readers_in_loops_with_scheduler() {
    two_readers_in_loops(true);
}

/// Exclusion under U and the re-flag: owners that hand a token around inside `with` (each
/// waits, inside its `with`, for the previous owner's `with`), so a reader meets borrowed
/// slots all the time, clears the later flags, waits, and flags them again; every `with`
/// marks itself inside and writes a pair non-atomically; the reader checks both.
#[test]
fn a_reader_never_sees_an_owner_inside_with_while_owners_meet_inside_with() {
    struct Pair {
        inside: AtomicBool,
        a: AtomicU64,
        b: AtomicU64,
    }
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::builder()
        .scan_period(nicework::MIN_SCAN_PERIOD)
        .build(&sched);
    let p: Arc<PerCid<Pair>> = Arc::new(PerCid::new(&ids, || Pair {
        inside: AtomicBool::new(false),
        a: AtomicU64::new(0),
        b: AtomicU64::new(0),
    }));
    const OWNERS: usize = 4;
    const ROUNDS: u64 = 3000;
    let token = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (p, stop, bad) = (p.clone(), stop.clone(), bad.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    p.for_each(|v| {
                        if v.inside.load(Ordering::SeqCst) {
                            bad.fetch_add(1, Ordering::SeqCst);
                        }
                        let a = v.a.load(Ordering::Relaxed);
                        std::hint::spin_loop();
                        let b = v.b.load(Ordering::Relaxed);
                        if a != b {
                            bad.fetch_add(1, Ordering::SeqCst);
                        }
                    });
                }
            })
        })
        .collect();
    let owners: Vec<_> = (0..OWNERS as u64)
        .map(|me| {
            let (p, token) = (p.clone(), token.clone());
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let turn = round * OWNERS as u64 + me;
                    p.with(|v| {
                        v.inside.store(true, Ordering::SeqCst);
                        let x = v.a.load(Ordering::Relaxed) + 1;
                        v.a.store(x, Ordering::Relaxed);
                        // Wait inside with for the previous owner's with (bounded).
                        let start = std::time::Instant::now();
                        while token.load(Ordering::SeqCst) != turn {
                            assert!(start.elapsed() < EVENTUALLY, "hang: token stuck");
                            std::thread::yield_now();
                        }
                        token.store(turn + 1, Ordering::SeqCst);
                        v.b.store(x, Ordering::Relaxed);
                        v.inside.store(false, Ordering::SeqCst);
                    });
                }
            })
        })
        .collect();
    let mut panicked = None;
    for o in owners {
        if let Err(e) = o.join() {
            panicked = Some(e);
        }
    }
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.join().unwrap();
    }
    if let Some(e) = panicked {
        resume_unwind(e);
    }
    assert_eq!(
        bad.load(Ordering::SeqCst),
        0,
        "reader saw an owner inside with"
    );
}

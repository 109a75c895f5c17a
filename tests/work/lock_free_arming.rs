//! Real schedulers (2 workers) under many threads arming, cancelling and touching: never
//! early, never lost, drop frees the closure. Waits are liveness bounds; nothing asserts a
//! duration.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use common::{Rng, drop_flag, eventually};
use nicework::{Next, Scheduler, Work};

fn sched() -> Scheduler {
    Scheduler::builder().workers(2).build().unwrap()
}

/// Whether `never_early`'s work `i` is a timeout.
fn is_timeout(i: usize) -> bool {
    i % 3 == 2
}

/// Nanoseconds since a common origin.
fn ns(origin: Instant) -> u64 {
    origin.elapsed().as_nanos() as u64
}

/// Each work has an owner thread that, per round, `cancel_sync`s it, records a lower bound
/// L = now + d, then arms it only with deadlines at or after L (reschedule/schedule with
/// delays >= d, touch whose period >= d), while other threads `cancel()` and `touch()` it.
/// Every run must start at or after L. Delays use the full clock (a few ms) or the coarse
/// clock (at least 100 coarse margins: 3.2 s on a 250 Hz kernel). A third of the works
/// are timeouts; half of them return `Again`, half `Park`.
fn never_early(coarse: bool, count: usize, rounds: usize) {
    let sched = sched();
    let origin = Instant::now();
    let bounds: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let early: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let runs = Arc::new(AtomicU64::new(0));
    let works: Arc<Vec<Work>> = Arc::new(
        (0..count)
            .map(|i| {
                let (bounds, early, runs) = (bounds.clone(), early.clone(), runs.clone());
                let f = move |_cx: &mut nicework::Ctx<'_>| {
                    let now = ns(origin);
                    let lb = bounds[i].load(SeqCst);
                    if now < lb {
                        early
                            .lock()
                            .unwrap()
                            .push(format!("work {i}: ran {} ns early", lb - now));
                    }
                    runs.fetch_add(1, SeqCst);
                    if i % 2 == 0 { Next::Again } else { Next::Park }
                };
                if is_timeout(i) {
                    let idle = if coarse {
                        Duration::from_millis(3500)
                    } else {
                        Duration::from_millis(2)
                    };
                    sched.timeout(idle, f)
                } else {
                    sched.work(f)
                }
            })
            .collect(),
    );
    if coarse {
        // Before any touch (which would hold a timeout back) and while every bound is 0,
        // so these runs check nothing: they only make each work one that has run.
        for (i, w) in works.iter().enumerate() {
            w.reschedule(Duration::ZERO);
            assert!(eventually(|| w.stats().runs > 0), "work {i} never ran");
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut noise = Vec::new();
    for t in 0..3 {
        let (works, stop) = (works.clone(), stop.clone());
        noise.push(std::thread::spawn(move || {
            let mut rng = Rng(0x1234 + t);
            while !stop.load(SeqCst) {
                let w = &works[(rng.next() % count as u64) as usize];
                if !coarse && rng.next() % 64 == 0 {
                    w.cancel();
                } else {
                    w.touch();
                }
                if rng.next() % 16 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }));
    }
    let mut owners = Vec::new();
    for i in 0..count {
        let (works, bounds) = (works.clone(), bounds.clone());
        owners.push(std::thread::spawn(move || {
            let mut rng = Rng(0x9E37 + i as u64);
            let w = &works[i];
            for _ in 0..rounds {
                w.cancel_sync();
                let base = if coarse {
                    3_300_000_000 + rng.next() % 400_000_000
                } else {
                    rng.next() % 3_000_000
                };
                let t0 = ns(origin);
                let timeout_idle = if coarse { 3_500_000_000 } else { 2_000_000 };
                // A timeout's touches arm it for touch + idle: the bound is the smaller.
                let lb = t0
                    + if is_timeout(i) {
                        base.min(timeout_idle)
                    } else {
                        base
                    };
                bounds[i].store(lb, SeqCst);
                for _ in 0..(rng.next() % 20) {
                    let d = Duration::from_nanos(base + rng.next() % 2_000_000);
                    match rng.next() % 3 {
                        0 => {
                            w.reschedule(d);
                        }
                        1 => {
                            w.schedule(d);
                        }
                        _ => {
                            w.touch();
                        }
                    }
                }
                if !coarse {
                    std::thread::sleep(Duration::from_micros(rng.next() % 3000));
                } else {
                    std::thread::sleep(Duration::from_millis(3800 + rng.next() % 500));
                }
            }
        }));
    }
    for o in owners {
        o.join().unwrap();
    }
    stop.store(true, SeqCst);
    for n in noise {
        n.join().unwrap();
    }
    let early = early.lock().unwrap();
    assert!(early.is_empty(), "early runs: {early:?}");
    assert!(runs.load(SeqCst) > 0, "nothing ran at all");
}

#[test]
fn never_early_under_concurrent_arming_full_clock() {
    never_early(false, 6, 2000);
}

#[test]
fn never_early_under_concurrent_arming_coarse_clock() {
    // A round waits about 4 s for its run, so the 18 trials are 18 works in one round (6
    // of them timeouts, as with 6 works and 3 rounds); each work has run once before it,
    // so the round's `cancel_sync` meets a work that ran, as a second round's would.
    never_early(true, 18, 1);
}

/// After a storm of reschedule/cancel/touch/schedule from many threads, every work that is
/// pending eventually runs, and a final arm always runs (no entry lost).
#[test]
fn pending_works_eventually_run_after_a_storm() {
    let sched = sched();
    const WORKS: usize = 16;
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..WORKS).map(|_| AtomicU64::new(0)).collect());
    let works: Arc<Vec<Work>> = Arc::new(
        (0..WORKS)
            .map(|i| {
                let counts = counts.clone();
                let f = move |_cx: &mut nicework::Ctx<'_>| {
                    counts[i].fetch_add(1, SeqCst);
                    match i % 4 {
                        0 => Next::Again,
                        1 => Next::Park,
                        2 => Next::Stop,
                        _ => Next::After(Duration::from_micros(300)),
                    }
                };
                if i % 5 == 4 {
                    sched.timeout(Duration::from_millis(1), f)
                } else {
                    sched.work(f)
                }
            })
            .collect(),
    );
    let mut threads = Vec::new();
    for t in 0..6u64 {
        let works = works.clone();
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng(77 + t * 1000);
            for _ in 0..200_000 {
                let w = &works[(rng.next() % WORKS as u64) as usize];
                let d = Duration::from_micros(rng.next() % 1500);
                match rng.next() % 6 {
                    0 => {
                        w.reschedule(d);
                    }
                    1 => {
                        w.schedule(d);
                    }
                    2 => {
                        w.cancel();
                    }
                    3 => {
                        w.touch();
                    }
                    4 => {
                        w.reschedule(Duration::from_secs(3600 - rng.next() % 60));
                    }
                    _ => {
                        w.reschedule(Duration::ZERO);
                    }
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    // Whatever is pending now has a deadline within an hour; the short ones must fire.
    for (i, w) in works.iter().enumerate() {
        let before = counts[i].load(SeqCst);
        w.reschedule(Duration::from_millis(1));
        assert!(
            eventually(|| counts[i].load(SeqCst) > before),
            "work {i}: armed with 1 ms but never ran (pending: {})",
            w.is_pending()
        );
    }
}

/// Alternating earlier/later reschedules racing the runs of a short work: after each
/// round the work ends armed (the last call was a reschedule) and runs.
#[test]
fn reschedule_racing_runs_never_loses_the_arm() {
    let sched = sched();
    for next in [Next::Again, Next::Park, Next::Stop] {
        let count = Arc::new(AtomicU64::new(0));
        let c = count.clone();
        let w = Arc::new(sched.work(move |_| {
            c.fetch_add(1, SeqCst);
            next
        }));
        let mut threads = Vec::new();
        for t in 0..4u64 {
            let w = w.clone();
            threads.push(std::thread::spawn(move || {
                let mut rng = Rng(5 + t);
                for k in 0..100_000u64 {
                    match (k + t) % 4 {
                        0 => {
                            w.reschedule(Duration::ZERO);
                        }
                        1 => {
                            w.reschedule(Duration::from_micros(rng.next() % 200));
                        }
                        2 => {
                            w.cancel();
                        }
                        _ => {
                            w.reschedule(Duration::from_secs(60));
                        }
                    }
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }
        // A run still in progress from the storm would rightly override the final arm
        // with its own `Stop`: end it first (nothing else arms the work now).
        w.cancel_sync();
        let before = count.load(SeqCst);
        w.reschedule(Duration::from_micros(100));
        assert!(
            eventually(|| count.load(SeqCst) > before),
            "{next:?}: armed but never ran"
        );
    }
}

/// Drop frees the closure before it returns, while other threads hammer other works.
#[test]
fn drop_frees_the_closure_while_others_reschedule() {
    let sched = sched();
    let others: Arc<Vec<Work>> = Arc::new((0..8).map(|_| sched.work(|_| Next::Again)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    // Two re-armers keep both workers and the core lock busy on a 2-core machine; more
    // only spin while the rounds wait for them.
    for t in 0..2u64 {
        let (others, stop) = (others.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng(3 + t);
            while !stop.load(SeqCst) {
                let w = &others[(rng.next() % 8) as usize];
                if rng.next() % 2 == 0 {
                    w.reschedule(Duration::from_micros(rng.next() % 500));
                } else {
                    w.cancel();
                }
            }
        }));
    }
    let mut rng = Rng(99);
    for k in 0..20_000u64 {
        let (flag, dropped) = drop_flag();
        let ran_after = Arc::new(AtomicBool::new(false));
        let r = ran_after.clone();
        let d2 = dropped.clone();
        let w = sched.work(move |_| {
            let _keep = &flag;
            if d2.load(SeqCst) {
                r.store(true, SeqCst);
            }
            Next::Again
        });
        w.reschedule(Duration::from_micros(rng.next() % 300));
        if k % 3 == 0 {
            std::thread::yield_now();
        }
        if k % 5 == 0 {
            w.reschedule(Duration::ZERO);
        }
        if k % 7 == 0 {
            let _ = w.cancel_sync();
            w.schedule(Duration::ZERO);
        }
        drop(w);
        assert!(
            dropped.load(SeqCst),
            "round {k}: drop returned before the closure was freed"
        );
        assert!(!ran_after.load(SeqCst));
    }
    stop.store(true, SeqCst);
    for t in threads {
        t.join().unwrap();
    }
}

/// cancel_sync: after it returns the callback never runs again, also racing reschedules
/// from the callback's own Again.
#[test]
fn cancel_sync_means_never_again() {
    let sched = sched();
    for k in 0..5000u64 {
        let cancelled = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(AtomicBool::new(false));
        let (c, b) = (cancelled.clone(), bad.clone());
        let w = sched.work(move |_| {
            if c.load(SeqCst) {
                b.store(true, SeqCst);
            }
            Next::After(Duration::ZERO)
        });
        w.reschedule(Duration::from_micros(k % 200));
        if k % 2 == 0 {
            std::thread::yield_now();
        }
        w.cancel_sync();
        cancelled.store(true, SeqCst);
        w.touch();
        std::thread::yield_now();
        assert!(
            !w.is_pending(),
            "round {k}: pending after cancel_sync + touch"
        );
        assert!(
            !bad.load(SeqCst),
            "round {k}: ran after cancel_sync returned"
        );
    }
}

/// A timeout_for object whose last Arc is dropped during its own run (the object is
/// dropped on the worker, with its Work inside): no deadlock, the object and closure go.
#[test]
fn timeout_for_object_dropped_during_its_own_run() {
    struct Conn {
        reaper: Work,
        _flag: common::DropFlag,
    }
    let sched = sched();
    for _ in 0..200 {
        let (flag, dropped) = drop_flag();
        let holder: Arc<Mutex<Option<Arc<Conn>>>> = Arc::new(Mutex::new(None));
        let h = holder.clone();
        let conn = Arc::new_cyclic(|me: &Weak<Conn>| Conn {
            reaper: sched.timeout_for(me, Duration::from_micros(200), move |_c: &Conn, _cx| {
                // Drop the only strong reference besides the upgrade held for this run.
                h.lock().unwrap().take();
                Next::Again
            }),
            _flag: flag,
        });
        conn.reaper.touch();
        *holder.lock().unwrap() = Some(conn);
        assert!(
            eventually(|| dropped.load(SeqCst)),
            "the object was never dropped"
        );
    }
}

/// Drop from inside the own callback while other threads touch it through a clone of
/// the Arc that holds it.
#[test]
fn drop_from_inside_own_callback() {
    let sched = sched();
    for _ in 0..500 {
        let (flag, dropped) = drop_flag();
        let slot: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
        let s = slot.clone();
        let w = sched.work(move |_| {
            let _keep = &flag;
            let me = s.lock().unwrap().take();
            drop(me);
            Next::Again
        });
        w.schedule(Duration::ZERO);
        *slot.lock().unwrap() = Some(w);
        assert!(eventually(|| dropped.load(SeqCst)), "closure never freed");
    }
}

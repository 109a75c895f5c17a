//! `for_each`'s promise: a sum of the slots plus what `on_reclaim` folded misses nothing
//! but the value the callback is being called with at that moment.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};

use nicework::{IdSpace, PerCid, Scheduler};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A manual scheduler and two readers summing in loops, checked only on passes during
/// which no `advance()` ran: no trim's drain and no `on_reclaim` call runs anywhere during
/// those passes. The only library code moving values then is a reader's `DeferredTrim`.
/// It used to let go of the gate before queueing the values it detached, and the other
/// reader's passes in between missed them (about 1,100 passes in a row, in every run).
#[test]
fn a_sum_while_nothing_drains_misses_nothing_beside_a_trim_left_to_a_reader() {
    let sched = Scheduler::manual();
    let ids = IdSpace::builder()
        .scan_period(nicework::MIN_SCAN_PERIOD)
        .build(&sched);
    let folded = Arc::new(AtomicU64::new(0));
    let p: Arc<PerCid<AtomicU64>> = Arc::new(PerCid::with_reclaim(&ids, || AtomicU64::new(0), {
        let folded = folded.clone();
        move |n: &mut AtomicU64| {
            folded.fetch_add(*n.get_mut(), SeqCst);
        }
    }));
    let adv_started = Arc::new(AtomicU64::new(0));
    let adv_done = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicUsize::new(0));
    let misses = Arc::new(std::sync::Mutex::new(Vec::new()));
    let readers: Vec<_> = (0..env("PERCID_SUM_READERS", 2))
        .map(|_| {
            let (p, folded, s, a, done, stop, checked, misses) = (
                p.clone(),
                folded.clone(),
                adv_started.clone(),
                adv_done.clone(),
                done.clone(),
                stop.clone(),
                checked.clone(),
                misses.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(SeqCst) {
                    let d0 = done.load(SeqCst);
                    let a0 = a.load(SeqCst);
                    let s0 = s.load(SeqCst);
                    let f = folded.load(SeqCst);
                    let mut sum = 0;
                    p.for_each(|n| sum += n.load(SeqCst));
                    let s1 = s.load(SeqCst);
                    if a0 == s0 && s1 == s0 {
                        checked.fetch_add(1, SeqCst);
                        if sum + f < d0 {
                            misses.lock().unwrap().push((d0, sum, f));
                            if env("PERCID_SUM_DIAG", 0) == 1 {
                                let t = std::time::Instant::now();
                                let mut k = 0;
                                loop {
                                    k += 1;
                                    let f = folded.load(SeqCst);
                                    let mut sum = 0;
                                    p.for_each(|n| sum += n.load(SeqCst));
                                    if sum + f >= d0 || k > 100000 {
                                        eprintln!(
                                            "diag: recovered after {k} passes, {:?}, adv {} -> {}",
                                            t.elapsed(),
                                            s0,
                                            s.load(SeqCst)
                                        );
                                        break;
                                    }
                                }
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let rounds = env("PERCID_SUM_ROUNDS", 3000);
    for _ in 0..rounds {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (p, done) = (p.clone(), done.clone());
                std::thread::spawn(move || {
                    p.with(|n| *n.get_mut() += 1);
                    done.fetch_add(1, SeqCst);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        adv_started.fetch_add(1, SeqCst);
        sched.advance(std::time::Duration::from_millis(50));
        adv_done.fetch_add(1, SeqCst);
        std::thread::sleep(std::time::Duration::from_micros(200));
        if !misses.lock().unwrap().is_empty() {
            break;
        }
    }
    stop.store(true, SeqCst);
    for r in readers {
        r.join().unwrap();
    }
    let misses = misses.lock().unwrap().clone();
    eprintln!(
        "checked passes={} misses={} first={:?}",
        checked.load(SeqCst),
        misses.len(),
        misses.first()
    );
    assert!(
        misses.is_empty(),
        "a pass during which no trim or on_reclaim ran missed values: (done before, sum, folded) = {:?}",
        misses.first()
    );
}

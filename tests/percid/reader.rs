//! `PerCid::for_each` beside owners and trims: it never sees a
//! slot while its owner holds the `&mut T`, a trimmed slot goes to `on_reclaim` exactly
//! once and is never visited after, and live plus folded is every increment while threads
//! come and go. Misuse on one thread panics with a message instead of deadlocking.

use crate::common;

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use common::eventually;
use nicework::{IdSpace, MIN_SCAN_PERIOD, PerCid, Scheduler};

const SCAN: Duration = Duration::from_millis(100);

/// Two halves an owner keeps equal, but writes one after the other with plain stores
/// through `&mut`: a reader that overlapped a `with` would see them differ.
#[derive(Default)]
struct Torn {
    first: AtomicU64,
    second: AtomicU64,
}

#[test]
fn for_each_never_sees_a_slot_its_owner_is_writing() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let slots: PerCid<Torn> = PerCid::new(&ids, Torn::default);
    let stop = AtomicBool::new(false);
    let (visits, torn) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    slots.with(|slot| {
                        *slot.first.get_mut() += 1;
                        // Widen the window between the two halves.
                        for _ in 0..50 {
                            std::hint::spin_loop();
                        }
                        *slot.second.get_mut() += 1;
                    });
                }
            });
        }
        s.spawn(|| {
            for _ in 0..2_000 {
                slots.for_each(|slot| {
                    visits.fetch_add(1, Ordering::Relaxed);
                    let first = slot.first.load(Ordering::Relaxed);
                    // Give a writer that wrongly got in the time to move on.
                    for _ in 0..50 {
                        std::hint::spin_loop();
                    }
                    if first != slot.second.load(Ordering::Relaxed)
                        || first != slot.first.load(Ordering::Relaxed)
                    {
                        torn.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    assert!(visits.load(Ordering::Relaxed) >= 2_000);
    assert_eq!(
        torn.load(Ordering::Relaxed),
        0,
        "a visit overlapped a `with`"
    );
}

/// Live plus folded equals every increment: owners on threads that come and go, a reader
/// summing all the time, and trims of a real scheduler (at the shortest scan period).
#[test]
fn live_plus_folded_is_every_increment_while_threads_come_and_go() {
    // The subject is the sum, and the scan runs beside this spinning reader.
    let sched = common::normal_priority_builder().build().unwrap();
    let ids = Arc::new(
        IdSpace::builder()
            .scan_period(MIN_SCAN_PERIOD)
            .build(&sched),
    );
    let folded = Arc::new(AtomicU64::new(0));
    let reclaims = Arc::new(AtomicUsize::new(0));
    let counters = Arc::new(PerCid::with_reclaim(&ids, || AtomicU64::new(0), {
        let (folded, reclaims) = (folded.clone(), reclaims.clone());
        move |slot: &mut AtomicU64| {
            folded.fetch_add(*slot.get_mut(), Ordering::SeqCst);
            reclaims.fetch_add(1, Ordering::SeqCst);
        }
    }));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (counters, done) = (counters.clone(), done.clone());
        std::thread::spawn(move || {
            let mut sums = 0u64;
            while !done.load(Ordering::Relaxed) {
                let mut live = 0;
                counters.for_each(|n| live += n.load(Ordering::Relaxed));
                sums += 1;
                std::hint::black_box(live);
            }
            sums
        })
    };
    let mut expected = 0u64;
    for wave in 0..12u64 {
        let width = 1 + (wave * 5) % 9;
        // Real threads, joined: a join waits for the thread-exit hook that releases ids.
        let threads: Vec<_> = (0..width)
            .map(|t| {
                let counters = counters.clone();
                std::thread::spawn(move || {
                    for _ in 0..(500 + t * 37) {
                        counters.with(|n| *n.get_mut() += 1);
                    }
                })
            })
            .collect();
        expected += (0..width).map(|t| 500 + t * 37).sum::<u64>();
        for thread in threads {
            thread.join().unwrap();
        }
        // Let the scan trim some waves and not others.
        if wave % 3 == 0 {
            assert!(eventually(|| ids.high_water() == 0 && counters.live() == 0));
        }
    }
    done.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    let mut live = 0;
    counters.for_each(|n| live += n.load(Ordering::Relaxed));
    assert_eq!(live + folded.load(Ordering::SeqCst), expected);
    assert!(reclaims.load(Ordering::SeqCst) > 0, "no trim ran");
}

#[test]
fn a_trimmed_slot_is_reclaimed_once_and_never_visited_again() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let reclaimed = Arc::new(Mutex::new(Vec::new()));
    let next_token = Arc::new(AtomicU64::new(1));
    let tokens: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(
        &ids,
        {
            let next_token = next_token.clone();
            move || next_token.fetch_add(1, Ordering::SeqCst)
        },
        {
            let reclaimed = reclaimed.clone();
            move |token: &mut u64| reclaimed.lock().unwrap().push(*token)
        },
    ));
    let _main = ids.enter();
    tokens.with(|_| ());
    let all_in = Arc::new(Barrier::new(6));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let (tokens, all_in) = (tokens.clone(), all_in.clone());
            std::thread::spawn(move || {
                tokens.with(|_| ());
                all_in.wait();
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let mut before = Vec::new();
    tokens.for_each(|token| before.push(*token));
    assert_eq!(before.len(), 7);
    sched.advance(SCAN);
    let reclaimed = reclaimed.lock().unwrap().clone();
    let unique: HashSet<u64> = reclaimed.iter().copied().collect();
    assert_eq!((reclaimed.len(), unique.len()), (6, 6), "each once");
    let mut after = Vec::new();
    tokens.for_each(|token| after.push(*token));
    assert_eq!(
        after,
        vec![before[0]],
        "only the main thread's slot is left"
    );
    assert!(after.iter().all(|token| !unique.contains(token)));
}

#[test]
fn with_on_its_own_flagged_slot_inside_for_each_works() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    let (held, release) = (Barrier::new(2), Barrier::new(2));
    std::thread::scope(|s| {
        // A helper keeps id 0 (slot 0 = 10) while the main thread reads.
        s.spawn(|| {
            let _pin = ids.enter();
            counters.with(|n| *n.get_mut() = 10);
            held.wait();
            release.wait();
        });
        held.wait();
        counters.with(|_| ()); // the main thread's slot 1, flagged by its own for_each
        let mut seen = Vec::new();
        counters.for_each(|n| {
            let value = n.load(Ordering::Relaxed);
            seen.push(value);
            if value == 10 {
                // Visiting slot 0; its own slot 1 is flagged, not visited: this works.
                counters.with(|mine| *mine.get_mut() += 1);
            }
        });
        assert_eq!(seen, vec![10, 1]);
        release.wait();
    });
}

#[test]
fn for_each_inside_with_on_the_same_percid_panics_with_a_message() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    let result = catch_unwind(AssertUnwindSafe(|| {
        counters.with(|_| counters.for_each(|_| ()));
    }));
    let message = panic_text(result.unwrap_err());
    assert!(message.contains("from inside `with`"), "{message}");
    // Nothing is left borrowed or flagged: both still work.
    counters.with(|n| *n.get_mut() += 1);
    let mut sum = 0;
    counters.for_each(|n| sum += n.load(Ordering::Relaxed));
    assert_eq!(sum, 1);
}

#[test]
fn with_on_the_slot_being_visited_panics_with_a_message() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    counters.with(|n| *n.get_mut() = 3);
    let result = catch_unwind(AssertUnwindSafe(|| {
        counters.for_each(|_| counters.with(|_| ()));
    }));
    let message = panic_text(result.unwrap_err());
    assert!(message.contains("is visiting"), "{message}");
    assert_eq!(counters.with(|n| *n.get_mut()), 3);
}

#[test]
fn for_each_inside_for_each_panics_with_a_message() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    counters.with(|_| ());
    let result = catch_unwind(AssertUnwindSafe(|| {
        counters.for_each(|_| counters.for_each(|_| ()));
    }));
    let message = panic_text(result.unwrap_err());
    assert!(message.contains("inside a for_each callback"), "{message}");
    let mut visits = 0;
    counters.for_each(|_| visits += 1);
    assert_eq!(visits, 1);
}

#[test]
fn for_each_inside_on_reclaim_works_and_skips_the_slot_being_reclaimed() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let counters: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 0));
    // What each on_reclaim call saw: the slot's value and the values for_each visited.
    let seen = Arc::new(Mutex::new(Vec::new()));
    {
        let (weak, seen) = (Arc::downgrade(&counters), seen.clone());
        counters.on_reclaim(move |slot| {
            let counters = weak.upgrade().unwrap();
            let mut visited = Vec::new();
            counters.for_each(|n| visited.push(*n));
            seen.lock().unwrap().push((*slot, visited));
        });
    }
    // Id 0 stays held by this thread (value 7); id 1's owner exits (value 5).
    let _held = ids.enter();
    counters.with(|n| *n = 7);
    {
        let counters = counters.clone();
        let ids = ids.clone();
        std::thread::spawn(move || {
            let cid = ids.enter();
            assert_eq!(cid.get(), 1);
            counters.with(|n| *n = 5);
        })
        .join()
        .unwrap();
    }
    sched.advance(SCAN);
    let seen = seen.lock().unwrap();
    assert_eq!(
        *seen,
        vec![(5, vec![7])],
        "one slot reclaimed, and the reader inside on_reclaim saw only the live one"
    );
    assert_eq!(counters.live(), 1);
}

#[test]
fn a_panicking_visit_releases_the_owner_waiting_for_it() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    let (created, visiting) = (Barrier::new(2), Barrier::new(2));
    let owner_started = AtomicBool::new(false);
    std::thread::scope(|s| {
        let owner = s.spawn(|| {
            counters.with(|_| ());
            created.wait();
            visiting.wait();
            owner_started.store(true, Ordering::SeqCst);
            // Its slot is being visited: this waits for the visit, which panics.
            counters.with(|n| *n.get_mut() += 1);
        });
        created.wait();
        let result = catch_unwind(AssertUnwindSafe(|| {
            counters.for_each(|_| {
                visiting.wait();
                assert!(eventually(|| owner_started.load(Ordering::SeqCst)));
                std::thread::sleep(Duration::from_millis(5));
                panic!("the visit fails");
            });
        }));
        assert!(result.is_err());
        owner.join().unwrap();
    });
    let mut sum = 0;
    counters.for_each(|n| sum += n.load(Ordering::Relaxed));
    assert_eq!(sum, 1);
}

#[test]
fn a_reader_in_a_loop_does_not_starve_the_trim() {
    let sched = Scheduler::new().unwrap();
    let ids = Arc::new(
        IdSpace::builder()
            .scan_period(MIN_SCAN_PERIOD)
            .build(&sched),
    );
    let counters: Arc<PerCid<AtomicU64>> = Arc::new(PerCid::new(&ids, || AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (counters, stop) = (counters.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                counters.for_each(|_| std::thread::yield_now());
            }
        })
    };
    for _ in 0..8 {
        let counters = counters.clone();
        std::thread::spawn(move || counters.with(|n| *n.get_mut() += 1))
            .join()
            .unwrap();
    }
    assert!(
        eventually(|| counters.live() == 0),
        "the trim never got the gate"
    );
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
}

#[test]
fn a_zero_scan_period_is_raised_to_the_minimum() {
    let sched = Scheduler::manual();
    let ids = IdSpace::builder().scan_period(Duration::ZERO).build(&sched);
    let _cid = ids.enter();
    sched.advance(Duration::from_millis(500));
    let runs = ids.compaction_stats().runs;
    let most = (Duration::from_millis(500).as_nanos() / MIN_SCAN_PERIOD.as_nanos()) as u64;
    assert!(runs > 0 && runs <= most, "{runs} scans in 500 ms");
}

/// Once the scheduler is gone nothing scans, but the slots of threads that exit are still
/// trimmed (and their values reclaimed) at their exit.
#[test]
fn without_a_scheduler_slots_are_trimmed_at_thread_exit() {
    let sched = Scheduler::new().unwrap();
    let ids = Arc::new(IdSpace::new(&sched));
    let folded = Arc::new(AtomicU64::new(0));
    let counters: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, {
        let folded = folded.clone();
        move |n: &mut u64| {
            folded.fetch_add(*n, Ordering::SeqCst);
        }
    }));
    drop(sched);
    for round in 0..20u64 {
        let all_in = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (counters, all_in) = (counters.clone(), all_in.clone());
                std::thread::spawn(move || {
                    counters.with(|n| *n += round);
                    all_in.wait();
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(
            counters.live(),
            0,
            "round {round}: slots left after every exit"
        );
    }
    assert_eq!(folded.load(Ordering::SeqCst), 8 * (0..20).sum::<u64>());
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

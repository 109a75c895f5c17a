//! `PerCid::take` and `put`: the calling thread's slot as a one-value cache. No `init`
//! call, `put` refusing a full slot, no panic where `with` would panic (inside `with`, a
//! `SlotGuard`, a `for_each` callback on the thread's own slot), `live()` following the
//! values in and out, values that outlive the thread that took them, and, against readers
//! and trims while threads come and go, every value accounted for exactly once.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use nicework::{IdSpace, MIN_SCAN_PERIOD, PerCid, Scheduler};

use crate::common::percid::{Owner, finishes};
use crate::common::{eventually, normal_priority_builder};

const SCAN: Duration = Duration::from_millis(100);

#[test]
fn take_never_calls_init_and_put_refuses_a_full_slot() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let inits = Arc::new(AtomicUsize::new(0));
    let pool: PerCid<String> = PerCid::new(&ids, {
        let inits = inits.clone();
        move || {
            inits.fetch_add(1, Ordering::Relaxed);
            String::from("made by init")
        }
    });
    assert_eq!(pool.take(), None);
    assert_eq!(pool.live(), 0);
    assert_eq!(pool.put("a".into()), Ok(()));
    assert_eq!(pool.live(), 1);
    assert_eq!(pool.put("b".into()), Err("b".into()));
    assert_eq!(pool.take().as_deref(), Some("a"));
    assert_eq!(pool.take(), None);
    assert_eq!(pool.live(), 0);
    assert_eq!(inits.load(Ordering::Relaxed), 0);
    // `with` on an emptied slot makes a value with `init`; `take` then returns it.
    pool.with(|value| value.push('!'));
    assert_eq!(inits.load(Ordering::Relaxed), 1);
    assert_eq!(pool.take().as_deref(), Some("made by init!"));
}

#[test]
fn take_and_put_inside_with_or_a_guard_on_the_same_slot_refuse_without_panicking() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let pool: PerCid<u64> = PerCid::new(&ids, || 7);
    pool.with(|value| {
        assert_eq!(pool.take(), None);
        assert_eq!(pool.put(1), Err(1));
        assert!(pool.try_borrow().is_none());
        *value += 1;
    });
    {
        let mut guard = pool.try_borrow().expect("not borrowed");
        assert_eq!(pool.take(), None);
        assert_eq!(pool.put(2), Err(2));
        assert!(pool.try_borrow().is_none());
        *guard += 1;
    }
    assert_eq!(pool.take(), Some(9));
    // Another PerCid of the same space, nested: its slot is not borrowed.
    let other: PerCid<u64> = PerCid::new(&ids, || 0);
    pool.with(|_| {
        assert_eq!(other.put(3), Ok(()));
        assert_eq!(other.take(), Some(3));
    });
    // That `with` found the slot empty and made a value with `init`.
    assert_eq!(pool.take(), Some(7));
    // And under a plain `Cid` of the space (a nested pin, not a borrow).
    let cid = ids.enter();
    assert_eq!(pool.put(4), Ok(()));
    assert_eq!(pool.take(), Some(4));
    drop(cid);
}

#[test]
fn inside_for_each_on_the_visited_own_slot_they_refuse_and_elsewhere_they_work() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let pool: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 0));
    // Another thread's slot, visited first or after this thread's.
    let other = Owner::start();
    other.run({
        let pool = pool.clone();
        move || pool.put(100).unwrap()
    });
    pool.put(1).unwrap();
    let mut visits = 0;
    let mut own_visits = 0;
    pool.for_each(|value| {
        visits += 1;
        if *value == 1 {
            own_visits += 1;
            // The callback holds `&` to this very value: no panic, no change.
            assert_eq!(pool.take(), None);
            assert_eq!(pool.put(5), Err(5));
            assert!(pool.try_borrow().is_none());
        }
    });
    assert_eq!((visits, own_visits), (2, 1));
    assert_eq!(pool.take(), Some(1));
    // Emptied, this thread's slot (id 1) is only flagged, not visited, while the callback
    // visits the other thread's (id 0): `put` and `take` work there, and the pass then
    // visits the value put.
    let mut visited = Vec::new();
    pool.for_each(|value| {
        visited.push(*value);
        if *value == 100 {
            assert_eq!(pool.put(6), Ok(()));
            assert_eq!(pool.take(), Some(6));
            assert_eq!(pool.put(6), Ok(()));
        }
    });
    assert_eq!(visited, [100, 6]);
    assert_eq!(pool.live(), 2);
    other.exit();
}

#[test]
fn a_taken_value_outlives_its_thread_and_is_reclaimed_once_from_the_slot_it_is_put_in() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let reclaimed = Arc::new(AtomicU64::new(0));
    let pool: Arc<PerCid<Vec<u64>>> = Arc::new(PerCid::with_reclaim(&ids, Vec::new, {
        let reclaimed = reclaimed.clone();
        move |value: &mut Vec<u64>| {
            reclaimed.fetch_add(value.iter().sum(), Ordering::SeqCst);
        }
    }));
    let taken = finishes("a thread that takes its value and exits", {
        let pool = pool.clone();
        move || {
            pool.put(vec![1, 2, 3]).unwrap();
            pool.take().unwrap()
        }
    });
    // The thread is gone and so is its id; the value is the caller's.
    assert_eq!(pool.live(), 0);
    assert_eq!(taken, vec![1, 2, 3]);
    sched.advance(SCAN);
    assert_eq!(reclaimed.load(Ordering::SeqCst), 0);
    // Put on another thread that then goes idle: the scan revokes its id, and the trim
    // passes the value to `on_reclaim`, once.
    let other = Owner::start();
    other.run({
        let pool = pool.clone();
        move || pool.put(taken).unwrap()
    });
    let mut seen = 0;
    pool.for_each(|value| seen += value.iter().sum::<u64>());
    assert_eq!(seen, 6);
    for _ in 0..4 {
        sched.advance(SCAN);
    }
    assert_eq!(ids.high_water(), 0);
    assert_eq!(reclaimed.load(Ordering::SeqCst), 6);
    assert_eq!(pool.live(), 0);
    other.exit();
    sched.advance(SCAN);
    assert_eq!(reclaimed.load(Ordering::SeqCst), 6);
}

/// A counter that knows whether a thread is using it out of its slot.
#[derive(Default)]
struct Counter {
    count: AtomicU64,
    out: AtomicBool,
}

/// Threads come and go, each getting its counter with `take` (or a new one), counting, and
/// giving it back with `put` (dropping it, folded, when the slot is full); a reader sums
/// the slots meanwhile and the scan trims. Every count ends in exactly one place: a slot,
/// the reclaim callback's total, or the drop total. A reader never sees a counter that a
/// thread has taken out.
#[test]
fn against_readers_and_trims_every_count_ends_in_exactly_one_place() {
    let sched = normal_priority_builder().build().unwrap();
    let ids = IdSpace::builder()
        .scan_period(MIN_SCAN_PERIOD)
        .build(&sched);
    let folded = Arc::new(AtomicU64::new(0));
    let pool: Arc<PerCid<Box<Counter>>> =
        Arc::new(PerCid::with_reclaim(&ids, Box::<Counter>::default, {
            let folded = folded.clone();
            move |counter: &mut Box<Counter>| {
                folded.fetch_add(*counter.count.get_mut(), Ordering::SeqCst);
            }
        }));
    let dropped = Arc::new(AtomicU64::new(0));
    let seen_out = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = std::thread::spawn({
        let (pool, seen_out, stop) = (pool.clone(), seen_out.clone(), stop.clone());
        move || {
            let mut passes = 0u64;
            while !stop.load(Ordering::Relaxed) || passes == 0 {
                pool.for_each(|counter| {
                    if counter.out.load(Ordering::SeqCst) {
                        seen_out.fetch_add(1, Ordering::Relaxed);
                    }
                });
                passes += 1;
            }
            passes
        }
    });
    let mut expected = 0u64;
    for wave in 0..crate::common::rounds(8) {
        let width = 1 + wave % 5;
        let start = Arc::new(Barrier::new(width));
        let threads: Vec<_> = (0..width)
            .map(|t| {
                let (pool, dropped, start) = (pool.clone(), dropped.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..(300 + t * 17) {
                        let counter = pool.take().unwrap_or_default();
                        counter.out.store(true, Ordering::SeqCst);
                        counter.count.fetch_add(1, Ordering::Relaxed);
                        if i % 50 == 0 {
                            std::thread::yield_now();
                        }
                        counter.out.store(false, Ordering::SeqCst);
                        if let Err(counter) = pool.put(counter) {
                            dropped
                                .fetch_add(counter.count.load(Ordering::Relaxed), Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        expected += (0..width as u64).map(|t| 300 + t * 17).sum::<u64>();
        for thread in threads {
            thread.join().unwrap();
        }
        if wave % 3 == 2 {
            // Every thread of the wave is gone: the scan trims every slot.
            assert!(eventually(|| pool.live() == 0), "live {}", pool.live());
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    assert_eq!(seen_out.load(Ordering::Relaxed), 0);
    let mut in_slots = 0;
    pool.for_each(|counter| in_slots += counter.count.load(Ordering::Relaxed));
    assert!(eventually(|| {
        let mut in_slots_now = 0;
        pool.for_each(|counter| in_slots_now += counter.count.load(Ordering::Relaxed));
        in_slots = in_slots_now;
        in_slots + folded.load(Ordering::SeqCst) + dropped.load(Ordering::SeqCst) == expected
    }));
    assert_eq!(
        in_slots + folded.load(Ordering::SeqCst) + dropped.load(Ordering::SeqCst),
        expected
    );
}

#[test]
fn a_panic_between_take_and_put_loses_the_value_and_nothing_else() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let pool: PerCid<u64> = PerCid::new(&ids, || 0);
    pool.put(1).unwrap();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let value = pool.take().unwrap();
        if value == 1 {
            panic!("planted: a panic while the value is out");
        }
        pool.put(value)
    }));
    assert!(result.is_err());
    assert_eq!(pool.live(), 0);
    assert_eq!(pool.take(), None);
    assert_eq!(pool.put(2), Ok(()));
    assert_eq!(pool.with(|value| *value), 2);
}

//! The owner's slot cache (`src/cid/slots.rs`): `with` finds its slot without the bucket
//! lookup, from a two-entry cache in the thread's record. These pin the cases where a
//! cached slot would be the wrong one: the thread's id reclaimed and its array trimmed
//! (and the id handed to another thread), the thread moved down to another id, a
//! `PerCid` made where a dropped one was, and two `PerCid`s of one space used in turn and
//! nested. Each checks values, which a stale slot would mix up (or read from freed
//! memory). And a panic on each of `with`'s paths (the straight line's closure, a first
//! value's `init`, a nested `with` on the same `PerCid`) leaves the slot unborrowed and
//! the thread unpinned: the cold paths take the borrow and the guard over, and must drop
//! both.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nicework::{IdSpace, PerCid, Scheduler};

use crate::common::percid::Owner;

const SCAN: Duration = Duration::from_millis(100);

/// `with` adding `n` and returning the value it found.
fn add(counters: &Arc<PerCid<u64>>, n: u64) -> impl FnOnce() -> u64 + Send + 'static {
    let counters = counters.clone();
    move || {
        counters.with(|count| {
            let found = *count;
            *count += n;
            found
        })
    }
}

fn sum(counters: &PerCid<u64>) -> u64 {
    let mut sum = 0;
    counters.for_each(|count| sum += *count);
    sum
}

#[test]
fn a_with_after_the_id_was_reclaimed_and_trimmed_gets_a_fresh_slot() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let folded = Arc::new(AtomicU64::new(0));
    let counters = {
        let folded = folded.clone();
        Arc::new(PerCid::with_reclaim(
            &ids,
            || 0u64,
            move |n: &mut u64| {
                folded.fetch_add(*n, Ordering::SeqCst);
            },
        ))
    };
    let (first, second) = (Owner::start(), Owner::start());
    let found = Arc::new(Mutex::new(Vec::new()));
    let record = |step: Box<dyn FnOnce() -> u64 + Send>| {
        let found = found.clone();
        move || found.lock().unwrap().push(step())
    };
    // `first` takes id 0 and caches its slot, twice, so the second `with` used the cache.
    first.run(record(Box::new(add(&counters, 1))));
    first.run(record(Box::new(add(&counters, 1))));
    // Idle for two scans: its id is revoked and freed, and the slot's value and array are
    // trimmed (the high water is 0).
    sched.advance(SCAN);
    sched.advance(SCAN);
    assert_eq!(ids.held(), 0);
    assert_eq!(folded.load(Ordering::SeqCst), 2);
    assert_eq!(counters.live(), 0);
    // `second` takes id 0 now, in a freshly linked array.
    second.run(record(Box::new(add(&counters, 10))));
    // `first` must not use its cached slot (freed, or now `second`'s): it takes id 1.
    first.run(record(Box::new(add(&counters, 100))));
    second.run(record(Box::new(add(&counters, 10))));
    first.run(record(Box::new(add(&counters, 100))));
    assert_eq!(*found.lock().unwrap(), vec![0, 1, 0, 0, 10, 100]);
    assert_eq!(sum(&counters), 220);
    assert_eq!(ids.held(), 2);
    drop((first, second));
}

#[test]
fn a_thread_that_moved_down_uses_the_slot_of_its_new_id() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counters = Arc::new(PerCid::new(&ids, || 0u64));
    let (low, high) = (Owner::start(), Owner::start());
    let found = Arc::new(Mutex::new(Vec::new()));
    let record = |step: Box<dyn FnOnce() -> u64 + Send>| {
        let found = found.clone();
        move || found.lock().unwrap().push(step())
    };
    low.run(record(Box::new(add(&counters, 1))));
    // `high` takes id 1 and caches that slot.
    high.run(record(Box::new(add(&counters, 10))));
    high.run(record(Box::new(add(&counters, 10))));
    // `low` exits: one id held, so `high` moves down to id 0 at its next `enter()`, whose
    // slot still holds what `low` left there.
    low.exit();
    assert_eq!(ids.held(), 1);
    high.run(record(Box::new(add(&counters, 100))));
    high.run(record(Box::new(add(&counters, 100))));
    assert_eq!(*found.lock().unwrap(), vec![0, 0, 10, 1, 101]);
    assert_eq!(ids.high_water(), 1);
    // Id 1's slot keeps its 20 until a trim; the thread's own slot is id 0's.
    assert_eq!(sum(&counters), 201 + 20);
    sched.advance(SCAN);
    assert_eq!(sum(&counters), 201);
}

#[test]
fn a_percid_made_where_a_dropped_one_was_does_not_use_its_cached_slot() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    for round in 0..64u64 {
        // The allocator tends to give a new storage the memory of the one dropped just
        // before, while the thread's cache still holds a slot of that one.
        let counters: PerCid<u64> = PerCid::new(&ids, move || round * 1_000);
        assert_eq!(counters.with(|n| *n), round * 1_000, "round {round}");
        counters.with(|n| *n += 1);
        assert_eq!(counters.with(|n| *n), round * 1_000 + 1);
    }
}

#[test]
fn two_percids_of_one_space_used_in_turn_and_nested_keep_their_own_slots() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let small: PerCid<u64> = PerCid::new(&ids, || 0);
    let large: PerCid<u64> = PerCid::new(&ids, || 1_000);
    for _ in 0..3 {
        small.with(|n| *n += 1);
        large.with(|n| *n += 1);
    }
    small.with(|outer| {
        large.with(|inner| {
            *outer += 10;
            *inner += 10;
        });
        *outer += 100;
    });
    large.with(|outer| small.with(|inner| *outer += *inner));
    assert_eq!(small.with(|n| *n), 113);
    assert_eq!(large.with(|n| *n), 1_000 + 3 + 10 + 113);
    // The outermost `with` of each, inside a `Cid` guard of the space, is a nested one.
    let cid = ids.enter();
    small.with(|n| *n += 1);
    drop(cid);
    assert_eq!(small.with(|n| *n), 114);
}

#[test]
fn a_panic_on_any_path_of_with_leaves_the_slot_unborrowed_and_the_thread_unpinned() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let refuse = AtomicBool::new(true);
    let counters: PerCid<u64> = PerCid::new(&ids, move || {
        assert!(
            !refuse.swap(false, Ordering::SeqCst),
            "attack: init refuses once"
        );
        0
    });
    crate::common::quiet_panics_starting_with("attack:");
    // A first value's `init` (the cold path, on a cache miss).
    let init = catch_unwind(AssertUnwindSafe(|| counters.with(|n| *n += 1)));
    counters.with(|n| *n += 1);
    // The closure on the straight line (a cached slot with a value).
    let closure = catch_unwind(AssertUnwindSafe(|| {
        counters.with(|n| {
            *n += 10;
            panic!("attack: the closure panics");
        })
    }));
    // A nested `with` on the same `PerCid`.
    let nested = catch_unwind(AssertUnwindSafe(|| {
        counters.with(|_| counters.with(|_| ()));
    }))
    .expect_err("a nested with on the same PerCid panics");
    let nested = nested
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| nested.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(nested.contains("re-entrantly"), "{nested}");
    assert!(init.is_err() && closure.is_err());
    // Not borrowed: a reader on another thread visits the slot (it would wait for ever).
    let seen = std::thread::scope(|s| s.spawn(|| sum(&counters)).join().unwrap());
    assert_eq!(seen, 11);
    assert_eq!(counters.with(|n| *n), 11);
    // Not pinned: idle for two scans, the thread loses its id (a pinned one is kept).
    sched.advance(SCAN);
    sched.advance(SCAN);
    assert_eq!(ids.held(), 0);
}

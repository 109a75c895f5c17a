#![cfg(loom)]
//! Loom models of `PerCid::take`, `put` and `try_borrow` (src/cid/lending.rs): the same
//! borrow protocol as `with` (src/cid/reader.rs), so a reader's visit never overlaps an
//! owner's access to the slot (the slot's value is a loom cell, and so is the count inside
//! it), a guard excludes a reader for its whole life, and a value put into a slot is
//! trimmed and folded exactly once when its id goes.

use std::sync::Arc;
use std::time::Duration;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use loom_tests::percid_fixtures::{Count, check, counters, sum};
use nicework::{IdSpace, Scheduler};

const SCAN: Duration = Duration::from_millis(100);

/// An owner puts a count, takes it out, counts and puts it back, while a reader sums: the
/// reader sees 0 or 1, never the count while it is out, and nothing overlaps.
#[test]
fn take_and_put_against_a_reader() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let pool = counters(&ids, &folded);
        let owner = {
            let pool = pool.clone();
            thread::spawn(move || {
                assert!(pool.put(Count::new()).is_ok());
                let mut count = pool.take().expect("the value just put");
                count.add();
                assert!(pool.put(count).is_ok());
            })
        };
        let reader = {
            let pool = pool.clone();
            thread::spawn(move || sum(&pool))
        };
        owner.join().unwrap();
        assert!(reader.join().unwrap() <= 1);
        let last = {
            let pool = pool.clone();
            thread::spawn(move || sum(&pool))
        };
        assert_eq!(last.join().unwrap(), 1);
        assert_eq!(folded.load(Ordering::SeqCst), 0);
    });
}

/// A guard's whole life excludes the reader: the count it adds through the guard is either
/// all before the visit or all after it, and the slot is free again after the drop.
#[test]
fn a_guard_against_a_reader() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let pool = counters(&ids, &folded);
        let owner = {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut guard = pool.try_borrow().expect("not borrowed");
                guard.add();
                guard.add();
                drop(guard);
                pool.with(Count::add);
            })
        };
        let reader = {
            let pool = pool.clone();
            thread::spawn(move || sum(&pool))
        };
        owner.join().unwrap();
        let seen = reader.join().unwrap();
        assert!(seen == 0 || seen == 2 || seen == 3, "the reader saw {seen}");
    });
}

/// Two threads put a count each and go idle (loom keeps their ids until the scan revokes
/// them); then, at once, a third takes and puts its
/// own while the second scan revokes the idle ids and trims above the high water. Every
/// count is live or folded, exactly once.
#[test]
fn put_against_a_trim() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let pool = counters(&ids, &folded);
        // If loom ran the first thread's exit, the second finds its full slot: that count
        // is dropped, and counted as such.
        let mut dropped = 0;
        for _ in 0..2 {
            let pool = pool.clone();
            dropped += thread::spawn(move || {
                let mut count = Count::new();
                count.add();
                pool.put(count).map_or_else(|count| count.get(), |()| 0)
            })
            .join()
            .unwrap();
        }
        sched.advance(SCAN);
        let owner = {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut count = pool.take().unwrap_or_else(Count::new);
                count.add();
                if let Err(count) = pool.put(count) {
                    count.get()
                } else {
                    0
                }
            })
        };
        sched.advance(SCAN);
        dropped += owner.join().unwrap();
        let last = {
            let pool = pool.clone();
            thread::spawn(move || sum(&pool))
        };
        let live = last.join().unwrap();
        assert_eq!(live + folded.load(Ordering::SeqCst) + dropped, 3);
    });
}

#![cfg(loom)]
//! Models of `PerCid::with`'s slot cache (`src/cid/slots.rs`): the scan revokes an
//! owner's id while the owner is between `enter()`'s fast path and the cache's use, and a
//! second owner makes its first value (and may take the revoked id) while the scan trims.
//! The slot's value is a loom cell, so two owners' `&mut` on one slot, or a trim taking a
//! value an owner uses, is a causality violation; every increment is live or folded.

use std::sync::Arc;
use std::time::Duration;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use nicework::{IdSpace, PerCid, Scheduler};

const SCAN: Duration = Duration::from_millis(100);

struct Count(UnsafeCell<u64>);

// SAFETY: shared access only reads; writes need `&mut`, which `PerCid` hands out
// exclusively (the property under test).
unsafe impl Sync for Count {}

impl Count {
    fn add(&mut self) {
        // SAFETY: `&mut self` (loom checks the claim).
        self.0.with_mut(|count| unsafe { *count += 1 });
    }

    fn get(&self) -> u64 {
        // SAFETY: a shared read (loom checks it against writers).
        self.0.with(|count| unsafe { *count })
    }
}

fn counters(ids: &IdSpace, folded: &Arc<AtomicU64>) -> Arc<PerCid<Count>> {
    let folded = folded.clone();
    Arc::new(PerCid::with_reclaim(
        ids,
        || Count(UnsafeCell::new(0)),
        move |count: &mut Count| {
            folded.fetch_add(count.get(), Ordering::SeqCst);
        },
    ))
}

fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.max_branches = 20_000;
    model.check(f);
}

fn sum(counters: &PerCid<Count>) -> u64 {
    let mut sum = 0;
    counters.for_each(|count| sum += count.get());
    sum
}

/// The owner cached its slot (id 0) and went idle through one scan. Then, at once: the
/// owner counts again (through the cache, or after losing its id), a second owner makes
/// its first value (taking id 0 if the scan freed it first, else id 1), and the second
/// scan revokes the owner's id and trims above the high water.
#[test]
fn a_scan_revokes_the_id_while_the_owner_is_on_its_cached_straight_line() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let counters = counters(&ids, &folded);
        let phase = Arc::new(AtomicU64::new(0));
        let first = {
            let (counters, phase) = (counters.clone(), phase.clone());
            thread::spawn(move || {
                counters.with(Count::add);
                counters.with(Count::add);
                phase.store(1, Ordering::SeqCst);
                while phase.load(Ordering::SeqCst) != 2 {
                    thread::yield_now();
                }
                counters.with(Count::add);
            })
        };
        while phase.load(Ordering::SeqCst) != 1 {
            thread::yield_now();
        }
        // The scan sees the owner's enters (not idle yet).
        sched.advance(SCAN);
        phase.store(2, Ordering::SeqCst);
        let second = {
            let counters = counters.clone();
            thread::spawn(move || counters.with(Count::add))
        };
        // Revokes the owner's id if it is idle at that moment, and trims.
        sched.advance(SCAN);
        first.join().unwrap();
        second.join().unwrap();
        let last = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        assert_eq!(last.join().unwrap() + folded.load(Ordering::SeqCst), 4);
    });
}

/// Two `PerCid`s of one space: the owner alternates them (the cache holds the other's
/// slot) while the scan revokes and a second owner takes ids; nested calls too.
#[test]
fn two_percids_alternated_beside_a_revoke() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let a = counters(&ids, &folded);
        let b = counters(&ids, &folded);
        let phase = Arc::new(AtomicU64::new(0));
        let first = {
            let (a, b, phase) = (a.clone(), b.clone(), phase.clone());
            thread::spawn(move || {
                a.with(Count::add);
                b.with(Count::add);
                phase.store(1, Ordering::SeqCst);
                while phase.load(Ordering::SeqCst) != 2 {
                    thread::yield_now();
                }
                a.with(|outer| {
                    outer.add();
                    b.with(Count::add);
                });
            })
        };
        while phase.load(Ordering::SeqCst) != 1 {
            thread::yield_now();
        }
        sched.advance(SCAN);
        phase.store(2, Ordering::SeqCst);
        let second = {
            let b = b.clone();
            thread::spawn(move || b.with(Count::add))
        };
        sched.advance(SCAN);
        first.join().unwrap();
        second.join().unwrap();
        let last = {
            let (a, b) = (a.clone(), b.clone());
            thread::spawn(move || sum(&a) + sum(&b))
        };
        assert_eq!(last.join().unwrap() + folded.load(Ordering::SeqCst), 5);
    });
}

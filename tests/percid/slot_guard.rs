//! `PerCid::try_borrow` and `SlotGuard`: a `with` whose closure is the guard's life. The
//! guard excludes readers as `with` does (a reader that did not wait would see the
//! value's `busy` mark), keeps its id and value across scans, returns `None` instead of
//! panicking on nesting, and lets the slot go on every unwind: a panic while it lives,
//! and an `init` that panics.

use std::panic::{AssertUnwindSafe, RefUnwindSafe, UnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use nicework::{IdSpace, PerCid, Scheduler, SlotGuard};

use crate::common::percid::Owner;

const SCAN: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Marked {
    busy: AtomicBool,
    count: AtomicU64,
}

#[test]
fn a_guard_derefs_to_the_slot_and_nesting_returns_none() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let scratch: PerCid<Vec<u8>> = PerCid::new(&ids, Vec::new);
    let mut guard: SlotGuard<'_, Vec<u8>> = scratch.try_borrow().expect("free");
    guard.push(1);
    assert_eq!(guard.len(), 1);
    assert!(format!("{guard:?}").contains("SlotGuard"));
    for _ in 0..3 {
        assert!(scratch.try_borrow().is_none());
    }
    // `with` nested in a guard panics as a nested `with` does; the guard is unharmed.
    let nested = catch_unwind(AssertUnwindSafe(|| scratch.with(|buffer| buffer.len())));
    assert!(nested.is_err());
    guard.push(2);
    drop(guard);
    assert_eq!(scratch.with(|buffer| buffer.clone()), [1, 2]);
    // Inside `with`, and inside another PerCid's guard (which does not borrow this one).
    scratch.with(|_| assert!(scratch.try_borrow().is_none()));
    let other: PerCid<u8> = PerCid::new(&ids, || 0);
    let outer = other.try_borrow().unwrap();
    assert_eq!(scratch.try_borrow().unwrap().len(), 2);
    drop(outer);
}

#[test]
fn a_reader_waits_for_a_guard_as_for_a_with() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let marked: Arc<PerCid<Marked>> = Arc::new(PerCid::new(&ids, Marked::default));
    let holder = Owner::start();
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    // The holder keeps a guard, marked busy, until told to drop it.
    let holder_marked = marked.clone();
    let holding = std::thread::spawn(move || {
        holder.run(move || {
            let guard = holder_marked.try_borrow().unwrap();
            guard.busy.store(true, Ordering::SeqCst);
            guard.count.fetch_add(1, Ordering::SeqCst);
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            guard.busy.store(false, Ordering::SeqCst);
            drop(guard);
        });
        holder
    });
    held_rx.recv().unwrap();
    let visited = Arc::new(AtomicUsize::new(0));
    let saw_busy = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = mpsc::channel();
    let reader = std::thread::spawn({
        let (marked, visited, saw_busy) = (marked.clone(), visited.clone(), saw_busy.clone());
        move || {
            started_tx.send(()).unwrap();
            marked.for_each(|value| {
                if value.busy.load(Ordering::SeqCst) {
                    saw_busy.store(true, Ordering::SeqCst);
                }
                visited.fetch_add(1, Ordering::SeqCst);
            })
        }
    });
    // The reader can only finish after the guard is gone; let it run into the wait.
    started_rx.recv().unwrap();
    for _ in 0..100 {
        std::thread::yield_now();
    }
    assert_eq!(visited.load(Ordering::SeqCst), 0);
    release_tx.send(()).unwrap();
    reader.join().unwrap();
    assert_eq!(visited.load(Ordering::SeqCst), 1);
    assert!(!saw_busy.load(Ordering::SeqCst));
    holding.join().unwrap().exit();
}

#[test]
fn a_guard_keeps_its_id_and_value_across_scans_and_lets_them_go_after() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let reclaimed = Arc::new(AtomicUsize::new(0));
    let slots: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 40, {
        let reclaimed = reclaimed.clone();
        move |_: &mut u64| {
            reclaimed.fetch_add(1, Ordering::SeqCst);
        }
    }));
    // Two threads: the lower id goes idle, the guard's holder has the higher id.
    let idle = Owner::start();
    idle.run({
        let slots = slots.clone();
        move || slots.with(|n| *n += 1)
    });
    let holder = Owner::start();
    let (id_tx, id_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let holding = std::thread::spawn({
        let slots = slots.clone();
        move || {
            holder.run(move || {
                let mut guard = slots.try_borrow().unwrap();
                *guard += 2;
                id_tx.send(*guard).unwrap();
                release_rx.recv().unwrap();
                *guard += 1;
            });
            holder
        }
    });
    assert_eq!(id_rx.recv().unwrap(), 42);
    for _ in 0..5 {
        sched.advance(SCAN);
    }
    // The idle thread lost id 0; the guard's id 1 stays held, so the high water is 2.
    assert_eq!(ids.held(), 1);
    assert_eq!(ids.high_water(), 2);
    assert_eq!(reclaimed.load(Ordering::SeqCst), 0);
    release_tx.send(()).unwrap();
    let holder = holding.join().unwrap();
    let mut values = Vec::new();
    slots.for_each(|n| values.push(*n));
    values.sort_unstable();
    assert_eq!(values, [41, 43]);
    // Both idle now: both ids revoked, both slots trimmed, once each.
    for _ in 0..5 {
        sched.advance(SCAN);
    }
    assert_eq!(ids.held(), 0);
    assert_eq!(reclaimed.load(Ordering::SeqCst), 2);
    assert_eq!(slots.live(), 0);
    idle.exit();
    holder.exit();
}

#[test]
fn every_unwind_lets_the_slot_go() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let fail_init = Arc::new(AtomicBool::new(true));
    let slots: PerCid<u64> = PerCid::new(&ids, {
        let fail_init = fail_init.clone();
        move || {
            if fail_init.load(Ordering::SeqCst) {
                panic!("planted: init panics");
            }
            5
        }
    });
    assert!(catch_unwind(AssertUnwindSafe(|| slots.try_borrow().map(|_| ()))).is_err());
    assert_eq!(slots.live(), 0);
    fail_init.store(false, Ordering::SeqCst);
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let mut guard = slots.try_borrow().unwrap();
        *guard += 1;
        panic!("planted: a panic while the guard lives");
    }));
    assert!(panicked.is_err());
    // Neither the slot nor the thread's pin was left behind.
    assert_eq!(slots.try_borrow().as_deref().copied(), Some(6));
    let mut sum = 0;
    slots.for_each(|n| sum += *n);
    assert_eq!(sum, 6);
    for _ in 0..3 {
        sched.advance(SCAN);
    }
    assert_eq!(ids.held(), 0);
}

#[test]
fn per_cid_is_as_unwind_safe_as_its_values() {
    fn unwind_safe<T: UnwindSafe + RefUnwindSafe>(_: &T) {}
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counts: PerCid<u64> = PerCid::new(&ids, || 0);
    unwind_safe(&counts);
    // So a pool can be used from inside `catch_unwind` without asserting it.
    let result = catch_unwind(|| counts.with(|n| *n += 1));
    assert!(result.is_ok());
}

#[test]
fn a_guard_asked_for_inside_a_for_each_callback_of_the_same_per_cid_is_refused() {
    // A guard made there could be kept past the callback; the pass would then wait for it
    // at this thread's own slot, on this thread, for ever. `with`, `take` and `put` end
    // inside the callback and still work on a slot that is only flagged.
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let slots: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 7));
    let low = Owner::start();
    low.run({
        let slots = slots.clone();
        move || slots.with(|n| *n = 1)
    });
    crate::common::percid::finishes("a for_each whose callback asks for a guard", {
        let slots = slots.clone();
        move || {
            slots.with(|n| *n = 2);
            let other: PerCid<u64> = PerCid::new(&ids, || 0);
            other.with(|n| *n = 1);
            let mut nested = 0;
            let mut kept = None;
            let mut refused = 0;
            slots.for_each(|value| {
                match slots.try_borrow() {
                    Some(guard) => kept = Some(guard),
                    None => refused += 1,
                }
                // Nested inside another PerCid's pass as well.
                other.for_each(|_| {
                    assert!(slots.try_borrow().is_none());
                    nested += 1;
                });
                if *value == 1 {
                    // The other thread's slot: this thread's own is only flagged.
                    slots.with(|_| ());
                }
            });
            assert_eq!((refused, nested), (2, 2));
            assert!(kept.is_none());
            assert_eq!(*slots.try_borrow().unwrap(), 2);
        }
    });
    low.exit();
}

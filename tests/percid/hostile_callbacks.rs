//! Attacks on `PerCid::for_each`, `with_reclaim`, trims that free slot arrays, the
//! reader/trim gate, trims at thread exit once the scheduler is gone, `MIN_SCAN_PERIOD`
//! and `IdSpace::enter()`'s fast path, against every id guarantee.
//!
//! No test asserts a timing: deadlocks are detected by a liveness bound
//! (`common::EVENTUALLY`, far above any expected latency), every other wait is for a state.

use crate::common;

use std::cell::RefCell;
use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use common::eventually;
use common::percid::finishes;
use nicework::{IdSpace, MIN_SCAN_PERIOD, PerCid, Scheduler};

/// The last handles of a `PerCid` and its space, dropped from inside a callback.
type Handles = (Arc<PerCid<u64>>, IdSpace);

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

fn quiet_panics() {
    common::quiet_panics_starting_with("attack:");
}

// ---------------------------------------------------------------------------------------
// Trims at thread exit once the scheduler is gone.
// ---------------------------------------------------------------------------------------

/// The natural way to fold reclaimed counters: into another `PerCid` of the same space.
/// Once the scheduler is gone, the trim runs on the exiting thread, inside nicework's exit
/// hook; `on_reclaim`'s `with` then takes a late-orphan id, whose release trims again, and
/// that nested trim waits for the gate its own thread holds.
#[test]
fn on_reclaim_folding_into_another_percid_at_thread_exit_without_scheduler() {
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::new(&sched);
    // The totals' own slots are trimmed too (the late id `on_reclaim` takes is released at
    // once): they fold into an atomic.
    let (total, totals, counters) = common::percid::fold_pair(&ids);
    drop(sched);
    let c = counters.clone();
    finishes("a thread exiting with on_reclaim calling with", move || {
        c.with(|n| *n += 7);
    });
    let mut sum = total.load(Ordering::SeqCst);
    counters.for_each(|n| sum += *n);
    totals.for_each(|n| sum += *n);
    assert_eq!(sum, 7, "live plus folded after the exit");
}

/// The same with a bare `enter()` in `on_reclaim` (a callback that reads its id, logs
/// with a per-id buffer, ...).
#[test]
fn on_reclaim_entering_the_space_at_thread_exit_without_scheduler() {
    let sched = Scheduler::new().unwrap();
    let ids = Arc::new(IdSpace::new(&sched));
    let reclaimed = Arc::new(AtomicUsize::new(0));
    let counters: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, {
        let ids = Arc::downgrade(&ids);
        let reclaimed = reclaimed.clone();
        move |_: &mut u64| {
            if let Some(ids) = ids.upgrade() {
                let _cid = ids.enter();
            }
            reclaimed.fetch_add(1, Ordering::SeqCst);
        }
    }));
    drop(sched);
    let c = counters.clone();
    finishes(
        "a thread exiting with on_reclaim calling enter",
        move || {
            c.with(|n| *n += 1);
        },
    );
    assert_eq!(reclaimed.load(Ordering::SeqCst), 1);
}

struct Late(Option<Box<dyn FnOnce()>>);
impl Drop for Late {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}
thread_local! {
    // First used before the thread's first enter(): destroyed after nicework's exit hook.
    static LATE: RefCell<Late> = const { RefCell::new(Late(None)) };
}

/// A `for_each` from a thread-local destructor that runs after nicework's exit hook,
/// whose callback uses an id of the same space (another `PerCid`'s `with`), with the
/// scheduler gone: the late-orphan id's release trims, and the trim waits for the gate
/// this thread's reader holds.
#[test]
fn for_each_in_a_late_destructor_whose_callback_enters_without_scheduler() {
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::new(&sched);
    let counters: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 0));
    let other: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 0));
    drop(sched);
    // This thread keeps id 0 and its slot; the exiting thread's id 1 is trimmed at its exit.
    counters.with(|n| *n += 1);
    let seen = Arc::new(AtomicU64::new(0));
    let (c, o, s) = (counters.clone(), other.clone(), seen.clone());
    finishes("for_each in a late thread-local destructor", move || {
        let (c2, o2, s2) = (c.clone(), o.clone(), s.clone());
        LATE.with(|late| {
            late.borrow_mut().0 = Some(Box::new(move || {
                c2.for_each(|n| {
                    s2.fetch_add(*n, Ordering::SeqCst);
                    o2.with(|m| *m += 1);
                });
            }))
        });
        c.with(|n| *n += 3);
    });
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the late reader saw this thread's slot"
    );
}

// ---------------------------------------------------------------------------------------
// Live + folded, exactly-once reclaim, never visited after, with panics
// everywhere and threads coming and going.
// ---------------------------------------------------------------------------------------

static SERIAL: AtomicU64 = AtomicU64::new(1);
static DROP_PANICS: AtomicBool = AtomicBool::new(false);
static TWICE: AtomicUsize = AtomicUsize::new(0);

struct Counted {
    serial: u64,
    n: AtomicU64,
}
impl Drop for Counted {
    fn drop(&mut self) {
        if DROP_PANICS.load(Ordering::Relaxed) && self.serial % 5 == 0 {
            panic!("attack: a slot's Drop panics");
        }
    }
}

#[test]
fn live_plus_folded_with_panics_everywhere_and_threads_coming_and_going() {
    quiet_panics();
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::builder().scan_period(Duration::ZERO).build(&sched);
    let folded = Arc::new(AtomicU64::new(0));
    let reclaimed: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let init_calls = AtomicUsize::new(0);
    let counters: PerCid<Counted> = PerCid::with_reclaim(
        &ids,
        {
            let calls = Arc::new(AtomicUsize::new(0));
            move || {
                if calls.fetch_add(1, Ordering::Relaxed) % 7 == 3 {
                    panic!("attack: init panics");
                }
                Counted {
                    serial: SERIAL.fetch_add(1, Ordering::Relaxed),
                    n: AtomicU64::new(0),
                }
            }
        },
        {
            let folded = folded.clone();
            let reclaimed = reclaimed.clone();
            let mut calls = 0u64;
            move |slot: &mut Counted| {
                if !reclaimed.lock().unwrap().insert(slot.serial) {
                    TWICE.fetch_add(1, Ordering::SeqCst);
                }
                folded.fetch_add(*slot.n.get_mut(), Ordering::SeqCst);
                *slot.n.get_mut() = 0;
                calls += 1;
                if calls % 3 == 0 {
                    panic!("attack: on_reclaim panics after folding");
                }
            }
        },
    );
    let _ = &init_calls;
    DROP_PANICS.store(true, Ordering::Relaxed);
    let added = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let visited_after_reclaim = AtomicUsize::new(0);
    let reads = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let mut sum = 0;
                let result = catch_unwind(AssertUnwindSafe(|| {
                    counters.for_each(|slot| {
                        if reclaimed.lock().unwrap().contains(&slot.serial) {
                            visited_after_reclaim.fetch_add(1, Ordering::SeqCst);
                        }
                        sum += slot.n.load(Ordering::Relaxed);
                        if round % 11 == 0 {
                            panic!("attack: a visit panics");
                        }
                    })
                }));
                if result.is_ok() {
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        for wave in 0..40u64 {
            let threads = 1 + (wave as usize * 7) % 12;
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (counters, added) = (&counters, &added);
                    std::thread::Builder::new()
                        .spawn_scoped(s, move || {
                            for i in 0..200u64 {
                                let r = catch_unwind(AssertUnwindSafe(|| {
                                    counters.with(|slot| {
                                        *slot.n.get_mut() += 1;
                                        added.fetch_add(1, Ordering::Relaxed);
                                        if (i + t as u64) % 37 == 0 {
                                            panic!("attack: with panics after counting");
                                        }
                                    })
                                }));
                                let _ = r;
                            }
                        })
                        .unwrap()
                })
                .collect();
            for handle in handles {
                handle.join().unwrap();
            }
        }
        // Stops the reader also if an assertion below fails.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        // Every wave's thread is gone: an id held here wakes the parked scan, which trims
        // every slot above the high water (1).
        let _cid = ids.enter();
        assert!(
            eventually(|| counters.live() <= 1),
            "live {}",
            counters.live()
        );
        assert!(eventually(|| reads.load(Ordering::Relaxed) > 10));
    });
    let mut live = 0;
    counters.for_each(|slot| live += slot.n.load(Ordering::Relaxed));
    assert_eq!(visited_after_reclaim.load(Ordering::SeqCst), 0);
    assert_eq!(
        TWICE.load(Ordering::SeqCst),
        0,
        "a value went to on_reclaim twice"
    );
    assert!(!reclaimed.lock().unwrap().is_empty(), "no trim ran");
    assert_eq!(
        live + folded.load(Ordering::SeqCst),
        added.load(Ordering::Relaxed),
        "live {live} + folded {} != added",
        folded.load(Ordering::SeqCst)
    );
    DROP_PANICS.store(false, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------------------
// Misuse on one thread never deadlocks (panics with a message, or works).
// ---------------------------------------------------------------------------------------

fn panics_with(what: &str, needle: &str, f: impl FnOnce() + Send + 'static) {
    quiet_panics();
    let result = finishes(what, move || catch_unwind(AssertUnwindSafe(f)));
    match result {
        Ok(()) => panic!("{what}: no panic"),
        Err(payload) => {
            let text = panic_text(payload.as_ref());
            assert!(text.contains(needle), "{what}: panicked with {text:?}");
        }
    }
}

fn pair() -> (Scheduler, Arc<IdSpace>, Arc<PerCid<u64>>) {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let slots = Arc::new(PerCid::new(&ids, || 0u64));
    (sched, ids, slots)
}

#[test]
fn misuse_on_one_thread_panics_or_works_never_deadlocks() {
    // for_each inside with (same PerCid).
    let (_s, _ids, p) = pair();
    panics_with("for_each inside with", "inside `with`", move || {
        p.with(|_| p.for_each(|_| ()));
    });
    // for_each inside with, reached through a nested Cid guard and another PerCid's with.
    let (_s, ids, p) = pair();
    let q = Arc::new(PerCid::new(&ids, || 0u64));
    panics_with(
        "for_each inside with inside with",
        "inside `with`",
        move || {
            let _cid = ids.enter();
            p.with(|_| q.with(|_| p.for_each(|_| ())));
        },
    );
    // with on the slot being visited (the reader's own).
    let (_s, _ids, p) = pair();
    panics_with("with on the visited slot", "visiting", move || {
        p.with(|n| *n += 1);
        p.for_each(|_| p.with(|n| *n += 1));
    });
    // with on the reader's own slot, only flagged (another slot being visited).
    let (_s, _ids, p) = pair();
    let result = finishes("with on the own flagged slot", move || {
        let other = p.clone();
        std::thread::spawn(move || other.with(|n| *n += 10))
            .join()
            .unwrap();
        // This thread gets id 0 (the other thread's id was freed at its exit): slot 0 is
        // the other thread's old value; give this thread id 1 with a held guard elsewhere.
        p.with(|n| *n += 1);
        let mut seen = Vec::new();
        p.for_each(|n| {
            seen.push(*n);
            // Visiting slot 0 (this thread's) panics; so only call it when visiting others.
        });
        seen
    });
    assert_eq!(result, vec![11]);
    // for_each inside for_each; for_each inside on_reclaim (trim goes on).
    let (_s, _ids, p) = pair();
    panics_with("for_each inside for_each", "inside a for_each", move || {
        p.with(|n| *n += 1);
        p.for_each(|_| p.for_each(|_| ()));
    });
    // A with inside for_each on a slot of another id than the one being visited.
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let p: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 0));
    let gate = Arc::new(Barrier::new(2));
    let done = Arc::new(Barrier::new(2));
    let holder = {
        let (p, gate, done) = (p.clone(), gate.clone(), done.clone());
        std::thread::spawn(move || {
            p.with(|n| *n += 100); // id 0
            gate.wait();
            done.wait();
        })
    };
    gate.wait();
    let visits = finishes("with on the own flagged slot while visiting another", {
        let p = p.clone();
        move || {
            p.with(|n| *n += 1); // id 1
            let mut visits = 0;
            p.for_each(|n| {
                visits += 1;
                if *n == 100 {
                    // Visiting slot 0: this thread's slot 1 is only flagged.
                    p.with(|m| *m += 1);
                }
            });
            visits
        }
    });
    assert_eq!(visits, 2);
    done.wait();
    holder.join().unwrap();
    let mut all = Vec::new();
    p.for_each(|n| all.push(*n));
    assert_eq!(all, vec![100, 2]);
}

#[test]
fn on_reclaim_reentrancy_drops_and_setters_during_a_scan() {
    quiet_panics();
    let sched = Scheduler::manual();
    let ids = IdSpace::builder()
        .scan_period(MIN_SCAN_PERIOD)
        .build(&sched);
    // A PerCid whose on_reclaim: calls for_each on itself (panics, contained), replaces
    // itself, drops the PerCid and the IdSpace it was handed, and calls with on itself.
    let cell: Arc<Mutex<Option<Handles>>> = Arc::default();
    let p = Arc::new(PerCid::new(&ids, || 0u64));
    let reclaimed = Arc::new(AtomicU64::new(0));
    {
        let (cell, reclaimed, weak) = (cell.clone(), reclaimed.clone(), Arc::downgrade(&p));
        p.on_reclaim(move |n| {
            reclaimed.fetch_add(*n, Ordering::SeqCst);
            if let Some(p) = weak.upgrade() {
                let _ = catch_unwind(AssertUnwindSafe(|| p.for_each(|_| ())));
                let again = reclaimed.clone();
                p.on_reclaim(move |n| {
                    again.fetch_add(*n, Ordering::SeqCst);
                });
                p.with(|m| *m += 1000);
            }
            // Drops the last user handles to the PerCid and the IdSpace.
            drop(cell.lock().unwrap().take());
        });
    }
    let q = p.clone();
    std::thread::spawn(move || q.with(|n| *n += 5))
        .join()
        .unwrap();
    *cell.lock().unwrap() = Some((p, ids));
    // The space is held by the PerCid (in the cell): the scan is parked with nothing held
    // since the thread exited; its exit touched it, so it runs once.
    let deadline_rounds = 100;
    for _ in 0..deadline_rounds {
        sched.advance(MIN_SCAN_PERIOD);
        if reclaimed.load(Ordering::SeqCst) >= 5 {
            break;
        }
    }
    assert!(
        reclaimed.load(Ordering::SeqCst) >= 5,
        "the slot was reclaimed"
    );
    assert!(
        cell.lock().unwrap().is_none(),
        "the callback dropped the pair"
    );
    // The scheduler goes on after the space was freed from inside its own scan.
    for _ in 0..5 {
        sched.advance(MIN_SCAN_PERIOD);
    }
}

#[test]
fn percid_used_after_its_space_and_scheduler_were_dropped() {
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::new(&sched);
    let p: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, |_| ()));
    p.with(|n| *n += 1);
    drop(ids);
    drop(sched);
    let total = finishes("with and for_each after the space is gone", {
        let p = p.clone();
        move || {
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for _ in 0..100 {
                            p.with(|n| *n += 1);
                        }
                    });
                }
                s.spawn(|| {
                    for _ in 0..100 {
                        p.for_each(|_| ());
                    }
                });
            });
            let mut total = 0;
            p.for_each(|n| total += *n);
            total
        }
    });
    // Scoped threads' exits trim their slots above the high water (no on_reclaim count
    // here): only this thread's slot is sure to stay.
    assert!(total >= 1);
}

#[test]
fn scheduler_dropped_while_readers_and_owners_run() {
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::builder()
        .scan_period(MIN_SCAN_PERIOD)
        .build(&sched);
    let folded = Arc::new(AtomicU64::new(0));
    let p: PerCid<AtomicU64> = PerCid::with_reclaim(&ids, || AtomicU64::new(0), {
        let folded = folded.clone();
        move |n: &mut AtomicU64| {
            folded.fetch_add(*n.get_mut(), Ordering::SeqCst);
        }
    });
    let added = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let mut sched = Some(sched);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                p.for_each(|_| ());
            }
        });
        for wave in 0..30 {
            if wave == 10 {
                drop(sched.take());
            }
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    std::thread::Builder::new()
                        .spawn_scoped(s, || {
                            for _ in 0..100 {
                                p.with(|n| *n.get_mut() += 1);
                                added.fetch_add(1, Ordering::Relaxed);
                            }
                        })
                        .unwrap()
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let mut live = 0;
    p.for_each(|n| live += n.load(Ordering::Relaxed));
    assert_eq!(
        live + folded.load(Ordering::SeqCst),
        added.load(Ordering::Relaxed)
    );
}

// ---------------------------------------------------------------------------------------
// Scan periods.
// ---------------------------------------------------------------------------------------

#[test]
fn tiny_and_huge_scan_periods() {
    for period in [
        Duration::ZERO,
        Duration::from_nanos(1),
        MIN_SCAN_PERIOD - Duration::from_nanos(1),
    ] {
        let sched = Scheduler::manual();
        let ids = IdSpace::builder().scan_period(period).build(&sched);
        drop(ids.enter());
        sched.advance(MIN_SCAN_PERIOD - Duration::from_nanos(1));
        assert_eq!(ids.compaction_stats().runs, 0, "{period:?}: ran early");
        sched.advance(Duration::from_millis(100));
        let runs = ids.compaction_stats().runs;
        assert!(
            (1..=10).contains(&runs),
            "{period:?}: {runs} runs in 110 ms"
        );
    }
    for period in [
        Duration::from_secs(86400 * 365 * 30),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ] {
        let sched = Scheduler::manual();
        let ids = IdSpace::builder().scan_period(period).build(&sched);
        let p = PerCid::new(&ids, || 0u8);
        p.with(|n| *n += 1);
        std::thread::scope(|s| {
            s.spawn(|| p.with(|n| *n += 1));
        });
        sched.advance(Duration::from_secs(86400 * 365));
        assert_eq!(ids.compaction_stats().runs, 0, "{period:?}: scanned");
        assert!(ids.held() >= 1);
    }
    // A real scheduler with a huge period: no busy loop (the worker parks).
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::builder().scan_period(Duration::MAX).build(&sched);
    drop(ids.enter());
    let p = PerCid::new(&ids, || 0u8);
    p.with(|n| *n = 1);
    assert_eq!(ids.compaction_stats().runs, 0);
}

// ---------------------------------------------------------------------------------------
// The id guarantees beside enter()'s fast path.
// ---------------------------------------------------------------------------------------

/// Six threads enter, nest, stay pinned across scans and go idle until their id is
/// revoked, while scans run back to back: a manual scheduler advanced by a thread of its
/// own runs the scan as often as that thread can loop (a real worker would wait its
/// `MIN_SCAN_PERIOD` between scans), so every enter meets a scan in some phase.
#[test]
fn ids_stay_unique_under_scans_and_nested_enters_return_the_outer_id() {
    const THREADS: usize = 6;
    let sched = Scheduler::manual();
    let ids = IdSpace::builder().scan_period(Duration::ZERO).build(&sched);
    let owners: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
    let violations = AtomicUsize::new(0);
    let scans_seen = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while finished.load(Ordering::SeqCst) < THREADS {
                sched.advance(MIN_SCAN_PERIOD);
                std::thread::yield_now();
            }
        });
        for t in 1..=THREADS {
            let (ids, owners, violations, scans_seen, finished) =
                (&ids, &owners, &violations, &scans_seen, &finished);
            s.spawn(move || {
                // Counted when the thread ends, also by a panic, so the driver stops and
                // the scope ends with the panic instead of hanging.
                struct Finished<'a>(&'a AtomicUsize);
                impl Drop for Finished<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let _finished = Finished(finished);
                for i in 0..20_000usize {
                    let cid = ids.enter();
                    let id = cid.get();
                    if owners[id].swap(t, Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    if i % 100 == 0 {
                        // Stay pinned across at least one scan; nested enters keep the id.
                        let runs = ids.compaction_stats().runs;
                        while ids.compaction_stats().runs < runs + 1 {
                            if ids.enter().get() != id {
                                violations.fetch_add(1, Ordering::SeqCst);
                            }
                            std::thread::yield_now();
                        }
                        scans_seen.fetch_add(1, Ordering::Relaxed);
                    }
                    if owners[id].swap(0, Ordering::SeqCst) != t {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    // Read while the id is held, so no park (which needs every id
                    // released) comes between this reading and the drop.
                    let before = ids.compaction_stats();
                    drop(cid);
                    if i % 7 == t % 7 {
                        // Go idle for two scans: the id is revoked and re-acquired. A scan
                        // that finds no id held parks (only an enter wakes it), and it only
                        // finds none once this thread's id is revoked too.
                        loop {
                            let now = ids.compaction_stats();
                            if now.runs >= before.runs + 2 || now.parks > before.parks {
                                break;
                            }
                            // Idle, holding no id: sleep rather than yield, so the thread
                            // that drives the scans gets the CPU.
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                }
            });
        }
    });
    assert!(scans_seen.load(Ordering::Relaxed) > 0);
    assert_eq!(violations.load(Ordering::SeqCst), 0);
}

/// The fast path's cache is keyed by the space's address: a space freed and another built
/// at the same address must not find the old record.
#[test]
fn a_new_space_at_a_freed_address_gets_its_own_record() {
    let sched = Scheduler::manual();
    for round in 0..200 {
        let ids = IdSpace::new(&sched);
        let other = IdSpace::new(&sched);
        // Another thread holds id 0 of `ids`: this thread must get 1 unless its record
        // is confused with a stale one.
        let held = Barrier::new(2);
        let release = Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _cid = ids.enter();
                held.wait();
                release.wait();
            });
            held.wait();
            let cid = ids.enter();
            assert_eq!(cid.get(), 1, "round {round}");
            assert_eq!(other.enter().get(), 0);
            assert_eq!(ids.enter().get(), 1, "round {round}: nested");
            drop(cid);
            release.wait();
        });
        drop(ids);
        drop(other);
    }
}

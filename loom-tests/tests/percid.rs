#![cfg(loom)]
//! Loom models of `PerCid`'s reader protocol (src/cid/reader.rs): a reader's `for_each`
//! against an owner's `with` against a trim by the compaction scan. The slot's value is a
//! loom cell, so a visit that overlaps an owner's `&mut`, or a trim that takes a value a
//! reader or an owner is using, is reported by loom as a causality violation; the counts
//! check that every increment is either live or folded by `on_reclaim`, exactly once.
//!
//! The last models race the owner's slot cache against the scan: a revoke between
//! `enter()`'s fast path and the cache's use, and a second owner's first value (which may
//! take the revoked id) while the scan trims.
//!
//! Loom does not run a spawned thread's thread-local destructors before `join` returns,
//! so threads that "went away" keep their ids until the scan revokes them as idle, which
//! is what makes their slots trimmable here.

use std::sync::Arc;
use std::time::Duration;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use loom_tests::percid_fixtures::{Count, check, counters, sum};
use nicework::{IdSpace, PerCid, Scheduler};

const SCAN: Duration = Duration::from_millis(100);

fn count_once(counters: &Arc<PerCid<Count>>) -> thread::JoinHandle<()> {
    let counters = counters.clone();
    thread::spawn(move || counters.with(Count::add))
}

/// Two threads counted once each and went idle (ids 0 and 1). Then, at once: an owner
/// counts (on a new id, or on a revoked one), a reader sums, and the second scan revokes
/// the idle ids and trims what is above the high water. Whatever the order, the reader
/// never overlaps a writer or a trim, and live plus folded is 3 at the end.
#[test]
fn reader_against_owner_against_trim() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let counters = counters(&ids, &folded);
        count_once(&counters).join().unwrap();
        count_once(&counters).join().unwrap();
        // The first scan notes that both entered; the second may revoke both.
        sched.advance(SCAN);
        let owner = count_once(&counters);
        let settled = Arc::new(AtomicU64::new(0));
        let reader = {
            let (counters, settled) = (counters.clone(), settled.clone());
            // Loom allows four spawned threads, and the main thread must not enter (loom
            // runs its thread-local destructors after the execution ends), so the reader
            // also takes the final sum.
            thread::spawn(move || {
                let during = sum(&counters);
                while settled.load(Ordering::SeqCst) == 0 {
                    thread::park();
                }
                (during, sum(&counters))
            })
        };
        sched.advance(SCAN);
        owner.join().unwrap();
        settled.store(1, Ordering::SeqCst);
        reader.thread().unpark();
        let (during, live) = reader.join().unwrap();
        assert!(during <= 3, "the reader saw {during} of 3 increments");
        assert_eq!(live + folded.load(Ordering::SeqCst), 3);
    });
}

/// An owner counting twice while a reader sums: the owner's second `with` may find its
/// slot flagged and wait for the visit (L), or the reader may wait for the first `with`
/// (W). No wakeup is lost (loom reports a deadlock otherwise) and the reader sees 0, 1 or
/// 2, never a torn value.
#[test]
fn owner_backs_off_for_a_flagged_slot() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let counters = counters(&ids, &folded);
        let owner = {
            let counters = counters.clone();
            thread::spawn(move || {
                counters.with(Count::add);
                counters.with(Count::add);
            })
        };
        let reader = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        owner.join().unwrap();
        assert!(reader.join().unwrap() <= 2);
        let reader = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        assert_eq!(reader.join().unwrap(), 2);
        assert_eq!(folded.load(Ordering::SeqCst), 0);
    });
}

/// Once the scheduler is gone, a thread's exit trims, and `on_reclaim` runs on the exiting
/// thread. Here the callback calls `with` on its own `PerCid` (as folding into a
/// `PerCid` does): that makes a late id and a new value, whose release trims again on the
/// same thread, inside its own `on_reclaim` calls. That trim must return rather than hand
/// the new value straight back to the callback (for ever: loom reports the unbounded
/// execution). A reader runs meanwhile. Everything terminates and every increment is live
/// or folded.
#[test]
fn a_trim_at_exit_whose_callback_enters_the_space() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        let folded = Arc::new(AtomicU64::new(0));
        let counters = {
            let folded = folded.clone();
            Arc::new_cyclic(|this: &std::sync::Weak<PerCid<Count>>| {
                let this = this.clone();
                PerCid::with_reclaim(&ids, Count::new, move |count: &mut Count| {
                    folded.fetch_add(count.get(), Ordering::SeqCst);
                    if let Some(counters) = this.upgrade() {
                        counters.with(|_| ());
                    }
                })
            })
        };
        drop(sched);
        let exiting = {
            let counters = counters.clone();
            thread::spawn(move || {
                counters.with(Count::add);
                nicework::hooks::run_thread_exit_hook_for_loom();
            })
        };
        let reader = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        exiting.join().unwrap();
        assert!(reader.join().unwrap() <= 1);
        let last = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        assert_eq!(last.join().unwrap() + folded.load(Ordering::SeqCst), 1);
    });
}

/// Two owners that meet inside `with` (one waits, in its `with`, for the other's `with` to
/// have run) while a reader sums. A reader that waited at W for the first owner with the
/// second one's slot still flagged would close a cycle: the second owner waits for the
/// reader, the reader for the first owner, the first owner for the second. The reader
/// clears the later flags while it waits (U), so everything terminates (loom reports a
/// deadlock otherwise) and the sums are exact.
#[test]
fn owners_waiting_for_each_other_inside_with_beside_a_reader() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let counters = counters(&ids, &folded);
        let met = Arc::new((loom::sync::Mutex::new(false), loom::sync::Condvar::new()));
        let waiter = {
            let (counters, met) = (counters.clone(), met.clone());
            thread::spawn(move || {
                counters.with(|count| {
                    count.add();
                    let (ran, changed) = &*met;
                    let mut ran = ran.lock().unwrap();
                    while !*ran {
                        ran = changed.wait(ran).unwrap();
                    }
                })
            })
        };
        let signaller = {
            let (counters, met) = (counters.clone(), met.clone());
            thread::spawn(move || {
                counters.with(|count| {
                    count.add();
                    let (ran, changed) = &*met;
                    *ran.lock().unwrap() = true;
                    changed.notify_all();
                })
            })
        };
        let reader = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        waiter.join().unwrap();
        signaller.join().unwrap();
        assert!(reader.join().unwrap() <= 2);
        let last = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        assert_eq!(last.join().unwrap(), 2);
        assert_eq!(folded.load(Ordering::SeqCst), 0);
    });
}

/// The compaction scan runs inside an owner's `with` (a manual scheduler advanced there; a
/// threaded one runs it on its worker, which an owner may wait for) while a reader sums.
/// A trim that waited for the reader would close a cycle: the reader waits for the owner
/// at W, the owner for the scan, the scan for the reader. The trim is left to the reader
/// instead, which runs it after its pass, so everything terminates and the sums are exact.
#[test]
fn a_scan_inside_with_beside_a_reader() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let counters = counters(&ids, &folded);
        let owner = {
            let (counters, sched) = (counters.clone(), sched.clone());
            thread::spawn(move || {
                counters.with(|count| {
                    count.add();
                    sched.advance(SCAN);
                })
            })
        };
        let reader = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        owner.join().unwrap();
        assert!(reader.join().unwrap() <= 1);
        let last = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        assert_eq!(last.join().unwrap() + folded.load(Ordering::SeqCst), 1);
    });
}

/// An owner counts twice (the second `with` finds its slot through the thread's slot
/// cache), goes idle, and two scans revoke its id and trim the slot and its array. Then a
/// second owner takes the id (linking a fresh array) while the first counts again: the
/// first must not reach its cached slot, freed or now the second owner's (loom reports
/// the second owner's `&mut` overlapping), but take the slow path to a new id. Every
/// increment is live or folded.
#[test]
fn a_cached_slot_is_not_used_after_its_id_was_reclaimed_and_trimmed() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let folded = Arc::new(AtomicU64::new(0));
        let counters = counters(&ids, &folded);
        // 1: the first owner went idle; 2: its id was reclaimed.
        let phase = Arc::new(AtomicU64::new(0));
        let first = {
            let (counters, phase) = (counters.clone(), phase.clone());
            thread::spawn(move || {
                counters.with(Count::add);
                counters.with(Count::add);
                phase.store(1, Ordering::SeqCst);
                while phase.load(Ordering::SeqCst) != 2 {
                    thread::park();
                }
                counters.with(Count::add);
            })
        };
        while phase.load(Ordering::SeqCst) != 1 {
            thread::yield_now();
        }
        sched.advance(SCAN);
        sched.advance(SCAN);
        assert_eq!(ids.held(), 0);
        assert_eq!(folded.load(Ordering::SeqCst), 2);
        let second = count_once(&counters);
        phase.store(2, Ordering::SeqCst);
        first.thread().unpark();
        first.join().unwrap();
        second.join().unwrap();
        let last = {
            let counters = counters.clone();
            thread::spawn(move || sum(&counters))
        };
        assert_eq!(last.join().unwrap(), 2);
    });
}

// --- the owner's slot cache (src/cid/slots.rs) ---

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

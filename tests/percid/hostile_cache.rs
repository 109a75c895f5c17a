//! Hostile use of `PerCid::with`'s slot cache and straight line (`src/cid/slots.rs`,
//! `src/cid/owner.rs`): every slot's value records the id it was first used under and a
//! "busy" flag, so a `with` served the wrong slot (another id's, another storage's, a
//! stale one) or two `with`s on one slot at once are counted, not just crashes. Each test
//! asserts counts (ids, values, runs), never timings.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::Duration;

use nicework::{IdSpace, MIN_SCAN_PERIOD, PerCid, Scheduler};

use crate::common::percid::Owner;
use crate::common::{self, eventually};

const SCAN: Duration = Duration::from_millis(100);
const UNSET: usize = usize::MAX;

/// A slot's value: the id it belongs to (set by its first `with`), whether a `with` is
/// inside it, and a count.
struct Tagged {
    id: AtomicUsize,
    busy: AtomicBool,
    count: AtomicU64,
    /// The storage it was made for (a mark per `PerCid`).
    mark: u64,
}

impl Tagged {
    fn new(mark: u64) -> Tagged {
        Tagged {
            id: AtomicUsize::new(UNSET),
            busy: AtomicBool::new(false),
            count: AtomicU64::new(0),
            mark,
        }
    }
}

/// Failures seen, with the first few described.
#[derive(Default)]
struct Broken {
    count: AtomicUsize,
    first: Mutex<Vec<String>>,
}

impl Broken {
    fn note(&self, what: String) {
        self.count.fetch_add(1, Ordering::SeqCst);
        let mut first = self.first.lock().unwrap();
        if first.len() < 8 {
            first.push(what);
        }
    }

    fn assert_none(&self, promise: &str) {
        let count = self.count.load(Ordering::SeqCst);
        let first = self.first.lock().unwrap();
        assert_eq!(
            count, 0,
            "{promise}: broken {count} times, first: {first:?}"
        );
    }
}

/// One checked `with` on `percid` (of `ids`, marked `mark`): the nested `enter()` names
/// the id the `with` pins; the slot must be that id's (its tag), this storage's (its
/// mark), and not busy. Adds 1 and returns the count it found.
fn checked_with(ids: &IdSpace, percid: &PerCid<Tagged>, mark: u64, broken: &Broken) -> u64 {
    percid.with(|slot| {
        let id = ids.enter().get();
        if slot.mark != mark {
            broken.note(format!(
                "slot of storage {} served for storage {mark}",
                slot.mark
            ));
        }
        match slot.id.load(Ordering::SeqCst) {
            UNSET => slot.id.store(id, Ordering::SeqCst),
            tag if tag != id => broken.note(format!("slot of id {tag} served for id {id}")),
            _ => {}
        }
        if slot.busy.swap(true, Ordering::SeqCst) {
            broken.note(format!("slot of id {id} entered twice at once"));
        }
        let found = slot.count.load(Ordering::SeqCst);
        slot.count.store(found + 1, Ordering::SeqCst);
        std::hint::spin_loop();
        slot.busy.store(false, Ordering::SeqCst);
        found
    })
}

fn tagged(ids: &IdSpace, mark: u64, folded: &Arc<AtomicU64>) -> PerCid<Tagged> {
    let folded = folded.clone();
    PerCid::with_reclaim(
        ids,
        move || Tagged::new(mark),
        move |slot: &mut Tagged| {
            folded.fetch_add(*slot.count.get_mut(), Ordering::SeqCst);
        },
    )
}

fn sum(percid: &PerCid<Tagged>) -> u64 {
    let mut total = 0;
    percid.for_each(|slot| total += slot.count.load(Ordering::SeqCst));
    total
}

/// The id a thread's revoked id went to stays linked (a third thread keeps the high water
/// up, so nothing is trimmed): a stale cached slot would be valid memory, so only the tags
/// tell. T1 caches id 0's slot, goes idle and loses id 0; T2 takes id 0; T1 comes back
/// and must use id 1's slot, not id 0's (which T2 owns).
#[test]
fn a_revoked_id_whose_slot_stays_linked_is_not_served_from_the_cache() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let folded = Arc::new(AtomicU64::new(0));
    let a = Arc::new(tagged(&ids, 1, &folded));
    let b = Arc::new(tagged(&ids, 2, &folded));
    let broken = Arc::new(Broken::default());
    let (t1, t2, t3) = (Owner::start(), Owner::start(), Owner::start());
    let step = |percid: &Arc<PerCid<Tagged>>, mark: u64| {
        let (ids, percid, broken) = (ids.clone(), percid.clone(), broken.clone());
        move || {
            checked_with(&ids, &percid, mark, &broken);
        }
    };
    // t1: id 0, caches b's slot last (and a's before it); t3: id 1; then t1 idles.
    t1.run(step(&a, 1));
    t1.run(step(&b, 2));
    t3.run(step(&a, 1));
    // t3 stays busy across the scans; t1 idles and loses id 0, so t3 (id 1) is marked to
    // move down into id 0, whose slots stay linked (the high water is 2 at the scan).
    sched.advance(SCAN);
    t3.run(step(&a, 1));
    sched.advance(SCAN);
    assert_eq!(ids.held(), 1, "t1's id 0 was revoked");
    assert_eq!(ids.high_water(), 2, "t3 still holds id 1");
    // t3 moves down to id 0 (its slots: t1's old ones, still linked); t1 comes back on
    // id 1: its cache (id 0's slot of b) must not be used.
    t3.run(step(&b, 2));
    t1.run(step(&b, 2));
    t1.run(step(&a, 1));
    t1.run(step(&b, 2));
    t2.run(step(&b, 2));
    t2.run(step(&a, 1));
    let pinned = |owner: &Owner| {
        let (ids, a) = (ids.clone(), a.clone());
        let (tx, rx) = mpsc::channel();
        owner.run(move || tx.send(a.with(|_| ids.enter().get())).unwrap());
        rx.recv().unwrap()
    };
    assert_eq!((pinned(&t3), pinned(&t1), pinned(&t2)), (0, 1, 2));
    // Concurrently now: t1 and t2 hammer b (a stale cache would make them share a slot).
    let barrier = Arc::new(Barrier::new(2));
    let hammer = |percid: &Arc<PerCid<Tagged>>| {
        let (ids, percid, broken, barrier) =
            (ids.clone(), percid.clone(), broken.clone(), barrier.clone());
        move || {
            barrier.wait();
            for _ in 0..20_000 {
                checked_with(&ids, &percid, 2, &broken);
            }
        }
    };
    let (h1, h3) = (hammer(&b), hammer(&b));
    std::thread::scope(|s| {
        s.spawn(|| t1.run(h1));
        s.spawn(|| t3.run(h3));
    });
    broken.assert_none("a revoked, still linked id's slot served from the cache");
    // Counts: b got 2 (t1) + 1 (t3) + 2 (t1) + 1 (t2) + 40_000; a got 1 + 2 + 1 + 1.
    assert_eq!(sum(&b) + folded.load(Ordering::SeqCst) + sum(&a), 40_010);
    drop((t1, t2, t3));
}

/// A `PerCid` dropped and another made in its place (a `Box` and a `Vec` slot reused),
/// of another `T` too, while the thread's cache holds the dropped one's slot: the new one
/// starts from `init` every time.
#[test]
fn a_percid_reborn_in_the_same_box_or_vec_slot_starts_fresh() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let mut same_box = 0;
    for round in 0..200u64 {
        let first: Box<PerCid<u64>> = Box::new(PerCid::new(&ids, move || round));
        first.with(|n| *n += 1_000);
        assert_eq!(first.with(|n| *n), round + 1_000);
        let address = &*first as *const PerCid<u64> as usize;
        drop(first);
        // Another T of the same size and one of another size.
        let second: Box<PerCid<(u32, u32)>> = Box::new(PerCid::new(&ids, move || (7, 9)));
        if &*second as *const _ as usize == address {
            same_box += 1;
        }
        assert_eq!(second.with(|p| *p), (7, 9), "round {round}");
        second.with(|p| p.0 += 1);
        drop(second);
        let third: Box<PerCid<[u64; 3]>> = Box::new(PerCid::new(&ids, || [1, 2, 3]));
        assert_eq!(third.with(|v| *v), [1, 2, 3], "round {round}");
    }
    eprintln!("a PerCid was made at the dropped one's address in {same_box} of 200 rounds");
    let mut list: Vec<PerCid<u64>> = Vec::with_capacity(1);
    for round in 0..200u64 {
        list.clear();
        list.push(PerCid::new(&ids, move || round * 3));
        assert_eq!(list[0].with(|n| *n), round * 3);
        list[0].with(|n| *n += 1);
        assert_eq!(list[0].with(|n| *n), round * 3 + 1);
    }
}

/// Two `PerCid`s of one space used alternately, nested in both orders, inside `Cid`
/// guards, and inside each other's `init`; the nested `enter()` always names the outer id.
#[test]
fn alternating_and_nested_percids_keep_their_slots_and_the_outer_id() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let folded = Arc::new(AtomicU64::new(0));
    let broken = Arc::new(Broken::default());
    let a = Arc::new(tagged(&ids, 1, &folded));
    let b = Arc::new(tagged(&ids, 2, &folded));
    // c's init uses a and b, and enter().
    let c: PerCid<Tagged> = {
        let (ids, a, b, broken) = (ids.clone(), a.clone(), b.clone(), broken.clone());
        PerCid::new(&ids.clone(), move || {
            let id = ids.enter().get();
            let _ = &a;
            checked_with(&ids, &b, 2, &broken);
            b.with(|slot| {
                if ids.enter().get() != id {
                    broken.note("enter() in init's nested with moved".into());
                }
                slot.count.fetch_add(1, Ordering::SeqCst);
            });
            Tagged::new(3)
        })
    };
    for round in 0..1_000 {
        checked_with(&ids, &a, 1, &broken);
        checked_with(&ids, &b, 2, &broken);
        if round % 3 == 0 {
            a.with(|_| {
                checked_with(&ids, &b, 2, &broken);
                checked_with(&ids, &c, 3, &broken);
            });
        }
        if round % 5 == 0 {
            let guard = ids.enter();
            checked_with(&ids, &b, 2, &broken);
            checked_with(&ids, &c, 3, &broken);
            if guard.get() != ids.enter().get() {
                broken.note("nested enter() differs from the guard's id".into());
            }
            drop(guard);
        }
        checked_with(&ids, &c, 3, &broken);
    }
    broken.assert_none("alternating and nested PerCids");
    // c's init ran once (one thread, one id): b got 1000 + 334 + 200 + 2 from it.
    assert_eq!(sum(&a), 1_000);
    assert_eq!(sum(&b), 1_000 + 334 + 200 + 2);
    assert_eq!(c.live(), 1);
}

/// `init` calling `with` on its own `PerCid` panics with the re-entrancy message (it is
/// nested in the `with` that is making the value), on every path the outer `with` can take
/// (straight line, inside a guard); afterwards nothing is borrowed or pinned.
#[test]
fn init_calling_with_on_its_own_percid_panics_and_leaves_nothing_pinned() {
    common::quiet_panics_starting_with("PerCid::with called re-entrantly");
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let me: Arc<Mutex<Option<Arc<PerCid<u64>>>>> = Arc::new(Mutex::new(None));
    let reenter = Arc::new(AtomicBool::new(true));
    let percid = {
        let (me, reenter) = (me.clone(), reenter.clone());
        Arc::new(PerCid::new(&ids, move || {
            if reenter.load(Ordering::SeqCst) {
                let me = me.lock().unwrap().clone().unwrap();
                me.with(|n| *n += 1);
            }
            5u64
        }))
    };
    *me.lock().unwrap() = Some(percid.clone());
    for inside_a_guard in [false, true, false] {
        let guard = inside_a_guard.then(|| ids.enter());
        let payload = catch_unwind(AssertUnwindSafe(|| percid.with(|n| *n)))
            .expect_err("init's with on its own PerCid panics");
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        assert!(text.contains("re-entrantly"), "{text}");
        drop(guard);
        assert_eq!(percid.live(), 0);
    }
    reenter.store(false, Ordering::SeqCst);
    assert_eq!(percid.with(|n| *n), 5);
    // Not borrowed: a reader on another thread finishes.
    let seen = common::percid::finishes("a reader after the panics", {
        let percid = percid.clone();
        move || {
            let mut total = 0;
            percid.for_each(|n| total += *n);
            total
        }
    });
    assert_eq!(seen, 5);
    // Not pinned: two idle scans take the id.
    sched.advance(SCAN);
    sched.advance(SCAN);
    assert_eq!(ids.held(), 0);
    *me.lock().unwrap() = None;
}

/// `on_reclaim` (on the thread calling `advance`, whose cache holds a slot) calls `with`
/// on another `PerCid` and `enter()`; `T`'s `Drop` panics after some reclaims. The
/// caller's own slots and ids stay right, and every count is live or folded.
#[test]
fn reclaim_callbacks_that_use_with_and_panicking_drops_leave_the_cache_right() {
    common::quiet_panics_starting_with("hostile:");
    struct Bomb(AtomicU64, AtomicBool);
    impl Drop for Bomb {
        fn drop(&mut self) {
            if self.1.load(Ordering::SeqCst) && !std::thread::panicking() {
                panic!("hostile: a reclaimed value's drop panics");
            }
        }
    }
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let folded = Arc::new(AtomicU64::new(0));
    let reclaims = Arc::new(AtomicU64::new(0));
    let broken = Arc::new(Broken::default());
    let sink = Arc::new(tagged(&ids, 9, &folded));
    let bombs: Arc<PerCid<Bomb>> = {
        let (ids, sink, broken, reclaims) =
            (ids.clone(), sink.clone(), broken.clone(), reclaims.clone());
        Arc::new(PerCid::with_reclaim(
            &ids.clone(),
            || Bomb(AtomicU64::new(0), AtomicBool::new(true)),
            move |bomb: &mut Bomb| {
                let id = ids.enter().get();
                sink.with(|slot| {
                    if ids.enter().get() != id {
                        broken.note("enter() inside on_reclaim's with moved".into());
                    }
                    slot.count.fetch_add(*bomb.0.get_mut(), Ordering::SeqCst);
                });
                checked_with(&ids, &sink, 9, &broken);
                reclaims.fetch_add(1, Ordering::SeqCst);
            },
        ))
    };
    let mut added = 0;
    let mut direct = 0;
    for round in 0..20u64 {
        // Some threads count and exit (their slots go above the high water).
        let spawned = 1 + (round % 3);
        std::thread::scope(|s| {
            for _ in 0..spawned {
                s.spawn(|| bombs.with(|b| b.0.fetch_add(10, Ordering::SeqCst)));
            }
        });
        added += 10 * spawned;
        // The main thread keeps an id and a cached slot of each.
        checked_with(&ids, &sink, 9, &broken);
        bombs.with(|b| b.1.store(false, Ordering::SeqCst));
        sched.advance(SCAN);
        checked_with(&ids, &sink, 9, &broken);
        direct += 2;
    }
    broken.assert_none("on_reclaim's with and enter beside the caller's cache");
    let live_bombs = || {
        let mut total = 0;
        bombs.for_each(|b| total += b.0.load(Ordering::SeqCst));
        total
    };
    assert!(
        eventually(|| {
            sched.advance(SCAN);
            sum(&sink) + folded.load(Ordering::SeqCst)
                == added - live_bombs() + reclaims.load(Ordering::SeqCst) + direct
        }),
        "sink {} folded {} added {added} live bombs {} reclaims {} direct {direct}",
        sum(&sink),
        folded.load(Ordering::SeqCst),
        live_bombs(),
        reclaims.load(Ordering::SeqCst)
    );
    assert!(reclaims.load(Ordering::SeqCst) > 0);
    bombs.for_each(|b| b.1.store(false, Ordering::SeqCst));
    broken.assert_none("on_reclaim's with and enter beside the caller's cache");
}

/// Many threads that count, idle past two scans (losing their ids to the compaction
/// work), exit and are replaced, on a real scheduler at the shortest scan period, beside
/// a reader that sums and checks that it never sees a slot while its owner is inside.
/// No slot is ever another id's or busy twice, and nothing is lost.
#[test]
fn churn_of_revokes_moves_and_exits_beside_a_reader_keeps_slots_exclusive() {
    let sched = Scheduler::new().unwrap();
    let ids = Arc::new(
        IdSpace::builder()
            .scan_period(MIN_SCAN_PERIOD)
            .build(&sched),
    );
    let folded = Arc::new(AtomicU64::new(0));
    let broken = Arc::new(Broken::default());
    let a = Arc::new(tagged(&ids, 1, &folded));
    let b = Arc::new(tagged(&ids, 2, &folded));
    let done = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let reader = {
        let (a, done, broken) = (a.clone(), done.clone(), broken.clone());
        std::thread::spawn(move || {
            let mut passes = 0u64;
            while !done.load(Ordering::SeqCst) {
                a.for_each(|slot| {
                    if slot.busy.load(Ordering::SeqCst) {
                        broken.note("for_each saw a slot while its owner was inside".into());
                    }
                });
                passes += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            passes
        })
    };
    let worker = |seed: u64| {
        let (ids, a, b, broken, counted) = (
            ids.clone(),
            a.clone(),
            b.clone(),
            broken.clone(),
            counted.clone(),
        );
        move || {
            let mut rng = common::Rng(seed * 2 + 1);
            for _ in 0..6 {
                for _ in 0..(rng.next() % 300) {
                    match rng.next() % 4 {
                        0 => {
                            checked_with(&ids, &a, 1, &broken);
                        }
                        1 => {
                            checked_with(&ids, &b, 2, &broken);
                            counted.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        2 => {
                            a.with(|_| {
                                checked_with(&ids, &b, 2, &broken);
                            });
                            counted.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        _ => {
                            checked_with(&ids, &a, 1, &broken);
                            std::thread::yield_now();
                        }
                    }
                    counted.fetch_add(1 << 32, Ordering::SeqCst);
                }
                // Idle for a few scan periods: the id is revoked.
                if rng.next() % 2 == 0 {
                    std::thread::sleep(MIN_SCAN_PERIOD * 3);
                }
            }
        }
    };
    let mut seed = 1;
    for _wave in 0..6 {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                seed += 1;
                std::thread::spawn(worker(seed))
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }
    done.store(true, Ordering::SeqCst);
    let passes = reader.join().unwrap();
    eprintln!("reader passes: {passes}");
    broken.assert_none("slot exclusivity under churn");
    let counted = counted.load(Ordering::SeqCst);
    let (in_a, in_b) = (counted >> 32, counted & 0xffff_ffff);
    assert!(
        eventually(|| sum(&a) + sum(&b) + folded.load(Ordering::SeqCst) == in_a + in_b),
        "live {} + {} and folded {} against {in_a} + {in_b}",
        sum(&a),
        sum(&b),
        folded.load(Ordering::SeqCst)
    );
    // Every thread left: the ids go, and with them the slots.
    assert!(eventually(|| ids.held() == 0
        && a.live() == 0
        && b.live() == 0));
}

/// After threads shrink from 8 to 2, the survivors' ids are below 2 within two scan
/// periods (waited for as a state) and their slots are those ids' (tags).
#[test]
fn survivors_move_down_to_their_new_ids_slots() {
    let sched = Scheduler::new().unwrap();
    let ids = Arc::new(
        IdSpace::builder()
            .scan_period(MIN_SCAN_PERIOD)
            .build(&sched),
    );
    let folded = Arc::new(AtomicU64::new(0));
    let broken = Arc::new(Broken::default());
    let a = Arc::new(tagged(&ids, 1, &folded));
    for round in 0..5 {
        let start = Arc::new(Barrier::new(8));
        let all_in = Arc::new(Barrier::new(9));
        let stop = Arc::new(AtomicBool::new(false));
        let latest: Arc<Vec<AtomicUsize>> =
            Arc::new((0..2).map(|_| AtomicUsize::new(UNSET)).collect());
        let mut leavers = Vec::new();
        let mut survivors = Vec::new();
        for n in 0..8 {
            let (ids, a, broken, start, all_in, stop, latest) = (
                ids.clone(),
                a.clone(),
                broken.clone(),
                start.clone(),
                all_in.clone(),
                stop.clone(),
                latest.clone(),
            );
            let thread = std::thread::spawn(move || {
                // All 8 hold an id at once: each waits for the others inside `with`.
                a.with(|_| {
                    start.wait();
                });
                checked_with(&ids, &a, 1, &broken);
                all_in.wait();
                if n < 6 {
                    return;
                }
                while !stop.load(Ordering::SeqCst) {
                    checked_with(&ids, &a, 1, &broken);
                    latest[n - 6].store(a.with(|_| ids.enter().get()), Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            if n < 6 {
                leavers.push(thread)
            } else {
                survivors.push(thread)
            }
        }
        all_in.wait();
        eprintln!(
            "round {round}: threads {} held {} high water {}",
            ids.threads(),
            ids.held(),
            ids.high_water()
        );
        for thread in leavers {
            thread.join().unwrap();
        }
        assert!(
            eventually(|| latest.iter().all(|id| id.load(Ordering::SeqCst) < 2)),
            "round {round}: survivors on ids {:?}",
            latest
                .iter()
                .map(|id| id.load(Ordering::SeqCst))
                .collect::<Vec<_>>()
        );
        stop.store(true, Ordering::SeqCst);
        for thread in survivors {
            thread.join().unwrap();
        }
    }
    broken.assert_none("moving down");
}

/// A `with` in a thread-local destructor that runs after nicework's exit hook, on a thread
/// whose cache held slots of both `PerCid`s: the late `with`s get a slot of the id they
/// pin, beside another thread hammering, and the thread's ids are released by `join`.
#[test]
fn late_destructor_withs_after_the_exit_hook_use_their_own_slots() {
    let sched = Scheduler::manual();
    let ids: &'static IdSpace = Box::leak(Box::new(IdSpace::new(&sched)));
    let folded = Arc::new(AtomicU64::new(0));
    let broken = Arc::new(Broken::default());
    let a = Arc::new(tagged(ids, 1, &folded));
    let b = Arc::new(tagged(ids, 2, &folded));
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (a, b, broken, stop) = (a.clone(), b.clone(), broken.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                checked_with(ids, &a, 1, &broken);
                checked_with(ids, &b, 2, &broken);
                n += 2;
            }
            n
        })
    };
    let mut late_counts = 0;
    for _ in 0..50 {
        let (a2, b2, broken2) = (a.clone(), b.clone(), broken.clone());
        let (a3, b3, broken3) = (a.clone(), b.clone(), broken.clone());
        let handle = std::thread::spawn(move || {
            // Fill the cache on the normal path first.
            checked_with(ids, &a3, 1, &broken3);
            checked_with(ids, &b3, 2, &broken3);
            checked_with(ids, &a3, 1, &broken3);
            let inner = common::child::in_a_late_destructor(move || {
                checked_with(ids, &a2, 1, &broken2);
                checked_with(ids, &a2, 1, &broken2);
                a2.with(|_| checked_with(ids, &b2, 2, &broken2));
                checked_with(ids, &b2, 2, &broken2);
            });
            inner.join().unwrap();
        });
        handle.join().unwrap();
        late_counts += 3 + 4;
    }
    stop.store(true, Ordering::SeqCst);
    let hammered = hammer.join().unwrap();
    broken.assert_none("late destructor withs");
    // Only the hammer's id is left.
    assert!(eventually(|| ids.held() == 0));
    sched.advance(SCAN);
    sched.advance(SCAN);
    assert_eq!(
        sum(&a) + sum(&b) + folded.load(Ordering::SeqCst),
        hammered + late_counts
    );
}

/// `fork()` in a thread whose cache holds a slot: in the child, the thread's `with` finds
/// its own slot (the value it wrote before the fork), a nested `with` and a new thread
/// work; and after its id was revoked and given to another thread before the fork, the
/// child's `with` does not write into that thread's slot.
#[cfg(unix)]
#[test]
fn fork_in_a_thread_with_a_cached_slot() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let folded = Arc::new(AtomicU64::new(0));
    let a = Arc::new(tagged(&ids, 1, &folded));
    let b = Arc::new(tagged(&ids, 2, &folded));
    let broken = Broken::default();
    for _ in 0..3 {
        checked_with(&ids, &a, 1, &broken);
    }
    checked_with(&ids, &b, 2, &broken);
    let fork_and_check = |expected_a: u64, expected_id: Option<usize>| {
        let (ids, a, b) = (ids.clone(), a.clone(), b.clone());
        std::thread::spawn(move || {
            // SAFETY: the child runs only this test's code and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let broken = Broken::default();
                let found = checked_with(&ids, &a, 1, &broken);
                let id = a.with(|_| ids.enter().get());
                a.with(|_| checked_with(&ids, &b, 2, &broken));
                let other = std::thread::spawn({
                    let (ids, a) = (ids.clone(), a.clone());
                    move || {
                        let broken = Broken::default();
                        checked_with(&ids, &a, 1, &broken);
                        (
                            broken.count.load(Ordering::SeqCst),
                            a.with(|_| ids.enter().get()),
                        )
                    }
                })
                .join()
                .unwrap();
                let code = if broken.count.load(Ordering::SeqCst) != 0 || other.0 != 0 {
                    3
                } else if expected_a != u64::MAX && found != expected_a {
                    4
                } else if expected_id.is_some_and(|e| e != id) {
                    5
                } else if other.1 == id {
                    6
                } else {
                    0
                };
                // SAFETY: leaves the child without running the parent's destructors.
                unsafe { libc::_exit(code) };
            }
            common::child::wait_for_forked_child(pid, Duration::from_secs(20))
        })
    };
    // In a thread: its own first slot, so fork with a thread-local cache holding it.
    let in_thread = {
        let (ids, a) = (ids.clone(), a.clone());
        std::thread::spawn(move || {
            let broken = Broken::default();
            for _ in 0..5 {
                checked_with(&ids, &a, 1, &broken);
            }
            let id = a.with(|_| ids.enter().get());
            // SAFETY: the child runs only this test's code and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let broken = Broken::default();
                let found = checked_with(&ids, &a, 1, &broken);
                let again = checked_with(&ids, &a, 1, &broken);
                let id_now = a.with(|_| ids.enter().get());
                let code = if broken.count.load(Ordering::SeqCst) != 0 {
                    3
                } else if found != 5 || again != 6 {
                    4
                } else if id_now != id {
                    5
                } else {
                    0
                };
                // SAFETY: as above.
                unsafe { libc::_exit(code) };
            }
            common::child::wait_for_forked_child(pid, Duration::from_secs(20))
        })
    };
    assert_eq!(
        in_thread.join().unwrap(),
        Some(0),
        "fork with a cached slot"
    );
    // A fork from another (new) thread, which takes the id the last one released (and
    // its slot's value).
    assert_eq!(fork_and_check(u64::MAX, None).join().unwrap(), Some(0));
    broken.assert_none("parent");
    // Revoked before the fork and taken by another thread: the forking thread's cache
    // (filled before) must not be used in the child.
    let stale = Owner::start();
    {
        let (ids, a) = (ids.clone(), a.clone());
        stale.run(move || {
            let broken = Broken::default();
            checked_with(&ids, &a, 1, &broken);
            checked_with(&ids, &a, 1, &broken);
            assert_eq!(broken.count.load(Ordering::SeqCst), 0);
        });
    }
    sched.advance(SCAN);
    sched.advance(SCAN);
    assert_eq!(ids.held(), 0);
    let other = Owner::start();
    {
        let (ids, a) = (ids.clone(), a.clone());
        other.run(move || {
            let broken = Broken::default();
            checked_with(&ids, &a, 1, &broken);
            a.with(|slot| slot.count.store(1_000_000, Ordering::SeqCst));
            assert_eq!(broken.count.load(Ordering::SeqCst), 0);
        });
    }
    let (code_tx, code) = mpsc::channel();
    {
        let (ids, a) = (ids.clone(), a.clone());
        stale.run(move || {
            // SAFETY: the child runs only this test's code and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let broken = Broken::default();
                let found = checked_with(&ids, &a, 1, &broken);
                let code = if broken.count.load(Ordering::SeqCst) != 0 {
                    3
                } else if found == 1_000_000 {
                    4
                } else {
                    0
                };
                // SAFETY: as above.
                unsafe { libc::_exit(code) };
            }
            code_tx
                .send(common::child::wait_for_forked_child(
                    pid,
                    Duration::from_secs(20),
                ))
                .unwrap();
        });
    }
    assert_eq!(
        code.recv().unwrap(),
        Some(0),
        "fork after the id was revoked and reused"
    );
    drop((stale, other));
}

/// The space's and the `PerCid`'s last handles dropped while live threads hold cached
/// slots of them; then a new space and `PerCid` (likely at the same addresses): the
/// threads' `with`s start fresh. Under ASan/valgrind, a stale slot would be a use after
/// free.
#[test]
fn a_space_dropped_while_threads_hold_cached_slots() {
    let broken = Arc::new(Broken::default());
    let owners: Vec<Owner> = (0..3).map(|_| Owner::start()).collect();
    for round in 0..40u64 {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        let folded = Arc::new(AtomicU64::new(0));
        let a = Arc::new(tagged(&ids, round, &folded));
        for owner in &owners {
            let (ids, a, broken) = (ids.clone(), a.clone(), broken.clone());
            owner.run(move || {
                let found = checked_with(&ids, &a, round, &broken);
                let again = checked_with(&ids, &a, round, &broken);
                if found != 0 || again != 1 {
                    broken.note(format!("round {round}: found {found}, {again}"));
                }
            });
        }
        assert_eq!(sum(&a), 6);
        // Last handles: the owners keep nothing but their records and caches.
        drop(a);
        drop(ids);
        drop(sched);
    }
    broken.assert_none("a space dropped under cached slots");
    drop(owners);
}

//! The concurrency-id guarantees: unique, dense, compacting ids, an idle space that costs
//! nothing, and per-id storage that follows the live concurrency.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::eventually;
use nicework::{IdSpace, PerCid, Scheduler};

const SCAN: Duration = Duration::from_millis(100);

/// The kernel's `mm_cid_compaction_test`: a thread per "CPU" enters, all but one exit, and
/// the survivor's id must reach 0. Here it does at the survivor's first enter after the
/// joins, well inside the two scan periods the kernel test allows.
#[test]
fn compaction_selftest_survivor_reaches_zero() {
    let sched = Scheduler::new().unwrap();
    let ids = Arc::new(IdSpace::new(&sched));
    let entered = Arc::new(Barrier::new(8));
    let stop = Arc::new(AtomicBool::new(false));
    let (id_tx, id_rx) = mpsc::channel();
    let survivor_id = Arc::new(AtomicUsize::new(usize::MAX));
    let threads: Vec<_> = (0..8)
        .map(|index| {
            let (ids, entered, stop, id_tx, survivor) = (
                ids.clone(),
                entered.clone(),
                stop.clone(),
                id_tx.clone(),
                survivor_id.clone(),
            );
            std::thread::spawn(move || {
                let mine = ids.enter().get();
                entered.wait();
                id_tx.send((mine, index)).unwrap();
                // Keep entering until the leader picks the survivor (the one with id 7).
                loop {
                    drop(ids.enter());
                    match survivor.load(Ordering::SeqCst) {
                        usize::MAX => std::thread::sleep(Duration::from_millis(1)),
                        chosen if chosen == index => break,
                        _ => return None, // exit
                    }
                }
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let first = ids.enter().get();
                Some((mine, first, ids.high_water()))
            })
        })
        .collect();
    let mut seen: Vec<(usize, usize)> = (0..8).map(|_| id_rx.recv().unwrap()).collect();
    seen.sort();
    let ids_seen: Vec<usize> = seen.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        ids_seen,
        (0..8).collect::<Vec<_>>(),
        "ids are dense and unique"
    );
    survivor_id.store(seen[7].1, Ordering::SeqCst);
    // Wait for the seven to exit; their ids are released before join returns.
    assert!(eventually(|| ids.threads() == 1));
    assert_eq!(ids.held(), 1);
    stop.store(true, Ordering::SeqCst);
    let results: Vec<_> = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(
        results,
        [(7, 0, 1)],
        "survivor: id before, id after, high water"
    );
    assert_eq!(ids.held(), 0, "the survivor's exit released its id");
}

#[test]
fn nested_enter_returns_the_same_id() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let outer = ids.enter();
    let inner = ids.enter();
    assert_eq!(outer.get(), inner.get());
    drop(inner);
    assert_eq!(ids.enter().get(), outer.get());
}

#[test]
fn a_thread_moves_down_when_its_id_is_not_below_held() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let spawn = |ids: Arc<IdSpace>| {
        let (to_thread, from_main) = mpsc::channel::<bool>();
        let (to_main, from_thread) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let id = ids.enter().get(); // the guard drops here, before main hears of it
            to_main.send(id).unwrap();
            while from_main.recv().unwrap() {
                let id = ids.enter().get(); // the guard drops here, before main hears of it
                to_main.send(id).unwrap();
            }
        });
        (to_thread, from_thread, thread)
    };
    let (a_tx, a_rx, a) = spawn(ids.clone());
    assert_eq!(a_rx.recv().unwrap(), 0);
    let (b_tx, b_rx, b) = spawn(ids.clone());
    assert_eq!(b_rx.recv().unwrap(), 1);
    a_tx.send(false).unwrap();
    a.join().unwrap(); // A exits: its id is free before join returns
    assert_eq!((ids.held(), ids.high_water()), (1, 2));
    b_tx.send(true).unwrap();
    assert_eq!(
        b_rx.recv().unwrap(),
        0,
        "1 is not below held (1): moved to 0"
    );
    assert_eq!((ids.held(), ids.high_water()), (1, 1));
    b_tx.send(false).unwrap();
    b.join().unwrap();
}

/// A thread whose id was marked to move when `held` shrank below it keeps that id if
/// `held` grew back past it before its next `enter()` (it moves only if its id is not below
/// `held` then), and a nested `enter()` under the mark returns the outer guard's id.
#[test]
fn a_thread_marked_to_move_keeps_its_id_once_held_grows_back() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    // A thread that enters and reports its id, keeping that guard if `hold`; then, while
    // main says `true`, enters again (nested under the kept guard) and reports; then drops
    // the kept guard and, if main says `true`, makes one more first-level enter and
    // reports; it exits when main hangs up.
    let spawn = |ids: Arc<IdSpace>, hold: bool| {
        let (to_thread, from_main) = mpsc::channel::<bool>();
        let (to_main, from_thread) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let first = ids.enter();
            to_main.send(first.get()).unwrap();
            let first = if hold { Some(first) } else { None };
            while from_main.recv() == Ok(true) {
                to_main.send(ids.enter().get()).unwrap();
            }
            drop(first);
            // Dropped: the next command is one more first-level enter.
            if from_main.recv() == Ok(true) {
                to_main.send(ids.enter().get()).unwrap();
            }
            // Exit (releasing the id) only once main hangs up.
            while from_main.recv().is_ok() {}
        });
        (to_thread, from_thread, thread)
    };
    let (a_tx, a_rx, a) = spawn(ids.clone(), true);
    assert_eq!(a_rx.recv().unwrap(), 0);
    let (b_tx, b_rx, b) = spawn(ids.clone(), true);
    assert_eq!(b_rx.recv().unwrap(), 1);
    drop(a_tx);
    a.join().unwrap(); // A exits: held is 1, B's id 1 is marked to move
    assert_eq!((ids.held(), ids.high_water()), (1, 2));
    b_tx.send(true).unwrap();
    assert_eq!(
        b_rx.recv().unwrap(),
        1,
        "nested under the mark: the outer id"
    );
    let (c_tx, c_rx, c) = spawn(ids.clone(), false);
    assert_eq!(c_rx.recv().unwrap(), 0, "C takes the lowest free id");
    assert_eq!(ids.held(), 2);
    b_tx.send(false).unwrap(); // B drops its guard, then enters again
    b_tx.send(true).unwrap();
    assert_eq!(
        b_rx.recv().unwrap(),
        1,
        "1 is below held (2) again: B keeps it"
    );
    assert_eq!((ids.held(), ids.high_water()), (2, 2));
    drop((b_tx, c_tx));
    c.join().unwrap();
    b.join().unwrap();
    assert_eq!(ids.held(), 0);
}

#[test]
fn an_idle_thread_loses_its_id_and_reacquires_lazily() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let (to_thread, from_main) = mpsc::channel::<()>();
    let (to_main, from_thread) = mpsc::channel();
    let thread = {
        let ids = ids.clone();
        std::thread::spawn(move || {
            let id = ids.enter().get(); // the guard drops here, before main hears of it
            to_main.send(id).unwrap();
            from_main.recv().unwrap();
            let id = ids.enter().get(); // the guard drops here, before main hears of it
            to_main.send(id).unwrap();
        })
    };
    assert_eq!(from_thread.recv().unwrap(), 0);
    assert_eq!(ids.held(), 1);
    sched.advance(SCAN); // clears the used mark
    assert_eq!(ids.held(), 1);
    sched.advance(SCAN); // idle for a whole period: reclaimed
    assert_eq!((ids.held(), ids.high_water(), ids.threads()), (0, 0, 1));
    to_thread.send(()).unwrap();
    assert_eq!(from_thread.recv().unwrap(), 0, "re-acquired lazily");
    thread.join().unwrap();
    assert_eq!(ids.held(), 0);
}

#[test]
fn a_pinned_thread_is_never_reclaimed() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let guard = ids.enter();
    for _ in 0..5 {
        sched.advance(SCAN);
    }
    assert_eq!(ids.held(), 1);
    assert_eq!(ids.enter().get(), guard.get());
}

#[test]
fn uniqueness_under_entering_sleeping_exiting_and_reclaim() {
    let sched = Scheduler::builder()
        .slack(Duration::from_micros(500))
        .build()
        .unwrap();
    let ids = Arc::new(
        IdSpace::builder()
            .scan_period(Duration::from_millis(2))
            .build(&sched),
    );
    let claims: Arc<Vec<AtomicUsize>> = Arc::new((0..64).map(|_| AtomicUsize::new(0)).collect());
    let conflicts = Arc::new(AtomicUsize::new(0));
    let enters = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut generation = 0usize;
    let mut live = Vec::new();
    while Instant::now() < deadline {
        while live.len() < 8 {
            generation += 1;
            let (ids, claims, conflicts, enters) = (
                ids.clone(),
                claims.clone(),
                conflicts.clone(),
                enters.clone(),
            );
            let token = generation;
            live.push(std::thread::spawn(move || {
                let mut seed = token as u64 * 0x9E37_79B9 + 1;
                let mut next = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                for _ in 0..(next() % 200) {
                    let cid = ids.enter();
                    let id = cid.get();
                    if claims[id].swap(token, Ordering::SeqCst) != 0 {
                        conflicts.fetch_add(1, Ordering::SeqCst);
                    }
                    if ids.enter().get() != id {
                        conflicts.fetch_add(1, Ordering::SeqCst); // nested must match
                    }
                    std::hint::black_box(next());
                    claims[id].store(0, Ordering::SeqCst);
                    enters.fetch_add(1, Ordering::Relaxed);
                    drop(cid);
                    if next() % 8 == 0 {
                        // Long enough to be reclaimed as idle.
                        std::thread::sleep(Duration::from_millis(next() % 6));
                    }
                }
            }));
        }
        let finished = live.remove(0);
        finished.join().unwrap();
    }
    for thread in live {
        thread.join().unwrap();
    }
    println!(
        "{} enters, {generation} threads",
        enters.load(Ordering::Relaxed)
    );
    assert_eq!(
        conflicts.load(Ordering::SeqCst),
        0,
        "two live guards shared an id"
    );
    assert!(enters.load(Ordering::Relaxed) > 1000);
    assert_eq!(ids.held(), 0, "every exited thread released its id");
}

#[test]
fn percid_trims_every_slot_of_exited_threads_exactly_once() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let caches: Arc<PerCid<Vec<usize>>> = Arc::new(PerCid::new(&ids, Vec::new));
    let reclaimed = Arc::new(Mutex::new(Vec::new()));
    let r = reclaimed.clone();
    caches.on_reclaim(move |slot| r.lock().unwrap().append(slot));
    let all_in = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (caches, all_in) = (caches.clone(), all_in.clone());
            std::thread::spawn(move || {
                caches.with(|slot| slot.push(7));
                all_in.wait(); // all eight hold an id at once: eight slots
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!((caches.live(), ids.held()), (8, 0));
    sched.advance(SCAN);
    assert_eq!(caches.live(), 0);
    assert_eq!(
        *reclaimed.lock().unwrap(),
        vec![7; 8],
        "each slot reclaimed once"
    );
    sched.advance(SCAN * 5);
    assert_eq!(reclaimed.lock().unwrap().len(), 8);
}

#[test]
fn percid_keeps_slots_below_the_high_water() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let caches: Arc<PerCid<u32>> = Arc::new(PerCid::new(&ids, || 0));
    let trimmed = Arc::new(AtomicUsize::new(0));
    let t = trimmed.clone();
    caches.on_reclaim(move |_| {
        t.fetch_add(1, Ordering::SeqCst);
    });
    // The main thread keeps id 0 busy; a helper takes id 1, writes, and exits.
    let _main = ids.enter();
    caches.with(|v| *v = 42);
    {
        let caches = caches.clone();
        std::thread::spawn(move || caches.with(|v| *v = 9))
            .join()
            .unwrap();
    }
    assert_eq!(caches.live(), 2);
    sched.advance(SCAN);
    assert_eq!(
        trimmed.load(Ordering::SeqCst),
        1,
        "slot 1 trimmed exactly once"
    );
    assert_eq!(caches.with(|v| *v), 42, "slot 0 kept its value");
    sched.advance(SCAN);
    assert_eq!(trimmed.load(Ordering::SeqCst), 1);
}

#[test]
#[should_panic(expected = "re-entrantly")]
fn percid_with_nested_on_the_same_slot_panics() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let caches: PerCid<u32> = PerCid::new(&ids, || 0);
    caches.with(|_| caches.with(|_| ()));
}

#[test]
fn an_idle_space_costs_nothing() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    {
        let ids = ids.clone();
        std::thread::spawn(move || drop(ids.enter()))
            .join()
            .unwrap();
    }
    sched.advance(SCAN * 3);
    let runs = ids.compaction_stats().runs;
    assert!(runs >= 1, "the exit's trim scan ran");
    sched.advance(Duration::from_secs(3600));
    assert_eq!(
        ids.compaction_stats().runs,
        runs,
        "an idle space ran its work"
    );
    assert_eq!(sched.metrics().armed, 0);
}

#[test]
fn an_idle_space_causes_no_worker_wakeups() {
    let sched = Scheduler::new().unwrap();
    let ids = Arc::new(
        IdSpace::builder()
            .scan_period(Duration::from_millis(10))
            .build(&sched),
    );
    for _ in 0..4 {
        let ids = ids.clone();
        std::thread::spawn(move || drop(ids.enter()))
            .join()
            .unwrap();
    }
    assert!(eventually(|| sched.metrics().armed == 0 && ids.held() == 0));
    std::thread::sleep(Duration::from_millis(30));
    let runs = ids.compaction_stats().runs;
    let before = sched.metrics().worker_wakeups;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sched.metrics().worker_wakeups, before);
    assert_eq!(ids.compaction_stats().runs, runs);
}

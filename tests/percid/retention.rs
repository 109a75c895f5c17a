//! `PerCid::retention`: a slot is trimmed only once it has stayed above the high water for
//! the retention, then exactly once; a thread back within it finds its value; with every
//! id released the compaction work wakes for the retention and then parks; zero is the
//! default, `Duration::MAX` never trims; a high water that comes back up restarts the
//! count. All on the manual clock, so each step is a state, not a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nicework::{IdSpace, PerCid, Scheduler};

use crate::common::percid::Owner;

const SCAN: Duration = Duration::from_millis(100);
const RETENTION: Duration = Duration::from_secs(1);

fn counted(ids: &IdSpace, retention: Duration) -> (Arc<PerCid<u64>>, Arc<AtomicUsize>) {
    let reclaimed = Arc::new(AtomicUsize::new(0));
    let slots = PerCid::with_reclaim(ids, || 0, {
        let reclaimed = reclaimed.clone();
        move |_: &mut u64| {
            reclaimed.fetch_add(1, Ordering::SeqCst);
        }
    })
    .retention(retention);
    (Arc::new(slots), reclaimed)
}

fn put_step(slots: &Arc<PerCid<u64>>, value: u64) -> impl FnOnce() + Send + 'static {
    let slots = slots.clone();
    move || slots.put(value).unwrap()
}

/// A keeper (id 0, which `scan_with` keeps busy) and a thread that will idle (id 1),
/// each with a value put in its slot.
fn keeper_and_idle(slots: &Arc<PerCid<u64>>) -> (Owner, Owner) {
    let keeper = Owner::start();
    keeper.run(put_step(slots, 1));
    let idle = Owner::start();
    idle.run(put_step(slots, 2));
    (keeper, idle)
}

/// Advances one scan period with `keeper` entering first, so it keeps its id.
fn scan_with(sched: &Scheduler, keeper: &Owner, ids: &Arc<IdSpace>) {
    let ids = ids.clone();
    keeper.run(move || drop(ids.enter()));
    sched.advance(SCAN);
}

#[test]
fn no_trim_within_the_retention_one_after_it_exactly_once() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let (slots, reclaimed) = counted(&ids, RETENTION);
    let (keeper, idle) = keeper_and_idle(&slots);
    assert_eq!(ids.high_water(), 2);
    // Two scans revoke the idle thread's id: the high water drops to 1.
    scan_with(&sched, &keeper, &ids);
    scan_with(&sched, &keeper, &ids);
    assert_eq!(ids.high_water(), 1);
    let dropped_at = sched.now();
    while sched.now() < dropped_at + RETENTION {
        assert_eq!(
            reclaimed.load(Ordering::SeqCst),
            0,
            "trimmed within the retention"
        );
        assert_eq!(slots.live(), 2);
        scan_with(&sched, &keeper, &ids);
    }
    // The retention has passed; the next scan trims, once.
    scan_with(&sched, &keeper, &ids);
    assert_eq!(reclaimed.load(Ordering::SeqCst), 1);
    assert_eq!(slots.live(), 1);
    for _ in 0..20 {
        scan_with(&sched, &keeper, &ids);
    }
    assert_eq!(reclaimed.load(Ordering::SeqCst), 1);
    keeper.exit();
    idle.exit();
}

#[test]
fn a_thread_back_within_the_retention_finds_its_value() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let (slots, reclaimed) = counted(&ids, RETENTION);
    let (keeper, idle) = keeper_and_idle(&slots);
    for _ in 0..8 {
        scan_with(&sched, &keeper, &ids);
    }
    assert_eq!(ids.high_water(), 1);
    // Back after 800 ms idle: the lowest free id is its old one, and so is the value.
    let found = Arc::new(AtomicUsize::new(0));
    idle.run({
        let (slots, found) = (slots.clone(), found.clone());
        move || found.store(slots.take().unwrap_or(0) as usize, Ordering::SeqCst)
    });
    assert_eq!(found.load(Ordering::SeqCst), 2);
    assert_eq!(reclaimed.load(Ordering::SeqCst), 0);
    // Without a retention the same idle loses the value at the first scan after the drop.
    let (plain, plain_reclaimed) = counted(&ids, Duration::ZERO);
    keeper.run(put_step(&plain, 1));
    idle.run(put_step(&plain, 2));
    for _ in 0..3 {
        scan_with(&sched, &keeper, &ids);
    }
    assert_eq!(plain_reclaimed.load(Ordering::SeqCst), 1);
    idle.run({
        let (plain, found) = (plain.clone(), found.clone());
        move || found.store(plain.take().unwrap_or(0) as usize, Ordering::SeqCst)
    });
    assert_eq!(found.load(Ordering::SeqCst), 0);
    keeper.exit();
    idle.exit();
}

#[test]
fn with_every_id_released_the_work_wakes_for_the_retention_then_parks() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let (slots, reclaimed) = counted(&ids, RETENTION);
    let gone = Owner::start();
    gone.run(put_step(&slots, 7));
    gone.exit();
    assert_eq!(ids.held(), 0);
    assert_eq!(slots.live(), 1);
    // Nothing is held, but the slot waits for its retention: the work does not park.
    let mut steps = 0;
    while reclaimed.load(Ordering::SeqCst) == 0 {
        assert!(steps < 40, "never trimmed");
        sched.advance(SCAN);
        steps += 1;
    }
    assert!(
        steps >= 10,
        "trimmed after {steps} scans, within the retention"
    );
    assert_eq!(slots.live(), 0);
    let runs = ids.compaction_stats().runs;
    for _ in 0..50 {
        sched.advance(SCAN);
    }
    assert_eq!(
        ids.compaction_stats().runs,
        runs,
        "the idle space kept scanning"
    );
    assert_eq!(reclaimed.load(Ordering::SeqCst), 1);
}

#[test]
fn zero_trims_as_without_one_and_the_longest_retention_never_trims() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let (zero, zero_reclaimed) = counted(&ids, Duration::ZERO);
    let (never, never_reclaimed) = counted(&ids, Duration::MAX);
    let gone = Owner::start();
    gone.run({
        let (zero, never) = (zero.clone(), never.clone());
        move || {
            zero.put(1).unwrap();
            never.put(2).unwrap();
        }
    });
    gone.exit();
    sched.advance(SCAN);
    assert_eq!(zero_reclaimed.load(Ordering::SeqCst), 1);
    for _ in 0..100 {
        sched.advance(SCAN);
    }
    assert_eq!(never_reclaimed.load(Ordering::SeqCst), 0);
    assert_eq!(never.live(), 1);
    // Dropping the PerCid drops what it kept (without the callback, as for any slot).
    drop(never);
    sched.advance(SCAN);
}

#[test]
fn a_high_water_that_comes_back_up_restarts_the_count() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let (slots, reclaimed) = counted(&ids, RETENTION);
    let (keeper, idle) = keeper_and_idle(&slots);
    // Idle for 700 ms (revoked after two scans), then back for a moment (it retakes id 1
    // and its value stays), then idle again.
    for _ in 0..7 {
        scan_with(&sched, &keeper, &ids);
    }
    assert_eq!(ids.high_water(), 1);
    idle.run({
        let ids = ids.clone();
        move || drop(ids.enter())
    });
    assert_eq!(ids.high_water(), 2);
    for _ in 0..2 {
        scan_with(&sched, &keeper, &ids);
    }
    // Revoked again: the second drop counts from now, not from the first.
    scan_with(&sched, &keeper, &ids);
    assert_eq!(ids.high_water(), 1);
    for _ in 0..8 {
        scan_with(&sched, &keeper, &ids);
        assert_eq!(reclaimed.load(Ordering::SeqCst), 0);
    }
    for _ in 0..4 {
        scan_with(&sched, &keeper, &ids);
    }
    assert_eq!(reclaimed.load(Ordering::SeqCst), 1);
    keeper.exit();
    idle.exit();
}

#[test]
fn a_retention_that_never_ends_costs_an_idle_space_no_scans_and_ids_still_compact() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let (slots, reclaimed) = counted(&ids, Duration::MAX);
    let gone = Owner::start();
    gone.run(put_step(&slots, 5));
    gone.exit();
    sched.advance(SCAN);
    let runs = ids.compaction_stats().runs;
    for _ in 0..50 {
        sched.advance(SCAN);
    }
    assert_eq!(
        ids.compaction_stats().runs,
        runs,
        "an idle space kept scanning"
    );
    // A thread that enters brings the work back: its id is revoked once it idles.
    let visitor = Owner::start();
    visitor.run({
        let ids = ids.clone();
        move || drop(ids.enter())
    });
    assert_eq!(ids.held(), 1);
    for _ in 0..3 {
        sched.advance(SCAN);
    }
    assert_eq!(ids.held(), 0);
    assert_eq!(reclaimed.load(Ordering::SeqCst), 0);
    assert_eq!(slots.live(), 1);
    visitor.exit();
}

/// The runs of the space's works, by name.
fn runs_of(sched: &Scheduler, name: &str) -> u64 {
    let mut runs = 0;
    sched.works(|info| {
        if info.name == name {
            runs = info.stats.runs;
        }
    });
    runs
}

#[test]
fn an_idle_space_wakes_once_for_a_slot_kept_behind_many_drops() {
    // Twenty threads leave from the top, one per scan period, after the slot's own
    // thread (id 0): the high water steps down twenty times, but the slot may go only
    // once the last drop is a retention old, and the idle space wakes once, then. (Ids
    // that follow the threads: per-thread mode, which counting 64 CPUs keeps.)
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    nicework::hooks::count_cpus_as(&ids, Some(64));
    let retention = Duration::from_secs(5);
    let (slots, reclaimed) = counted(&ids, retention);
    let mut owners: Vec<Owner> = (0..20).map(|_| Owner::start()).collect();
    for (id, owner) in owners.iter().enumerate() {
        let (ids, slots) = (ids.clone(), slots.clone());
        owner.run(move || {
            assert_eq!(ids.enter().get(), id);
            if id == 0 {
                slots.put(7).unwrap();
            }
        });
    }
    owners.remove(0).exit();
    let mut last_exit = sched.now();
    while let Some(owner) = owners.pop() {
        owner.exit();
        last_exit = sched.now();
        for owner in &owners {
            let ids = ids.clone();
            owner.run(move || drop(ids.enter()));
        }
        sched.advance(SCAN);
    }
    assert_eq!(ids.held(), 0);
    let before = runs_of(&sched, "nicework.cid-retention");
    while reclaimed.load(Ordering::SeqCst) == 0 {
        assert!(sched.now() < last_exit + 2 * retention, "never trimmed");
        sched.advance(Duration::from_millis(10));
    }
    assert!(
        sched.now() >= last_exit + retention,
        "trimmed within the retention"
    );
    assert_eq!(runs_of(&sched, "nicework.cid-retention") - before, 1);
}

#[test]
fn a_reader_in_progress_does_not_keep_an_idle_space_scanning() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let (slots, _) = counted(&ids, Duration::MAX);
    let gone = Owner::start();
    gone.run(put_step(&slots, 5));
    gone.exit();
    for _ in 0..5 {
        sched.advance(SCAN);
    }
    // A reader stays inside its callback, holding the gate, while a visit wakes the scan.
    let (inside_tx, inside) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let reader = std::thread::spawn({
        let slots = slots.clone();
        move || {
            slots.for_each(|_| {
                inside_tx.send(()).unwrap();
                released.recv().unwrap();
            })
        }
    });
    inside.recv().unwrap();
    let visitor = Owner::start();
    visitor.run({
        let ids = ids.clone();
        move || drop(ids.enter())
    });
    for _ in 0..3 {
        sched.advance(SCAN);
    }
    assert_eq!(ids.held(), 0);
    let runs = ids.compaction_stats().runs;
    for _ in 0..20 {
        sched.advance(SCAN);
    }
    assert_eq!(
        ids.compaction_stats().runs,
        runs,
        "an idle space kept scanning"
    );
    release.send(()).unwrap();
    reader.join().unwrap();
    visitor.exit();
}

#[test]
fn a_thread_entering_around_the_moment_a_slot_may_go_neither_loses_nor_repeats_it() {
    for enters_at in [0u64, 90, 110, 900, 990, 1_010, 1_050] {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        let (slots, reclaimed) = counted(&ids, RETENTION);
        let keeper = Owner::start();
        keeper.run({
            let ids = ids.clone();
            move || drop(ids.enter())
        });
        let gone = Owner::start();
        gone.run(put_step(&slots, 5));
        let dropped_at = sched.now();
        gone.exit();
        let mut entered = false;
        while reclaimed.load(Ordering::SeqCst) == 0 {
            let now = (sched.now() - dropped_at).as_millis() as u64;
            assert!(now < 3_000, "entering at {enters_at} ms: never trimmed");
            if !entered && now >= enters_at {
                let ids = ids.clone();
                keeper.run(move || drop(ids.enter()));
                entered = true;
            }
            sched.advance(Duration::from_millis(10));
        }
        assert!(
            sched.now() >= dropped_at + RETENTION,
            "entering at {enters_at} ms: early"
        );
        // Then both works stop for good, and the slot went once.
        for _ in 0..10 {
            sched.advance(SCAN);
        }
        let runs =
            runs_of(&sched, "nicework.cid-compaction") + runs_of(&sched, "nicework.cid-retention");
        for _ in 0..50 {
            sched.advance(SCAN);
        }
        let after =
            runs_of(&sched, "nicework.cid-compaction") + runs_of(&sched, "nicework.cid-retention");
        assert_eq!(
            after, runs,
            "entering at {enters_at} ms: the idle space kept running"
        );
        assert_eq!(reclaimed.load(Ordering::SeqCst), 1);
        keeper.exit();
    }
}

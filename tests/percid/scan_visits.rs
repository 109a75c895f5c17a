//! Scans cost in proportion to change: a trim visits only the `PerCid`s that may have
//! slots above the high water. With 10,000 `PerCid`s whose slots all lie below it, a busy
//! space whose threads come and go above them visits as many storages and slots as with
//! one (counted by `hooks::trim_visits`, not timed).

use std::sync::{Arc, Barrier};
use std::time::Duration;

use nicework::hooks::trim_visits;
use nicework::{IdSpace, PerCid, Scheduler};

use crate::common::percid::{Owner, finishes};

const SCAN: Duration = Duration::from_millis(100);

/// Storages and slots the trims of a busy space visited: a keeper holds id 0 and enters
/// before every scan, `idle` `PerCid`s were used once at id 0, and one busy `PerCid` is
/// used by threads that come and go above the keeper.
fn visits_with(idle: usize) -> (u64, u64) {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let idle_slots: Arc<Vec<PerCid<u64>>> =
        Arc::new((0..idle).map(|_| PerCid::new(&ids, || 0)).collect());
    let busy: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 0));
    let keeper = Owner::start();
    keeper.run({
        let idle_slots = idle_slots.clone();
        move || idle_slots.iter().for_each(|slots| slots.with(|n| *n += 1))
    });
    let before = trim_visits(&ids);
    for round in 0..6 {
        for width in [3, 1, 2] {
            // Together, so they hold ids 1..=width whatever the order they run in.
            let together = Arc::new(Barrier::new(width));
            let passers: Vec<_> = (0..width)
                .map(|_| {
                    let (busy, together) = (busy.clone(), together.clone());
                    std::thread::spawn(move || {
                        busy.with(|n| *n += 1 + round);
                        together.wait();
                    })
                })
                .collect();
            for passer in passers {
                passer.join().unwrap();
            }
            keeper.run({
                let (ids, busy) = (ids.clone(), busy.clone());
                move || {
                    drop(ids.enter());
                    busy.with(|n| *n += 1);
                }
            });
            sched.advance(SCAN);
        }
    }
    let after = trim_visits(&ids);
    assert_eq!(ids.high_water(), 1);
    keeper.exit();
    (after.0 - before.0, after.1 - before.1)
}

#[test]
fn a_scan_with_ten_thousand_idle_per_cids_visits_what_it_visits_with_one() {
    let (one, ten_thousand) = (visits_with(1), visits_with(10_000));
    // The busy PerCid was visited whenever its passers left slots above the keeper.
    assert!(one.0 > 0, "the busy PerCid was never trimmed");
    assert_eq!(one, ten_thousand);
}

#[test]
fn a_dropped_per_cid_is_never_visited() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    for _ in 0..50 {
        let slots: PerCid<u64> = PerCid::new(&ids, || 0);
        finishes("a thread that fills a slot and exits", {
            let ids = ids.clone();
            move || {
                let slots: PerCid<u64> = PerCid::new(&ids, || 0);
                slots.with(|n| *n += 1);
                // Dropped with its slot above the high water once the thread is gone.
                drop(slots);
            }
        });
        slots.with(|n| *n += 1);
        drop(slots);
    }
    let before = trim_visits(&ids);
    for _ in 0..5 {
        sched.advance(SCAN);
    }
    assert_eq!(trim_visits(&ids), before);
}

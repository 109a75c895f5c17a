//! Memory of an `IdSpace` whose `PerCid`s (or which itself) come and go.
//!
//! A `PerCid` registers a `Weak` trim handle with its space, and each `Weak` keeps its
//! storage's allocation (64 bucket pointers, the gate, ...). The scan parks while no id is
//! held and nothing scans once the scheduler is gone, so registration must forget dropped
//! `PerCid`s itself (10,000 created and dropped would otherwise keep 6.5 MB).

use crate::counting;

use nicework::{IdSpace, PerCid, Scheduler};

fn growth_over(rounds: usize, mut f: impl FnMut()) -> isize {
    // Warm-up: one-time allocations.
    for _ in 0..16 {
        f();
    }
    let before = counting::live_bytes();
    for _ in 0..rounds {
        f();
    }
    counting::live_bytes() - before
}

#[test]
fn dropped_percids_leave_nothing_behind_while_no_id_is_held() {
    let _measuring = counting::measuring();
    let sched = Scheduler::new().unwrap();
    let ids = IdSpace::new(&sched);
    let rounds = 10_000;
    let grown = growth_over(rounds, || {
        let p: PerCid<u64> = PerCid::new(&ids, || 0);
        drop(p);
    });
    println!("{rounds} PerCids created and dropped: heap grew by {grown} B");
    assert!(
        grown < 64 * 1024,
        "heap grew by {grown} B ({} B per dropped PerCid) although no PerCid is alive",
        grown / rounds as isize
    );
}

#[test]
fn dropped_percids_leave_nothing_behind_after_the_scheduler_is_gone() {
    let _measuring = counting::measuring();
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    drop(sched);
    // A thread holds an id; nothing scans.
    let _cid = ids.enter();
    let rounds = 10_000;
    let grown = growth_over(rounds, || {
        let p: PerCid<u64> = PerCid::new(&ids, || 0);
        p.with(|n| *n += 1);
        drop(p);
    });
    println!("{rounds} PerCids used and dropped: heap grew by {grown} B");
    assert!(
        grown < 64 * 1024,
        "heap grew by {grown} B ({} B per dropped PerCid) although no PerCid is alive",
        grown / rounds as isize
    );
}

/// Control: spaces (not PerCids) created and dropped on one thread that enters each.
#[test]
fn dropped_spaces_entered_by_this_thread_do_not_accumulate() {
    let _measuring = counting::measuring();
    let sched = Scheduler::manual();
    let rounds = 10_000;
    let grown = growth_over(rounds, || {
        let ids = IdSpace::new(&sched);
        drop(ids.enter());
        drop(ids);
    });
    println!("{rounds} spaces entered and dropped: heap grew by {grown} B");
    // The scheduler keeps some amortized capacity from the first rounds; what matters is
    // that a further 4x does not grow it.
    let grown4 = growth_over(4 * rounds, || {
        let ids = IdSpace::new(&sched);
        drop(ids.enter());
        drop(ids);
    });
    println!("{} more: heap grew by {grown4} B", 4 * rounds);
    assert!(grown4 < 64 * 1024, "heap grew by {grown4} B");
}

/// Control for the control: spaces created and dropped, never entered.
#[test]
fn dropped_spaces_never_entered_do_not_accumulate() {
    let _measuring = counting::measuring();
    let sched = Scheduler::manual();
    let rounds = 10_000;
    let grown = growth_over(rounds, || {
        let ids = IdSpace::new(&sched);
        drop(ids);
    });
    println!("{rounds} spaces never entered, dropped: heap grew by {grown} B");
    let grown4 = growth_over(4 * rounds, || {
        let ids = IdSpace::new(&sched);
        drop(ids);
    });
    println!(
        "{} more spaces never entered, dropped: heap grew by {grown4} B",
        4 * rounds
    );
    let grown_works = growth_over(rounds, || {
        let w = sched.every(std::time::Duration::from_millis(100), |_| {
            nicework::Next::Park
        });
        w.cancel();
        drop(w);
    });
    println!("{rounds} works made, cancelled and dropped: heap grew by {grown_works} B");
    assert!(grown4 < 64 * 1024, "heap grew by {grown4} B");
}

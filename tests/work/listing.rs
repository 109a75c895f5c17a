//! `Scheduler::works`: every live work, and only those, with what its handle would show,
//! against creation, drop, poison, detach and `once` from other threads.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::thread;
use std::time::Duration;

use common::{Rng, eventually};
use nicework::{Next, Scheduler, Work};

/// The names of the listed works, with how often each appears.
fn listed(sched: &Scheduler) -> BTreeMap<String, usize> {
    let mut names = BTreeMap::new();
    sched.works(|w| *names.entry(w.name.to_string()).or_insert(0) += 1);
    names
}

fn names(list: &[(&str, usize)]) -> BTreeMap<String, usize> {
    list.iter().map(|&(n, c)| (n.to_string(), c)).collect()
}

#[test]
fn each_field_shows_what_the_handle_shows() {
    let sched = Scheduler::manual();
    let periodic = sched
        .every(Duration::from_secs(1), |_| Next::Again)
        .named("periodic");
    let parked = sched.work(|_| Next::Park).named("parked");
    let poisoned = sched.work(|_| panic!("boom")).named("poisoned");
    poisoned.schedule(Duration::ZERO);
    sched.advance(Duration::from_millis(1500));
    assert!(poisoned.is_poisoned());
    let mut seen = 0;
    sched.works(|w| {
        seen += 1;
        let handle: &Work = match w.name {
            "periodic" => &periodic,
            "parked" => &parked,
            "poisoned" => &poisoned,
            other => panic!("an unknown work is listed: {other}"),
        };
        assert_eq!(w.stats, handle.stats(), "{}", w.name);
        assert_eq!(w.deadline, handle.deadline(), "{}", w.name);
        assert_eq!(w.running, handle.is_running(), "{}", w.name);
        assert_eq!(w.poisoned, handle.is_poisoned(), "{}", w.name);
    });
    assert_eq!(seen, 3);
    assert_eq!(
        sched.metrics().panics,
        1,
        "the poisoned work's panic is counted"
    );
    // An unnamed work shows its closure's type name, as `Work::name` does.
    let unnamed = sched.work(|_| Next::Park);
    let mut found = false;
    sched.works(|w| found |= w.name == unnamed.name());
    assert!(found);
}

#[test]
fn a_running_work_is_listed_as_running() {
    let sched = Scheduler::new().unwrap();
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let work = sched
        .once(Duration::ZERO, move |_| {
            entered_tx.send(()).unwrap();
            let _ = release_rx.lock().unwrap().recv();
        })
        .named("held");
    entered_rx.recv().unwrap();
    let mut running = None;
    sched.works(|w| running = Some(w.running));
    assert_eq!(running, Some(true));
    release_tx.send(()).unwrap();
    assert!(eventually(|| !work.is_running()));
    // Its run consumed the closure, but its handle lives: still listed, no longer running.
    let mut after = Vec::new();
    sched.works(|w| after.push((w.name.to_string(), w.running, w.stats.runs)));
    assert_eq!(after, [("held".to_string(), false, 1)]);
    drop(work);
    assert!(listed(&sched).is_empty());
}

#[test]
fn dropped_detached_and_finished_works_leave_the_list() {
    let sched = Scheduler::manual();
    let kept = sched.work(|_| Next::Park).named("kept");
    drop(sched.work(|_| Next::Park).named("dropped"));
    // Detached and parked: freed at once.
    sched.work(|_| Next::Park).named("detached idle").detach();
    // Detached and pending: listed until its run ends its life.
    sched
        .once(Duration::from_secs(1), |_| {})
        .named("detached once")
        .detach();
    let stopper = sched.work(|_| Next::Stop).named("detached stop");
    stopper.schedule(Duration::from_secs(2));
    stopper.detach();
    assert_eq!(
        listed(&sched),
        names(&[("kept", 1), ("detached once", 1), ("detached stop", 1)])
    );
    sched.advance(Duration::from_secs(1));
    assert_eq!(listed(&sched), names(&[("kept", 1), ("detached stop", 1)]));
    sched.advance(Duration::from_secs(1));
    assert_eq!(listed(&sched), names(&[("kept", 1)]));
    drop(kept);
    assert!(listed(&sched).is_empty());
}

#[test]
fn works_of_another_scheduler_are_not_listed_and_clones_list_the_same() {
    let a = Scheduler::manual();
    let b = Scheduler::manual();
    let _wa = a.work(|_| Next::Park).named("a");
    let _wb = b.work(|_| Next::Park).named("b");
    assert_eq!(listed(&a), names(&[("a", 1)]));
    assert_eq!(listed(&b), names(&[("b", 1)]));
    assert_eq!(listed(&a.clone()), names(&[("a", 1)]));
}

#[test]
fn the_callback_may_make_drop_and_list_works_and_a_panic_in_it_leaves_the_list_intact() {
    let sched = Scheduler::manual();
    let works: Mutex<Vec<Work>> = Mutex::new(
        (0..10)
            .map(|i| sched.work(|_| Next::Park).named(format!("w{i}")))
            .collect(),
    );
    let mut calls = 0;
    sched.works(|w| {
        calls += 1;
        // Re-entrant listing, creation and drop, all from inside the callback.
        // Each call before this one dropped one of the ten (and its own new work).
        let mut inner = 0;
        sched.works(|_| inner += 1);
        assert_eq!(inner, 11 - calls, "{} saw {inner}", w.name);
        drop(sched.work(|_| Next::Park));
        works.lock().unwrap().pop();
    });
    assert_eq!(
        calls, 10,
        "a snapshot: works made or dropped meanwhile do not change it"
    );
    assert!(listed(&sched).is_empty(), "{:?}", listed(&sched));
    let _kept: Vec<Work> = (0..3)
        .map(|_| sched.work(|_| Next::Park).named("kept"))
        .collect();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sched.works(|_| panic!("a lister's panic"));
    }));
    assert!(caught.is_err(), "the lister's panic propagates");
    assert_eq!(listed(&sched), names(&[("kept", 3)]));
}

#[test]
fn the_list_follows_many_works_down_and_up_again() {
    let sched = Scheduler::manual();
    let mut works: Vec<Work> = (0..5_000)
        .map(|i| sched.work(|_| Next::Park).named(format!("{}", i % 7)))
        .collect();
    let count = || {
        let mut n = 0;
        sched.works(|_| n += 1);
        n
    };
    assert_eq!(count(), 5_000);
    // Drop most of them out of order, so the slots shrink while works sit everywhere.
    let mut rng = Rng(5);
    while works.len() > 40 {
        let i = (rng.next() % works.len() as u64) as usize;
        works.swap_remove(i);
    }
    assert_eq!(count(), 40);
    let mut expected: BTreeMap<String, usize> = BTreeMap::new();
    for w in &works {
        *expected.entry(w.name().to_string()).or_insert(0) += 1;
    }
    assert_eq!(listed(&sched), expected);
    works.extend((0..1_000).map(|_| sched.work(|_| Next::Park)));
    assert_eq!(count(), 1_040);
    works.clear();
    assert_eq!(count(), 0);
}

/// Threads make, drop, detach, poison and run works (`once`, `every`, panicking ones) on
/// a two-worker scheduler while others list it: a listed work is always one of theirs,
/// a work whose handle the test holds is always listed, and at the end exactly the held
/// ones are. Freed works are never read (ASan and valgrind run this suite too).
#[test]
fn listing_races_creation_drop_poison_and_detach_from_other_threads() {
    const OPS: usize = 4_000;
    // The race is between the listing and the works' lives, beside four busy threads.
    let sched = common::normal_priority_builder()
        .workers(2)
        .build()
        .unwrap();
    let held: Vec<Work> = (0..4)
        .map(|_| {
            sched
                .every(Duration::from_millis(1), |_| Next::Again)
                .named("held")
        })
        .collect();
    let churners_done = AtomicUsize::new(0);
    let listings = AtomicUsize::new(0);
    let poisoned_seen = AtomicUsize::new(0);
    let wrong = Mutex::new(Vec::<String>::new());
    thread::scope(|s| {
        for t in 0..2u64 {
            let (sched, churners_done) = (&sched, &churners_done);
            s.spawn(move || {
                let mut rng = Rng(17 + t);
                let mut mine: Vec<Work> = Vec::new();
                for _ in 0..OPS {
                    match rng.next() % 6 {
                        0 => mine.push(sched.work(|_| Next::Park).named("churn")),
                        1 => {
                            let w = sched.work(|_| panic!("poisoned on purpose")).named("churn");
                            w.schedule(Duration::ZERO);
                            mine.push(w);
                        }
                        2 => sched
                            .once(Duration::from_micros(rng.next() % 300), |_| {})
                            .named("churn")
                            .detach(),
                        3 => {
                            let w = sched.work(|_| Next::Stop).named("churn");
                            w.schedule(Duration::from_micros(rng.next() % 300));
                            w.detach();
                        }
                        4 if !mine.is_empty() => {
                            let i = (rng.next() % mine.len() as u64) as usize;
                            mine.swap_remove(i);
                        }
                        _ => {
                            if let Some(w) = mine.pop() {
                                w.detach();
                            }
                        }
                    }
                    if mine.len() > 64 {
                        mine.clear();
                    }
                }
                churners_done.fetch_add(1, SeqCst);
            });
        }
        for _ in 0..2 {
            s.spawn(|| {
                while churners_done.load(SeqCst) < 2 {
                    let mut held_seen = 0;
                    sched.works(|w| match w.name {
                        "held" => held_seen += 1,
                        "churn" => {
                            if w.poisoned {
                                poisoned_seen.fetch_add(1, SeqCst);
                            }
                        }
                        // Made and not yet named: its closure's type name.
                        other if other.contains("listing_races") => {}
                        other => wrong.lock().unwrap().push(format!("unknown work {other}")),
                    });
                    if held_seen != 4 {
                        wrong
                            .lock()
                            .unwrap()
                            .push(format!("{held_seen} held works listed"));
                    }
                    listings.fetch_add(1, SeqCst);
                }
            });
        }
    });
    let wrong = wrong.into_inner().unwrap();
    assert!(
        wrong.is_empty(),
        "{} wrong listings, first: {:?}",
        wrong.len(),
        wrong.first()
    );
    assert!(listings.load(SeqCst) > 0);
    // Detached works end with their runs; then only the held ones are left.
    assert!(
        eventually(|| listed(&sched) == names(&[("held", 4)])),
        "left listed: {:?}",
        listed(&sched)
    );
    eprintln!(
        "{} listings, {} poisoned works seen, {} panics",
        listings.load(SeqCst),
        poisoned_seen.load(SeqCst),
        sched.metrics().panics
    );
    drop(held);
    assert!(listed(&sched).is_empty());
}

/// A detached work's life ends with the scheduler's shutdown: the last handle's drop
/// frees the closures of detached works that were still armed, and unlists them.
#[test]
fn shutdown_ends_the_detached_works_lives() {
    let sched = Scheduler::new().unwrap();
    let (alive_tx, alive_rx) = std::sync::mpsc::channel::<()>();
    for _ in 0..10 {
        let tx = alive_tx.clone();
        sched
            .once(Duration::from_secs(3600), move |_| {
                let _ = &tx;
            })
            .named("far")
            .detach();
    }
    drop(alive_tx);
    assert_eq!(listed(&sched), names(&[("far", 10)]));
    drop(sched);
    // Every closure was dropped by the shutdown: the channel's senders are gone.
    assert_eq!(
        alive_rx.recv_timeout(common::EVENTUALLY),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
    );
}

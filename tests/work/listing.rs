//! `Scheduler::works`: every live work, and only those, with what its handle would show,
//! against creation, drop, poison, detach and `once` from other threads; and against every
//! way a work's life ends, from inside the listing and beside it: re-entrant drops and
//! detaches, panicking listers and closure destructors, the last scheduler handle dropped
//! from a callback's listing, churn over every path on real workers, the registry
//! shrinking under drops, object works holding their own handles, hosted and
//! `run_chunked` and `global()` schedulers, and `fork()`.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
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

// --- every way a work's life ends ---

fn count(sched: &Scheduler) -> usize {
    let mut n = 0;
    sched.works(|_| n += 1);
    n
}

/// Counts live closures.
struct Alive(Arc<AtomicUsize>);
impl Alive {
    fn new(c: &Arc<AtomicUsize>) -> Alive {
        c.fetch_add(1, SeqCst);
        Alive(c.clone())
    }
}
impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// Two workers at the caller's priority: the listing races the works' lives.
fn two_workers() -> Scheduler {
    common::normal_priority_builder()
        .workers(2)
        .build()
        .unwrap()
}

/// A work re-arming every 50 µs whose closure keeps `alive` counted.
fn periodic_keeping(sched: &Scheduler, alive: Alive) -> Work {
    sched
        .every(Duration::from_micros(50), move |_| {
            let _ = &alive;
            Next::Again
        })
        .named("c")
}

/// A detached `once` work, due after `delay`, whose closure keeps `alive` counted.
fn detached_once_keeping(sched: &Scheduler, delay: Duration, alive: &Arc<AtomicUsize>, name: &str) {
    let a = Alive::new(alive);
    sched
        .once(delay, move |_| {
            let _ = &a;
        })
        .named(name)
        .detach();
}

struct PanicOnDrop;
impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !thread::panicking() {
            panic!("closure destructor panics on purpose");
        }
    }
}

#[test]
fn reentrant_listing_drops_creates_and_detaches_inside_the_closure() {
    let sched = Scheduler::manual();
    let alive = Arc::new(AtomicUsize::new(0));
    let mut held: Vec<Option<Work>> = (0..200)
        .map(|i| {
            let a = Alive::new(&alive);
            let w = sched
                .every(Duration::from_millis(1 + i % 7), move |_| {
                    let _ = &a;
                    Next::Again
                })
                .named(format!("w{i}"));
            Some(w)
        })
        .collect();
    let mut made = Vec::new();
    let mut dropped = std::collections::BTreeSet::new();
    let mut visits = 0;
    sched.works(|info| {
        visits += 1;
        // Drop the listed work itself (and others) while the listing still holds it.
        if let Some(i) = info
            .name
            .strip_prefix('w')
            .and_then(|s| s.parse::<usize>().ok())
        {
            if held[i].take().is_some() {
                dropped.insert(i);
            }
            if i + 1 < held.len() {
                if let Some(w) = held[i + 1].take() {
                    w.detach();
                }
            }
        }
        // Re-entrant listing.
        let mut inner = 0;
        sched.works(|_| inner += 1);
        assert!(inner < 10_000);
        if visits % 3 == 0 {
            let a = Alive::new(&alive);
            made.push(
                sched
                    .work(move |_| {
                        let _ = &a;
                        Next::Park
                    })
                    .named("made"),
            );
        }
        if visits % 5 == 0 {
            detached_once_keeping(&sched, Duration::from_millis(3), &alive, "once-detached");
        }
    });
    // Detached periodic works live on; the dropped ones are gone.
    // A work dropped inside the listing is not listed after it; a detached one may be
    // (it re-arms with `Again`).
    assert!(!dropped.is_empty());
    let l = listed(&sched);
    for name in l.keys() {
        if let Some(i) = name.strip_prefix('w').and_then(|s| s.parse::<usize>().ok()) {
            assert!(
                !dropped.contains(&i),
                "w{i} was dropped and is still listed"
            );
        }
    }
    sched.advance(Duration::from_millis(10));
    // The once-detached ran and are gone.
    assert!(
        !listed(&sched).contains_key("once-detached"),
        "{:?}",
        listed(&sched)
    );
    drop(made);
    drop(held);
    let n_detached = count(&sched);
    eprintln!(
        "left (detached periodic): {n_detached}, alive closures {}",
        alive.load(SeqCst)
    );
    assert_eq!(alive.load(SeqCst), n_detached);
    drop(sched);
    assert_eq!(alive.load(SeqCst), 0, "shutdown frees detached closures");
}

#[test]
fn panicking_listing_closure_and_panicking_closure_destructors() {
    let sched = two_workers();
    let works: Vec<Work> = (0..100)
        .map(|_| {
            let p = PanicOnDrop;
            sched
                .every(Duration::from_micros(200), move |_| {
                    let _ = &p;
                    Next::Again
                })
                .named("pd")
        })
        .collect();
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(SeqCst) {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut n = 0;
                    sched.works(|_| {
                        n += 1;
                        if n == 50 {
                            panic!("listing closure panics on purpose");
                        }
                    });
                }));
                let _ = r;
            }
        });
        let mut works = works;
        while let Some(w) = works.pop() {
            drop(w);
        }
        stop.store(true, SeqCst);
    });
    assert!(listed(&sched).is_empty(), "{:?}", listed(&sched));
}

/// The last `Scheduler` is dropped inside the listing closure of a callback, while
/// another thread creates and drops works of a resurrected clone.
#[test]
fn last_handle_dropped_inside_a_callbacks_listing() {
    for round in 0..20 {
        let sched = two_workers();
        let alive = Arc::new(AtomicUsize::new(0));
        for _ in 0..30 {
            detached_once_keeping(&sched, Duration::from_secs(3600), &alive, "far");
        }
        let kept: Vec<Work> = (0..5)
            .map(|_| sched.work(|_| Next::Park).named("kept"))
            .collect();
        let slot = Arc::new(Mutex::new(Some(sched.clone())));
        let resurrected: Arc<Mutex<Option<Scheduler>>> = Arc::new(Mutex::new(None));
        let after = Arc::new(Mutex::new(None::<BTreeMap<String, usize>>));
        let (slot2, res2, after2) = (slot.clone(), resurrected.clone(), after.clone());
        let trigger = sched
            .once(Duration::from_secs(3600), move |cx| {
                let mut first = true;
                cx.scheduler().works(|_| {
                    if first {
                        first = false;
                        drop(slot2.lock().unwrap().take());
                    }
                });
                let mut names = BTreeMap::new();
                cx.scheduler()
                    .works(|w| *names.entry(w.name.to_string()).or_insert(0) += 1);
                *after2.lock().unwrap() = Some(names);
                *res2.lock().unwrap() = Some(cx.scheduler().clone());
            })
            .named("trigger");
        drop(sched);
        assert!(trigger.reschedule(Duration::ZERO));
        assert!(
            eventually(|| after.lock().unwrap().is_some()),
            "round {round}"
        );
        let names = after.lock().unwrap().take().unwrap();
        assert!(
            !names.contains_key("far"),
            "round {round}: detached works listed after shutdown: {names:?}"
        );
        assert_eq!(names.get("kept"), Some(&5), "round {round}: {names:?}");
        assert!(eventually(|| alive.load(SeqCst) == 0), "round {round}");
        let res = resurrected.lock().unwrap().take().unwrap();
        // A work made after shutdown, detached: ended at once.
        let a = Alive::new(&alive);
        res.every(Duration::from_millis(1), move |_| {
            let _ = &a;
            Next::Again
        })
        .named("late")
        .detach();
        let l = listed(&res);
        assert!(!l.contains_key("late") && !l.contains_key("far"), "{l:?}");
        assert_eq!(alive.load(SeqCst), 0);
        drop(trigger);
        drop(kept);
        assert!(listed(&res).is_empty(), "{:?}", listed(&res));
        drop(res);
    }
}

/// Heavy churn on real schedulers: every closure freed, nothing listed at the end,
/// nothing of another scheduler listed.
#[test]
fn churn_over_every_path_on_real_workers_frees_every_closure() {
    let ops: usize = 3000;
    let sched = two_workers();
    let other = Scheduler::new().unwrap();
    let _foreign = other.work(|_| Next::Park).named("foreign");
    let alive = Arc::new(AtomicUsize::new(0));
    let done = AtomicUsize::new(0);
    let wrong = Mutex::new(Vec::<String>::new());
    thread::scope(|s| {
        for t in 0..3u64 {
            let (sched, alive, done) = (&sched, &alive, &done);
            s.spawn(move || {
                let mut rng = Rng(99 + t);
                let mut mine: Vec<Work> = Vec::new();
                for _ in 0..ops {
                    let a = Alive::new(alive);
                    match rng.next() % 10 {
                        0 => mine.push(
                            sched
                                .work(move |_| {
                                    let _ = &a;
                                    Next::Park
                                })
                                .named("c"),
                        ),
                        1 => {
                            let w = sched
                                .every(Duration::from_micros(100), move |_| {
                                    let _ = &a;
                                    Next::Again
                                })
                                .named("c");
                            w.schedule(Duration::ZERO);
                            mine.push(w);
                        }
                        2 => sched
                            .once(Duration::from_micros(rng.next() % 200), move |_| {
                                let _ = &a;
                            })
                            .named("c")
                            .detach(),
                        3 => {
                            let w = sched
                                .once(Duration::ZERO, move |_| {
                                    let _ = &a;
                                })
                                .named("c");
                            mine.push(w);
                        }
                        4 => {
                            let w = sched
                                .work(move |_| {
                                    let _ = &a;
                                    panic!("poison")
                                })
                                .named("c");
                            w.schedule(Duration::ZERO);
                            if rng.next() % 2 == 0 {
                                w.detach()
                            } else {
                                mine.push(w)
                            }
                        }
                        5 => {
                            let w = periodic_keeping(sched, a);
                            w.schedule(Duration::ZERO);
                            let _ = w.cancel_sync();
                            mine.push(w);
                        }
                        6 => {
                            let w = sched
                                .every(Duration::from_micros(50), move |_| {
                                    let _ = &a;
                                    common::counted::spin(Duration::from_micros(30));
                                    Next::Again
                                })
                                .named("c");
                            w.schedule(Duration::ZERO);
                            thread::yield_now();
                            let fut = w.drop_async();
                            let mut fut = std::pin::pin!(fut);
                            let waker = std::task::Waker::noop();
                            let mut cx = std::task::Context::from_waker(waker);
                            if rng.next() % 2 == 0 {
                                let _ = fut.as_mut().poll(&mut cx);
                            }
                            // dropped unresolved or resolved
                        }
                        7 => {
                            let w = periodic_keeping(sched, a);
                            w.schedule(Duration::ZERO);
                            {
                                let fut = w.cancel_async();
                                let mut fut = std::pin::pin!(fut);
                                let waker = std::task::Waker::noop();
                                let mut cx = std::task::Context::from_waker(waker);
                                let _ = fut.as_mut().poll(&mut cx);
                            }
                            if rng.next() % 2 == 0 {
                                w.detach()
                            } else {
                                mine.push(w)
                            }
                        }
                        8 => {
                            let w = sched
                                .work(move |_| {
                                    let _ = &a;
                                    Next::Stop
                                })
                                .named("c");
                            w.schedule(Duration::ZERO);
                            let _ = w.try_flush();
                            w.detach();
                        }
                        _ => {
                            drop(a);
                            if !mine.is_empty() {
                                let i = (rng.next() % mine.len() as u64) as usize;
                                let w = mine.swap_remove(i);
                                if rng.next() % 2 == 0 {
                                    drop(w)
                                } else {
                                    w.detach()
                                }
                            }
                        }
                    }
                    if mine.len() > 100 {
                        mine.clear();
                    }
                }
                drop(mine);
                done.fetch_add(1, SeqCst);
            });
        }
        s.spawn(|| {
            while done.load(SeqCst) < 3 {
                sched.works(|w| {
                    if w.name == "foreign" {
                        wrong.lock().unwrap().push("foreign listed".into());
                    }
                    let _ = (w.stats.runs, w.deadline, w.running, w.poisoned);
                });
            }
        });
    });
    assert!(
        wrong.lock().unwrap().is_empty(),
        "{:?}",
        wrong.lock().unwrap().first()
    );
    // Detached periodic works live on: exactly those are listed, one per live closure.
    assert!(
        eventually(|| count(&sched) == alive.load(SeqCst)),
        "left listed: {:?}, alive closures {}",
        listed(&sched),
        alive.load(SeqCst)
    );
    eprintln!("detached periodic left: {}", count(&sched));
    drop(sched);
    assert!(
        eventually(|| alive.load(SeqCst) == 0),
        "alive closures after shutdown {}",
        alive.load(SeqCst)
    );
}

/// The registry shrinks while other threads drop, list and make works.
#[test]
fn shrink_races_drops_and_listing() {
    let sched = Scheduler::manual();
    for round in 0..5 {
        let works: Vec<Work> = (0..20_000)
            .map(|_| sched.work(|_| Next::Park).named("s"))
            .collect();
        let keep: Vec<Work> = (0..7)
            .map(|_| sched.work(|_| Next::Park).named("keep"))
            .collect();
        let chunks: Vec<Vec<Work>> = {
            let mut it = works.into_iter();
            (0..4).map(|_| it.by_ref().take(5000).collect()).collect()
        };
        let done = AtomicUsize::new(0);
        thread::scope(|s| {
            for mut chunk in chunks {
                let done = &done;
                let sched = &sched;
                s.spawn(move || {
                    let mut rng = Rng(round + 5);
                    while !chunk.is_empty() {
                        let i = (rng.next() % chunk.len() as u64) as usize;
                        chunk.swap_remove(i);
                        if rng.next() % 64 == 0 {
                            drop(sched.work(|_| Next::Park));
                        }
                    }
                    done.fetch_add(1, SeqCst);
                });
            }
            s.spawn(|| {
                while done.load(SeqCst) < 4 {
                    let mut k = 0;
                    sched.works(|w| k += usize::from(w.name == "keep"));
                    assert_eq!(k, 7);
                }
            });
        });
        assert_eq!(listed(&sched), BTreeMap::from([("keep".to_string(), 7)]));
        drop(keep);
        assert_eq!(count(&sched), 0);
    }
}

/// `every_for` on an `Arc::new_cyclic` object holding its own handle.
#[test]
fn object_works_with_cyclic_handles() {
    struct Obj {
        work: Mutex<Option<Work>>,
        _alive: Alive,
    }
    let sched = two_workers();
    let alive = Arc::new(AtomicUsize::new(0));
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(SeqCst) {
                sched.works(|w| {
                    let _ = (w.name.len(), w.deadline);
                });
            }
        });
        for i in 0..300 {
            let obj = Arc::new_cyclic(|_weak: &std::sync::Weak<Obj>| Obj {
                work: Mutex::new(None),
                _alive: Alive::new(&alive),
            });
            let w = sched.every_for(
                &Arc::downgrade(&obj),
                Duration::from_micros(100),
                |_o: &Obj, _| Next::Again,
            );
            w.schedule(Duration::ZERO);
            *obj.work.lock().unwrap() = Some(w);
            if i % 2 == 0 {
                // Drop the object (and with it the handle) from inside the callback of another work.
                let holder = Mutex::new(Some(obj));
                let w2 = sched.once(Duration::ZERO, move |_| {
                    drop(holder.lock().unwrap().take());
                });
                let _ = w2.try_flush();
                drop(w2);
            } else {
                drop(obj);
            }
        }
        stop.store(true, SeqCst);
    });
    assert!(
        eventually(|| count(&sched) == 0 && alive.load(SeqCst) == 0),
        "{:?}",
        listed(&sched)
    );
}

#[test]
fn hosted_and_run_chunked_and_global() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let alive = Arc::new(AtomicUsize::new(0));
    for _ in 0..50 {
        let a = Alive::new(&alive);
        sched
            .once(Duration::ZERO, move |cx| {
                let _ = &a;
                let mut n = 0;
                cx.scheduler().works(|_| n += 1);
                assert!(n >= 1);
            })
            .named("h")
            .detach();
    }
    let held = sched.once(Duration::ZERO, |_| {}).named("held-once");
    assert!(eventually(|| {
        driver.run_due();
        alive.load(SeqCst) == 0
    }));
    assert_eq!(
        listed(&sched),
        BTreeMap::from([("held-once".to_string(), 1)])
    );
    assert_eq!(held.stats().runs, 1);
    let mut info = None;
    sched.works(|w| info = Some((w.stats, w.running, w.poisoned, w.deadline)));
    assert_eq!(info, Some((held.stats(), false, false, None)));
    drop(held);
    assert!(listed(&sched).is_empty());

    // run_chunked while listing.
    let s2 = two_workers();
    let seen = AtomicUsize::new(0);
    s2.run_chunked(0..10_000, 10, |_r| {
        s2.works(|_| {
            seen.fetch_add(1, SeqCst);
        });
        Ok::<(), ()>(())
    })
    .unwrap();
    eprintln!("run_chunked: {} works seen in total", seen.load(SeqCst));
    assert!(eventually(|| count(&s2) == 0), "{:?}", listed(&s2));

    let g = nicework::global();
    let before = count(g);
    let w = g.work(|_| Next::Park).named("g");
    assert!(listed(g).contains_key("g"));
    drop(w);
    assert_eq!(count(g), before);
}

#[cfg(target_os = "linux")]
#[test]
fn fork_child_lists_and_drops() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let parent_works: Vec<Work> = (0..10)
        .map(|_| sched.work(|_| Next::Park).named("p"))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (sched, stop) = (sched.clone(), stop.clone());
        thread::spawn(move || {
            // Works are kept rather than dropped: under AddressSanitizer a fork while
            // another thread frees can leave the child waiting for the quarantine's lock.
            let mut made = Vec::new();
            while !stop.load(SeqCst) {
                if made.len() < 8 {
                    made.push(sched.work(|_| Next::Park));
                }
                sched.works(|_| {});
            }
            made.len()
        })
    };
    thread::sleep(Duration::from_millis(20));
    for _ in 0..5 {
        // SAFETY: the child uses nicework, malloc and std (fork-aware in glibc), and
        // leaves through `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut n = 0;
                sched.works(|_| n += 1);
                assert_eq!(n, 0);
                let w = sched.work(|_| Next::Park);
                sched.works(|_| n += 1);
                assert_eq!(n, 0);
                drop(w);
                // Fresh scheduler in the child.
                let s = Scheduler::manual();
                let w = s
                    .every(Duration::from_millis(1), |_| Next::Again)
                    .named("c");
                let mut names = Vec::new();
                s.works(|i| names.push(i.name.to_string()));
                assert_eq!(names, ["c"]);
                drop(w);
                let mut n = 0;
                s.works(|_| n += 1);
                assert_eq!(n, 0);
                drop(s);
                let c2 = sched.clone();
                drop(c2);
                0
            }))
            .unwrap_or(101);
            // SAFETY: ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let code = common::child::wait_for_forked_child(pid, Duration::from_secs(60));
        assert_eq!(code, Some(0));
    }
    stop.store(true, SeqCst);
    hammer.join().unwrap();
    assert_eq!(listed(&sched), BTreeMap::from([("p".to_string(), 10)]));
    drop(parent_works);
    assert_eq!(count(&sched), 0);
}

#[test]
fn works_with_one_default_name_differ_by_id_and_show_their_kind_and_period() {
    use nicework::WorkKind;
    let sched = Scheduler::manual();
    // One closure type: the default names are all the same.
    let make = |sched: &Scheduler| sched.every(Duration::from_secs(5), |_| Next::Again);
    let reapers: Vec<Work> = (0..50).map(|_| make(&sched)).collect();
    let plain = sched.work(|_| Next::Park);
    plain.schedule(Duration::from_secs(2));
    let once = sched.once(Duration::from_secs(1), |_| {});
    let timeout = sched.timeout(Duration::from_millis(700), |_| Next::Park);
    let mut seen = BTreeMap::new();
    sched.works(|w| {
        assert!(
            seen.insert(w.id, (w.kind, w.period, w.name.to_string()))
                .is_none()
        );
    });
    assert_eq!(
        seen.len(),
        53,
        "every live work once, each with an id of its own"
    );
    let names: std::collections::BTreeSet<_> =
        reapers.iter().map(|r| seen[&r.id()].2.clone()).collect();
    assert_eq!(names.len(), 1, "the reapers share their default name");
    for reaper in &reapers {
        assert_eq!(seen[&reaper.id()].0, WorkKind::Every);
        assert_eq!(seen[&reaper.id()].1, Duration::from_secs(5));
    }
    assert_eq!(seen[&plain.id()].0, WorkKind::Work);
    assert_eq!(seen[&plain.id()].1, Duration::from_secs(2));
    assert_eq!(seen[&once.id()].0, WorkKind::Once);
    assert_eq!(seen[&timeout.id()].0, WorkKind::Timeout);
    assert_eq!(seen[&timeout.id()].1, Duration::from_millis(700));
    // An id stays while the work lives: re-arms and runs do not change it.
    let id = plain.id();
    plain.reschedule(Duration::from_secs(9));
    sched.advance(Duration::from_secs(10));
    assert_eq!(plain.id(), id);
    assert_eq!(plain.period(), Duration::from_secs(9));
    let mut periods = Vec::new();
    sched.works(|w| {
        if w.id == id {
            periods.push(w.period);
        }
    });
    assert_eq!(periods, [Duration::from_secs(9)]);
}

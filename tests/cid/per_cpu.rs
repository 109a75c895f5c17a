//! Per-CPU ids (promise 11): once threads outnumber the CPUs, the ids held follow the
//! CPUs plus the guards alive beyond them; the switch and the switch back keep every other
//! promise (unique ids, exclusive slots, nested enters, exits, late guards).
//!
//! The tests that count switches use a manual scheduler (each `advance` of a scan period
//! is one scan) and make the space count a known number of CPUs
//! (`hooks::count_cpus_as`); the 200-thread test runs on the machine's own CPUs.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use nicework::hooks::{count_cpus_as, id_mode, switch_id_mode};
use nicework::{Cid, IdSpace, PerCid, Scheduler};

use crate::common;
use crate::common::percid::Owner;

const SCAN: Duration = Duration::from_millis(100);

/// A slot that says whether a `with` is inside it.
#[derive(Default)]
struct Inside(AtomicBool);

impl Inside {
    /// Marks the slot entered for `f`; two `with`s inside one slot at once fail the test.
    fn visit<R>(&self, f: impl FnOnce() -> R) -> R {
        assert!(
            !self.0.swap(true, Ordering::SeqCst),
            "two threads inside one slot"
        );
        let result = f();
        self.0.store(false, Ordering::SeqCst);
        result
    }
}

/// Runs `step` on each owner.
fn on_each(owners: &[Owner], step: impl Fn() + Send + Sync + Clone + 'static) {
    for owner in owners {
        let step = step.clone();
        owner.run(step);
    }
}

#[test]
fn two_hundred_threads_entering_every_millisecond_hold_the_cpus_plus_the_guards_beyond_them() {
    const THREADS: usize = 200;
    const PERIOD: Duration = Duration::from_millis(20);
    // Guards alive at once, by 5 ms bucket: the bound at a moment allows the guards alive
    // beyond the CPUs lately (an id used by a guard preempted inside stays reserved for
    // up to two scan periods after).
    const BUCKET_MS: u128 = 5;
    const BUCKETS: usize = 2_000;
    let sched = common::normal_priority_builder().build().unwrap();
    let ids = Arc::new(IdSpace::builder().scan_period(PERIOD).build(&sched));
    let slots: Arc<PerCid<Inside>> = Arc::new(PerCid::new(&ids, Inside::default));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = Instant::now();
    let alive = Arc::new(AtomicUsize::new(0));
    let most_alive: Arc<Vec<AtomicUsize>> =
        Arc::new((0..BUCKETS).map(|_| AtomicUsize::new(0)).collect());
    let bucket = move || ((start.elapsed().as_millis() / BUCKET_MS) as usize).min(BUCKETS - 1);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (slots, alive, most_alive, stop) = (
                slots.clone(),
                alive.clone(),
                most_alive.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // Counted from before the guard is made to after it is gone: at
                    // least every guard alive (a thread preempted anywhere in `with`
                    // counts).
                    let now = alive.fetch_add(1, Ordering::SeqCst) + 1;
                    most_alive[bucket()].fetch_max(now, Ordering::SeqCst);
                    slots.with(|inside| inside.visit(|| ()));
                    // And where it ends: a guard preempted for longer than the window
                    // still counts in it.
                    let now = alive.fetch_sub(1, Ordering::SeqCst);
                    most_alive[bucket()].fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        })
        .collect();
    // Two scans to switch and settle, from the moment every thread runs (200 thread
    // starts take a scan period or so).
    std::thread::sleep(6 * PERIOD);
    let (mut samples, mut worst) = (0, (0, 0, 0));
    // When each scan count was first seen: "lately" is since three scans ago, however
    // late a loaded machine runs them.
    let mut scans_seen: Vec<(u64, usize)> = Vec::new();
    while start.elapsed() < Duration::from_millis(1_500) {
        let scans = ids.compaction_stats().runs;
        let (held, live) = (ids.held(), slots.live());
        let now = bucket();
        if scans_seen.last().is_none_or(|&(seen, _)| seen < scans) {
            scans_seen.push((scans, now));
        }
        let since = scans.saturating_sub(3);
        // From the start if the scan three back came before the first sample (a loaded
        // machine runs the scans late: the ids of a peak long ago may still be held).
        let lately = match scans_seen.first() {
            Some(&(first, _)) if first > since => 0,
            _ => scans_seen
                .iter()
                .find(|&&(seen, _)| seen >= since)
                .map_or(0, |&(_, at)| at.saturating_sub(1)),
        };
        let beyond = most_alive[lately..=now]
            .iter()
            .map(|most| most.load(Ordering::SeqCst))
            .max()
            .unwrap_or(0)
            .max(alive.load(Ordering::SeqCst))
            .saturating_sub(cpus);
        // A taker whose search found every reserved id held reserves another, though a
        // guard may have let one go behind its search (the releases take no lock, so no
        // search is a snapshot; the next scans take it back): at most one more per guard
        // alive (takers are counted alive), and one for the moment of the sample. A
        // loaded machine (AddressSanitizer) preempts many searches at once.
        let bound = cpus + 2 * beyond + 1;
        assert!(
            held <= bound && live <= bound,
            "held {held}, live {live}: more than {cpus} CPUs + twice the {beyond} guards alive beyond them + 1"
        );
        worst = worst.max((held, live, beyond));
        samples += 1;
        std::thread::sleep(Duration::from_millis(7));
    }
    assert!(id_mode(&ids).0, "per-CPU mode");
    assert_eq!(ids.threads(), THREADS);
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    println!("{samples} samples, worst (held, live, beyond): {worst:?}");
    assert_eq!(ids.held(), 0, "every thread gone: no id left");
}

#[test]
fn a_count_hovering_at_the_threshold_does_not_flip_the_mode_at_every_scan() {
    // 2 CPUs: per-CPU from 3 active threads, per-thread again at 1.
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    count_cpus_as(&ids, Some(2));
    let owners: Vec<Owner> = (0..3).map(|_| Owner::start()).collect();
    let enter = |owners: &[Owner]| {
        let ids = ids.clone();
        on_each(owners, move || drop(ids.enter()));
    };
    enter(&owners);
    sched.advance(SCAN);
    assert_eq!(id_mode(&ids), (true, 1));
    for round in 0..10 {
        enter(&owners[..2 + round % 2]);
        sched.advance(SCAN);
    }
    assert_eq!(id_mode(&ids), (true, 1), "2 and 3 in turn: no switch");
    enter(&owners[..1]);
    sched.advance(SCAN);
    assert_eq!(id_mode(&ids), (false, 2), "1 thread: back to per-thread");
    for round in 0..10 {
        enter(&owners[..1 + round % 2]);
        sched.advance(SCAN);
    }
    assert_eq!(id_mode(&ids), (false, 2), "1 and 2 in turn: no switch");
    enter(&owners);
    sched.advance(SCAN);
    assert_eq!(id_mode(&ids), (true, 3));
}

/// Parks a `with` of a new thread inside `slots`' slot: the thread adds `add` to the
/// value, reports its id, waits for `resume`, checks that a nested enter still returns
/// that id and the value is what it left, and adds `add` again.
fn park_inside(
    ids: &Arc<IdSpace>,
    slots: &Arc<PerCid<u64>>,
    add: u64,
) -> (usize, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (ids, slots) = (ids.clone(), slots.clone());
    let (report, id) = mpsc::channel();
    let (resume, wait) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        slots.with(|value| {
            *value += add;
            let seen = *value;
            let id = ids.enter().get();
            report.send(id).unwrap();
            wait.recv().unwrap();
            assert_eq!(ids.enter().get(), id, "a nested enter after the switch");
            assert_eq!(*value, seen, "nobody else wrote the slot meanwhile");
            *value += add;
        });
    });
    (id.recv().unwrap(), resume, thread)
}

#[test]
fn a_thread_inside_with_keeps_its_id_across_a_switch_both_ways() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let folded = Arc::new(AtomicU64::new(0));
    let slots: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, {
        let folded = folded.clone();
        move |n: &mut u64| {
            folded.fetch_add(*n, Ordering::SeqCst);
        }
    }));
    let owners: Vec<Owner> = (0..3).map(|_| Owner::start()).collect();
    let others_use_their_slots = |owners: &[Owner], parked: usize| {
        let (ids, slots) = (ids.clone(), slots.clone());
        on_each(owners, move || {
            slots.with(|value| *value += 1_000);
            assert_ne!(ids.enter().get(), parked, "the parked thread's id was lent");
        });
    };
    // Per-thread → per-CPU, with a thread inside `with` on its own id.
    count_cpus_as(&ids, Some(1));
    let (parked, resume, thread) = park_inside(&ids, &slots, 1);
    others_use_their_slots(&owners, parked);
    sched.advance(SCAN);
    assert!(id_mode(&ids).0, "per-CPU now");
    for _ in 0..3 {
        others_use_their_slots(&owners, parked);
        sched.advance(SCAN);
    }
    resume.send(()).unwrap();
    thread.join().unwrap();

    // Per-CPU → per-thread, with a thread inside `with` on a borrowed id.
    let (parked, resume, thread) = park_inside(&ids, &slots, 1);
    others_use_their_slots(&owners, parked);
    count_cpus_as(&ids, Some(64));
    sched.advance(SCAN);
    assert!(!id_mode(&ids).0, "per-thread again");
    for _ in 0..3 {
        others_use_their_slots(&owners, parked);
        sched.advance(SCAN);
    }
    resume.send(()).unwrap();
    thread.join().unwrap();
    let mut total = folded.load(Ordering::SeqCst);
    slots.for_each(|value| total += *value);
    assert_eq!(
        total % 1_000,
        4,
        "each parked thread's two adds are all there"
    );
}

#[test]
fn a_guard_parked_in_per_cpu_mode_keeps_its_id_while_others_take_spares() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    count_cpus_as(&ids, Some(1));
    switch_id_mode(&ids, true);
    let slots: Arc<PerCid<u64>> = Arc::new(PerCid::new(&ids, || 0));
    // The parked thread took the one CPU's id: every other guard takes a spare.
    let (parked, resume, thread) = park_inside(&ids, &slots, 5);
    assert_eq!(parked, 0, "the CPU's id");
    let owners: Vec<Owner> = (0..4).map(|_| Owner::start()).collect();
    for _ in 0..3 {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (ids2, slots2, seen2) = (ids.clone(), slots.clone(), seen.clone());
        on_each(&owners, move || {
            slots2.with(|value| *value += 1);
            let id = ids2.enter().get();
            seen2.lock().unwrap().push(id);
        });
        let seen = seen.lock().unwrap().clone();
        assert!(!seen.contains(&parked), "{seen:?} includes the parked id");
        // One after another, the others share one spare: the ids held are the CPU's and
        // one per guard alive beyond it.
        assert!(seen.iter().all(|&id| id == 1), "spares: {seen:?}");
        sched.advance(SCAN);
        assert!(ids.held() <= 2, "held {}", ids.held());
    }
    resume.send(()).unwrap();
    thread.join().unwrap();
    // The parked thread checked its own slot when it woke (`park_inside`); all counts are
    // there: its 5 + 5 and the others' 12.
    let mut total = 0;
    slots.for_each(|value| total += *value);
    assert_eq!(total, 22);
}

#[test]
fn for_each_and_trims_across_switches_count_every_increment_once() {
    const THREADS: usize = 4;
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let folded = Arc::new(AtomicU64::new(0));
    let counters: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, {
        let folded = folded.clone();
        move |n: &mut u64| {
            folded.fetch_add(*n, Ordering::SeqCst);
        }
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let added = Arc::new(AtomicU64::new(0));
    let bumpers: Vec<_> = (0..THREADS)
        .map(|index| {
            let (counters, stop, added) = (counters.clone(), stop.clone(), added.clone());
            std::thread::spawn(move || {
                let mut rng = common::Rng(index as u64 + 1);
                while !stop.load(Ordering::Relaxed) {
                    counters.with(|n| *n += 1);
                    added.fetch_add(1, Ordering::Relaxed);
                    if rng.next() % 64 == 0 {
                        std::thread::sleep(Duration::from_micros(rng.next() % 200));
                    }
                }
            })
        })
        .collect();
    let reader = {
        let (counters, stop, added) = (counters.clone(), stop.clone(), added.clone());
        std::thread::spawn(move || {
            let mut sums = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut live = 0;
                counters.for_each(|n| live += *n);
                // A bumper counts its increment just after it: at most one each ahead.
                let added = added.load(Ordering::SeqCst) + THREADS as u64;
                assert!(live <= added, "the reader counted {live} of {added}");
                sums += 1;
            }
            sums
        })
    };
    for round in 0..60 {
        // Switch at every other scan: 1 CPU (per-CPU) and 64 (per-thread) in turn.
        count_cpus_as(&ids, Some(if round % 4 < 2 { 1 } else { 64 }));
        sched.advance(SCAN);
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::Relaxed);
    for bumper in bumpers {
        bumper.join().unwrap();
    }
    let sums = reader.join().unwrap();
    let switches = id_mode(&ids).1;
    let mut live = 0;
    counters.for_each(|n| live += *n);
    assert_eq!(
        live + folded.load(Ordering::SeqCst),
        added.load(Ordering::SeqCst),
        "every increment in exactly one place"
    );
    assert!(switches >= 20, "{switches} switches");
    assert!(sums > 0);
}

#[test]
fn threads_that_exit_in_per_cpu_mode_leave_no_id_held() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    count_cpus_as(&ids, Some(1));
    switch_id_mode(&ids, true);
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (ids, barrier) = (ids.clone(), barrier.clone());
            std::thread::spawn(move || {
                // All eight inside at once: eight ids, one of the CPU and seven spares.
                let cid = ids.enter();
                barrier.wait();
                let id = cid.get();
                barrier.wait();
                id
            })
        })
        .collect();
    let mut seen: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..8).collect::<Vec<_>>(), "unique and dense");
    assert_eq!(
        (ids.held(), ids.threads()),
        (0, 0),
        "released before join returned"
    );
    assert!(id_mode(&ids).0);
}

/// A `Cid<'static>` in a thread-local destroyed after nicework's exit hook, in per-CPU
/// mode: the guard keeps its borrowed id through the teardown, a nested enter from the
/// destructor returns it, another thread entering meanwhile gets another, and the id is
/// given back when the guard drops, before `join()` returns.
#[test]
fn a_late_thread_local_guard_keeps_its_borrowed_id() {
    struct Late {
        ids: &'static IdSpace,
        guard: Option<Cid<'static>>,
        report: mpsc::Sender<usize>,
        resume: mpsc::Receiver<()>,
    }
    impl Drop for Late {
        fn drop(&mut self) {
            let guard = self.guard.take().unwrap();
            let _ = self.report.send(guard.get());
            let _ = self.resume.recv_timeout(Duration::from_secs(20));
            let _ = self.report.send(self.ids.enter().get());
            drop(guard);
        }
    }
    thread_local! {
        static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
    }
    let sched = Scheduler::manual();
    let ids: &'static IdSpace = Box::leak(Box::new(IdSpace::new(&sched)));
    count_cpus_as(ids, Some(1));
    switch_id_mode(ids, true);
    let (report, reports) = mpsc::channel();
    let (resume, resume_rx) = mpsc::channel();
    let late = std::thread::spawn(move || {
        LATE.with(|_| ()); // registered first, destroyed last
        let guard = ids.enter();
        LATE.with(|late| {
            *late.borrow_mut() = Some(Late {
                ids,
                guard: Some(guard),
                report,
                resume: resume_rx,
            })
        });
    });
    let id = reports.recv().unwrap();
    let other = std::thread::spawn(move || ids.enter().get())
        .join()
        .unwrap();
    assert_ne!(other, id, "another thread got the late guard's id");
    resume.send(()).unwrap();
    assert_eq!(reports.recv().unwrap(), id, "the nested enter's id");
    late.join().unwrap();
    assert_eq!(ids.held(), 0, "the borrowed id went back with the guard");
}

#[test]
fn a_late_destructor_entering_in_per_cpu_mode_gets_a_unique_id_and_releases_it() {
    let sched = Scheduler::manual();
    let ids: &'static IdSpace = Box::leak(Box::new(IdSpace::new(&sched)));
    count_cpus_as(ids, Some(1));
    switch_id_mode(ids, true);
    let holder = ids.enter();
    let (report, reports) = mpsc::channel();
    common::child::in_a_late_destructor(move || {
        let outer = ids.enter();
        let _ = report.send((outer.get(), ids.enter().get()));
    })
    .join()
    .unwrap();
    let (outer, nested) = reports.recv().unwrap();
    assert_eq!(outer, nested);
    assert_ne!(outer, holder.get());
    drop(holder);
    assert_eq!(
        ids.held(),
        1,
        "only the main thread's table id, not yet idle"
    );
    sched.advance(SCAN);
    sched.advance(SCAN);
    assert_eq!(ids.held(), 0);
}

#[test]
fn take_put_and_slot_guards_work_in_per_cpu_mode_and_across_a_switch() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    count_cpus_as(&ids, Some(1));
    switch_id_mode(&ids, true);
    let pool: Arc<PerCid<Vec<u64>>> = Arc::new(PerCid::new(&ids, Vec::new));
    // A pool: what a thread puts, the next taker on the CPU finds, whichever thread.
    assert!(pool.put(vec![1]).is_ok());
    let taken = std::thread::spawn({
        let pool = pool.clone();
        move || pool.take()
    })
    .join()
    .unwrap();
    assert_eq!(taken, Some(vec![1]), "the CPU's slot, from another thread");
    // A guard holds its borrowed id and value across both switches; nesting is refused.
    let mut guard = pool.try_borrow().expect("not borrowed");
    guard.push(2);
    let id = ids.enter().get();
    assert!(pool.try_borrow().is_none() && pool.take().is_none());
    assert_eq!(pool.put(vec![9]), Err(vec![9]));
    let other = Owner::start();
    // Each switch back to per-thread mode is undone by the scan after it (1 CPU, 2 active
    // threads): the guard lives through both directions.
    for per_cpu in [false, true, false] {
        switch_id_mode(&ids, per_cpu);
        sched.advance(SCAN);
        let (ids2, pool2) = (ids.clone(), pool.clone());
        let (report, seen) = mpsc::channel();
        other.run(move || {
            let put = pool2.put(vec![3]).is_ok();
            report.send((ids2.enter().get(), put)).unwrap();
        });
        let (other_id, _) = seen.recv().unwrap();
        assert_ne!(other_id, id, "the guard's id went to another thread");
        assert_eq!(ids.enter().get(), id, "nested enter under the guard");
    }
    assert_eq!(*guard, vec![2]);
    drop(guard);
    // The value stays in the guard's slot (which id a later call borrows depends on which
    // the CPU's threads took last).
    let mut values = Vec::new();
    pool.for_each(|value| values.push(value.clone()));
    assert!(values.contains(&vec![2]), "{values:?}");
}

/// A thread's slot cache, filled for an id it owned during a spell of per-thread mode
/// while the per-CPU table's epoch stood still (a guard held the table's only id), must
/// not be trusted when the thread later borrows the same number from the table: that id
/// was revoked and its slot array freed in between. (Found by an attack: the thread wrote
/// into the freed array; AddressSanitizer reports it, and the count below misses the
/// increments.)
#[test]
fn a_slot_cache_from_a_per_thread_spell_is_not_trusted_by_a_later_borrow() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let reclaimed = Arc::new(AtomicU64::new(0));
    let counters: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(&ids, || 0, {
        let reclaimed = reclaimed.clone();
        move |n: &mut u64| {
            reclaimed.fetch_add(*n, Ordering::SeqCst);
        }
    }));
    let (a, c) = (Owner::start(), Owner::start());
    let enter = |owner: &Owner| {
        let ids = ids.clone();
        owner.run(move || drop(ids.enter()));
    };
    let bump = |owner: &Owner| {
        let counters = counters.clone();
        owner.run(move || counters.with(|n| *n += 1));
    };
    count_cpus_as(&ids, Some(1));
    enter(&a);
    // D holds the table's only id through the per-thread spell, so no unreserve moves the
    // epoch.
    let d = Owner::start();
    enter(&d);
    sched.advance(SCAN);
    assert!(id_mode(&ids).0);
    enter(&a); // A borrows table id 0 in epoch 0
    let (hold, release) = mpsc::channel::<()>();
    let (held, holding) = mpsc::channel();
    let d_thread = {
        let ids = ids.clone();
        std::thread::spawn(move || {
            let guard = ids.enter();
            held.send(guard.get()).unwrap();
            release.recv().unwrap();
        })
    };
    holding.recv().unwrap();
    count_cpus_as(&ids, Some(64));
    sched.advance(SCAN);
    assert!(!id_mode(&ids).0);
    bump(&a); // A owns a bitmap id and caches its slot
    sched.advance(SCAN);
    sched.advance(SCAN); // A idle: its id revoked, its slot trimmed, the array freed
    count_cpus_as(&ids, Some(1));
    enter(&c);
    sched.advance(SCAN);
    assert!(id_mode(&ids).0);
    enter(&c); // C reserves A's old id in the table
    for _ in 0..5 {
        bump(&a); // A borrows that number, in the same epoch
    }
    hold.send(()).unwrap();
    d_thread.join().unwrap();
    drop(d);
    let mut live = 0;
    counters.for_each(|n| live += *n);
    assert_eq!(
        live + reclaimed.load(Ordering::SeqCst),
        6,
        "every increment once"
    );
}

//! Wait cycles: callbacks that `flush`, `cancel_sync` or drop each other's works. Each
//! would wait for the other's run to end; nicework breaks the cycle. The call that would
//! close it does not wait and behaves as inside the own callback, and a `tracing`
//! warning names both works. Real worker threads; every wait is bounded by
//! `common::EVENTUALLY`, so a deadlock fails instead of hanging. And what is no cycle:
//!
//! - a wait that has ended does not count in the wait-for graph: a work `A` whose
//!   callback flushed `B` keeps its edge "`A` waits for `B`" until `A`'s thread takes
//!   the core lock again, and if `B` runs again before that (it armed itself during the
//!   run), `B`'s `cancel_sync(A)`, `drop(A)` or `A.flush()` must still wait for `A`
//!   (see also the loom model
//!   `work_waits::cancel_sync_from_a_run_that_nothing_waits_for_waits_for_the_other_run`);
//! - breaking a wait cycle logs its warning with no lock held, so a `tracing` subscriber
//!   that `touch()`es a parked work of that scheduler (a log flusher woken per event)
//!   does not deadlock the thread that broke the cycle (in a child process: the failure
//!   is a hang).
//!
//! The races of an ended wait repeat rounds and fail if any round broke the promise;
//! waits are for states, bounded ([`common::BOUND`]), and nothing asserts a timing.
//!
//! A process-wide subscriber collects the warnings, so these tests share one binary.

use crate::common;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use common::child::is_child;
use common::{BOUND, FAR, assert_no_round_broke, drop_flag, flush_waits};
use nicework::{Next, Scheduler, Work};

fn warnings() -> &'static std::sync::Mutex<Vec<String>> {
    &common::events::captured().warnings
}

/// The cycle warnings that name both `a` and `b`.
fn cycle_warnings_naming(a: &str, b: &str) -> usize {
    warnings()
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.contains("wait cycle") && w.contains(a) && w.contains(b))
        .count()
}

// === the scenario ===

/// What one callback does to the other work.
#[derive(Clone, Copy)]
enum Action {
    Flush,
    CancelSync,
    Drop,
}

/// Handles that callbacks reach each other through; the slot holds the only one.
type Slot = Arc<Mutex<Option<Arc<Work>>>>;

struct Ring {
    works: Vec<Slot>,
    /// Runs that returned (the cycle did not hang them).
    finished: Arc<AtomicUsize>,
    /// What each call on the other work returned (flush/cancel_sync), by work index.
    returned: Arc<Mutex<Vec<Option<bool>>>>,
    /// Set when each work's closure was freed.
    freed: Vec<Arc<AtomicBool>>,
}

/// `n` works on `scheds[i % scheds.len()]`, all due at once; work `i`'s callback waits
/// until all `n` are running (so they run on `n` threads at once), then applies `action`
/// to work `i + 1` (mod n), so the waits form one cycle through all of them.
fn ring(scheds: &[&Scheduler], n: usize, action: Action, tag: &str) -> Ring {
    let works: Vec<Slot> = (0..n).map(|_| Arc::new(Mutex::new(None))).collect();
    let all_running = Arc::new(Barrier::new(n));
    let finished = Arc::new(AtomicUsize::new(0));
    let returned = Arc::new(Mutex::new(vec![None; n]));
    let mut freed = Vec::new();
    let mut made = Vec::new();
    for i in 0..n {
        let (flag, was_freed) = common::drop_flag();
        freed.push(was_freed);
        let next = works[(i + 1) % n].clone();
        let (all_running, finished, returned) =
            (all_running.clone(), finished.clone(), returned.clone());
        let sched = scheds[i % scheds.len()];
        let work = sched
            .work(move |_| {
                let _keep = &flag;
                all_running.wait();
                // Clone (or, to drop it, take) the other handle out of its slot, so the
                // slot's lock is not held while waiting (a cycle of the test's own making).
                let result = match action {
                    Action::Flush | Action::CancelSync => {
                        let other = next.lock().unwrap().clone();
                        other.map(|other| match action {
                            Action::Flush => other.flush(),
                            _ => other.cancel_sync(),
                        })
                    }
                    Action::Drop => {
                        let other = next.lock().unwrap().take();
                        drop(other);
                        None
                    }
                };
                returned.lock().unwrap()[i] = result;
                finished.fetch_add(1, Ordering::SeqCst);
                match action {
                    // One run each: a second run would wait at the barrier for ever.
                    Action::Flush => Next::Park,
                    // The cancel or drop refuses this re-arm (checked by the tests).
                    Action::CancelSync | Action::Drop => Next::Again,
                }
            })
            .named(format!("{tag}-{i}"));
        made.push(work);
    }
    for (i, work) in made.into_iter().enumerate() {
        *works[i].lock().unwrap() = Some(Arc::new(work));
    }
    Ring {
        works,
        finished,
        returned,
        freed,
    }
}

impl Ring {
    fn arm_all(&self) {
        for slot in &self.works {
            if let Some(work) = slot.lock().unwrap().as_ref() {
                assert!(work.schedule(Duration::ZERO));
            }
        }
    }
}

fn sched(workers: usize) -> Scheduler {
    Scheduler::builder().workers(workers).build().unwrap()
}

#[test]
fn two_works_that_flush_each_other_on_two_workers_do_not_deadlock() {
    warnings();
    let sched = sched(2);
    let ring = ring(&[&sched], 2, Action::Flush, "flush-pair");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 2),
        "two works flushing each other deadlocked"
    );
    let returned = ring.returned.lock().unwrap().clone();
    // One flush waited for the other run (true); the one that would have closed the
    // cycle did not wait and returned false, as inside its own callback.
    let mut sorted: Vec<bool> = returned.iter().map(|r| r.unwrap()).collect();
    sorted.sort();
    assert_eq!(sorted, vec![false, true], "returned: {returned:?}");
    assert_eq!(cycle_warnings_naming("flush-pair-0", "flush-pair-1"), 1);
}

#[test]
fn two_works_that_cancel_sync_each_other_do_not_deadlock_and_neither_rearms() {
    warnings();
    let sched = sched(2);
    let ring = ring(&[&sched], 2, Action::CancelSync, "cancel-pair");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 2),
        "two works cancelling each other deadlocked"
    );
    // Both were cancelled during their runs, so both `Next::Again` were refused: once
    // neither runs, neither is pending (a re-arm is applied as the run completes).
    let works: Vec<Arc<Work>> = ring
        .works
        .iter()
        .map(|slot| slot.lock().unwrap().clone().unwrap())
        .collect();
    assert!(common::eventually(|| works.iter().all(|w| !w.is_running())));
    assert!(
        works.iter().all(|w| !w.is_pending()),
        "a cancelled work re-armed"
    );
    assert_eq!(
        ring.finished.load(Ordering::SeqCst),
        2,
        "a cancelled work ran again"
    );
    let returned = ring.returned.lock().unwrap().clone();
    assert!(
        returned.iter().all(Option::is_some),
        "returned: {returned:?}"
    );
    assert_eq!(cycle_warnings_naming("cancel-pair-0", "cancel-pair-1"), 1);
}

#[test]
fn two_works_that_drop_each_other_free_both_closures_after_their_runs() {
    warnings();
    let sched = sched(2);
    let ring = ring(&[&sched], 2, Action::Drop, "drop-pair");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 2),
        "two works dropping each other deadlocked"
    );
    assert!(common::eventually(|| ring
        .freed
        .iter()
        .all(|f| f.load(Ordering::SeqCst))));
    assert_eq!(sched.metrics().armed, 0);
    assert_eq!(cycle_warnings_naming("drop-pair-0", "drop-pair-1"), 1);
}

#[test]
fn a_cycle_through_three_works_is_broken_once() {
    warnings();
    let sched = sched(3);
    let ring = ring(&[&sched], 3, Action::Flush, "flush-three");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 3),
        "three works flushing in a ring deadlocked"
    );
    let returned = ring.returned.lock().unwrap().clone();
    let refused = returned.iter().filter(|r| **r == Some(false)).count();
    assert_eq!(refused, 1, "returned: {returned:?}");
}

#[test]
fn a_cycle_across_two_schedulers_is_broken() {
    warnings();
    let (first, second) = (sched(1), sched(1));
    let ring = ring(&[&first, &second], 2, Action::Flush, "flush-across");
    ring.arm_all();
    assert!(
        common::eventually(|| ring.finished.load(Ordering::SeqCst) == 2),
        "two works on two schedulers flushing each other deadlocked"
    );
    let returned = ring.returned.lock().unwrap().clone();
    let mut sorted: Vec<bool> = returned.iter().map(|r| r.unwrap()).collect();
    sorted.sort();
    assert_eq!(sorted, vec![false, true], "returned: {returned:?}");
}

#[test]
fn a_chain_that_is_not_a_cycle_still_waits() {
    // A flushes B while B runs and waits for a signal that arrives from outside: no cycle,
    // so A's flush waits and returns true once B finished.
    warnings();
    let sched = sched(2);
    let b_started = Arc::new(Barrier::new(2));
    let release_b = Arc::new(Barrier::new(2));
    let b_runs = Arc::new(AtomicUsize::new(0));
    let b = {
        let (b_started, release_b, b_runs) = (b_started.clone(), release_b.clone(), b_runs.clone());
        Arc::new(sched.work(move |_| {
            b_started.wait();
            release_b.wait();
            b_runs.fetch_add(1, Ordering::SeqCst);
            Next::Park
        }))
    };
    let flushed = Arc::new(Mutex::new(None));
    let a = {
        let (b, flushed) = (b.clone(), flushed.clone());
        sched.work(move |_| {
            *flushed.lock().unwrap() = Some((b.flush(), b.stats().runs));
            Next::Park
        })
    };
    assert!(b.schedule(Duration::ZERO));
    b_started.wait();
    assert!(a.schedule(Duration::ZERO));
    // A is now running or about to; B is held until we release it.
    assert!(common::eventually(|| a.is_running()));
    release_b.wait();
    assert!(common::eventually(|| flushed.lock().unwrap().is_some()));
    assert_eq!(*flushed.lock().unwrap(), Some((true, 1)));
    assert_eq!(b_runs.load(Ordering::SeqCst), 1);
}

// === a wait that has ended is no wait ===

/// What `B`'s second run does to `A`, whose callback's flush of `B`'s first run is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    CancelSync,
    Drop,
    Flush,
}

/// What `B`'s second run saw right after its call on `A` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    /// `A`'s callback was still running (it had not even got back from its flush).
    a_still_in_its_callback: bool,
    /// Drop: `A`'s closure had been freed.
    a_closure_freed: bool,
}

/// One round. `A` (on `sa`) flushes `B` (on `sb`) while `B`'s first run is in progress,
/// so `A`'s thread sleeps in that wait with its edge "A waits for B" registered. `B`'s
/// first run arms `B` again (`schedule(0)`) and ends: `A`'s wait is over, `A` will go on
/// as soon as its thread gets the lock back, and waits for nothing any more. `B`'s second
/// run, on `B`'s worker, then calls `op` on `A`. Nobody waits for `B` at that point, so
/// `op` must wait for `A`'s run (there is no cycle): when it returns, `A`'s callback is
/// over. Returns what `B` saw, or `None` if the round did not get that far.
fn stale_edge_round(sa: &Scheduler, sb: &Scheduler, op: Op) -> Option<Seen> {
    let b_slot: Arc<OnceLock<Weak<Work>>> = Arc::new(OnceLock::new());
    let a_holder: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
    let a_in_callback = Arc::new(AtomicBool::new(false));
    let b_runs = Arc::new(AtomicU32::new(0));
    let seen: Arc<Mutex<Option<Seen>>> = Arc::new(Mutex::new(None));
    let (flag, a_freed) = drop_flag();
    let waits_before = flush_waits(sa) + flush_waits(sb);

    let a = {
        let (b_slot, a_in_callback) = (b_slot.clone(), a_in_callback.clone());
        sa.work(move |_| {
            let _keep = &flag;
            a_in_callback.store(true, SeqCst);
            if let Some(b) = b_slot.get().and_then(Weak::upgrade) {
                b.flush(); // waits for B's first run
            }
            a_in_callback.store(false, SeqCst);
            Next::Park
        })
    };
    let b = {
        let (b_slot, a_holder, a_in_callback, b_runs, seen, a_freed) = (
            b_slot.clone(),
            a_holder.clone(),
            a_in_callback.clone(),
            b_runs.clone(),
            seen.clone(),
            a_freed.clone(),
        );
        let (sa2, sb2) = (sa.clone(), sb.clone());
        Arc::new(sb.work(move |_| {
            let (sa, sb) = (&sa2, &sb2);
            match b_runs.fetch_add(1, SeqCst) + 1 {
                1 => {
                    // A's flush registered its edge and sleeps, waiting for this run.
                    common::spin_until(BOUND, || flush_waits(sa) + flush_waits(sb) > waits_before);
                    // The next instance runs as soon as this one ends.
                    if let Some(me) = b_slot.get().and_then(Weak::upgrade) {
                        me.schedule(Duration::ZERO);
                    }
                }
                2 => {
                    match op {
                        Op::CancelSync => {
                            if let Some(a) = a_holder.lock().unwrap().as_ref() {
                                a.cancel_sync();
                            }
                        }
                        Op::Flush => {
                            if let Some(a) = a_holder.lock().unwrap().as_ref() {
                                a.flush();
                            }
                        }
                        Op::Drop => {
                            let a = a_holder.lock().unwrap().take();
                            drop(a);
                        }
                    }
                    *seen.lock().unwrap() = Some(Seen {
                        a_still_in_its_callback: a_in_callback.load(SeqCst),
                        a_closure_freed: a_freed.load(SeqCst),
                    });
                }
                _ => {}
            }
            Next::Park
        }))
    };
    b_slot.set(Arc::downgrade(&b)).unwrap();
    *a_holder.lock().unwrap() = Some(a);

    assert!(b.schedule(Duration::ZERO));
    assert!(
        common::spin_until(BOUND, || b_runs.load(SeqCst) >= 1),
        "B never ran"
    );
    if let Some(a) = a_holder.lock().unwrap().as_ref() {
        assert!(a.schedule(Duration::ZERO)); // runs on A's worker, flushes B
    }
    let done = common::spin_until(BOUND, || {
        seen.lock().unwrap().is_some() && !a_in_callback.load(SeqCst) && !b.is_running()
    });
    let result = *seen.lock().unwrap();
    assert!(done || result.is_none(), "the round never settled");
    drop(a_holder.lock().unwrap().take());
    b.cancel_sync();
    result
}

/// Runs `rounds` stale-edge rounds of `op`; returns (broken, completed).
fn stale_edge_rounds(op: Op, rounds: usize, broken: impl Fn(&Seen) -> bool) -> (usize, usize) {
    // A's scheduler runs at SCHED_IDLE, B's at the default nice 19: A's worker is the
    // slower one to get the CPU back once its wait ends (setup, not needed for the break;
    // it also happens with one scheduler of two workers).
    let sa = Scheduler::builder()
        .priority(nicework::Priority::Idle)
        .build()
        .unwrap();
    let sb = Scheduler::builder().build().unwrap();
    let (mut broke, mut completed) = (0, 0);
    for _ in 0..rounds {
        if let Some(seen) = stale_edge_round(&sa, &sb, op) {
            completed += 1;
            if broken(&seen) {
                broke += 1;
            }
        }
    }
    (broke, completed)
}

#[test]
fn cancel_sync_from_a_callback_waits_for_a_run_whose_flush_of_that_work_has_ended() {
    let (broke, completed) =
        stale_edge_rounds(Op::CancelSync, 200, |seen| seen.a_still_in_its_callback);
    assert!(completed > 150, "only {completed} rounds got to the cancel");
    assert_no_round_broke(
        "cancel_sync never returns while the callback runs on another thread",
        broke,
        completed,
        "(B's cancel_sync(A) returned while A's callback still ran: A's ended wait for \
         B's previous run was taken for a wait cycle)",
    );
}

#[test]
fn drop_from_a_callback_waits_for_a_run_whose_flush_of_that_work_has_ended() {
    let (broke, completed) = stale_edge_rounds(Op::Drop, 200, |seen| {
        seen.a_still_in_its_callback || !seen.a_closure_freed
    });
    assert!(completed > 150, "only {completed} rounds got to the drop");
    assert_no_round_broke(
        "drop returns once the run ended, with the closure freed",
        broke,
        completed,
        "(B's drop(A) returned while A's callback still ran and before A's closure was \
         freed: A's ended wait for B's previous run was taken for a wait cycle)",
    );
}

#[test]
fn flush_from_a_callback_waits_for_a_run_whose_flush_of_that_work_has_ended() {
    // Its return value says nothing here: `false` is right when A's callback had already
    // ended (A was idle). A flush that returned while A's callback still ran broke the
    // promise.
    let (broke, completed) = stale_edge_rounds(Op::Flush, 200, |seen| seen.a_still_in_its_callback);
    assert!(completed > 150, "only {completed} rounds got to the flush");
    assert_no_round_broke(
        "flush of a running work waits for it and returns true",
        broke,
        completed,
        "(B's A.flush() returned false without waiting while A's callback ran: A's \
         ended wait for B's previous run was taken for a wait cycle)",
    );
}

/// The same race on one scheduler with two workers (no priority difference at all).
#[test]
fn cancel_sync_waits_for_a_run_whose_flush_has_ended_on_one_scheduler_of_two_workers() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let (mut broke, mut completed) = (0, 0);
    for _ in 0..200 {
        if let Some(seen) = stale_edge_round(&sched, &sched, Op::CancelSync) {
            completed += 1;
            broke += usize::from(seen.a_still_in_its_callback);
        }
    }
    assert!(completed > 150, "only {completed} rounds got to the cancel");
    assert_no_round_broke(
        "cancel_sync never returns while the callback runs on another worker",
        broke,
        completed,
        "(one scheduler, two workers)",
    );
}

// === the cycle's warning, to a subscriber that touches a work ===

/// A tracing subscriber that wakes a log-shipping work on every event: it `touch()`es a
/// parked work, as a periodic flusher of buffered log lines would.
struct TouchOnEvent {
    flusher: Arc<Work>,
    events: Arc<AtomicU64>,
}

impl tracing::Subscriber for TouchOnEvent {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {
        self.events.fetch_add(1, SeqCst);
        self.flusher.touch();
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_broken_wait_cycle_does_not_deadlock_a_subscriber_that_touches_a_work() {
    const NAME: &str = "a_broken_wait_cycle_does_not_deadlock_a_subscriber_that_touches_a_work";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    let sched = Scheduler::manual();
    let flusher = Arc::new(sched.work(|_| Next::Park)); // parked: touch() arms it
    let a_slot: Arc<OnceLock<Weak<Work>>> = Arc::new(OnceLock::new());
    let b_slot: Arc<OnceLock<Weak<Work>>> = Arc::new(OnceLock::new());
    let a_running = Arc::new(AtomicBool::new(false));
    let b = {
        let (a_slot, a_running) = (a_slot.clone(), a_running.clone());
        Arc::new(sched.work(move |_| {
            common::spin_until(BOUND, || a_running.load(SeqCst));
            if let Some(a) = a_slot.get().and_then(Weak::upgrade) {
                a.cancel_sync(); // waits for A's run
            }
            Next::Park
        }))
    };
    let a = {
        let (a_slot, b_slot, a_running) = (a_slot.clone(), b_slot.clone(), a_running.clone());
        Arc::new(sched.work(move |_| {
            a_running.store(true, SeqCst);
            let me = a_slot.get().and_then(Weak::upgrade).unwrap();
            // Wait until B's cancel_sync of this run refuses re-arms (it waits for us).
            common::spin_until(BOUND, || {
                me.reschedule(FAR);
                !me.is_pending()
            });
            if let Some(b) = b_slot.get().and_then(Weak::upgrade) {
                b.cancel_sync(); // a cycle: must not wait; a warning names both works
            }
            Next::Park
        }))
    };
    a_slot.set(Arc::downgrade(&a)).unwrap();
    b_slot.set(Arc::downgrade(&b)).unwrap();
    assert!(a.schedule(Duration::ZERO) && b.schedule(Duration::ZERO));
    let b_flusher = {
        let b = b.clone();
        thread::spawn(move || b.flush())
    };
    let done = Arc::new(AtomicBool::new(false));
    let subscriber_events = Arc::new(AtomicU64::new(0));
    let subscriber = TouchOnEvent {
        flusher: flusher.clone(),
        events: subscriber_events.clone(),
    };
    {
        let (a, done) = (a.clone(), done.clone());
        thread::spawn(move || {
            tracing::subscriber::with_default(subscriber, || a.flush());
            done.store(true, SeqCst);
        });
    }
    // Unbroken, this takes milliseconds.
    if !common::spin_until(Duration::from_secs(5), || done.load(SeqCst)) {
        // Not a panic: unwinding would drop the works, whose drop waits for the same lock.
        eprintln!(
            "deadlock: the flush that broke the wait cycle never returned (its warning \
             event ran the subscriber, whose touch() of a work waits for the core lock \
             the cycle check holds); subscriber events: {}",
            subscriber_events.load(SeqCst)
        );
        std::process::exit(3);
    }
    b_flusher.join().unwrap();
    println!("CHILD-OK");
}

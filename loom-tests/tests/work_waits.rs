#![cfg(loom)]
//! Loom models of the waits between works: a wait cycle between two works (each callback
//! flushes, cancels or drops the other while both run on two threads driving the manual
//! scheduler), and an unmatched `enable()` against a `cancel_sync` waiting for a run.
//! Loom reports a deadlock when every thread is blocked, so a cycle that is not broken
//! fails the model.

use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};
use std::time::Duration;

use loom::sync::atomic::Ordering::SeqCst;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;
use nicework::{Next, Scheduler, Work};

const PERIOD: Duration = Duration::from_millis(1);

/// A handle the other callback reaches. The std mutex is only held to clone or take the
/// handle (no loom operation inside), so it never blocks a loom thread.
type Slot = Arc<StdMutex<Option<Arc<Work>>>>;

#[derive(Clone, Copy)]
enum Action {
    Flush,
    CancelSync,
    Drop,
}

fn apply(action: Action, other: &Slot) {
    match action {
        Action::Flush | Action::CancelSync => {
            let other = other.lock().unwrap().clone();
            if let Some(other) = other {
                match action {
                    Action::Flush => drop(other.flush()),
                    _ => drop(other.cancel_sync()),
                }
            }
        }
        Action::Drop => drop(other.lock().unwrap().take()),
    }
}

/// Two works due at once, each applying `action` to the other; two threads advance the
/// manual scheduler, so the works may run at the same time on both (a cycle), or one
/// after the other, or nested on one thread (a flush of a pending work runs it on the
/// flusher). In every interleaving every run ends and nothing is left running or armed.
fn two_works_acting_on_each_other(action: Action) {
    works_in_a_ring(2, action);
}

/// `n` works due at once, each applying `action` to the next one in a ring, on `n`
/// threads advancing the manual scheduler.
fn works_in_a_ring(n: usize, action: Action) {
    loom::model(move || {
        let sched = Scheduler::manual();
        let slots: Vec<Slot> = (0..n).map(|_| Arc::default()).collect();
        let runs = Arc::new(AtomicUsize::new(0));
        for i in 0..n {
            let other = slots[(i + 1) % n].clone();
            let runs = runs.clone();
            let work = sched.work(move |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                apply(action, &other);
                Next::Park
            });
            assert!(work.schedule(PERIOD));
            *slots[i].lock().unwrap() = Some(Arc::new(work));
        }
        let helpers: Vec<_> = (1..n)
            .map(|_| {
                let sched = sched.clone();
                thread::spawn(move || sched.advance(PERIOD))
            })
            .collect();
        let here = sched.advance(PERIOD);
        let there: usize = helpers.into_iter().map(|h| h.join().unwrap()).sum();
        // A flush runs the other work at the latest; a cancel or a drop that comes
        // before the other's run removes it.
        let runs = runs.load(Ordering::SeqCst);
        match action {
            Action::Flush => assert_eq!(runs, n),
            Action::CancelSync | Action::Drop => assert!((1..=n).contains(&runs)),
        }
        // A run taken by `advance` counts there; a run taken by a flush does not.
        assert!(here + there <= n);
        for slot in &slots {
            if let Some(work) = slot.lock().unwrap().take() {
                assert!(!work.is_running() && !work.is_pending());
            }
        }
    });
}

#[test]
fn a_flush_cycle_between_two_works_never_deadlocks() {
    two_works_acting_on_each_other(Action::Flush);
}

/// A cycle through three works on three threads: the ring's last wait is the one that
/// is broken, wherever it forms.
#[test]
fn a_flush_cycle_through_three_works_never_deadlocks() {
    works_in_a_ring(3, Action::Flush);
}

#[test]
fn a_cancel_sync_cycle_between_two_works_never_deadlocks() {
    two_works_acting_on_each_other(Action::CancelSync);
}

#[test]
fn a_drop_cycle_between_two_works_never_deadlocks() {
    two_works_acting_on_each_other(Action::Drop);
}

/// Two `cancel_sync` calls wait for a run that returns `Again` while one of them first
/// calls an unmatched `enable()`: in every interleaving the run's re-arm is refused (the
/// waiters are counted, so the first to return does not lift the other's refusal), and
/// the work never runs after the `cancel_sync` calls returned.
#[test]
fn an_unmatched_enable_never_undoes_a_waiting_cancel_sync() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let work = Arc::new(sched.every(PERIOD, move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            Next::Again
        }));
        let canceller = {
            let (work, runs) = (work.clone(), runs.clone());
            thread::spawn(move || {
                work.cancel_sync();
                runs.load(Ordering::SeqCst)
            })
        };
        let second_canceller = {
            let (work, runs) = (work.clone(), runs.clone());
            thread::spawn(move || {
                work.enable();
                work.cancel_sync();
                runs.load(Ordering::SeqCst)
            })
        };
        sched.advance(PERIOD);
        let runs_when_cancel_returned = canceller
            .join()
            .unwrap()
            .max(second_canceller.join().unwrap());
        assert!(!work.is_pending(), "re-armed after cancel_sync returned");
        sched.advance(PERIOD * 10);
        assert_eq!(runs.load(Ordering::SeqCst), runs_when_cancel_returned);
    });
}

/// A wait that has ended does not count in the cycle check. `A` (flushed on the main
/// thread) flushes `B` while `B`'s first run is in progress on another thread, which
/// flushed it. That run arms `B` again and ends, so `A`'s wait is over; the other thread
/// then flushes `B` again, and `B`'s second run cancels `A` with `cancel_sync`. Nothing
/// waits for `B`'s second run, so this is no cycle: `cancel_sync` must wait for `A`'s
/// run. Fails when the search follows the edge "A waits for B" that stays registered
/// until the main thread takes the lock back after its wait.
#[test]
fn cancel_sync_from_a_run_that_nothing_waits_for_waits_for_the_other_run() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let a_slot: Arc<OnceLock<Weak<Work>>> = Arc::new(OnceLock::new());
        let b_slot: Arc<OnceLock<Weak<Work>>> = Arc::new(OnceLock::new());
        let b_started = Arc::new(AtomicBool::new(false));
        let a_in_callback = Arc::new(AtomicBool::new(false));
        let second_run_done = Arc::new(AtomicBool::new(false));
        // Whether A's callback was still running when B's cancel_sync(A) returned.
        let a_ran_on = Arc::new(AtomicBool::new(false));
        let b = {
            let (a_slot, b_slot, b_started, a_in_callback, second_run_done, a_ran_on, sched2) = (
                a_slot.clone(),
                b_slot.clone(),
                b_started.clone(),
                a_in_callback.clone(),
                second_run_done.clone(),
                a_ran_on.clone(),
                sched.clone(),
            );
            Arc::new(sched.work(move |_| {
                if !b_started.swap(true, SeqCst) {
                    // First run: until A's flush waits for it (counted under the lock,
                    // after its edge is registered), then arm the next instance.
                    while sched2.metrics().lending.waited == 0 {
                        thread::yield_now();
                    }
                    b_slot
                        .get()
                        .and_then(Weak::upgrade)
                        .unwrap()
                        .schedule(Duration::ZERO);
                } else {
                    let a = a_slot.get().and_then(Weak::upgrade).unwrap();
                    a.cancel_sync();
                    // Checked outside: a panic here would only poison B.
                    a_ran_on.store(a_in_callback.load(SeqCst), SeqCst);
                    second_run_done.store(true, SeqCst);
                }
                Next::Park
            }))
        };
        let a = {
            let (b_slot, b_started, a_in_callback) =
                (b_slot.clone(), b_started.clone(), a_in_callback.clone());
            Arc::new(sched.work(move |_| {
                a_in_callback.store(true, SeqCst);
                while !b_started.load(SeqCst) {
                    thread::yield_now();
                }
                b_slot.get().and_then(Weak::upgrade).unwrap().flush();
                a_in_callback.store(false, SeqCst);
                Next::Park
            }))
        };
        a_slot.set(Arc::downgrade(&a)).unwrap();
        b_slot.set(Arc::downgrade(&b)).unwrap();
        assert!(a.schedule(Duration::ZERO) && b.schedule(Duration::ZERO));
        let other = {
            let b = b.clone();
            thread::spawn(move || {
                assert!(b.flush()); // B's first run
                assert!(b.flush()); // B's second run
            })
        };
        assert!(a.flush());
        other.join().unwrap();
        assert!(second_run_done.load(SeqCst), "B's second run never came");
        assert!(
            !a_ran_on.load(SeqCst),
            "B's cancel_sync(A) returned while A's callback still ran: A's ended wait for \
             B's first run was taken for a wait cycle"
        );
    });
}

#![cfg(loom)]
//! Loom models of the waits between works: a wait cycle between two works (each callback
//! flushes, cancels or drops the other while both run on two threads driving the manual
//! scheduler), and an unmatched `enable()` against a `cancel_sync` waiting for a run.
//! Loom reports a deadlock when every thread is blocked, so a cycle that is not broken
//! fails the model.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering};
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

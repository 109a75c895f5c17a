//! No hidden waits on a `PerCid`'s reader gate.
//!
//! A `for_each` waiting for an owner (documented) once blocked whoever needed its gate:
//! owners of flagged slots not visited yet, trims at a thread's exit once the scheduler is
//! gone, and the compaction scan on the scheduler's worker; each closed a cycle that
//! exists in no other way. Now the reader clears the later flags while it waits (U in
//! `src/cid/reader.rs`) and a trim never waits for a reader (it is left to it).
//!
//! Hangs are detected by a liveness bound; no test waits for a sleep as proof.

use crate::common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::EVENTUALLY;
use nicework::{IdSpace, MIN_SCAN_PERIOD, Next, PerCid, Scheduler};

/// Runs `f` on a thread and reports whether it finished (body and thread exit) within the
/// liveness bound. A thread that does not finish is left behind (it is deadlocked).
fn finishes_within(bound: Duration, f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let inner = std::thread::spawn(f);
        let _ = inner.join();
        let _ = tx.send(());
    });
    rx.recv_timeout(bound).is_ok()
}

/// Runs `f` on a thread that then never exits (its exit could trim, and wait for a gate a
/// deadlocked test left held), and waits for `f` to return.
fn on_a_thread_that_stays(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
        loop {
            std::thread::park();
        }
    });
    rx.recv().unwrap();
}

/// Two owners that meet inside `with` (a `Barrier` of 2, each in `with` on its own slot)
/// work alone. With a reader in `for_each` started while the first one is inside, the
/// second one's `with` used to wait for the reader (its slot FLAGGED, not visited yet)
/// while the reader waited at W for the first one's borrow, and the first one for the
/// second one. The reader now clears the later flags while it waits (U).
#[test]
fn owners_meeting_inside_with_finish_beside_a_reader() {
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let p: Arc<PerCid<AtomicU64>> = Arc::new(PerCid::new(&ids, || AtomicU64::new(0)));
    std::mem::forget(sched.clone()); // never shut down: thread exits do not trim
    // id 0: a slot never borrowed during the test, visited first.
    let p0 = p.clone();
    on_a_thread_that_stays(move || p0.with(|n| *n.get_mut() += 1));

    let meet = Arc::new(Barrier::new(2));
    let (a_ready_tx, a_ready) = mpsc::channel();
    let (a_go_tx, a_go) = mpsc::channel::<()>();
    let (a_in_tx, a_in) = mpsc::channel();
    let (b_ready_tx, b_ready) = mpsc::channel();
    let (b_go_tx, b_go) = mpsc::channel::<()>();
    let (b_done_tx, b_done) = mpsc::channel();

    let a = {
        let (p, meet) = (p.clone(), meet.clone());
        std::thread::spawn(move || {
            let id = p.with(|n| {
                *n.get_mut() += 1;
                0
            });
            let _ = id;
            a_ready_tx.send(()).unwrap();
            a_go.recv().unwrap();
            p.with(|_| {
                a_in_tx.send(()).unwrap();
                meet.wait();
            });
        })
    };
    a_ready.recv().unwrap(); // a owns id 1
    let b = {
        let (p, meet) = (p.clone(), meet.clone());
        std::thread::spawn(move || {
            p.with(|n| *n.get_mut() += 1);
            b_ready_tx.send(()).unwrap();
            b_go.recv().unwrap();
            p.with(|_| {
                meet.wait();
            });
            b_done_tx.send(()).unwrap();
        })
    };
    b_ready.recv().unwrap(); // b owns id 2
    assert_eq!(ids.held(), 3);

    a_go_tx.send(()).unwrap();
    a_in.recv().unwrap(); // a is inside `with`, before the barrier

    let (visited_tx, visited) = mpsc::channel();
    let reader = {
        let p = p.clone();
        std::thread::spawn(move || {
            let first = AtomicUsize::new(0);
            p.for_each(|_| {
                if first.fetch_add(1, Ordering::Relaxed) == 0 {
                    // Slot 0 is being visited: every slot was flagged before.
                    let _ = visited_tx.send(());
                }
            });
        })
    };
    visited.recv().unwrap();
    // Every slot is flagged now; b's `with` starts after that.
    b_go_tx.send(()).unwrap();
    let finished = b_done.recv_timeout(EVENTUALLY).is_ok();
    assert!(
        finished,
        "deadlock: owner b waits in `with` for the reader (its slot is flagged), the reader \
         waits for owner a's borrow, owner a waits for b inside its `with`"
    );
    a.join().unwrap();
    b.join().unwrap();
    reader.join().unwrap();
}

/// With the scheduler gone, a thread's exit trims. When that trim waited for the gate, a
/// `for_each` callback that spawned a thread using the space and joined it waited for a
/// thread that waited for the callback's own gate. The trim is now left to the reader.
#[test]
fn a_for_each_callback_may_join_a_thread_that_used_the_space_without_scheduler() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let p: Arc<PerCid<AtomicU64>> = Arc::new(PerCid::new(&ids, || AtomicU64::new(0)));
    drop(sched); // no scans: trims run at thread exits
    let p0 = p.clone();
    on_a_thread_that_stays(move || p0.with(|n| *n.get_mut() += 1));
    let p2 = p.clone();
    let ok = finishes_within(EVENTUALLY, move || {
        let mut once = true;
        p2.for_each(|_| {
            if std::mem::take(&mut once) {
                let p3 = p2.clone();
                std::thread::spawn(move || p3.with(|n| *n.get_mut() += 1))
                    .join()
                    .unwrap();
            }
        });
    });
    assert!(
        ok,
        "deadlock: the joined thread's exit trims and waits for the gate held by the \
         for_each whose callback joins it"
    );
}

/// The same with the wait on the owner's side: a `with` that joins a thread which used the
/// space, while another thread's `for_each` waits for that `with`.
#[test]
fn a_with_may_join_a_thread_that_used_the_space_beside_a_reader_without_scheduler() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let p: Arc<PerCid<AtomicU64>> = Arc::new(PerCid::new(&ids, || AtomicU64::new(0)));
    drop(sched);
    let p2 = p.clone();
    let ok = finishes_within(EVENTUALLY, move || {
        // id 0 and slot 0, visited first by the reader.
        let p0 = p2.clone();
        on_a_thread_that_stays(move || p0.with(|n| *n.get_mut() += 1));
        let (in_tx, in_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let owner = {
            let p = p2.clone();
            std::thread::spawn(move || {
                p.with(|_| {
                    in_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    let p3 = p.clone();
                    std::thread::spawn(move || p3.with(|n| *n.get_mut() += 1))
                        .join()
                        .unwrap();
                })
            })
        };
        in_rx.recv().unwrap(); // the owner is inside `with` on id 1
        let (visited_tx, visited) = mpsc::channel();
        let reader = {
            let p = p2.clone();
            std::thread::spawn(move || {
                let mut first = true;
                p.for_each(|_| {
                    if std::mem::take(&mut first) {
                        let _ = visited_tx.send(());
                    }
                });
            })
        };
        visited.recv().unwrap(); // the reader holds the gate, and waits for slot 1 next
        go_tx.send(()).unwrap();
        owner.join().unwrap();
        reader.join().unwrap();
    });
    assert!(
        ok,
        "deadlock: with -> join -> thread exit trim -> gate -> reader -> with"
    );
}

/// The compaction scan's trim runs on the scheduler's worker. When it waited for the gate,
/// a `for_each` waiting for an owner stalled every work of that scheduler (the default
/// has one worker; `global()` is shared by the process), and an owner waiting inside
/// `with` for one of those works closed a cycle.
#[test]
fn a_reader_waiting_for_an_owner_never_stalls_the_scheduler_worker() {
    let sched = Scheduler::new().unwrap(); // one worker
    let ids = Arc::new(
        IdSpace::builder()
            .scan_period(MIN_SCAN_PERIOD)
            .build(&sched),
    );
    let p: Arc<PerCid<AtomicU64>> = Arc::new(PerCid::new(&ids, || AtomicU64::new(0)));

    // Thread x takes id 0 and makes slot 0, then waits; the main thread takes id 1.
    let (x_ready_tx, x_ready) = mpsc::channel();
    let (x_exit_tx, x_exit) = mpsc::channel::<()>();
    let x = {
        let p = p.clone();
        std::thread::spawn(move || {
            p.with(|n| *n.get_mut() += 1);
            x_ready_tx.send(()).unwrap();
            x_exit.recv().unwrap();
        })
    };
    x_ready.recv().unwrap();

    let (ran_tx, ran) = mpsc::channel();
    let work = sched.work(move |_| {
        let _ = ran_tx.send(());
        Next::Park
    });

    let stalled = p.with(|_| {
        // Pinned on id 1 from here on (x's exit leaves it not below `held`; pinned, it
        // stays ours).
        x_exit_tx.send(()).unwrap();
        x.join().unwrap();
        let (visited_tx, visited) = mpsc::channel();
        let reader = {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut first = true;
                p.for_each(|_| {
                    if std::mem::take(&mut first) {
                        let _ = visited_tx.send(());
                    }
                });
            })
        };
        // The reader holds the gate (it visits slot 0) and will wait for our borrow.
        visited.recv().unwrap();
        // A scan is due within one period, before this work's deadline.
        work.schedule(MIN_SCAN_PERIOD * 5);
        let stalled = ran.recv_timeout(EVENTUALLY).is_err();
        (stalled, reader)
    });
    let (stalled, reader) = stalled;
    reader.join().unwrap();
    assert!(
        !stalled,
        "deadlock: a work due in 50 ms never ran: the compaction scan holds the only \
         worker, waiting for the gate of a for_each that waits for this thread's `with`"
    );
}

/// The manual scheduler runs the scan on the thread that calls `advance()`: from inside
/// `with`, beside a reader that waits for that `with`, the scan's trim used to wait for
/// the reader's gate.
#[test]
fn advance_inside_with_finishes_beside_a_reader() {
    let sched = Scheduler::manual();
    let ids = Arc::new(
        IdSpace::builder()
            .scan_period(MIN_SCAN_PERIOD)
            .build(&sched),
    );
    let p: Arc<PerCid<AtomicU64>> = Arc::new(PerCid::new(&ids, || AtomicU64::new(0)));
    std::mem::forget(sched.clone());
    let p0 = p.clone();
    on_a_thread_that_stays(move || p0.with(|n| *n.get_mut() += 1)); // id 0, slot 0
    let p1 = p.clone();
    let ok = finishes_within(EVENTUALLY, move || {
        p1.with(|_| {
            // id 1
            let (visited_tx, visited) = mpsc::channel();
            let p = p1.clone();
            std::thread::spawn(move || {
                let mut first = true;
                p.for_each(|_| {
                    if std::mem::take(&mut first) {
                        let _ = visited_tx.send(());
                    }
                });
            });
            visited.recv().unwrap(); // the reader holds the gate and waits for slot 1
            sched.advance(MIN_SCAN_PERIOD * 2);
        });
    });
    assert!(
        ok,
        "deadlock: advance() inside with -> scan -> trim -> gate -> reader -> with"
    );
}

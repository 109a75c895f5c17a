//! `Work::try_flush`: helps without waiting. A pending work runs on the caller; a running
//! or idle one returns `false` at once. Each running case holds the callback on a
//! channel, so a `try_flush` that waited would never return.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::EVENTUALLY;
use nicework::{Next, Scheduler, Work};

const HOUR: Duration = Duration::from_secs(3600);

/// Runs `f` on another thread and returns its result, failing if it does not return
/// while the callback is held (that is, if it waited).
fn returns_without_waiting<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(EVENTUALLY)
        .expect("try_flush waited for a run it should have left alone")
}

/// A work on a real scheduler whose runs block until the returned sender says go; the
/// receiver hears each run start, with the thread it runs on.
fn held_work(
    sched: &Scheduler,
    next: Next,
) -> (
    Arc<Work>,
    mpsc::Receiver<std::thread::ThreadId>,
    mpsc::Sender<()>,
) {
    let (started_tx, started_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let work = sched.work(move |_| {
        started_tx.send(std::thread::current().id()).unwrap();
        go_rx.lock().unwrap().recv().unwrap();
        next
    });
    (Arc::new(work), started_rx, go_tx)
}

#[test]
fn an_idle_work_returns_false_and_a_pending_one_runs_on_the_caller() {
    let sched = Scheduler::new().unwrap();
    let (work, started, go) = held_work(&sched, Next::Park);
    assert!(!work.try_flush(), "idle");
    assert!(work.schedule(HOUR));
    go.send(()).unwrap(); // the run about to happen here may go at once
    assert!(work.try_flush(), "pending: ran here");
    assert_eq!(started.recv().unwrap(), std::thread::current().id());
    assert_eq!(work.stats().runs, 1);
    assert!(!work.is_pending());
    assert!(!work.try_flush(), "parked again");
}

#[test]
fn a_work_running_on_a_worker_returns_false_at_once_even_with_an_instance_pending() {
    let sched = Scheduler::new().unwrap();
    let (work, started, go) = held_work(&sched, Next::Park);
    work.schedule(Duration::ZERO);
    started.recv_timeout(EVENTUALLY).unwrap(); // held on the worker now
    let w = work.clone();
    assert!(!returns_without_waiting(move || w.try_flush()), "running");
    // An instance armed during the run: still running, still false, no wait.
    assert!(work.schedule(Duration::ZERO));
    let w = work.clone();
    assert!(
        !returns_without_waiting(move || w.try_flush()),
        "running and pending"
    );
    assert_eq!(work.stats().runs, 0, "nothing ran on the caller");
    go.send(()).unwrap();
    // The pending instance then runs, on a worker or on a try_flush that finds it
    // pending and idle: exactly once either way.
    go.send(()).unwrap();
    let _ = started.recv_timeout(EVENTUALLY).unwrap();
    assert!(common::eventually(|| work.stats().runs == 2));
}

#[test]
fn a_yielding_work_is_helped_while_no_worker_holds_an_increment() {
    let sched = Scheduler::manual();
    let left = Arc::new(AtomicUsize::new(5));
    let l = left.clone();
    let work = sched.work(move |_| {
        if l.fetch_sub(1, SeqCst) > 1 {
            Next::Yield
        } else {
            Next::Park
        }
    });
    work.schedule(HOUR);
    assert!(work.try_flush());
    assert_eq!(
        left.load(SeqCst),
        0,
        "every increment ran on the caller, as flush"
    );
    assert_eq!(work.stats().runs, 5);

    // On a real worker holding an increment: false, without waiting.
    let real = Scheduler::new().unwrap();
    let (started_tx, started_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let work = Arc::new(real.work(move |_| {
        started_tx.send(()).unwrap();
        go_rx.lock().unwrap().recv().unwrap();
        Next::Yield
    }));
    work.schedule(Duration::ZERO);
    started_rx.recv_timeout(EVENTUALLY).unwrap();
    let w = work.clone();
    assert!(!returns_without_waiting(move || w.try_flush()));
    common::quiet_panics_starting_with("called `Result::unwrap()`");
    drop(go_tx); // every later increment's recv fails: the callback panics, poisoned
    assert!(common::eventually(|| work.is_poisoned()));
}

#[test]
fn refused_states_return_false_disabled_poisoned_cancelled_shut_down_and_inside_the_callback() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Park);
    work.schedule(HOUR);
    work.disable();
    assert!(!work.try_flush(), "disabled (and so disarmed)");
    work.enable();

    common::quiet_panics_starting_with("try_flush poison");
    let poisoned = sched.work(|_| panic!("try_flush poison"));
    poisoned.schedule(Duration::ZERO);
    sched.advance(Duration::from_millis(1));
    assert!(poisoned.is_poisoned());
    assert!(!poisoned.try_flush());

    let cancelled = sched.work(|_| Next::Park);
    cancelled.schedule(HOUR);
    cancelled.cancel();
    assert!(!cancelled.try_flush());

    // From inside its own callback: false, and the run goes on.
    let slot: Arc<Mutex<Option<Arc<Work>>>> = Arc::new(Mutex::new(None));
    let seen = Arc::new(Mutex::new(None));
    let (own, s) = (slot.clone(), seen.clone());
    let inner = Arc::new(sched.work(move |_| {
        let work = own.lock().unwrap().clone().unwrap();
        *s.lock().unwrap() = Some(work.try_flush());
        Next::Park
    }));
    *slot.lock().unwrap() = Some(inner.clone());
    inner.schedule(Duration::ZERO);
    sched.advance(Duration::from_millis(1));
    assert_eq!(*seen.lock().unwrap(), Some(false));
    slot.lock().unwrap().take();

    // After shutdown.
    let real = Scheduler::new().unwrap();
    let work = real.work(|_| Next::Park);
    work.schedule(HOUR);
    drop(real);
    assert!(!work.try_flush());
}

#[test]
fn a_pending_once_runs_on_the_caller_and_is_spent() {
    let sched = Scheduler::new().unwrap();
    let (tx, rx) = mpsc::channel();
    let work = sched.once(HOUR, move |_| tx.send(std::thread::current().id()).unwrap());
    assert!(work.try_flush());
    assert_eq!(rx.recv().unwrap(), std::thread::current().id());
    assert!(!work.try_flush());
    assert!(!work.schedule(Duration::ZERO));
}

/// Writers that help through `try_flush` while a worker drains too: every pending
/// instance runs exactly once, and no writer ever blocks for a run.
#[test]
fn many_helpers_and_a_worker_never_run_one_instance_twice_or_wait() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let (r, o) = (running.clone(), overlaps.clone());
    let work = Arc::new(sched.work(move |_| {
        if r.fetch_add(1, SeqCst) != 0 {
            o.fetch_add(1, SeqCst);
        }
        std::hint::black_box((0..200).sum::<u64>());
        r.fetch_sub(1, SeqCst);
        Next::Park
    }));
    std::thread::scope(|s| {
        for _ in 0..4 {
            let work = work.clone();
            s.spawn(move || {
                for _ in 0..2_000 {
                    work.schedule(Duration::ZERO);
                    work.try_flush();
                }
            });
        }
    });
    assert!(common::eventually(
        || !work.is_pending() && !work.is_running()
    ));
    assert_eq!(overlaps.load(SeqCst), 0, "two runs at once");
}

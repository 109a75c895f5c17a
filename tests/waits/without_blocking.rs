//! `cancel_async` and `drop_async`: the cancel and the refusal happen in the call, the
//! future resolves once no instance runs, it never blocks the polling thread, and one
//! dropped early never blocks either (the closure is then freed by the run's end).
//! Futures are polled by hand with a counting waker, so no executor is involved.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, mpsc};
use std::task::Poll;
use std::time::Duration;

use common::wakers::{counting_waker as waker, poll};
use common::{EVENTUALLY, drop_flag, eventually};
use nicework::{Next, Scheduler, Work};

/// A work on a real worker whose run is in progress until `release` is sent; it
/// returns `Next::Again` (which a cancel must refuse). Its closure's drop sets the flag.
struct Running {
    _sched: Scheduler,
    work: Work,
    release: mpsc::Sender<()>,
    freed: Arc<AtomicBool>,
    runs: Arc<AtomicUsize>,
}

fn running() -> Running {
    let sched = Scheduler::new().unwrap();
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let (flag, freed) = drop_flag();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let work = sched.work(move |_| {
        let _keep = &flag;
        counted.fetch_add(1, SeqCst);
        let _ = started_tx.send(());
        let _ = release_rx.recv_timeout(EVENTUALLY);
        Next::Again
    });
    work.schedule(Duration::ZERO);
    started.recv_timeout(EVENTUALLY).unwrap();
    Running {
        _sched: sched,
        work,
        release,
        freed,
        runs,
    }
}

#[test]
fn drop_async_resolves_after_the_run_and_frees_the_closure_then() {
    let Running {
        _sched,
        work,
        release,
        freed,
        runs,
    } = running();
    let (wakes, waker) = waker();
    let mut dropped = Box::pin(work.drop_async());
    assert!(
        poll(dropped.as_mut(), &waker).is_pending(),
        "the run goes on"
    );
    assert!(poll(dropped.as_mut(), &waker).is_pending(), "polled again");
    assert!(!freed.load(SeqCst), "not freed under the run");
    release.send(()).unwrap();
    assert!(
        eventually(|| wakes.0.load(SeqCst) > 0),
        "woken at the run's end"
    );
    assert!(poll(dropped.as_mut(), &waker).is_ready());
    assert!(freed.load(SeqCst), "freed when it resolved");
    assert_eq!(runs.load(SeqCst), 1, "its own Again was refused");
}

#[test]
fn a_drop_async_future_dropped_early_never_blocks_and_the_run_frees_the_closure() {
    let Running {
        _sched,
        work,
        release,
        freed,
        runs,
    } = running();
    let (_wakes, waker) = waker();
    let mut dropped = Box::pin(work.drop_async());
    assert!(poll(dropped.as_mut(), &waker).is_pending());
    // Dropping it while the run is blocked on `release` must return: it does not wait.
    drop(dropped);
    assert!(!freed.load(SeqCst));
    release.send(()).unwrap();
    assert!(eventually(|| freed.load(SeqCst)), "the runner frees it");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(runs.load(SeqCst), 1, "never runs again");
    // Never polled at all: the same.
    let Running {
        _sched,
        work,
        release,
        freed,
        runs,
    } = running();
    drop(work.drop_async());
    release.send(()).unwrap();
    assert!(eventually(|| freed.load(SeqCst)));
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn drop_async_of_an_idle_work_frees_the_closure_in_the_call() {
    let sched = Scheduler::new().unwrap();
    let (flag, freed) = drop_flag();
    let work = sched.every(Duration::from_secs(60), move |_| {
        let _keep = &flag;
        Next::Again
    });
    let (_wakes, waker) = waker();
    let mut dropped = Box::pin(work.drop_async());
    assert!(freed.load(SeqCst));
    assert!(poll(dropped.as_mut(), &waker).is_ready());
    assert!(
        poll(dropped.as_mut(), &waker).is_ready(),
        "polled again: still ready"
    );
    assert_eq!(sched.metrics().armed, 0);
}

#[test]
fn cancel_async_refuses_at_once_and_resolves_when_no_instance_runs() {
    let Running {
        _sched,
        work,
        release,
        freed,
        runs,
    } = running();
    let (wakes, waker) = waker();
    let mut cancelled = Box::pin(work.cancel_async());
    assert!(
        !work.schedule(Duration::ZERO),
        "re-arms are refused while it waits"
    );
    assert!(poll(cancelled.as_mut(), &waker).is_pending());
    release.send(()).unwrap();
    assert!(eventually(|| wakes.0.load(SeqCst) > 0));
    assert_eq!(
        poll(cancelled.as_mut(), &waker),
        Poll::Ready(false),
        "was running"
    );
    assert!(!work.is_pending() && !work.is_running());
    assert_eq!(runs.load(SeqCst), 1, "its own Again was refused");
    assert!(!freed.load(SeqCst), "cancel keeps the closure");
    drop(cancelled);
    // As after cancel_sync: schedule arms it again.
    assert!(work.schedule(Duration::ZERO));
    assert!(eventually(|| runs.load(SeqCst) == 2));
    let _ = release.send(());
}

#[test]
fn a_cancel_async_future_dropped_early_still_refuses_the_runs_own_re_arm() {
    let Running {
        _sched,
        work,
        release,
        runs,
        ..
    } = running();
    let (_wakes, waker) = waker();
    let mut cancelled = Box::pin(work.cancel_async());
    assert!(poll(cancelled.as_mut(), &waker).is_pending());
    drop(cancelled);
    release.send(()).unwrap();
    assert!(eventually(|| !work.is_running()));
    assert!(!work.is_pending(), "the run's Again stays refused");
    assert_eq!(runs.load(SeqCst), 1);
    assert!(
        work.schedule(Duration::ZERO),
        "and the work can be armed again after"
    );
}

#[test]
fn cancel_async_and_drop_async_inside_the_own_callback_resolve_at_once() {
    let sched = Scheduler::manual();
    let slot: Arc<std::sync::Mutex<Option<Work>>> = Arc::default();
    let resolved = Arc::new(AtomicUsize::new(0));
    let (inner_slot, seen) = (slot.clone(), resolved.clone());
    let work = sched.work(move |_| {
        let (_wakes, waker) = waker();
        let guard = inner_slot.lock().unwrap();
        if let Some(me) = guard.as_ref() {
            let mut cancelled = Box::pin(me.cancel_async());
            if poll(cancelled.as_mut(), &waker).is_ready() {
                seen.fetch_add(1, SeqCst);
            }
        }
        Next::Again
    });
    work.schedule(Duration::ZERO);
    *slot.lock().unwrap() = Some(work);
    sched.advance(Duration::from_millis(1));
    assert_eq!(resolved.load(SeqCst), 1);
    assert_eq!(
        sched.advance(Duration::from_secs(1)),
        0,
        "its Again was refused"
    );
    // drop_async from inside: the closure is freed right after the callback returns.
    let (flag, freed) = drop_flag();
    let slot: Arc<std::sync::Mutex<Option<Work>>> = Arc::default();
    let inner_slot = slot.clone();
    let work = sched.work(move |_| {
        let _keep = &flag;
        if let Some(me) = inner_slot.lock().unwrap().take() {
            let (_wakes, waker) = waker();
            let mut dropped = Box::pin(me.drop_async());
            assert!(poll(dropped.as_mut(), &waker).is_ready());
        }
        Next::Again
    });
    work.schedule(Duration::ZERO);
    *slot.lock().unwrap() = Some(work);
    sched.advance(Duration::from_millis(1));
    assert!(freed.load(SeqCst));
    assert_eq!(sched.advance(Duration::from_secs(1)), 0);
}

#[test]
fn drop_async_on_a_hosted_scheduler_waits_for_the_run_on_the_host() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let (flag, freed) = drop_flag();
    let work = sched.work(move |_| {
        let _keep = &flag;
        started_tx.send(()).unwrap();
        release_rx.recv_timeout(EVENTUALLY).unwrap();
        Next::Again
    });
    work.schedule(Duration::ZERO);
    let host = std::thread::spawn(move || {
        driver.run_due();
        driver
    });
    started.recv_timeout(EVENTUALLY).unwrap();
    let (wakes, waker) = waker();
    let mut dropped = Box::pin(work.drop_async());
    assert!(poll(dropped.as_mut(), &waker).is_pending());
    release.send(()).unwrap();
    let _driver = host.join().unwrap();
    assert_eq!(wakes.0.load(SeqCst), 1);
    assert!(poll(dropped.as_mut(), &waker).is_ready());
    assert!(freed.load(SeqCst));
}

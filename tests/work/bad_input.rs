//! Bad input and calls in the wrong place: each gets a clear `Error` or a documented
//! result, never a panic, a hang, a spin or lost work.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use common::EVENTUALLY;
use nicework::{Error, MAX_WORKERS, MIN_SLACK, Next, Priority, Scheduler};

const MS: Duration = Duration::from_millis(1);

#[test]
fn zero_or_too_many_workers_is_an_error() {
    assert!(matches!(
        Scheduler::builder().workers(0).build(),
        Err(Error::InvalidWorkers(0))
    ));
    assert!(matches!(
        Scheduler::builder().workers(MAX_WORKERS + 1).build(),
        Err(Error::InvalidWorkers(_))
    ));
}

#[test]
fn nice_out_of_range_is_an_error() {
    for nice in [20, -21, i32::MIN, i32::MAX] {
        let err = Scheduler::builder()
            .priority(Priority::Nice(nice))
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidPriority(n) if n == nice));
        assert!(err.to_string().starts_with("invalid nice value"));
    }
}

#[test]
fn a_thread_name_with_nul_is_an_error() {
    let err = Scheduler::builder().name("a\0b").build().unwrap_err();
    assert!(matches!(err, Error::InvalidName(_)));
}

#[test]
fn slack_is_clamped_not_rejected() {
    let sched = Scheduler::builder().slack(Duration::ZERO).build().unwrap();
    assert_eq!(sched.slack(), MIN_SLACK);
    let sched = Scheduler::builder().slack(Duration::MAX).build().unwrap();
    assert_eq!(sched.slack(), nicework::MAX_SLACK);
}

#[test]
fn duration_max_is_armed_and_never_due() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::After(Duration::MAX));
    assert!(work.schedule(Duration::MAX));
    assert_eq!(sched.advance(Duration::from_secs(86_400 * 365 * 10)), 0);
    assert!(work.is_pending());
    assert!(work.reschedule(Duration::ZERO));
    assert_eq!(sched.advance(Duration::ZERO), 1);
    assert!(
        work.is_pending(),
        "After(Duration::MAX) re-arms for 'never'"
    );
    let every = sched.every(Duration::MAX, |_| Next::Again);
    assert!(every.is_pending());
    assert_eq!(sched.advance(Duration::MAX), 0, "advance(MAX) saturates");
}

#[test]
fn zero_period_again_is_rounded_up_to_the_slack_manual() {
    let sched = Scheduler::manual();
    let work = sched.every(Duration::ZERO, |_| Next::Again);
    // First run at +0, then one per slack (1 ms): 11 runs in 10 ms, not a spin.
    assert_eq!(sched.advance(10 * MS), 11);
    assert_eq!(work.stats().runs, 11);
}

#[test]
fn zero_period_again_does_not_spin_a_worker() {
    let sched = Scheduler::new().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let start = Instant::now();
    let work = sched.every(Duration::ZERO, move |_| {
        r.fetch_add(1, Ordering::Relaxed);
        Next::Again
    });
    // A nice-19 worker beside busy tests may wait a while for its first run.
    assert!(common::eventually(|| runs.load(Ordering::Relaxed) > 0));
    std::thread::sleep(Duration::from_millis(100));
    work.cancel_sync();
    let elapsed = start.elapsed();
    let bound = elapsed.as_nanos() / sched.slack().as_nanos() + 2;
    let runs = runs.load(Ordering::Relaxed) as u128;
    assert!(
        runs <= bound,
        "{runs} runs in {elapsed:?}: more than one per slack"
    );
}

#[test]
fn calls_after_the_scheduler_was_dropped_are_inert() {
    let sched = Scheduler::new().unwrap();
    let armed = sched.every(MS, |_| Next::Again);
    let idle = sched.work(|_| Next::Park);
    drop(sched);
    assert!(!armed.is_pending(), "shutdown cancels armed works");
    common::assert_inert(&armed);
    common::assert_inert(&idle);
    drop(armed);
    drop(idle);
}

#[test]
fn dropping_the_scheduler_from_its_own_callback_does_not_deadlock() {
    let sched = Scheduler::new().unwrap();
    let (tx, rx) = mpsc::channel();
    let holder = Arc::new(std::sync::Mutex::new(Some(sched.clone())));
    let h = holder.clone();
    let work = sched.work(move |_| {
        drop(h.lock().unwrap().take()); // the last handle, dropped on the worker
        tx.send(()).unwrap();
        Next::Again
    });
    drop(sched);
    work.schedule(Duration::ZERO);
    rx.recv_timeout(EVENTUALLY).unwrap();
    assert!(common::eventually(|| !work.is_running()));
    assert!(!work.is_pending());
    assert!(!work.schedule(Duration::ZERO));
}

#[test]
fn advance_on_a_threaded_scheduler_panics_naming_manual() {
    let sched = Scheduler::new().unwrap();
    let work = sched.work(|_| Next::Park);
    work.schedule(Duration::from_secs(3600));
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sched.advance(Duration::from_secs(7200))
    }))
    .expect_err("advance on a threaded scheduler must panic");
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(message.contains("Scheduler::manual()"), "{message}");
    // Nothing ran and nothing changed: the work is still armed for its real deadline.
    assert!(work.is_pending());
    assert_eq!(work.stats().runs, 0);
}

#[test]
fn enable_without_disable_does_nothing() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Park);
    work.enable();
    assert!(!work.is_disabled());
    assert!(!work.disable() && work.is_disabled());
    work.enable();
    assert!(work.schedule(MS));
}

#[test]
fn the_work_handle_outlives_a_manual_scheduler() {
    let sched = Scheduler::manual();
    let work = sched.every(MS, |_| Next::Again);
    drop(sched);
    assert!(!work.is_pending());
    assert!(!work.schedule(MS));
}

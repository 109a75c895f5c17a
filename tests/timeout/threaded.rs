//! Idle timeouts on real threads and the real clock: activity from several threads
//! postpones the run, the run comes once the activity stops, and it never comes within
//! `idle` of a touch that had completed before the run started. The assertions are on
//! the order of events (touch completed, run started) measured with the real clock,
//! never on how long anything took.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::eventually;
use nicework::{Next, Scheduler};

/// Touches recorded as (started, completed) real instants.
type Touches = Arc<Mutex<Vec<(Instant, Instant)>>>;

/// Two threads touch one timeout work every 2 ms for `touching`; returns the touches
/// and the start instant of each run.
fn two_threads_touch(idle: Duration, touching: Duration) -> (Touches, Vec<Instant>) {
    let sched = Scheduler::new().unwrap();
    let touches: Touches = Arc::default();
    let runs: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let record = runs.clone();
    let work = Arc::new(sched.timeout(idle, move |_| {
        record.lock().unwrap().push(Instant::now());
        Next::Park
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let touchers: Vec<_> = (0..2)
        .map(|_| {
            let (work, touches, stop) = (work.clone(), touches.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    work.touch();
                    touches.lock().unwrap().push((started, Instant::now()));
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        })
        .collect();
    std::thread::sleep(touching);
    stop.store(true, Ordering::SeqCst);
    for toucher in touchers {
        toucher.join().unwrap();
    }
    assert!(
        eventually(|| !runs.lock().unwrap().is_empty()),
        "the timeout ran once the touching stopped"
    );
    // A run the touchers' starvation let through may have been touched while it ran, and
    // then ends armed for touch + idle (never lost): the work parks after that run.
    assert!(
        eventually(|| !work.is_pending() && !work.is_running()),
        "it parked"
    );
    let runs = runs.lock().unwrap().clone();
    (touches, runs)
}

/// For each run: no touch that completed before the run started may lie within `idle`
/// before the run (its start counts as the touch's time: the touch happened after it).
fn assert_never_within_idle(idle: Duration, touches: &Touches, runs: &[Instant]) {
    let touches = touches.lock().unwrap();
    assert!(touches.len() > 50, "the threads touched it");
    for run in runs {
        let last = touches
            .iter()
            .filter(|(_, completed)| completed < run)
            .map(|(started, _)| *started)
            .max()
            .unwrap();
        assert!(
            *run >= last + idle,
            "ran {:?} after a touch, within the idle of {idle:?}",
            *run - last
        );
    }
    let last_touch = touches.iter().map(|(started, _)| *started).max().unwrap();
    assert!(
        runs.iter().all(|run| *run >= last_touch),
        "it never ran while the threads still touched it"
    );
}

#[test]
fn two_threads_touching_every_2ms_keep_a_full_clock_timeout_from_running() {
    // 40 ms is below the coarse clock's threshold: touches read the full clock.
    let idle = Duration::from_millis(40);
    let (touches, runs) = two_threads_touch(idle, Duration::from_millis(400));
    assert_eq!(runs.len(), 1);
    assert_never_within_idle(idle, &touches, &runs);
}

#[test]
fn two_threads_touching_every_2ms_keep_a_coarse_clock_timeout_from_running() {
    // 3.3 s is above the threshold (100 coarse margins, 3.2 s on a 250 Hz kernel):
    // touches read CLOCK_MONOTONIC_COARSE, and the margin must keep the run from coming
    // early.
    let idle = Duration::from_millis(3300);
    let (touches, runs) = two_threads_touch(idle, Duration::from_millis(3500));
    assert_eq!(runs.len(), 1);
    assert_never_within_idle(idle, &touches, &runs);
}

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
    two_threads_touch_on(&Scheduler::new().unwrap(), idle, touching)
}

/// [`two_threads_touch`] on `sched`.
fn two_threads_touch_on(
    sched: &Scheduler,
    idle: Duration,
    touching: Duration,
) -> (Touches, Vec<Instant>) {
    let touches: Touches = Arc::default();
    let (work, runs) = crate::recording_timeout(sched, idle);
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
    // 1.3 s is above the touch tick's threshold (1 s): touches read the scheduler's tick,
    // not a clock, and a stamp counts as the time the next tick was published, which
    // must keep the run from coming early.
    let idle = Duration::from_millis(1300);
    let (touches, runs) = two_threads_touch(idle, Duration::from_millis(1500));
    assert_eq!(runs.len(), 1);
    assert_never_within_idle(idle, &touches, &runs);
}

/// The touch tick under a starved worker: the one worker is held by another work's long
/// run, so the tick's refresher cannot run, while two threads keep touching a timeout of
/// 1.2 s (tick-stamped) through that run and after it. The stale tick may only make the
/// run late: it never comes within idle of a touch, by the real clock.
#[test]
fn a_starved_worker_never_lets_a_tick_stamped_timeout_run_within_idle_of_a_touch() {
    let sched = Scheduler::new().unwrap(); // one worker
    let idle = Duration::from_millis(1200);
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let hog = sched.once(Duration::ZERO, move |_| {
        held_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(1300)); // the worker is busy: no refresh
    });
    held_rx.recv().unwrap();
    let (touches, runs) = two_threads_touch_on(&sched, idle, Duration::from_millis(2000));
    assert_eq!(runs.len(), 1);
    assert_never_within_idle(idle, &touches, &runs);
    assert_eq!(hog.stats().runs, 1);
}

/// A long timeout touched once, beside a short one touched all the time (which keeps the
/// tick refreshing every 1/16 of the short idle): by the time the long one is judged its
/// stamp is older than the exact part of the tick history, and it must still run, close
/// to touch + idle, and not before.
#[test]
fn a_long_timeout_touched_once_runs_beside_a_short_one_that_keeps_the_tick_busy() {
    let sched = Scheduler::new().unwrap();
    let short = sched.timeout(Duration::from_secs(1), |_| Next::Park);
    let long_idle = Duration::from_secs(5);
    let (ran_tx, ran_rx) = std::sync::mpsc::channel();
    let long = sched.timeout(long_idle, move |_| {
        let _ = ran_tx.send(Instant::now());
        Next::Park
    });
    let touched = Instant::now();
    long.touch();
    let stop = AtomicBool::new(false);
    let ran = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                short.touch();
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let ran = ran_rx.recv_timeout(common::EVENTUALLY);
        stop.store(true, Ordering::SeqCst);
        ran
    });
    let ran = ran.expect("the long timeout ran while the short one kept the tick busy");
    assert!(
        ran >= touched + long_idle,
        "ran {:?} after its touch",
        ran - touched
    );
    assert_eq!(short.stats().runs, 0, "the short one was touched all along");
}

/// The one precision rule's bound, read from `deadline()` (computed from the stamp, no
/// run waited for): for idles on both sides of 1 s, a touched timeout is due no earlier
/// than the touch + idle and no later than that + idle / 16 + the slack (a short idle's
/// reap rounded up to 1/16 of it, a long one's bounded by the touch tick's interval).
#[test]
fn a_touched_timeouts_deadline_is_within_an_idle_sixteenth_and_a_slack_of_touch_plus_idle() {
    let sched = Scheduler::new().unwrap();
    let slack = sched.slack();
    for ms in [50u64, 160, 999, 1_000, 4_000] {
        let idle = Duration::from_millis(ms);
        let work = sched.timeout(idle, |_| Next::Park);
        let before = Instant::now();
        work.touch();
        let after = Instant::now();
        let due = work.deadline().expect("armed");
        assert!(
            due >= before + idle,
            "idle {idle:?}: due before touch + idle"
        );
        // The tick's next refresh may not have come yet: its bound is then the time of
        // a refresh at most one interval (idle / 16) after the touch.
        assert!(
            due <= after + idle + idle / 16 + slack * 2,
            "idle {idle:?}: due {:?} after touch + idle",
            due - (before + idle)
        );
    }
}

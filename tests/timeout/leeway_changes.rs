//! A timeout's leeway changed after its creation: against a run in progress (a touch
//! during the run is never lost, an untouched run that parks stays parked), long after
//! a touch (the reap keeps the rule's bound), after the tick moved past a stamp (at most
//! one old interval more, until the next touch), over repeated changes (never early),
//! and the tick's registry (no leak once the works are gone, and the refresher slows
//! down again).

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::eventually;
use nicework::{Next, Scheduler, Work};

const IDLE: Duration = Duration::from_millis(300); // idle/16 = 19 ms: the clock
const TICKING: Duration = Duration::from_millis(200); // leeway/2 = 100 ms: the tick

/// A timeout whose first run signals `started` and waits for `go`, then parks.
fn blocking_timeout(
    sched: &Scheduler,
    idle: Duration,
) -> (Work, Arc<AtomicU64>, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let runs = Arc::new(AtomicU64::new(0));
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let started_tx = Mutex::new(started_tx);
    let go_rx = Mutex::new(go_rx);
    let r = runs.clone();
    let work = sched.timeout(idle, move |_| {
        if r.fetch_add(1, SeqCst) == 0 {
            started_tx.lock().unwrap().send(()).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
        }
        Next::Park
    });
    (work, runs, started_rx, go_tx)
}

/// A touch during the run, then a leeway that converts the stamp from the clock to a
/// tick: "a touch during a run is never lost".
#[test]
fn touch_during_run_then_leeway_to_ticks_is_not_lost() {
    let sched = common::normal_priority_builder().build().unwrap();
    let (work, runs, started, go) = blocking_timeout(&sched, IDLE);
    started.recv().unwrap();
    assert!(work.is_running());
    work.touch(); // during the run: the work must end armed
    let work = work.leeway(TICKING); // clock -> tick
    go.send(()).unwrap();
    assert!(eventually(|| !work.is_running()));
    assert!(
        work.is_pending(),
        "touched during its run, the timeout ended parked: the touch was lost"
    );
    assert!(eventually(|| runs.load(SeqCst) >= 2));
}

/// No touch at all, a leeway that converts the (tick) stamp to the clock during the run:
/// the callback parks, and nothing touched it.
#[test]
fn untouched_leeway_to_clock_during_run_does_not_rearm() {
    let sched = common::normal_priority_builder().build().unwrap();
    let (work, runs, started, go) = blocking_timeout(&sched, IDLE);
    let work = work.leeway(TICKING); // ticks from the start, never touched
    started.recv().unwrap();
    let work = work.leeway(Duration::ZERO); // tick -> clock, during the run
    go.send(()).unwrap();
    assert!(eventually(|| !work.is_running()));
    assert!(
        !work.is_pending(),
        "parked by its callback and never touched, the timeout was re-armed"
    );
    std::thread::sleep(IDLE * 2);
    assert_eq!(runs.load(SeqCst), 1, "ran again without a touch");
}

/// Same, touched before the run only (not during it).
#[test]
fn touched_before_leeway_to_clock_during_run_does_not_rearm() {
    let sched = common::normal_priority_builder().build().unwrap();
    let (work, _runs, started, go) = blocking_timeout(&sched, IDLE);
    let work = work.leeway(TICKING);
    work.touch();
    started.recv().unwrap();
    let work = work.leeway(Duration::ZERO); // tick -> clock, during the run
    go.send(()).unwrap();
    assert!(eventually(|| !work.is_running()));
    assert!(
        !work.is_pending(),
        "parked by its callback, untouched during the run, the timeout was re-armed"
    );
}

/// Control: touched during the run, no leeway change: armed.
#[test]
fn control_touch_during_run_rearms() {
    let sched = common::normal_priority_builder().build().unwrap();
    let (work, _runs, started, go) = blocking_timeout(&sched, IDLE);
    started.recv().unwrap();
    work.touch();
    go.send(()).unwrap();
    assert!(eventually(|| !work.is_running()));
    assert!(work.is_pending());
}

/// After many timeouts of many leeways are dropped, the refresher stops: touches of a
/// clock-stamped timeout cost no refresh.
#[test]
fn registry_does_not_leak_after_drops() {
    let sched = Scheduler::new().unwrap();
    let leeways = [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_millis(124),
        Duration::from_millis(125),
        Duration::from_millis(200),
        Duration::from_secs(3),
        Duration::MAX,
    ];
    for idle in [
        Duration::from_millis(100),
        Duration::from_millis(500),
        Duration::from_secs(2),
    ] {
        for (i, &a) in leeways.iter().enumerate() {
            for &b in &leeways[i..] {
                let w = sched.timeout(idle, |_| Next::Park);
                w.touch();
                let w = w.leeway(a);
                w.touch();
                let w = w.leeway(b);
                w.touch();
                let w = w.leeway(a);
                w.touch();
                w.cancel();
                let w = w.leeway(b);
                drop(w);
            }
        }
    }
    // A ticking timeout is alive, touched, then dropped too.
    let t = sched.timeout(Duration::from_secs(2), |_| Next::Park);
    t.touch();
    drop(t);
    common::settle_wakeups(&sched);
    let before = sched.metrics().worker_wakeups;
    std::thread::sleep(Duration::from_millis(500));
    let quiet = sched.metrics().worker_wakeups - before;
    // A registration left behind keeps the touch tick's refresher waking once per
    // interval: every 125 ms for the last timeout (2 s idle), four times in this window;
    // a slowed build (ASan) may still see a straggler or two settle.
    assert!(quiet <= 2, "{quiet} wakeups with no work left");
}

/// A short-interval ticking timeout dropped: the refresher slows to the long one's.
#[test]
fn interval_grows_back_after_leeway_changes() {
    let sched = Scheduler::new().unwrap();
    // Long: idle 4 s -> interval 250 ms.
    let long = sched.timeout(Duration::from_secs(4), |_| Next::Park);
    // Short: idle 300 ms, leeway 150 ms -> 75 ms, given then changed, then given again.
    let short = sched
        .timeout(Duration::from_millis(300), |_| Next::Park)
        .leeway(Duration::from_millis(150))
        .leeway(Duration::from_millis(400))
        .leeway(Duration::from_millis(150));
    short.touch();
    drop(short);
    common::settle_wakeups(&sched);
    let before = sched.metrics().worker_wakeups;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(700) {
        long.touch();
        std::thread::sleep(Duration::from_millis(1));
    }
    let n = sched.metrics().worker_wakeups - before;
    println!("{n} wakeups in 700 ms touching the 4 s timeout");
    // 250 ms refreshes: ~3; at 75 ms ~9.
    assert!(n <= 6, "{n} wakeups: the refresher kept the short interval");
}

/// Drives a hosted scheduler until `ran` is set; asserts every plan is within `bound`
/// and returns the run's start.
fn drive_until_run(
    driver: &nicework::Driver,
    ran: &Mutex<Option<Instant>>,
    bound: Instant,
    what: &str,
) -> Instant {
    let start = Instant::now();
    loop {
        if let Some(at) = *ran.lock().unwrap() {
            return at;
        }
        assert!(start.elapsed() < common::EVENTUALLY, "{what}: never ran");
        let wake = driver.next_deadline().expect("armed");
        assert!(
            wake <= bound,
            "{what}: the host is told to wake {:?} past the rule's bound",
            wake - bound
        );
        if let Some(gap) = wake.checked_duration_since(Instant::now()) {
            std::thread::sleep(gap);
        }
        driver.run_due();
    }
}

fn hosted_recording(
    idle: Duration,
) -> (
    Scheduler,
    nicework::Driver,
    Work,
    Arc<Mutex<Option<Instant>>>,
) {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let at = Arc::new(Mutex::new(None));
    let a = at.clone();
    let work = sched.timeout(idle, move |_| {
        a.lock().unwrap().get_or_insert(Instant::now());
        Next::Park
    });
    (sched, driver, work, at)
}

/// A leeway long after the last touch: the touched work keeps its clock stamp, which is
/// exact, so the reap keeps the new rule's bound.
#[test]
fn late_conversion_clock_to_tick_keeps_the_lateness_bound() {
    let idle = Duration::from_millis(300);
    let leeway = Duration::from_millis(150);
    let (_sched, driver, work, at) = hosted_recording(idle);
    let last_touch = Instant::now();
    work.touch();
    std::thread::sleep(Duration::from_millis(250)); // nothing due yet
    let work = work.leeway(leeway);
    let bound = last_touch + idle + idle / 16 + leeway + Duration::from_millis(2);
    let ran = drive_until_run(&driver, &at, bound, "clock->tick late");
    assert!(ran >= last_touch + idle);
    drop(work);
}

/// Tick -> clock after the tick moved past the stamp: the stamp becomes the next tick's
/// time, up to the old interval (75 ms) after the touch, which the reap may then be
/// later than the new leeway allows, until the next touch (see `retick_timeout`).
#[test]
fn conversion_tick_to_clock_after_a_refresh_keeps_the_lateness_bound() {
    let idle = Duration::from_millis(300);
    let (_sched, driver, work, at) = hosted_recording(idle);
    let work = work.leeway(Duration::from_millis(150)); // interval 75 ms
    let last_touch = Instant::now();
    work.touch();
    // Let the refresher run once (hosted: it runs in run_due).
    let until = Instant::now() + Duration::from_millis(120);
    while Instant::now() < until {
        if let Some(wake) = driver.next_deadline() {
            if let Some(gap) = wake.checked_duration_since(Instant::now()) {
                std::thread::sleep(gap.min(until.saturating_duration_since(Instant::now())));
            }
        }
        driver.run_due();
    }
    let work = work.leeway(Duration::ZERO); // tick -> clock
    let old_interval = Duration::from_millis(75);
    let bound = last_touch + idle + idle / 16 + Duration::from_millis(1) + old_interval;
    let ran = drive_until_run(&driver, &at, bound, "tick->clock after a refresh");
    assert!(ran >= last_touch + idle);
    drop(work);
}

#[test]
fn never_early_across_repeated_conversions_hosted() {
    let idle = Duration::from_millis(300);
    for round in 0..2u32 {
        let (_sched, driver, mut work, at) = hosted_recording(idle);
        let mut last_touch = Instant::now();
        for step in 0..12u32 {
            let l = match (step + round) % 4 {
                0 => Duration::from_millis(150),
                1 => Duration::ZERO,
                2 => Duration::from_millis(400),
                _ => Duration::MAX,
            };
            last_touch = Instant::now();
            work.touch();
            std::thread::sleep(Duration::from_millis(20));
            driver.run_due();
            work = work.leeway(l);
        }
        let work = work.leeway(Duration::ZERO);
        let far = Instant::now() + Duration::from_secs(3600);
        let ran = drive_until_run(&driver, &at, far, "repeated");
        assert!(
            ran >= last_touch + idle,
            "round {round}: early by {:?}",
            last_touch + idle - ran
        );
        drop(work);
    }
}

//! Maintenance that runs while the object is quiet: a timeout every write touches, with
//! a leeway (`sched.timeout(idle, drain).leeway(l)`). It never runs while touches come
//! faster than its idle, runs once they stop, and with a leeway of 125 ms or more its
//! touches read the touch tick instead of the clock: the refresher then runs about once
//! per half leeway while touched, and not at all once touches stop. A leeway given after
//! touches converts the stamp (clock to tick, and back) without ever making the reap
//! early, and a host is never told to wake past `last touch + idle + idle / 16 +
//! leeway`.
//!
//! Nothing asserts a timing: a run is compared with the touches before it, a plan with
//! the rule's bound, and wakeups are counted.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::eventually;
use nicework::{Next, Scheduler};

const IDLE: Duration = Duration::from_millis(200);
/// Half of it, 65 ms, is at least the touch tick's shortest interval (62.5 ms).
const LEEWAY: Duration = Duration::from_millis(130);

#[test]
fn a_timeout_every_write_touches_never_runs_while_writes_come_and_runs_once_they_stop() {
    let sched = Scheduler::new().unwrap();
    let runs = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let ran = runs.clone();
    let drain = sched
        .timeout(IDLE, move |_| {
            ran.lock().unwrap().push(Instant::now());
            Next::Park
        })
        .leeway(LEEWAY);
    let start = Instant::now();
    let (mut last_touch, mut longest_gap) = (start, Duration::ZERO);
    // Writes every millisecond for three idles.
    while start.elapsed() < IDLE * 3 {
        let now = Instant::now();
        longest_gap = longest_gap.max(now - last_touch);
        last_touch = now;
        drain.touch();
        std::thread::sleep(Duration::from_millis(1));
    }
    let writes_stopped = Instant::now();
    assert!(
        eventually(|| runs.lock().unwrap().iter().any(|&at| at >= writes_stopped)),
        "the drain never ran once the writes stopped"
    );
    if longest_gap >= IDLE / 2 {
        println!("the writer stalled for {longest_gap:?}: runs during the writes not judged");
        return;
    }
    for &at in runs.lock().unwrap().iter() {
        assert!(
            at >= last_touch + IDLE,
            "the drain ran {:?} before the last write + idle",
            last_touch + IDLE - at
        );
    }
}

#[test]
fn with_a_leeway_the_touches_keep_the_tick_moving_only_while_they_come() {
    let sched = Scheduler::new().unwrap();
    let drain = sched.timeout(IDLE, |_| Next::Park).leeway(LEEWAY);
    common::settle_wakeups(&sched);
    let before = sched.metrics().worker_wakeups;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(400) {
        drain.touch();
        std::thread::sleep(Duration::from_micros(200));
    }
    let touched = sched.metrics().worker_wakeups - before;
    // One refresh per 65 ms (half the leeway), and the timer's re-placement once per idle.
    println!("{touched} worker wakeups in 400 ms of touches");
    assert!(touched <= 10, "{touched} wakeups in 400 ms of touches");
    assert!(
        touched >= 3,
        "the tick did not move while touched: {touched} wakeups"
    );
    // Left alone: the reap, a refresh that finds no touch, then nothing.
    std::thread::sleep(IDLE * 2);
    let quiet = sched.metrics().worker_wakeups;
    std::thread::sleep(Duration::from_millis(300));
    let after = sched.metrics().worker_wakeups - quiet;
    assert!(
        after <= 1,
        "{after} wakeups while nothing touched the drain"
    );
}

/// A hosted plan after the last touch, for a leeway given before the touches (ticks from
/// the start), after them (the touched work keeps its clock stamp), and narrowed back.
#[test]
fn a_leeway_given_before_or_after_touches_keeps_the_reap_within_the_rule() {
    for order in ["before", "after", "narrowed back"] {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let ran = Arc::new(AtomicU64::new(0));
        let at = Arc::new(Mutex::new(None));
        let (counter, ran_at) = (ran.clone(), at.clone());
        let mut drain = sched.timeout(IDLE, move |_| {
            *ran_at.lock().unwrap() = Some(Instant::now());
            counter.fetch_add(1, Ordering::SeqCst);
            Next::Park
        });
        if order == "before" {
            drain = drain.leeway(LEEWAY);
        }
        let last_touch = Instant::now();
        drain.touch();
        let (drain, leeway) = match order {
            "before" => (drain, LEEWAY),
            "after" => (drain.leeway(LEEWAY), LEEWAY),
            _ => (
                drain.leeway(LEEWAY).leeway(Duration::ZERO),
                Duration::from_millis(1),
            ),
        };
        let bound = last_touch + IDLE + IDLE / 16 + leeway + Duration::from_millis(1);
        let start = Instant::now();
        while ran.load(Ordering::SeqCst) == 0 {
            assert!(start.elapsed() < common::EVENTUALLY, "{order}: never ran");
            let wake = driver.next_deadline().expect("the drain is armed");
            assert!(
                wake <= bound,
                "{order}: the host is told to wake {:?} past the rule's bound",
                wake - bound
            );
            if let Some(gap) = wake.checked_duration_since(Instant::now()) {
                std::thread::sleep(gap);
            }
            driver.run_due();
        }
        let ran_at = at.lock().unwrap().expect("it ran");
        assert!(
            ran_at >= last_touch + IDLE,
            "{order}: ran {:?} before the touch + idle",
            last_touch + IDLE - ran_at
        );
        drop(drain);
    }
}

#[test]
fn touches_racing_the_leeway_of_another_timeout_lose_nothing() {
    // A leeway converts only its own work's stamp; other timeouts' touches go on.
    let sched = Scheduler::new().unwrap();
    let fired = Arc::new(AtomicBool::new(false));
    let flag = fired.clone();
    let other = sched.timeout(IDLE, move |_| {
        flag.store(true, Ordering::SeqCst);
        Next::Park
    });
    let stop = Arc::new(AtomicBool::new(false));
    // The longest gap between two touches (µs): the check holds only while they come
    // faster than the idle.
    let longest_gap_us = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                other.touch();
                let gap = last.elapsed().as_micros() as u64;
                longest_gap_us.fetch_max(gap, Ordering::Relaxed);
                last = Instant::now();
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        for _ in 0..50 {
            let _drain = sched
                .timeout(IDLE, |_| Next::Park)
                .leeway(LEEWAY)
                .leeway(Duration::ZERO)
                .leeway(LEEWAY);
        }
        std::thread::sleep(IDLE);
        stop.store(true, Ordering::Relaxed);
    });
    let stalled = Duration::from_micros(longest_gap_us.load(Ordering::Relaxed)) >= IDLE / 2;
    assert!(
        stalled || !fired.load(Ordering::SeqCst),
        "the touched timeout fired while touched"
    );
    assert!(eventually(|| fired.load(Ordering::SeqCst)));
}

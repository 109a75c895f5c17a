//! Never early by the real clock:
//!
//! - a real scheduler's clock is `Instant`'s: `now()` is never behind an
//!   `Instant::now()` read before it, and a deadline is never before `Instant::now()`
//!   (read before the arm) plus the delay;
//! - runs armed by `Next::At`, `schedule_within`, `reschedule`, `Next::After` and `Again`
//!   never begin before their deadline by `Instant::now()`;
//! - a timeout work never runs within idle of a touch that returned before the run began.
//!
//! Nothing asserts a timing: every check compares an instant with the deadline it must
//! not precede. The reads of the clock are spread over many schedulers (their epoch is
//! read once, when each is built), and their counts scale with [`common::rounds`]. The
//! two tests of the clock against `Instant` are built on Linux only.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::Rng;
use nicework::{Next, Scheduler};

#[cfg(target_os = "linux")]
use common::{assert_no_round_broke, rounds};

#[test]
fn runs_are_never_early_by_the_real_clock_for_at_schedule_within_reschedule_and_again() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let early = Arc::new(Mutex::new(Vec::new()));
    let runs = Arc::new(AtomicU64::new(0));
    let mk = |kind: &'static str, next: fn(&mut nicework::Ctx<'_>, u64) -> Next| {
        let (early, runs) = (early.clone(), runs.clone());
        let mut n = 0u64;
        sched.work(move |cx| {
            let now = Instant::now();
            if now < cx.deadline() {
                early.lock().unwrap().push((kind, cx.deadline() - now));
            }
            runs.fetch_add(1, SeqCst);
            n += 1;
            next(cx, n)
        })
    };
    let at = mk("At", |_, n| {
        Next::At(Instant::now() + Duration::from_micros(137 * (n % 13)))
    });
    let again = mk("Again", |_, _| Next::Again);
    let after = mk("After", |_, n| {
        Next::After(Duration::from_nanos(9_973 * (n % 29)))
    });
    let armed = mk("schedule_within/reschedule", |_, _| Next::Park);
    at.schedule(Duration::ZERO);
    again.schedule(Duration::from_micros(250));
    after.schedule(Duration::ZERO);
    let mut rng = Rng(12345);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let d = Duration::from_nanos(rng.next() % 700_000);
        if rng.next() % 2 == 0 {
            armed.schedule_within(d);
        } else {
            armed.reschedule(d);
        }
        let before = Instant::now();
        let now = sched.now();
        assert!(
            before <= now && now <= Instant::now(),
            "now() is off Instant"
        );
        thread::sleep(Duration::from_micros(rng.next() % 300));
    }
    drop((at, again, after, armed));
    assert!(runs.load(SeqCst) > 100);
    let early = early.lock().unwrap();
    assert!(
        early.is_empty(),
        "{} runs before cx.deadline() by the real clock, first: {:?}",
        early.len(),
        early.first()
    );
}

#[test]
fn a_timeout_never_runs_within_idle_of_a_touch_that_returned_before_the_run_began() {
    const IDLE: Duration = Duration::from_millis(10);
    let sched = Scheduler::builder().build().unwrap();
    let starts = Arc::new(Mutex::new(BTreeMap::new()));
    let out = starts.clone();
    let work = sched.timeout(IDLE, move |cx| {
        out.lock().unwrap().insert(cx.runs(), Instant::now());
        if cx.runs() % 2 == 0 {
            Next::Park
        } else {
            Next::Again
        }
    });
    // (runs completed, time before the touch) for every touch after which the work was
    // seen not running: run `runs + 1` began after that touch returned.
    let mut touches = Vec::new();
    let mut rng = Rng(777);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        let before = Instant::now();
        work.touch();
        let running = work.is_running();
        let runs = work.stats().runs;
        if !running {
            touches.push((runs, before));
        }
        thread::sleep(Duration::from_micros(rng.next() % 25_000));
    }
    work.cancel_sync();
    let starts = starts.lock().unwrap();
    assert!(starts.len() > 10, "only {} runs", starts.len());
    let early: Vec<_> = touches
        .iter()
        .filter_map(|&(runs, before)| {
            let began = *starts.get(&(runs + 1))?;
            (began < before + IDLE).then(|| (runs + 1, before + IDLE - began))
        })
        .collect();
    assert!(
        early.is_empty(),
        "{} runs began within idle of a touch that returned before them, first (run, \
         how early): {:?}",
        early.len(),
        early.first()
    );
}

#[cfg(target_os = "linux")]
#[test]
fn a_real_schedulers_now_is_never_behind_instant_now() {
    // How far behind it can read depends on the scheduler's epoch, read once when it is
    // built: the reads are spread over several schedulers.
    let (schedulers, per_scheduler) = (200, rounds(1_000));
    let (mut behind, mut behind_schedulers) = (0, 0);
    let mut worst = Duration::ZERO;
    for _ in 0..schedulers {
        let sched = Scheduler::builder().build().unwrap();
        let behind_before = behind;
        for _ in 0..per_scheduler {
            let before = Instant::now();
            let now = sched.now();
            if now < before {
                behind += 1;
                worst = worst.max(before - now);
            }
        }
        behind_schedulers += usize::from(behind > behind_before);
    }
    assert_no_round_broke(
        "Scheduler::now() is never behind an earlier Instant::now()",
        behind,
        schedulers * per_scheduler,
        &format!(
            "(reads behind, on {behind_schedulers} of {schedulers} schedulers; the worst \
             by {worst:?})"
        ),
    );
}

#[cfg(target_os = "linux")]
#[test]
fn a_reschedule_deadline_is_never_before_instant_now_plus_the_delay() {
    // Deadlines are kept in 100 µs units, rounded up, which hides a clock that runs a
    // little behind except where `now + delay` falls just after a unit boundary. So each
    // delay is aimed at a few ns around a boundary (learnt from a first deadline), sweeping
    // -200..=200 ns. The delays stay near 1 s: short enough for the full clock (the coarse
    // clock serves 3.2 s and up), long enough that the work never runs during the loop.
    const UNIT: Duration = Duration::from_micros(100);
    let delay = Duration::from_secs(1);
    // How far a deadline can fall short depends on the scheduler's epoch, read once when
    // it is built: the reads are spread over several schedulers.
    let (schedulers, per_scheduler) = (100, rounds(2_000));
    let (mut early, mut measured, mut early_schedulers) = (0, 0, 0);
    let mut worst = Duration::ZERO;
    for _ in 0..schedulers {
        let sched = Scheduler::builder().build().unwrap();
        let work = sched.work(|_| Next::Park);
        work.reschedule(delay);
        let boundary = work.deadline().expect("just armed");
        let early_before = early;
        for i in 0..per_scheduler {
            let aim = Instant::now();
            let units =
                (aim + delay).saturating_duration_since(boundary).as_nanos() / UNIT.as_nanos() + 1;
            let target = boundary + UNIT * units as u32;
            let offset = (i % 401) as i64 - 200;
            let target = if offset >= 0 {
                target + Duration::from_nanos(offset as u64)
            } else {
                target - Duration::from_nanos(offset.unsigned_abs())
            };
            let before = Instant::now();
            let delay = target - aim;
            work.reschedule(delay);
            if let Some(deadline) = work.deadline() {
                measured += 1;
                if deadline < before + delay {
                    early += 1;
                    worst = worst.max(before + delay - deadline);
                }
            }
        }
        early_schedulers += usize::from(early > early_before);
        work.cancel_sync();
    }
    assert!(
        measured > schedulers * per_scheduler / 2,
        "the work kept running: {measured}"
    );
    assert_no_round_broke(
        "a deadline is never before Instant::now() (read before the arm) + delay",
        early,
        measured,
        &format!(
            "(deadlines early, on {early_schedulers} of {schedulers} schedulers; the worst \
             by {worst:?})"
        ),
    );
}

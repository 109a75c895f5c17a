//! The arming API a connection pool needs: `Work::detach`, `Next::At`,
//! `Work::schedule_within`, `Work::deadline`, and touches that respect the callback's
//! decision (a touch during a run never overrides what the callback decided). Manual-clock tests pin exact times; real-scheduler
//! tests wait for states only.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use common::{drop_flag, eventually};
use nicework::{Next, Scheduler, Work};

const MS: Duration = Duration::from_millis(1);

// === detach ===

#[test]
fn a_detached_one_shot_runs_once_and_is_freed() {
    let sched = Scheduler::manual();
    let (flag, freed) = drop_flag();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let work = sched.work(move |_| {
        let _keep = &flag;
        r.fetch_add(1, Ordering::SeqCst);
        Next::Stop
    });
    work.schedule(5 * MS);
    work.detach();
    assert!(!freed.load(Ordering::SeqCst), "pending: it lives on");
    sched.advance(5 * MS);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(freed.load(Ordering::SeqCst), "Stop ended its life");
    sched.advance(Duration::from_secs(10));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(sched.metrics().timer_entries, 0);
}

#[test]
fn a_detached_one_shot_on_a_real_scheduler_runs_once_and_is_freed() {
    let sched = Scheduler::new().unwrap();
    let (flag, freed) = drop_flag();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let work = sched.work(move |_| {
        let _keep = &flag;
        r.fetch_add(1, Ordering::SeqCst);
        Next::Park
    });
    work.schedule(Duration::ZERO);
    work.detach();
    assert!(eventually(|| freed.load(Ordering::SeqCst)));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_detached_periodic_job_is_freed_at_shutdown() {
    let sched = Scheduler::manual();
    let (flag, freed) = drop_flag();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let work = sched.every(10 * MS, move |_| {
        let _keep = &flag;
        r.fetch_add(1, Ordering::SeqCst);
        Next::Again
    });
    work.detach();
    sched.advance(35 * MS);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert!(!freed.load(Ordering::SeqCst));
    drop(sched);
    assert!(freed.load(Ordering::SeqCst), "shutdown ended its life");
}

#[test]
fn a_detached_periodic_job_on_a_real_scheduler_is_freed_at_shutdown() {
    let sched = Scheduler::new().unwrap();
    let (flag, freed) = drop_flag();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    sched
        .every(MS, move |_| {
            let _keep = &flag;
            r.fetch_add(1, Ordering::SeqCst);
            Next::Again
        })
        .detach();
    assert!(eventually(|| runs.load(Ordering::SeqCst) >= 3));
    drop(sched);
    assert!(
        freed.load(Ordering::SeqCst),
        "freed once the scheduler's drop returned"
    );
    let after = runs.load(Ordering::SeqCst);
    std::thread::sleep(10 * MS);
    assert_eq!(runs.load(Ordering::SeqCst), after);
}

#[test]
fn a_detached_work_that_parks_is_freed_and_one_that_panics_too() {
    let sched = Scheduler::manual();
    let (park_flag, park_freed) = drop_flag();
    let parks = sched.every(MS, move |_| {
        let _keep = &park_flag;
        Next::Park
    });
    parks.detach();
    let (panic_flag, panic_freed) = drop_flag();
    let panics = sched.every(MS, move |_| {
        let _keep = &panic_flag;
        panic!("detached and broken");
    });
    panics.detach();
    sched.advance(MS);
    assert!(park_freed.load(Ordering::SeqCst));
    assert!(panic_freed.load(Ordering::SeqCst));
}

#[test]
fn detaching_an_idle_work_or_after_shutdown_frees_it_at_once() {
    let sched = Scheduler::manual();
    let (flag, freed) = drop_flag();
    let idle = sched.work(move |_| {
        let _keep = &flag;
        Next::Again
    });
    idle.detach();
    assert!(freed.load(Ordering::SeqCst), "nothing would ever run it");

    let (flag, freed) = drop_flag();
    let armed = sched.every(MS, move |_| {
        let _keep = &flag;
        Next::Again
    });
    drop(sched);
    armed.detach();
    assert!(freed.load(Ordering::SeqCst), "its scheduler is gone");
}

#[test]
fn a_work_detached_from_inside_its_own_callback_lives_until_it_stops() {
    let sched = Scheduler::manual();
    let slot: Arc<Mutex<Option<Work>>> = Arc::default();
    let reach = slot.clone();
    let (flag, freed) = drop_flag();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let work = sched.every(MS, move |_| {
        let _keep = &flag;
        if let Some(me) = reach.lock().unwrap().take() {
            me.detach(); // from inside its own run
        }
        if r.fetch_add(1, Ordering::SeqCst) < 2 {
            Next::Again
        } else {
            Next::Stop
        }
    });
    *slot.lock().unwrap() = Some(work);
    sched.advance(10 * MS);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert!(freed.load(Ordering::SeqCst));
}

// === Next::At ===

#[test]
fn at_runs_at_its_instant_with_no_drift() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let work = sched.every(10 * MS, move |cx| {
        seen.lock().unwrap().push(cx.scheduler().now() - start);
        Next::At(cx.deadline() + cx.period())
    });
    sched.advance(45 * MS);
    assert_eq!(*runs.lock().unwrap(), [10 * MS, 20 * MS, 30 * MS, 40 * MS]);
    assert_eq!(work.deadline(), Some(start + 50 * MS));
}

#[test]
fn at_in_the_past_is_due_after_the_slack_and_never_spins() {
    let sched = Scheduler::manual();
    let long_ago = sched.now();
    sched.advance(Duration::from_secs(1));
    let work = sched.work(move |_| Next::At(long_ago));
    work.schedule(Duration::ZERO);
    // A past instant re-arms at now + slack (1 ms): 11 runs in 10 ms, not a spin.
    assert_eq!(sched.advance(10 * MS), 11);
    drop(work);
}

#[test]
fn at_far_in_the_future_saturates_and_is_never_due() {
    let sched = Scheduler::manual();
    let far = sched.now() + Duration::from_secs(86_400 * 365 * 100);
    let work = sched.work(move |_| Next::At(far));
    work.schedule(Duration::ZERO);
    assert_eq!(sched.advance(Duration::MAX), 1);
    assert!(work.is_pending());
}

#[test]
fn at_on_a_real_scheduler_never_runs_before_its_instant() {
    let sched = Scheduler::new().unwrap();
    let target = Arc::new(Mutex::new(None::<Instant>));
    let early = Arc::new(AtomicU32::new(0));
    let runs = Arc::new(AtomicU32::new(0));
    let (t, e, r) = (target.clone(), early.clone(), runs.clone());
    let work = sched.work(move |cx| {
        if let Some(at) = *t.lock().unwrap() {
            if Instant::now() < at {
                e.fetch_add(1, Ordering::SeqCst);
            }
        }
        if r.fetch_add(1, Ordering::SeqCst) == 3 {
            return Next::Stop;
        }
        let at = cx.scheduler().now() + 20 * MS;
        *t.lock().unwrap() = Some(at);
        Next::At(at)
    });
    work.schedule(Duration::ZERO);
    assert!(eventually(|| runs.load(Ordering::SeqCst) == 4));
    assert_eq!(early.load(Ordering::SeqCst), 0);
}

// === schedule_within and deadline ===

#[test]
fn schedule_within_only_ever_moves_a_deadline_earlier() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let work = sched.work(|_| Next::Park);
    assert!(work.schedule_within(100 * MS), "idle: armed");
    assert_eq!(work.deadline(), Some(start + 100 * MS));
    assert!(!work.schedule_within(200 * MS), "later: left");
    assert!(!work.schedule_within(100 * MS), "the same: left");
    assert_eq!(work.deadline(), Some(start + 100 * MS));
    assert!(work.schedule_within(30 * MS), "sooner: moved");
    assert_eq!(work.deadline(), Some(start + 30 * MS));
    assert_eq!(sched.advance(29 * MS), 0);
    assert_eq!(sched.advance(MS), 1);
    assert!(work.deadline().is_none());
}

#[test]
fn schedule_within_zero_on_an_idle_work_is_schedule_zero() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Park);
    assert!(work.schedule_within(Duration::ZERO));
    assert_eq!(sched.advance(Duration::ZERO), 1);
    assert!(!work.is_pending());
}

#[test]
fn schedule_within_is_refused_when_disabled_and_after_shutdown() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Park);
    work.disable();
    assert!(!work.schedule_within(MS));
    work.enable();
    drop(sched);
    assert!(!work.schedule_within(MS));
}

#[test]
fn schedule_within_on_a_real_scheduler_brings_the_run_forward() {
    let sched = Scheduler::new().unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let work = sched.work(move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Next::Park
    });
    work.schedule(Duration::from_secs(3600));
    assert!(work.schedule_within(MS));
    assert!(eventually(|| runs.load(Ordering::SeqCst) == 1));
}

#[test]
fn deadline_is_exact_and_none_when_not_pending() {
    let sched = Scheduler::manual();
    sched.advance(Duration::from_millis(1234));
    let now = sched.now();
    let work = sched.work(|_| Next::Park);
    assert_eq!(work.deadline(), None);
    work.schedule(Duration::from_millis(250));
    assert_eq!(work.deadline(), Some(now + Duration::from_millis(250)));
    work.reschedule(Duration::from_secs(7));
    assert_eq!(work.deadline(), Some(now + Duration::from_secs(7)));
    work.cancel();
    assert_eq!(work.deadline(), None);
    let timeout = sched.timeout(Duration::from_secs(1), |_| Next::Park);
    sched.advance(Duration::from_millis(400));
    timeout.touch();
    assert_eq!(
        timeout.deadline(),
        Some(now + Duration::from_millis(1400)),
        "a timeout's deadline is the postponed one"
    );
}

// === a touch during a run respects the callback ===

/// A work whose callback touches itself (through a Weak) and returns `next`.
fn touching_itself(sched: &Scheduler, next: Next) -> (Arc<Work>, Arc<Mutex<Vec<Duration>>>) {
    let start = sched.now();
    let slot: Arc<Mutex<Weak<Work>>> = Arc::default();
    let reach = slot.clone();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let work = Arc::new(sched.every(10 * MS, move |cx| {
        seen.lock().unwrap().push(cx.scheduler().now() - start);
        if let Some(me) = reach.lock().unwrap().upgrade() {
            me.touch();
        }
        next
    }));
    *slot.lock().unwrap() = Arc::downgrade(&work);
    (work, runs)
}

#[test]
fn a_touch_during_the_run_does_not_override_after_again_at_or_yield() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let (after, after_runs) = touching_itself(&sched, Next::After(50 * MS));
    sched.advance(10 * MS);
    assert_eq!(
        after.deadline(),
        Some(start + 60 * MS),
        "After(50 ms) stands"
    );
    drop(after);
    drop(after_runs);

    let sched = Scheduler::manual();
    let start = sched.now();
    let (again, _) = touching_itself(&sched, Next::Again);
    sched.advance(10 * MS);
    assert_eq!(again.deadline(), Some(start + 20 * MS), "Again stands");

    let sched = Scheduler::manual();
    let start = sched.now();
    let at = start + 77 * MS;
    let (at_work, _) = touching_itself(&sched, Next::At(at));
    sched.advance(10 * MS);
    assert_eq!(at_work.deadline(), Some(at), "At stands");

    // Yield runs again at once (advance keeps running it at the same instant), so a
    // touch that pushed it out to the period would show as a second run 10 ms later.
    let sched = Scheduler::manual();
    let start = sched.now();
    let slot: Arc<Mutex<Weak<Work>>> = Arc::default();
    let reach = slot.clone();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let yielding = Arc::new(sched.every(10 * MS, move |cx| {
        let mut runs = seen.lock().unwrap();
        runs.push(cx.scheduler().now() - start);
        if let Some(me) = reach.lock().unwrap().upgrade() {
            me.touch();
        }
        if runs.len() < 3 {
            Next::Yield
        } else {
            Next::Stop
        }
    }));
    *slot.lock().unwrap() = Arc::downgrade(&yielding);
    sched.advance(15 * MS);
    assert_eq!(
        *runs.lock().unwrap(),
        [10 * MS, 10 * MS, 10 * MS],
        "Yield stands"
    );
}

#[test]
fn park_plus_a_touch_during_the_run_ends_armed_and_stop_stays_stopped() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let (parked, _) = touching_itself(&sched, Next::Park);
    sched.advance(10 * MS);
    assert_eq!(
        parked.deadline(),
        Some(start + 20 * MS),
        "armed for its period"
    );

    let sched = Scheduler::manual();
    let (stopped, _) = touching_itself(&sched, Next::Stop);
    sched.advance(10 * MS);
    assert!(!stopped.is_pending(), "Stop stays stopped");
    sched.advance(Duration::from_secs(1));
    assert_eq!(stopped.stats().runs, 1);
}

#[test]
fn a_reschedule_during_the_run_still_wins_over_again() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let slot: Arc<Mutex<Weak<Work>>> = Arc::default();
    let reach = slot.clone();
    let work = Arc::new(sched.every(10 * MS, move |_| {
        if let Some(me) = reach.lock().unwrap().upgrade() {
            me.reschedule(3 * MS);
        }
        Next::Again
    }));
    *slot.lock().unwrap() = Arc::downgrade(&work);
    sched.advance(10 * MS);
    assert_eq!(
        work.deadline(),
        Some(start + 13 * MS),
        "an explicit re-arm stands"
    );
}

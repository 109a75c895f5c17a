//! Idle timeouts (`Scheduler::timeout`, `timeout_for`) on the manual clock: every rule of
//! the timeout docs (`src/scheduler/work/timeout.rs`), and the bad inputs. The real-thread rules are in
//! `threaded.rs`.

use crate::common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use common::drop_flag;
use nicework::{Next, Scheduler, Work};

const MS: Duration = Duration::from_millis(1);
const IDLE: Duration = Duration::from_millis(100);

/// A timeout work that counts its runs and records the virtual time of each.
fn counted(sched: &Scheduler, next: Next) -> (Work, Arc<Mutex<Vec<Instant>>>) {
    let at = Arc::new(Mutex::new(Vec::new()));
    let runs = at.clone();
    let work = sched.timeout(IDLE, move |cx| {
        runs.lock().unwrap().push(cx.scheduler().now());
        next
    });
    (work, at)
}

#[test]
fn touches_postpone_the_run_to_the_last_touch_plus_idle() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let (work, runs) = counted(&sched, Next::Park);
    for _ in 0..5 {
        sched.advance(40 * MS);
        work.touch();
    }
    // Last touch at 200 ms: nothing may run before 300 ms, though the first deadline
    // (100 ms) and later re-arms came and went.
    assert_eq!(sched.advance(99 * MS), 0);
    assert!(runs.lock().unwrap().is_empty());
    assert_eq!(sched.advance(MS), 1);
    assert_eq!(runs.lock().unwrap()[0] - start, 300 * MS);
    assert!(!work.is_pending(), "Park: it stays disarmed");
}

#[test]
fn early_fires_are_not_runs() {
    let sched = Scheduler::manual();
    let (work, _runs) = counted(&sched, Next::Park);
    sched.advance(90 * MS);
    work.touch();
    sched.advance(95 * MS); // the fire at 100 ms came before 190 ms: re-armed, not run
    let stats = work.stats();
    assert_eq!((stats.runs, stats.parks), (0, 0));
    assert!(work.is_pending());
    sched.advance(5 * MS);
    assert_eq!(work.stats().runs, 1);
}

#[test]
fn the_run_sees_the_postponed_deadline() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let deadline = Arc::new(Mutex::new(None));
    let seen = deadline.clone();
    let work = sched.timeout(IDLE, move |cx| {
        *seen.lock().unwrap() = Some((cx.deadline(), cx.lateness()));
        Next::Park
    });
    sched.advance(30 * MS);
    work.touch();
    sched.advance(200 * MS);
    let (at, lateness) = deadline.lock().unwrap().unwrap();
    assert_eq!(at - start, 130 * MS);
    assert_eq!(lateness, Duration::ZERO);
}

#[test]
fn again_starts_a_fresh_idle_period() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let (work, runs) = counted(&sched, Next::Again);
    sched.advance(100 * MS);
    sched.advance(50 * MS);
    work.touch(); // at 150 ms: the second run moves from 200 ms to 250 ms
    sched.advance(200 * MS);
    let at: Vec<Duration> = runs.lock().unwrap().iter().map(|t| *t - start).collect();
    assert_eq!(at, [100 * MS, 250 * MS, 350 * MS]);
    assert_eq!(work.period(), IDLE);
}

#[test]
fn a_touch_inside_the_run_re_arms_a_parking_work() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let slot: Arc<Mutex<Option<Weak<Work>>>> = Arc::default();
    let reach = slot.clone();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let work = Arc::new(sched.timeout(IDLE, move |cx| {
        let now = cx.scheduler().now();
        seen.lock().unwrap().push(now);
        if seen.lock().unwrap().len() == 1 {
            // Activity arrives while the reaper runs: it must not be lost to its Park.
            reach
                .lock()
                .unwrap()
                .as_ref()
                .unwrap()
                .upgrade()
                .unwrap()
                .touch();
        }
        Next::Park
    }));
    *slot.lock().unwrap() = Some(Arc::downgrade(&work));
    sched.advance(100 * MS);
    assert!(work.is_pending(), "the touch during the run re-armed it");
    sched.advance(99 * MS);
    assert_eq!(runs.lock().unwrap().len(), 1);
    sched.advance(MS);
    let at: Vec<Duration> = runs.lock().unwrap().iter().map(|t| *t - start).collect();
    assert_eq!(at, [100 * MS, 200 * MS]);
    assert!(!work.is_pending());
}

#[test]
fn a_touch_inside_the_run_does_not_undo_stop() {
    let sched = Scheduler::manual();
    let slot: Arc<Mutex<Option<Weak<Work>>>> = Arc::default();
    let reach = slot.clone();
    let work = Arc::new(sched.timeout(IDLE, move |_| {
        reach
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .upgrade()
            .unwrap()
            .touch();
        Next::Stop
    }));
    *slot.lock().unwrap() = Some(Arc::downgrade(&work));
    sched.advance(IDLE);
    assert!(!work.is_pending());
    sched.advance(10 * IDLE);
    assert_eq!(work.stats().runs, 1);
}

#[test]
fn reschedule_earlier_does_not_undercut_a_touch() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let (work, runs) = counted(&sched, Next::Park);
    sched.advance(5 * MS);
    work.touch(); // due no earlier than 105 ms
    assert!(work.reschedule(10 * MS)); // a deadline of 15 ms: the touch still wins
    sched.advance(99 * MS);
    assert!(runs.lock().unwrap().is_empty());
    sched.advance(MS);
    assert_eq!(runs.lock().unwrap()[0] - start, 105 * MS);
}

#[test]
fn reschedule_later_than_the_touch_wins() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let (work, runs) = counted(&sched, Next::Park);
    sched.advance(5 * MS);
    work.touch();
    assert!(work.reschedule(300 * MS)); // due at 305 ms, later than the touch's 105 ms
    sched.advance(299 * MS);
    assert!(runs.lock().unwrap().is_empty());
    sched.advance(MS);
    assert_eq!(runs.lock().unwrap()[0] - start, 305 * MS);
    assert_eq!(work.period(), IDLE, "reschedule keeps a timeout's idle");
}

#[test]
fn touch_on_a_parked_timeout_arms_it_for_now_plus_idle() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let (work, runs) = counted(&sched, Next::Park);
    sched.advance(IDLE);
    assert!(!work.is_pending());
    sched.advance(IDLE * 5);
    work.touch();
    assert!(work.is_pending());
    sched.advance(IDLE);
    let at: Vec<Duration> = runs.lock().unwrap().iter().map(|t| *t - start).collect();
    assert_eq!(at, [IDLE, IDLE * 7]);
}

#[test]
fn touch_does_not_revive_a_stopped_or_cancelled_timeout() {
    let sched = Scheduler::manual();
    let (stopped, _) = counted(&sched, Next::Stop);
    sched.advance(IDLE);
    stopped.touch();
    assert!(!stopped.is_pending(), "after Stop only schedule re-arms");
    let (cancelled, runs) = counted(&sched, Next::Park);
    assert!(cancelled.cancel_sync());
    cancelled.touch();
    assert!(
        !cancelled.is_pending(),
        "after cancel_sync only schedule re-arms"
    );
    // The touch did not arm it, but it was activity: a schedule is still due no earlier
    // than that touch + idle (the rule's "later of its deadline and its latest touch").
    assert!(cancelled.schedule(MS));
    assert_eq!(sched.advance(IDLE - MS), 0);
    assert_eq!(sched.advance(MS), 1);
    assert_eq!(runs.lock().unwrap().len(), 1);
}

#[test]
fn cancel_leaves_a_timeout_disarmed_and_touch_re_arms_it() {
    let sched = Scheduler::manual();
    let (work, runs) = counted(&sched, Next::Park);
    assert!(work.cancel());
    sched.advance(IDLE * 3);
    assert!(runs.lock().unwrap().is_empty());
    work.touch();
    sched.advance(IDLE);
    assert_eq!(runs.lock().unwrap().len(), 1);
}

/// A connection that owns its reaper, built in one step: no `Mutex<Option<Work>>`.
struct Conn {
    reaped: AtomicU32,
    reaper: Work,
}

fn conn(sched: &Scheduler) -> Arc<Conn> {
    Arc::new_cyclic(|me: &Weak<Conn>| Conn {
        reaped: AtomicU32::new(0),
        reaper: sched.timeout_for(me, IDLE, |conn: &Conn, _| {
            conn.reaped.fetch_add(1, Ordering::SeqCst);
            Next::Park
        }),
    })
}

#[test]
fn an_object_owns_its_timeout_through_new_cyclic() {
    let sched = Scheduler::manual();
    let conn = conn(&sched);
    sched.advance(IDLE / 2);
    conn.reaper.touch();
    sched.advance(IDLE - MS);
    assert_eq!(conn.reaped.load(Ordering::SeqCst), 0);
    sched.advance(MS);
    assert_eq!(conn.reaped.load(Ordering::SeqCst), 1);
    assert_eq!(
        Arc::strong_count(&conn),
        1,
        "the work holds no strong reference"
    );
}

#[test]
fn dropping_the_object_drops_its_timeout_and_nothing_runs() {
    let sched = Scheduler::manual();
    let conn = conn(&sched);
    let weak = Arc::downgrade(&conn);
    drop(conn);
    assert!(weak.upgrade().is_none());
    assert_eq!(sched.advance(IDLE * 3), 0);
    assert_eq!(sched.metrics().armed, 0);
}

#[test]
fn a_timeout_whose_object_is_gone_stops_itself() {
    let sched = Scheduler::manual();
    let object = Arc::new(AtomicU32::new(0));
    let (flag, freed) = drop_flag();
    let work = sched.timeout_for(&object, IDLE, move |object, _| {
        let _keep = &flag;
        object.fetch_add(1, Ordering::SeqCst);
        Next::Again
    });
    sched.advance(IDLE);
    assert_eq!(object.load(Ordering::SeqCst), 1);
    drop(object);
    sched.advance(IDLE);
    assert!(!work.is_pending(), "the object is gone: Stop");
    work.touch();
    assert!(!work.is_pending(), "and touch does not revive it");
    drop(work);
    assert!(freed.load(Ordering::SeqCst));
}

#[test]
fn work_for_and_every_for_take_a_weak_too() {
    let sched = Scheduler::manual();
    let hits = Arc::new(AtomicU64::new(0));
    let weak = Arc::downgrade(&hits);
    let once = sched.work_for(&weak, |hits: &AtomicU64, _| {
        hits.fetch_add(1, Ordering::SeqCst);
        Next::Park
    });
    let every = sched.every_for(&weak, 10 * MS, |hits: &AtomicU64, _| {
        hits.fetch_add(100, Ordering::SeqCst);
        Next::Again
    });
    assert!(!once.is_pending(), "work_for starts unarmed, like work");
    once.schedule(MS);
    sched.advance(20 * MS);
    assert_eq!(hits.load(Ordering::SeqCst), 201);
    drop(hits);
    sched.advance(10 * MS);
    assert!(!every.is_pending());
    assert!(once.schedule(MS));
    sched.advance(MS);
    assert!(!once.is_pending());
}

#[test]
fn a_zero_idle_is_due_at_once_and_re_arms_at_the_slack() {
    let sched = Scheduler::manual();
    let (work, runs) = counted(&sched, Next::Again);
    drop(work);
    let runs_zero = Arc::new(AtomicU32::new(0));
    let count = runs_zero.clone();
    let zero = sched.timeout(Duration::ZERO, move |_| {
        count.fetch_add(1, Ordering::SeqCst);
        Next::Again
    });
    assert!(zero.is_pending());
    assert_eq!(sched.advance(Duration::ZERO), 1);
    zero.touch();
    // Re-arms round up to the slack (1 ms): 10 more runs in 10 ms, never a spin.
    assert_eq!(sched.advance(10 * MS), 10);
    assert!(runs.lock().unwrap().is_empty());
}

#[test]
fn a_huge_idle_saturates_and_never_runs() {
    let sched = Scheduler::manual();
    let runs = Arc::new(AtomicU32::new(0));
    let count = runs.clone();
    let work = sched.timeout(Duration::MAX, move |_| {
        count.fetch_add(1, Ordering::SeqCst);
        Next::Park
    });
    sched.advance(Duration::from_secs(86_400 * 365));
    work.touch();
    work.touch();
    assert_eq!(sched.advance(Duration::MAX), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(work.is_pending());
}

#[test]
fn touch_after_the_scheduler_was_dropped_does_nothing() {
    let sched = Scheduler::manual();
    let (armed, _) = counted(&sched, Next::Park);
    let (parked, _) = counted(&sched, Next::Park);
    parked.cancel();
    drop(sched);
    armed.touch();
    parked.touch();
    assert!(!armed.is_pending(), "shutdown disarmed it");
    assert!(!parked.is_pending());
    assert!(!parked.reschedule(MS));
}

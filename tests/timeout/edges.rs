//! Edge cases of timeout works on the manual clock: the rule "due at the later of its
//! deadline and its latest touch + idle" with no touch at all, a saturated clock, and the
//! order of runs after a due work was moved later without the lock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

const MS: Duration = Duration::from_millis(1);
const IDLE: Duration = Duration::from_millis(100);

fn counted(sched: &Scheduler, idle: Duration) -> (Work, Arc<Mutex<Vec<Instant>>>) {
    let at = Arc::new(Mutex::new(Vec::new()));
    let runs = at.clone();
    let work = sched.timeout(idle, move |cx| {
        runs.lock().unwrap().push(cx.scheduler().now());
        Next::Park
    });
    (work, at)
}

/// A timeout that was never touched is due at its deadline: `reschedule(10 ms)` right after
/// creation must run it at 10 ms, not at the creation's idle (there is no touch to
/// postpone it).
#[test]
fn untouched_timeout_rescheduled_sooner_runs_at_its_deadline() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let (work, runs) = counted(&sched, IDLE);
    assert!(work.reschedule(10 * MS));
    sched.advance(10 * MS);
    let at: Vec<Duration> = runs.lock().unwrap().iter().map(|t| *t - start).collect();
    assert_eq!(
        at,
        [10 * MS],
        "no touch ever happened, so nothing postpones the deadline"
    );
}

/// The same, created later than the scheduler's epoch: only the scheduler's age differs.
#[test]
fn untouched_timeout_created_late_rescheduled_sooner_runs_at_its_deadline() {
    let sched = Scheduler::manual();
    sched.advance(Duration::from_secs(10));
    let start = sched.now();
    let (work, runs) = counted(&sched, IDLE);
    assert!(work.reschedule(10 * MS));
    sched.advance(10 * MS);
    let at: Vec<Duration> = runs.lock().unwrap().iter().map(|t| *t - start).collect();
    assert_eq!(at, [10 * MS]);
}

/// A never-touched timeout whose schedule follows a cancel: due at its deadline.
#[test]
fn untouched_cancelled_timeout_scheduled_sooner_runs_at_its_deadline() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let (work, runs) = counted(&sched, IDLE);
    assert!(work.cancel());
    assert!(work.schedule(MS));
    sched.advance(MS);
    let at: Vec<Duration> = runs.lock().unwrap().iter().map(|t| *t - start).collect();
    assert_eq!(at, [MS]);
}

/// advance(Duration::MAX) on a manual scheduler with timeouts: nothing panics, a huge idle
/// stays never due, a normal one runs once and parks, and advancing again works.
#[test]
fn advance_max_with_timeouts_and_huge_idles() {
    let sched = Scheduler::manual();
    let (huge, huge_runs) = counted(&sched, Duration::MAX);
    let (normal, normal_runs) = counted(&sched, IDLE);
    let (zero, zero_runs) = counted(&sched, Duration::ZERO);
    huge.touch();
    normal.touch();
    sched.advance(Duration::MAX);
    assert!(huge_runs.lock().unwrap().is_empty());
    assert_eq!(normal_runs.lock().unwrap().len(), 1);
    assert_eq!(zero_runs.lock().unwrap().len(), 1);
    huge.touch();
    normal.touch();
    zero.touch();
    sched.advance(Duration::MAX);
    sched.advance(Duration::from_secs(1));
    assert!(huge_runs.lock().unwrap().is_empty());
    // At saturated time a touch at "now" + idle can never be reached again: whatever the
    // outcome, nothing panics and the work stays consistent.
    let _ = normal.reschedule(Duration::MAX);
    let _ = normal.reschedule(Duration::ZERO);
    sched.advance(Duration::MAX);
    assert!(huge.is_pending() || !huge.is_running());
}

/// Minimized from `attack_model` (seed 8): a stopped timeout scheduled again and touched
/// in the same instant runs at max(deadline, touch + idle), not later.
#[test]
fn stopped_timeout_scheduled_and_touched_runs_at_touch_plus_idle() {
    let sched = Scheduler::manual();
    sched.advance(Duration::from_secs(1));
    let start = sched.now();
    let at = Arc::new(Mutex::new(Vec::new()));
    let runs = at.clone();
    let mut n = 0;
    let work = sched.timeout(2 * MS, move |cx| {
        runs.lock().unwrap().push(cx.scheduler().now() - start);
        n += 1;
        if n < 3 { Next::Again } else { Next::Stop }
    });
    sched.advance(23 * MS);
    assert_eq!(*at.lock().unwrap(), [2 * MS, 4 * MS, 6 * MS]);
    assert!(!work.cancel_sync());
    sched.advance(6 * MS); // t = 29 ms
    assert!(work.schedule(MS)); // deadline 30 ms
    work.touch(); // touch + idle = 31 ms
    sched.advance(5 * MS);
    assert_eq!(*at.lock().unwrap(), [2 * MS, 4 * MS, 6 * MS, 31 * MS]);
}

/// Minimized from `attack_model` (seed 8): `reschedule(0)` puts the entry on the ready
/// queue; a lock-free `reschedule(4 ms)` then moves the deadline later without moving the
/// entry. `advance` must still step time to each deadline in order: `b` (due at 2 ms)
/// runs at 2 ms, before `a` (due at 4 ms).
#[test]
fn advance_runs_in_deadline_order_after_a_zero_delay_is_moved_later() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (la, lb) = (log.clone(), log.clone());
    let a = sched.work(move |cx| {
        la.lock().unwrap().push(("a", cx.scheduler().now() - start));
        Next::Park
    });
    let b = sched.work(move |cx| {
        lb.lock().unwrap().push(("b", cx.scheduler().now() - start));
        Next::Park
    });
    assert!(!a.reschedule(Duration::ZERO));
    assert!(a.reschedule(4 * MS));
    assert!(b.schedule(2 * MS));
    sched.advance(5 * MS);
    assert_eq!(*log.lock().unwrap(), [("b", 2 * MS), ("a", 4 * MS)]);
}

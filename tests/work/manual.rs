//! The work semantics (the workqueue guarantees in the crate docs) on the manual
//! scheduler, where time is virtual and every interleaving is chosen by the test.

use crate::common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::drop_flag;
use nicework::{Next, Scheduler, Work};

const MS: Duration = Duration::from_millis(1);

fn counter() -> (Arc<AtomicUsize>, impl Fn() -> usize) {
    let runs = Arc::new(AtomicUsize::new(0));
    let read = runs.clone();
    (runs, move || read.load(Ordering::SeqCst))
}

#[test]
fn every_first_runs_after_one_period_and_keeps_its_period() {
    let sched = Scheduler::manual();
    let work = sched.every(10 * MS, |_| Next::Again);
    assert_eq!(sched.advance(9 * MS), 0);
    assert_eq!(sched.advance(MS), 1);
    assert!(work.reschedule(3 * MS));
    assert_eq!(
        work.period(),
        10 * MS,
        "reschedule must not change an every() period"
    );
    assert_eq!(sched.advance(3 * MS), 1);
    assert_eq!(sched.advance(9 * MS), 0);
    assert_eq!(sched.advance(MS), 1);
}

#[test]
fn work_period_is_the_latest_schedule_delay() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Again);
    assert!(!work.is_pending());
    assert!(work.schedule(7 * MS));
    assert_eq!(work.period(), 7 * MS);
    assert_eq!(sched.advance(7 * MS), 1);
    assert_eq!(sched.advance(6 * MS), 0);
    assert_eq!(sched.advance(MS), 1);
    work.reschedule(2 * MS);
    assert_eq!(work.period(), 2 * MS);
}

#[test]
fn after_never_changes_the_period() {
    let sched = Scheduler::manual();
    let work = sched.every(10 * MS, |cx| {
        if cx.runs() == 1 {
            Next::After(Duration::from_millis(3))
        } else {
            Next::Again
        }
    });
    assert_eq!(sched.advance(10 * MS), 1);
    assert_eq!(sched.advance(3 * MS), 1);
    assert_eq!(work.period(), 10 * MS);
    assert_eq!(sched.advance(9 * MS), 0);
    assert_eq!(sched.advance(MS), 1);
}

#[test]
fn advance_runs_each_work_at_its_deadline_in_order() {
    let sched = Scheduler::manual();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut works = Vec::new();
    for (name, period) in [("c", 30), ("a", 10), ("b", 20)] {
        let order = order.clone();
        let clock = sched.clone();
        let start = sched.now();
        works.push(sched.every(Duration::from_millis(period), move |cx| {
            assert_eq!(clock.now(), cx.deadline(), "runs exactly at its deadline");
            let at = cx.deadline().duration_since(start).as_millis();
            order.lock().unwrap().push((at, name));
            Next::Again
        }));
    }
    sched.advance(60 * MS);
    let order = order.lock().unwrap().clone();
    let expected = [
        (10, "a"),
        (20, "a"),
        (20, "b"),
        (30, "a"),
        (30, "c"),
        (40, "a"),
        (40, "b"),
        (50, "a"),
        (60, "a"),
        (60, "b"),
        (60, "c"),
    ];
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(sorted, expected);
    assert!(
        order.windows(2).all(|w| w[0].0 <= w[1].0),
        "deadline order: {order:?}"
    );
}

// Schedule never moves a pending deadline; reschedule does.
#[test]
fn schedule_on_a_pending_work_changes_nothing() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Park);
    assert!(work.schedule(10 * MS));
    assert!(!work.schedule(MS));
    assert_eq!(
        sched.advance(9 * MS),
        0,
        "schedule must not move the deadline"
    );
    assert_eq!(sched.advance(MS), 1);
}

#[test]
fn reschedule_moves_the_deadline_and_reports_pending() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Park);
    assert!(!work.reschedule(10 * MS));
    assert!(work.reschedule(20 * MS));
    assert_eq!(sched.advance(19 * MS), 0);
    assert_eq!(sched.advance(MS), 1);
}

// A zero delay runs at the next opportunity.
#[test]
fn zero_delay_runs_without_time_passing() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Park);
    assert!(work.schedule(Duration::ZERO));
    assert_eq!(sched.advance(Duration::ZERO), 1);
}

// Cancel_sync and drop refuse re-arms and wait for the run in progress.
#[test]
fn cancel_sync_returns_pending_and_the_work_never_runs_again() {
    let sched = Scheduler::manual();
    let (runs, read) = counter();
    let work = sched.every(MS, move |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        Next::Again
    });
    sched.advance(5 * MS);
    assert_eq!(read(), 5);
    assert!(work.cancel_sync());
    assert!(!work.cancel_sync());
    sched.advance(100 * MS);
    assert_eq!(read(), 5);
    assert!(work.schedule(MS), "schedule after cancel_sync re-arms");
    sched.advance(MS);
    assert_eq!(read(), 6);
}

#[test]
fn drop_frees_the_closure_before_returning() {
    let sched = Scheduler::manual();
    let (guard, dropped) = drop_flag();
    let work = sched.every(MS, move |_| {
        let _keep = &guard;
        Next::Again
    });
    sched.advance(3 * MS);
    drop(work);
    assert!(dropped.load(Ordering::SeqCst));
    assert_eq!(sched.metrics().armed, 0);
}

#[test]
fn cancel_does_not_refuse_the_running_callbacks_rearm() {
    let sched = Scheduler::manual();
    let slot: Arc<Mutex<Option<Work>>> = Arc::default();
    let inner = slot.clone();
    let work = sched.every(MS, move |_| {
        if let Some(work) = inner.lock().unwrap().as_ref() {
            work.cancel();
        }
        Next::Again
    });
    *slot.lock().unwrap() = Some(work);
    sched.advance(MS);
    let work = slot.lock().unwrap().take().unwrap();
    assert!(
        work.is_pending(),
        "cancel() does not stop a running callback from re-arming"
    );
}

// From inside the own callback nothing waits for itself.
#[test]
fn cancel_sync_from_inside_the_callback_refuses_its_own_rearm() {
    let sched = Scheduler::manual();
    let slot: Arc<Mutex<Option<Work>>> = Arc::default();
    let inner = slot.clone();
    let work = sched.every(MS, move |_| {
        let guard = inner.lock().unwrap();
        guard.as_ref().unwrap().cancel_sync();
        Next::Again
    });
    *slot.lock().unwrap() = Some(work);
    assert_eq!(sched.advance(10 * MS), 1);
    let work = slot.lock().unwrap().take().unwrap();
    assert!(!work.is_pending());
    assert!(work.schedule(MS), "a later schedule re-arms it");
}

#[test]
fn flush_from_inside_the_callback_returns_false() {
    let sched = Scheduler::manual();
    let slot: Arc<Mutex<Option<Work>>> = Arc::default();
    let inner = slot.clone();
    let flushed = Arc::new(Mutex::new(None));
    let seen = flushed.clone();
    let work = sched.every(MS, move |_| {
        let guard = inner.lock().unwrap();
        *seen.lock().unwrap() = Some(guard.as_ref().unwrap().flush());
        Next::Again
    });
    *slot.lock().unwrap() = Some(work);
    sched.advance(MS);
    assert_eq!(*flushed.lock().unwrap(), Some(false));
    assert!(
        slot.lock().unwrap().as_ref().unwrap().is_pending(),
        "flush changed nothing"
    );
    // The closure holds the slot that holds the work: break the cycle.
    drop(slot.lock().unwrap().take());
}

#[test]
fn drop_from_inside_the_callback_frees_the_closure_after_it_returns() {
    let sched = Scheduler::manual();
    let slot: Arc<Mutex<Option<Work>>> = Arc::default();
    let inner = slot.clone();
    let (guard, dropped) = drop_flag();
    let dropped_in_callback = dropped.clone();
    let still_alive_after_drop = Arc::new(Mutex::new(None));
    let seen = still_alive_after_drop.clone();
    let work = sched.every(MS, move |_| {
        let _keep = &guard;
        let work = inner.lock().unwrap().take();
        drop(work);
        *seen.lock().unwrap() = Some(!dropped_in_callback.load(Ordering::SeqCst));
        Next::Again
    });
    *slot.lock().unwrap() = Some(work);
    assert_eq!(
        sched.advance(10 * MS),
        1,
        "the dropped work never runs again"
    );
    assert_eq!(*still_alive_after_drop.lock().unwrap(), Some(true));
    assert!(
        dropped.load(Ordering::SeqCst),
        "freed once the callback returned"
    );
    assert_eq!(sched.metrics().armed, 0);
}

#[test]
fn every_for_drops_the_object_and_its_work_on_the_running_thread() {
    struct Object {
        work: Mutex<Option<Work>>,
        _flag: common::DropFlag,
    }
    let sched = Scheduler::manual();
    let (flag, dropped) = drop_flag();
    let object = Arc::new(Object {
        work: Mutex::new(None),
        _flag: flag,
    });
    let holder = Arc::new(Mutex::new(Some(object.clone())));
    let release = holder.clone();
    let work = sched.every_for(&object, MS, move |_, _| {
        // The last strong reference goes away while the callback runs.
        release.lock().unwrap().take();
        Next::Again
    });
    *object.work.lock().unwrap() = Some(work);
    drop(object);
    assert_eq!(sched.advance(10 * MS), 1);
    assert!(dropped.load(Ordering::SeqCst));
    assert_eq!(sched.metrics().armed, 0);
}

// A panic is caught and poisons only its work.
#[test]
fn a_panicking_callback_is_poisoned_and_others_carry_on() {
    let sched = Scheduler::manual();
    let bad = sched.every(MS, |_| panic!("boom"));
    let (runs, read) = counter();
    let _good = sched.every(MS, move |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        Next::Again
    });
    sched.advance(10 * MS);
    assert!(bad.is_poisoned());
    assert!(!bad.is_pending());
    assert_eq!(bad.stats().runs, 1);
    assert!(
        !bad.schedule(Duration::ZERO),
        "a poisoned work never runs again"
    );
    bad.touch();
    assert!(!bad.flush());
    assert_eq!(read(), 10);
}

// Idle costs nothing.
#[test]
fn a_parked_work_is_in_no_timer_structure() {
    let sched = Scheduler::manual();
    let works: Vec<Work> = (0..100).map(|_| sched.every(MS, |_| Next::Park)).collect();
    assert_eq!(sched.metrics().armed, 100);
    sched.advance(MS);
    assert_eq!(sched.metrics().armed, 0);
    assert_eq!(sched.advance(Duration::from_secs(3600)), 0);
    assert!(
        works
            .iter()
            .all(|w| w.stats().runs == 1 && w.stats().parks == 1)
    );
}

// A touch during a run is never lost (the single-threaded orders; the racing ones are
// in the threaded tests and the loom models).
#[test]
fn touch_during_a_run_that_parks_leaves_the_work_armed() {
    let sched = Scheduler::manual();
    let slot: Arc<Mutex<Option<Work>>> = Arc::default();
    let inner = slot.clone();
    let work = sched.every(5 * MS, move |_| {
        inner.lock().unwrap().as_ref().unwrap().touch();
        Next::Park
    });
    *slot.lock().unwrap() = Some(work);
    sched.advance(5 * MS);
    let work = slot.lock().unwrap().take().unwrap(); // the closure holds the slot: a cycle
    assert!(work.is_pending());
    assert_eq!(work.stats().parks, 1);
}

#[test]
fn touch_arms_a_parked_work_for_its_period() {
    let sched = Scheduler::manual();
    let work = sched.every(10 * MS, |_| Next::Park);
    sched.advance(10 * MS);
    work.touch();
    work.touch();
    assert_eq!(sched.advance(9 * MS), 0);
    assert_eq!(sched.advance(MS), 1);
}

#[test]
fn stop_disarms_and_touch_no_longer_arms_but_schedule_does() {
    let sched = Scheduler::manual();
    let work = sched.every(MS, |_| Next::Stop);
    sched.advance(MS);
    work.touch();
    assert!(!work.is_pending());
    assert!(work.schedule(MS));
    assert_eq!(sched.advance(MS), 1);
}

/// `schedule` "may arm a work that is running: the new instance runs after the current
/// one ends", also when the current one returns `Stop`: here the callback arms itself and
/// stops. The second run stops with nothing armed, and then the work is stopped.
#[test]
fn an_arm_made_during_a_run_that_returns_stop_stands() {
    let sched = Scheduler::manual();
    let me: Arc<std::sync::OnceLock<std::sync::Weak<Work>>> = Arc::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let (me2, r) = (me.clone(), runs.clone());
    let work = Arc::new(sched.work(move |_| {
        if r.fetch_add(1, Ordering::SeqCst) == 0 {
            let work = me2.get().and_then(std::sync::Weak::upgrade).unwrap();
            assert!(work.schedule(MS), "a running work can be armed");
        }
        Next::Stop
    }));
    me.set(Arc::downgrade(&work)).unwrap();
    assert!(work.schedule(MS));
    assert_eq!(sched.advance(MS), 1);
    assert!(work.is_pending(), "the arm made during the Stop run stands");
    assert_eq!(sched.advance(MS), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(!work.is_pending());
    work.touch();
    assert!(
        !work.is_pending(),
        "stopped by the second run: touch does not arm it"
    );
    assert_eq!(sched.advance(10 * MS), 0);
}

// Fixed-delay re-arm.
#[test]
fn again_is_fixed_delay_from_the_end_of_the_run() {
    let sched = Scheduler::manual();
    let deadlines = Arc::new(Mutex::new(Vec::new()));
    let seen = deadlines.clone();
    let start = sched.now();
    let _work = sched.every(10 * MS, move |cx| {
        seen.lock()
            .unwrap()
            .push(cx.deadline().duration_since(start));
        Next::Again
    });
    // One big jump: no burst, every run at its own deadline, each 10 ms after the last.
    assert_eq!(sched.advance(1000 * MS), 100);
    let deadlines = deadlines.lock().unwrap();
    assert!(
        deadlines
            .windows(2)
            .all(|w| w[1] - w[0] == Duration::from_millis(10))
    );
}

#[test]
fn yield_runs_again_after_the_other_due_works() {
    let sched = Scheduler::manual();
    let order = Arc::new(Mutex::new(Vec::new()));
    let (o1, o2) = (order.clone(), order.clone());
    let _a = sched.every(MS, move |cx| {
        o1.lock().unwrap().push("a");
        if cx.runs() < 3 {
            Next::Yield
        } else {
            Next::Park
        }
    });
    let _b = sched.every(MS, move |_| {
        o2.lock().unwrap().push("b");
        Next::Park
    });
    sched.advance(MS);
    assert_eq!(*order.lock().unwrap(), ["a", "b", "a", "a"]);
}

#[test]
fn flush_runs_a_pending_work_on_the_caller_and_is_false_when_idle() {
    let sched = Scheduler::manual();
    let caller = std::thread::current().id();
    let ran_on = Arc::new(Mutex::new(None));
    let seen = ran_on.clone();
    let work = sched.every(Duration::from_secs(60), move |_| {
        *seen.lock().unwrap() = Some(std::thread::current().id());
        Next::Park
    });
    assert!(work.flush());
    assert_eq!(*ran_on.lock().unwrap(), Some(caller));
    assert!(!work.flush());
}

#[test]
fn flush_takes_over_the_increments_of_a_yielding_work() {
    let sched = Scheduler::manual();
    let left = Arc::new(AtomicU64::new(5));
    let l = left.clone();
    let work = sched.every(Duration::from_secs(60), move |_| {
        if l.fetch_sub(1, Ordering::SeqCst) > 1 {
            Next::Yield
        } else {
            Next::Park
        }
    });
    assert!(work.flush());
    assert_eq!(left.load(Ordering::SeqCst), 0);
    assert_eq!(work.stats().runs, 5);
}

#[test]
fn disable_nests_cancels_pending_and_refuses_arms() {
    let sched = Scheduler::manual();
    let work = sched.every(MS, |_| Next::Again);
    assert!(work.disable());
    assert!(!work.disable());
    assert!(!work.schedule(MS));
    assert!(!work.reschedule(MS));
    work.touch();
    assert!(!work.is_pending());
    work.enable();
    assert!(!work.schedule(MS), "still disabled once");
    work.enable();
    work.enable(); // unmatched: does nothing
    assert!(work.schedule(MS));
    assert!(!work.is_disabled());
}

#[test]
fn stats_count_runs_parks_and_names() {
    let sched = Scheduler::manual();
    let work = sched
        .every(MS, |cx| {
            if cx.runs() % 2 == 0 {
                Next::Park
            } else {
                Next::Again
            }
        })
        .named("halves");
    sched.advance(2 * MS);
    let stats = work.stats();
    assert_eq!((stats.runs, stats.parks), (2, 1));
    assert_eq!(stats.lateness_max, Duration::ZERO);
    assert!(stats.last_run.is_some());
    assert_eq!(work.name(), "halves");
}

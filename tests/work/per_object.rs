//! Per-object works (`every_for`, `timeout_for`, `work_for`) given the `Weak` of
//! `Arc::new_cyclic`, whose runs may come while the object is still being constructed:
//!
//! - such a run finds no object, calls nothing and re-arms, so the work stays alive and
//!   reaches the object once it exists: with `every_for`, `timeout_for` and a scheduled
//!   `work_for` during a slow constructor, with a zero period, and after a touch;
//! - a `cancel_sync` during construction stays in force until the work is scheduled;
//! - a constructor that panics while runs come frees the work, and no run reaches the
//!   object that never existed;
//! - a work of a dead `Weak` calls nothing and retries no faster than every 10 ms.
//!
//! Waits are for states, bounded; the slow constructor is setup, not an assertion. The
//! three tests of a slow constructor on a real scheduler are built on Linux only.

use crate::common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::time::Duration;

use common::{BOUND, drop_flag};
use nicework::{Next, Scheduler, Work};

#[cfg(target_os = "linux")]
use common::eventually;
#[cfg(target_os = "linux")]
use std::thread;
#[cfg(target_os = "linux")]
use std::time::Instant;

struct Obj {
    reached: AtomicU64,
    work: Work,
}

fn reach(obj: &Obj, _: &mut nicework::Ctx<'_>) -> Next {
    obj.reached.fetch_add(1, SeqCst);
    Next::Again
}

#[test]
fn a_constructor_that_panics_while_runs_come_frees_the_work_and_nothing_runs_after() {
    common::quiet_panics_starting_with("per_object: constructor");
    let sched = Scheduler::builder().build().unwrap();
    let (flag, freed) = drop_flag();
    let runs_at_panic = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let result = {
        let (runs_at_panic, calls) = (runs_at_panic.clone(), calls.clone());
        catch_unwind(AssertUnwindSafe(|| {
            Arc::new_cyclic(|me: &Weak<Obj>| {
                let work = sched.every_for(me, Duration::ZERO, move |obj: &Obj, cx| {
                    let _keep = &flag;
                    calls.fetch_add(1, SeqCst);
                    reach(obj, cx)
                });
                // Runs come (and find no object) while the constructor works on.
                common::spin_until(BOUND, || work.stats().runs >= 2 || work.is_running());
                runs_at_panic.store(work.stats().runs, SeqCst);
                panic!("per_object: constructor fails");
                #[allow(unreachable_code)]
                Obj {
                    reached: AtomicU64::new(0),
                    work,
                }
            })
        }))
    };
    assert!(result.is_err());
    // The unwinding dropped the work: that waited for a run in progress and freed the
    // closure.
    assert!(freed.load(SeqCst), "the work's closure outlived the panic");
    assert_eq!(
        calls.load(SeqCst),
        0,
        "a run reached an object that never existed"
    );
}

#[test]
fn a_per_object_work_of_a_dead_weak_calls_nothing_and_retries_no_faster_than_10_ms() {
    let sched = Scheduler::manual();
    let dead: Weak<Obj> = Weak::new();
    let calls = Arc::new(AtomicU64::new(0));
    let counter = calls.clone();
    let work = sched.every_for(&dead, Duration::ZERO, move |obj: &Obj, cx| {
        counter.fetch_add(1, SeqCst);
        reach(obj, cx)
    });
    let runs = sched.advance(Duration::from_millis(100));
    assert_eq!(calls.load(SeqCst), 0);
    assert!(work.is_pending(), "the retrying work stopped");
    assert!(
        (1..=11).contains(&runs),
        "{runs} runs in 100 ms: faster than every 10 ms"
    );
}

#[test]
fn new_cyclic_with_a_touch_and_runs_during_construction_reaches_the_object_after() {
    let sched = Scheduler::manual();
    let obj = Arc::new_cyclic(|me: &Weak<Obj>| {
        let work = sched.work_for(me, reach);
        work.touch(); // parked work(): armed for its period (0: the slack)
        assert!(work.is_pending());
        // Runs during construction: they find no object, call nothing, re-arm.
        assert!(sched.advance(Duration::from_millis(50)) >= 1);
        assert!(
            work.is_pending(),
            "a run during construction stopped the work"
        );
        Obj {
            reached: AtomicU64::new(0),
            work,
        }
    });
    sched.advance(Duration::from_millis(50));
    assert!(
        obj.reached.load(SeqCst) >= 1,
        "the work never reached the object"
    );
}

#[test]
fn new_cyclic_with_cancel_sync_during_construction_stays_cancelled_until_scheduled() {
    let sched = Scheduler::manual();
    let obj = Arc::new_cyclic(|me: &Weak<Obj>| {
        let work = sched.every_for(me, Duration::from_millis(5), reach);
        assert!(sched.advance(Duration::from_millis(5)) == 1); // before the object exists
        work.cancel_sync();
        Obj {
            reached: AtomicU64::new(0),
            work,
        }
    });
    assert_eq!(sched.advance(Duration::from_millis(100)), 0);
    obj.work.touch(); // stopped by cancel_sync: touch does not arm it
    assert!(!obj.work.is_pending());
    assert!(obj.work.schedule(Duration::ZERO));
    sched.advance(Duration::from_millis(20));
    assert!(obj.reached.load(SeqCst) >= 1);
    drop(obj);
    assert_eq!(sched.advance(Duration::from_millis(100)), 0);
}

#[test]
fn every_for_with_a_zero_period_in_new_cyclic_survives_runs_during_construction() {
    let sched = Scheduler::builder().build().unwrap();
    let obj = Arc::new_cyclic(|me: &Weak<Obj>| {
        let work = sched.every_for(me, Duration::ZERO, reach);
        common::spin_until(BOUND, || work.stats().runs >= 3);
        Obj {
            reached: AtomicU64::new(0),
            work,
        }
    });
    assert!(
        common::spin_until(BOUND, || obj.reached.load(SeqCst) >= 3),
        "the work stopped after the runs during construction"
    );
}

/// An object that owns its work and counts the runs that reached it.
#[cfg(target_os = "linux")]
struct Counter {
    runs: AtomicU64,
    work: Work,
}

/// Builds a `Counter` with `Arc::new_cyclic`; `make` creates (and if need be arms) its work
/// with a 5 ms period that counts runs on the object and returns `Again`. The constructor
/// is slow: it returns once a run of the work came (and found the object not there yet),
/// or after 200 ms (40 periods) if none is counted. Then the work must stay alive: the
/// object sees two runs.
#[cfg(target_os = "linux")]
fn new_cyclic_survives_a_run_during_construction(
    make: impl FnOnce(&Scheduler, &Weak<Counter>) -> Work,
) {
    let sched = Scheduler::builder().build().unwrap();
    let obj = Arc::new_cyclic(|me: &Weak<Counter>| {
        let work = make(&sched, me);
        // Setup, not an assertion: a constructor that takes a while.
        let slow = Instant::now();
        while work.stats().runs == 0 && slow.elapsed() < Duration::from_millis(200) {
            thread::sleep(Duration::from_millis(1));
        }
        Counter {
            runs: AtomicU64::new(0),
            work,
        }
    });
    // The callback always returns `Again`: a work neither pending nor running is dead.
    let alive = |obj: &Counter| obj.work.is_pending() || obj.work.is_running();
    eventually(|| obj.runs.load(SeqCst) >= 2 || !alive(&obj));
    assert!(
        obj.runs.load(SeqCst) >= 2,
        "the work died with the run during construction: {} runs reached the object, \
         {} runs in all, pending {}, running {}",
        obj.runs.load(SeqCst),
        obj.work.stats().runs,
        obj.work.is_pending(),
        obj.work.is_running()
    );
}

#[cfg(target_os = "linux")]
const CYCLIC_PERIOD: Duration = Duration::from_millis(5);

#[cfg(target_os = "linux")]
fn count_run(obj: &Counter, _: &mut nicework::Ctx<'_>) -> Next {
    obj.runs.fetch_add(1, SeqCst);
    Next::Again
}

#[cfg(target_os = "linux")]
#[test]
fn every_for_in_new_cyclic_survives_a_run_during_construction() {
    new_cyclic_survives_a_run_during_construction(|sched, me| {
        sched.every_for(me, CYCLIC_PERIOD, count_run)
    });
}

#[cfg(target_os = "linux")]
#[test]
fn timeout_for_in_new_cyclic_survives_a_run_during_construction() {
    new_cyclic_survives_a_run_during_construction(|sched, me| {
        sched.timeout_for(me, CYCLIC_PERIOD, count_run)
    });
}

#[cfg(target_os = "linux")]
#[test]
fn work_for_scheduled_in_new_cyclic_survives_a_run_during_construction() {
    new_cyclic_survives_a_run_during_construction(|sched, me| {
        let work = sched.work_for(me, count_run);
        assert!(work.schedule(CYCLIC_PERIOD));
        work
    });
}

//! Promises that legal code once broke, one test (or a few) each:
//!
//! - the `Arc::new_cyclic` idiom survives a run that comes while the object is still being
//!   constructed: the work stays alive afterwards.
//!
//! Race tests repeat many rounds and assert that no round broke the promise; the
//! environment variable `NICEWORK_PROMISES_SCALE` (a whole number, default 1) multiplies
//! their rounds, to measure failure rates. Where two threads must race, they are pinned to
//! two CPUs (if the process may use two), and one side waits for the state the other
//! creates (a disarm, an arm) rather than for luck. No test asserts a timing: waits are
//! for states.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use common::eventually;
use nicework::{Next, Scheduler, Work};

// ---------------------------------------------------------------------------------------
// 7. The `Arc::new_cyclic` idiom with a run during construction.
// ---------------------------------------------------------------------------------------

/// An object that owns its work and counts the runs that reached it.
struct Obj {
    runs: AtomicU64,
    work: Work,
}

/// Builds an `Obj` with `Arc::new_cyclic`; `make` creates (and if need be arms) its work
/// with a 5 ms period that counts runs on the object and returns `Again`. The constructor
/// is slow: it returns once a run of the work came (and found the object not there yet),
/// or after 200 ms (40 periods) if none is counted. Then the work must stay alive: the
/// object sees two runs.
fn new_cyclic_survives_a_run_during_construction(
    make: impl FnOnce(&Scheduler, &Weak<Obj>) -> Work,
) {
    let sched = Scheduler::builder().build().unwrap();
    let obj = Arc::new_cyclic(|me: &Weak<Obj>| {
        let work = make(&sched, me);
        // Setup, not an assertion: a constructor that takes a while.
        let slow = Instant::now();
        while work.stats().runs == 0 && slow.elapsed() < Duration::from_millis(200) {
            thread::sleep(Duration::from_millis(1));
        }
        Obj {
            runs: AtomicU64::new(0),
            work,
        }
    });
    // The callback always returns `Again`: a work neither pending nor running is dead.
    let alive = |obj: &Obj| obj.work.is_pending() || obj.work.is_running();
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

const CYCLIC_PERIOD: Duration = Duration::from_millis(5);

fn count_run(obj: &Obj, _: &mut nicework::Ctx<'_>) -> Next {
    obj.runs.fetch_add(1, SeqCst);
    Next::Again
}

#[test]
fn every_for_in_new_cyclic_survives_a_run_during_construction() {
    new_cyclic_survives_a_run_during_construction(|sched, me| {
        sched.every_for(me, CYCLIC_PERIOD, count_run)
    });
}

#[test]
fn timeout_for_in_new_cyclic_survives_a_run_during_construction() {
    new_cyclic_survives_a_run_during_construction(|sched, me| {
        sched.timeout_for(me, CYCLIC_PERIOD, count_run)
    });
}

#[test]
fn work_for_scheduled_in_new_cyclic_survives_a_run_during_construction() {
    new_cyclic_survives_a_run_during_construction(|sched, me| {
        let work = sched.work_for(me, count_run);
        assert!(work.schedule(CYCLIC_PERIOD));
        work
    });
}

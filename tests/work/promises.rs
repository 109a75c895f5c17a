//! Promises that legal code once broke, one test (or a few) each:
//!
//! - a `work()`'s period comes from the same arm as its deadline.
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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    assert_no_round_broke, eventually, pin_to_cpu, racing_sched, rounds, spin_until_eventually,
    two_cpus,
};
use nicework::{Next, Scheduler, Work};

// ---------------------------------------------------------------------------------------
// 6. A work()'s period and deadline come from the same arm.
// ---------------------------------------------------------------------------------------

#[test]
fn a_works_period_comes_from_the_same_arm_as_its_deadline() {
    const SHORT: Duration = Duration::from_millis(10);
    const LONG: Duration = Duration::from_secs(10);
    let sched = racing_sched();
    let work = sched.work(|_| Next::Park);
    let total = rounds(100_000);
    // Per round: two threads (on two CPUs) each reschedule once, at the same moment; which
    // one takes which delay alternates. The long arm comes the moment the short one armed
    // the work (it was cancelled at the end of the previous round).
    let go = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let short_done = AtomicUsize::new(0);
    let arm = |round: usize, short: bool| {
        if short {
            work.reschedule(SHORT);
            short_done.store(round, SeqCst);
        } else {
            // (Or once the short arm returned: it may have come due and run meanwhile.)
            spin_until_eventually(|| work.is_pending() || short_done.load(SeqCst) >= round);
            work.reschedule(LONG);
        }
    };
    let cpus = two_cpus();
    let (ran, mismatched, skipped, example) = thread::scope(|s| {
        let helper = s.spawn(|| {
            if let Some((_, cpu)) = cpus {
                pin_to_cpu(cpu);
            }
            for round in 1.. {
                if !spin_until_eventually(|| go.load(SeqCst) >= round)
                    || go.load(SeqCst) == usize::MAX
                {
                    return;
                }
                arm(round, round % 2 == 0);
                done.store(round, SeqCst);
            }
        });
        let driver = s.spawn(|| {
            if let Some((cpu, _)) = cpus {
                pin_to_cpu(cpu);
            }
            let (mut ran, mut mismatched, mut skipped, mut example) = (0, 0, 0, None);
            let started = Instant::now();
            for round in 1..=total {
                // Bounded by a budget too, so that a slow machine still ends in seconds.
                if started.elapsed() > Duration::from_secs(4) {
                    break;
                }
                ran = round;
                let start = Instant::now();
                go.store(round, SeqCst);
                arm(round, round % 2 == 1);
                assert!(
                    spin_until_eventually(|| done.load(SeqCst) >= round),
                    "helper stuck"
                );
                let period = work.period();
                match work.deadline() {
                    None => skipped += 1, // the short arm came due and ran: no verdict
                    Some(deadline) => {
                        let agrees = if period == LONG {
                            deadline >= start + LONG
                        } else {
                            period == SHORT && deadline < start + LONG / 2
                        };
                        if !agrees {
                            mismatched += 1;
                            example
                                .get_or_insert((period, deadline.saturating_duration_since(start)));
                        }
                    }
                }
                work.cancel();
            }
            go.store(usize::MAX, SeqCst);
            (ran, mismatched, skipped, example)
        });
        let verdict = driver.join().unwrap();
        helper.join().unwrap();
        verdict
    });
    work.cancel_sync();
    assert_no_round_broke(
        "period() comes from the same arm as deadline()",
        mismatched,
        ran - skipped,
        &format!(
            "(rounds with a deadline; {skipped} skipped because the work ran; first \
             mismatch (period, deadline - start): {example:?})"
        ),
    );
}

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

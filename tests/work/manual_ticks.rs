//! The manual clock at sub-slack resolution: a deadline inside a tick runs when `advance`
//! reaches the end of that tick (the slack lets any work run up to that much late, so
//! that neighbouring deadlines share a wakeup; virtual time keeps the rule), never before
//! its deadline; and a zero delay runs at once, also when it reuses a timer entry.

use std::time::Duration;

use nicework::{Next, Scheduler};

const UNIT: Duration = Duration::from_micros(100);
const SLACK: Duration = Duration::from_millis(1);

#[test]
fn a_sub_slack_deadline_runs_at_the_end_of_its_tick_and_never_before_it() {
    for (first, delay) in [
        (Duration::ZERO, 2 * UNIT),
        (2 * UNIT, 2 * UNIT),
        (20 * UNIT, 2 * UNIT),
        (25 * UNIT, 12 * UNIT),
    ] {
        let sched = Scheduler::manual();
        let start = sched.now();
        let work = sched.work(|_| Next::Park);
        sched.advance(first);
        assert!(work.schedule(delay));
        let due = work.deadline().unwrap();
        assert_eq!(due, sched.now() + delay, "deadline() is exact");
        // The end of the tick that holds the deadline.
        let due_ns = (due - start).as_nanos() as u64;
        let slack_ns = SLACK.as_nanos() as u64;
        let tick_end = start + Duration::from_nanos(due_ns.div_ceil(slack_ns) * slack_ns);
        let before = (tick_end - sched.now()).saturating_sub(UNIT);
        assert_eq!(
            sched.advance(before),
            0,
            "at {first:?} + {delay:?}: ran before the end of its tick"
        );
        assert_eq!(
            sched.advance(UNIT),
            1,
            "at {first:?} + {delay:?}: not run by its tick"
        );
        assert!(sched.now() >= due);
    }
}

/// Delay zero runs at the next opportunity, not at the next tick. After a
/// cancel, the cancelled instance's timer entry is reused by the zero-delay arm (the
/// lock-free path), and the work then waits for that entry's tick.
#[test]
fn zero_delay_after_a_cancel_runs_at_the_next_opportunity() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Park);
    assert!(work.schedule(5 * UNIT)); // its entry sits at the 1 ms tick
    assert_eq!(sched.advance(7 * UNIT), 0);
    assert!(work.cancel());
    assert!(work.schedule(Duration::ZERO));
    assert_eq!(work.deadline(), Some(sched.now()));
    assert_eq!(
        sched.advance(Duration::ZERO),
        1,
        "a zero-delay work waited for the next tick"
    );
}

#[test]
fn zero_delay_reschedule_of_a_pending_work_runs_at_the_next_opportunity() {
    let sched = Scheduler::manual();
    let work = sched.work(|_| Next::Park);
    assert!(work.schedule(5 * UNIT));
    assert_eq!(sched.advance(3 * UNIT), 0);
    // Due at 0.3 ms, which is later than the pending 0.5 ms? No: earlier, so a new
    // entry is needed and placed on the ready queue.
    assert!(work.schedule_within(Duration::ZERO));
    assert_eq!(sched.advance(Duration::ZERO), 1);
    // And from a later position: pending for 0.2 ms from now (0.5 ms), reschedule(0)
    // at 0.7 ms is a later deadline than 0.5 ms, so the live entry at the 1 ms tick is
    // reused.
    assert!(work.schedule(2 * UNIT));
    assert_eq!(sched.advance(4 * UNIT), 0);
    assert!(work.reschedule(Duration::ZERO));
    assert_eq!(
        sched.advance(Duration::ZERO),
        1,
        "a zero-delay reschedule waited for the next tick"
    );
}

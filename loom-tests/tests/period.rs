#![cfg(loom)]
//! Loom models of the lock-free arms that change a `work()`'s period, and of the ones
//! that lower a deadline below the previous one through the live entry's placement. Run
//! with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release
//! --test period`.
//!
//! A `work()`'s period is the delay of its latest arm, in a word of its own: an arm takes
//! a claim on it in its CAS, stores its delay and releases the claim, and a completion
//! that re-arms for the period reads it under a claim of its own. The rule every
//! model checks at its end, with the virtual clock standing still at `at`: a pending
//! `work()` is due at `at + period()`, so its deadline and its period came from the same
//! arm (or from a completion's `Again`, which re-arms for the period). Then `advance`
//! must run it at that deadline: a lowered deadline that its timer entry did not serve
//! would run late.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use loom::thread;
use nicework::{Next, Scheduler, Work};

const MS: Duration = Duration::from_millis(1);

/// Checks the rule above on `work` at the virtual time `at`, then runs it at its
/// deadline and checks the run came exactly then (`ran` records each run's start).
fn deadline_and_period_agree(
    sched: &Scheduler,
    work: &Work,
    at: Instant,
    ran: &StdMutex<Vec<Instant>>,
) {
    assert_eq!(sched.now(), at, "the model's clock stood still");
    let Some(deadline) = work.deadline() else {
        return;
    };
    let period = work.period();
    assert_eq!(
        deadline - at,
        period,
        "the deadline of one arm and the period of another"
    );
    ran.lock().unwrap().clear();
    // One slack (1 ms) past it: a deadline inside a tick runs at the tick's end, and the
    // run records the deadline as its time.
    sched.advance(period + MS);
    let ran = ran.lock().unwrap();
    assert_eq!(
        ran.first(),
        Some(&deadline),
        "ran late or not at all: {ran:?}"
    );
}

/// A `work()` that records when each run started and returns `next`.
fn recording(sched: &Scheduler, next: Next) -> (Work, Arc<StdMutex<Vec<Instant>>>) {
    let ran = Arc::new(StdMutex::new(Vec::new()));
    let r = ran.clone();
    let work = sched.work(move |cx| {
        r.lock().unwrap().push(cx.scheduler().now());
        next
    });
    (work, ran)
}

/// Two lock-free arms, each changing the period (the work has a live entry at 10 ms,
/// placed no later than either deadline): whichever CAS comes last leaves its deadline
/// and its period, and the other waits for, or goes around, the change in progress.
#[test]
fn two_lock_free_period_changes() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let (work, ran) = recording(&sched, Next::Park);
        let work = Arc::new(work);
        assert!(!work.reschedule(10 * MS));
        let at = sched.now();
        let other = {
            let work = work.clone();
            thread::spawn(move || work.reschedule(30 * MS))
        };
        work.reschedule(50 * MS);
        other.join().unwrap();
        deadline_and_period_agree(&sched, &work, at, &ran);
    });
}

/// A lock-free arm changing the period against a run's completion that reads it: the
/// callback (run by a `flush`, so the clock stands still) makes the work's entry live
/// (`schedule` links one, `cancel` disarms it) and returns `Again`; another thread arms it meanwhile with a new delay, and a third cancels
/// it, so the completion may find the work disarmed while the arm is still storing its
/// period. `Again` must then use that arm's delay, the latest, as the arm itself would.
#[test]
fn a_period_change_against_the_completion_reading_it() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let ran = Arc::new(StdMutex::new(Vec::new()));
        let racers = Arc::new(StdMutex::new(Vec::new()));
        let work: Arc<StdMutex<Option<Arc<Work>>>> = Arc::new(StdMutex::new(None));
        let (r, me, rs) = (ran.clone(), work.clone(), racers.clone());
        let handle = Arc::new(sched.work(move |cx| {
            r.lock().unwrap().push(cx.scheduler().now());
            let Some(me) = me.lock().unwrap().clone() else {
                return Next::Again;
            };
            if rs.lock().unwrap().is_empty() {
                me.schedule(20 * MS);
                me.cancel();
                // Spawned here, so that both race the rest of this run and its completion.
                let arm = me.clone();
                let cancel = me.clone();
                let mut racers = rs.lock().unwrap();
                racers.push(thread::spawn(move || {
                    arm.reschedule(40 * MS);
                }));
                racers.push(thread::spawn(move || {
                    cancel.cancel();
                }));
            }
            Next::Again
        }));
        *work.lock().unwrap() = Some(handle.clone());
        assert!(!handle.reschedule(10 * MS));
        // The run, on this thread and at virtual time 0, so every arm is made then.
        assert!(handle.flush());
        for racer in std::mem::take(&mut *racers.lock().unwrap()) {
            racer.join().unwrap();
        }
        work.lock().unwrap().take();
        let at = sched.now();
        deadline_and_period_agree(&sched, &handle, at, &ran);
    });
}

/// A lock-free arm changing the period against `cancel_sync` waiting for a run that
/// returns `Again`: once both returned, whatever the order, the work's period word and
/// its claim are left whole: a later arm with yet another delay is lock-free or locked as
/// usual, and its deadline and period agree.
#[test]
fn a_period_change_against_cancel_sync() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let (work, ran) = recording(&sched, Next::Again);
        let work = Arc::new(work);
        assert!(!work.reschedule(10 * MS));
        let arm = {
            let work = work.clone();
            thread::spawn(move || {
                work.reschedule(30 * MS);
            })
        };
        // The run is a flush (on its own thread, at virtual time 0, as every arm here):
        // `advance` would move the clock between arms.
        let runner = {
            let work = work.clone();
            thread::spawn(move || work.flush())
        };
        work.cancel_sync();
        arm.join().unwrap();
        runner.join().unwrap();
        let at = sched.now();
        deadline_and_period_agree(&sched, &work, at, &ran);
        work.reschedule(70 * MS);
        let at = sched.now();
        assert_eq!(work.period(), 70 * MS);
        deadline_and_period_agree(&sched, &work, at, &ran);
    });
}

/// A lock-free arm lowering the deadline below the last one, which only the placement of
/// the live entry allows, against the worker that meets that entry at its tick and moves
/// it later to the deadline it finds (claiming a new epoch for it): the work must still
/// run exactly at the deadline that stands, never at the entry's new, later tick.
#[test]
fn a_lowered_deadline_against_the_entry_moving_later() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let (work, ran) = recording(&sched, Next::Park);
        let work = Arc::new(work);
        let start = sched.now();
        // The entry at 10 ms; the deadline raised to 30 ms without moving it.
        assert!(!work.reschedule(10 * MS));
        assert!(work.reschedule(30 * MS));
        let lower = {
            let work = work.clone();
            thread::spawn(move || {
                // At 0 or 10 ms on the virtual clock: due at 20 or 30 ms, either way
                // between the entry's first tick and its moved one, or at it.
                work.reschedule(20 * MS);
            })
        };
        // Meets the entry at 10 ms: not due, so it moves it to the deadline it reads.
        assert_eq!(sched.advance(10 * MS), 0);
        lower.join().unwrap();
        let deadline = work.deadline().expect("pending");
        let at = sched.now();
        assert_eq!(at, start + 10 * MS);
        ran.lock().unwrap().clear();
        sched.advance(deadline - at);
        assert_eq!(ran.lock().unwrap().first(), Some(&deadline), "ran late");
    });
}

/// An arm that finds the period already equal to its delay changes nothing but the
/// deadline; meanwhile two other arms change the period twice and bring the state word
/// back bit for bit (the same deadline, through the entry's placement at 19.2 ms). A
/// decision from a period read without a claim would let that arm's CAS succeed on the
/// returned word and leave its deadline with the other arms' period: the claim taken in
/// every arm's CAS makes the returned word carry no such decision.
#[test]
fn a_state_word_that_comes_back_bit_for_bit() {
    const UNIT: Duration = Duration::from_micros(100);
    loom::model(|| {
        let sched = Scheduler::manual();
        let (work, ran) = recording(&sched, Next::Park);
        let work = Arc::new(work);
        assert!(!work.reschedule(192 * UNIT));
        assert_eq!(sched.advance(96 * UNIT), 0);
        let at = sched.now();
        let same = {
            let work = work.clone();
            thread::spawn(move || {
                work.reschedule(192 * UNIT);
            })
        };
        work.reschedule(400 * UNIT);
        work.reschedule(96 * UNIT);
        same.join().unwrap();
        deadline_and_period_agree(&sched, &work, at, &ran);
    });
}

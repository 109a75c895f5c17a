//! Re-arms whose delay changes at every call, as jittered keep-alives, `deadline - now`
//! re-arms and back-offs make them: they stay on the lock-free path (no new timer entry)
//! while the live entry serves, never run early or late, and leave a `work()`'s deadline
//! and period from the same arm, also under storms from several threads:
//!
//! - a short and a long arm racing on two CPUs (the long one the moment the short one
//!   armed the work) leave the period of the arm whose deadline stands;
//! - so do three threads racing `schedule`, `reschedule` and `cancel` with three delays,
//!   while runs return `Again` (which re-arm for the period).
//!
//! Race tests repeat rounds (bounded by a budget too) and fail if any round broke the
//! promise; waits are for states, and nothing asserts a timing. The two-CPU race is built
//! on Linux only.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{Rng, assert_no_round_broke, eventually};
use nicework::{Next, Scheduler, Work};

// The two-CPU race pins its threads with Linux's affinity calls.
#[cfg(target_os = "linux")]
use common::{pin_to_cpu, racing_sched, rounds, spin_until_eventually, two_cpus};
#[cfg(target_os = "linux")]
use std::sync::atomic::AtomicUsize;

const MS: Duration = Duration::from_millis(1);

/// A `work()` that records its runs' start times (virtual for a manual scheduler).
pub(super) fn recording(sched: &Scheduler, next: Next) -> (Work, Arc<Mutex<Vec<Instant>>>) {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let r = ran.clone();
    let work = sched.work(move |cx| {
        r.lock().unwrap().push(cx.scheduler().now());
        next
    });
    (work, ran)
}

/// Deadlines an hour out that move up and down within a second, as a jittered
/// keep-alive's do: after the first arm placed the entry, every later one (all no
/// earlier than the entry) is served by it, so the structure never holds a second
/// entry, whatever the order; and the work runs exactly at the last deadline.
#[test]
fn jittered_deadlines_above_the_entry_link_no_entry_and_run_on_time() {
    let sched = Scheduler::manual();
    let (work, ran) = recording(&sched, Next::Park);
    let hour = Duration::from_secs(3600);
    assert!(!work.reschedule(hour));
    assert_eq!(sched.metrics().timer_entries, 1);
    let mut rng = Rng(0xC0FFEE);
    let mut last = hour;
    let mut pending = true;
    for _ in 0..10_000 {
        // Whole milliseconds, so the deadline is a whole tick of the default slack.
        last = hour + Duration::from_millis(rng.next() % 1_000);
        assert_eq!(work.reschedule(last), pending);
        assert_eq!(work.period(), last);
        pending = rng.next() % 4 != 0;
        if !pending {
            assert!(work.cancel());
        }
    }
    work.reschedule(last);
    assert_eq!(
        sched.metrics().timer_entries,
        1,
        "a jittered re-arm above the entry linked an entry"
    );
    let start = sched.now();
    let due = work.deadline().expect("pending");
    assert_eq!(due - start, last);
    sched.advance(last - MS);
    assert!(ran.lock().unwrap().is_empty(), "ran early");
    sched.advance(MS);
    assert_eq!(
        *ran.lock().unwrap(),
        [due],
        "not exactly at the last deadline"
    );
}

/// A deadline below the entry still needs a new one (and gets it): the work runs at the
/// lowered deadline, not at the entry's.
#[test]
fn a_deadline_below_the_entry_links_one_and_runs_then() {
    let sched = Scheduler::manual();
    let (work, ran) = recording(&sched, Next::Park);
    let start = sched.now();
    work.reschedule(Duration::from_secs(10));
    work.reschedule(Duration::from_secs(20));
    work.reschedule(Duration::from_secs(15));
    assert_eq!(
        sched.metrics().timer_entries,
        1,
        "15 s is above the entry at 10 s"
    );
    work.reschedule(Duration::from_secs(5));
    assert_eq!(sched.metrics().timer_entries, 2, "5 s is below it");
    sched.advance(Duration::from_secs(30));
    assert_eq!(*ran.lock().unwrap(), [start + Duration::from_secs(5)]);
}

/// The worker meets an entry whose deadline moved later, and places it again there; an
/// arm that then lowers the deadline between the entry's old tick and its new one must
/// not be served by the moved entry (it would run late): it runs exactly at its deadline.
#[test]
fn a_deadline_lowered_after_the_entry_moved_later_runs_on_time() {
    let sched = Scheduler::manual();
    let (work, ran) = recording(&sched, Next::Park);
    let start = sched.now();
    work.reschedule(10 * MS);
    work.reschedule(40 * MS);
    // The entry at 10 ms is met and moved to 40 ms.
    assert_eq!(sched.advance(10 * MS), 0);
    work.reschedule(15 * MS); // due at 25 ms
    // To the deadline exactly: one `advance` past the moved entry would run the work at
    // its deadline even from the later entry (manual time jumps to each deadline).
    sched.advance(15 * MS);
    assert_eq!(*ran.lock().unwrap(), [start + 25 * MS]);
}

/// The period rule under a storm: four threads re-arm one `work()` with delays that
/// differ at every call while the main thread moves virtual time in steps, so the work
/// runs and completes with `Again` amid the arms. Every run sees a period that some arm
/// set; when the storm is over (the clock stood still for the last arms), the deadline
/// is the last arm's time plus the period left, and the work runs exactly then, and
/// again one period later.
#[test]
fn the_period_rule_under_a_storm_of_differing_delays() {
    const DELAYS_MS: [u64; 7] = [3, 5, 8, 13, 21, 34, 55];
    let sched = Scheduler::manual();
    let seen_periods = Arc::new(Mutex::new(Vec::new()));
    let ran = Arc::new(Mutex::new(Vec::new()));
    let (p, r) = (seen_periods.clone(), ran.clone());
    let work = Arc::new(sched.work(move |cx| {
        p.lock().unwrap().push(cx.period());
        r.lock().unwrap().push(cx.scheduler().now());
        Next::Again
    }));
    work.reschedule(Duration::from_millis(DELAYS_MS[0]));
    let advancing = Arc::new(AtomicBool::new(true));
    let arms = Arc::new(AtomicU64::new(0));
    let storm: Vec<_> = (0..4)
        .map(|t| {
            let (work, advancing, arms) = (work.clone(), advancing.clone(), arms.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x51 + t);
                let mut after_clock_stopped = 0;
                while after_clock_stopped < 2_000 {
                    if !advancing.load(SeqCst) {
                        after_clock_stopped += 1;
                    }
                    let delay = Duration::from_millis(
                        DELAYS_MS[(rng.next() % DELAYS_MS.len() as u64) as usize],
                    );
                    match rng.next() % 8 {
                        0 => {
                            work.cancel();
                        }
                        1 => {
                            work.schedule(delay);
                        }
                        _ => {
                            work.reschedule(delay);
                        }
                    }
                    arms.fetch_add(1, SeqCst);
                }
            })
        })
        .collect();
    let mut runs = 0;
    while runs < 2_000 && arms.load(SeqCst) < 200_000 {
        runs += sched.advance(MS);
    }
    advancing.store(false, SeqCst);
    for thread in storm {
        thread.join().unwrap();
    }
    assert!(runs > 0, "the storm never let the work run");
    let allowed: Vec<Duration> = DELAYS_MS
        .iter()
        .map(|&ms| Duration::from_millis(ms))
        .collect();
    for period in seen_periods.lock().unwrap().iter() {
        assert!(allowed.contains(period), "a run saw the period {period:?}");
    }
    // The last arms all came at this instant, after the last `advance`.
    let at = sched.now();
    if work.deadline().is_none() {
        // The storm ended on a cancel: arm once more, as the storm would have.
        work.reschedule(Duration::from_millis(DELAYS_MS[2]));
    }
    let due = work.deadline().expect("pending");
    let period = work.period();
    assert!(allowed.contains(&period), "period {period:?}");
    assert_eq!(
        due - at,
        period,
        "the deadline of one arm and the period of another"
    );
    ran.lock().unwrap().clear();
    sched.advance(period * 2);
    assert_eq!(*ran.lock().unwrap(), [due, due + period]);
}

/// Never early, with delays that differ at every call from several threads at once, on
/// a real scheduler: per round, the works are cancelled and a lower bound L = now +
/// the shortest delay of the round is set before any arm; then four threads re-arm
/// shared works with delays above that (each thread's deadlines go up and down, and the
/// threads' interleave), so arms move deadlines both ways through the lock-free path and
/// the locked one. Every run must start at or after L, by the real clock.
#[test]
fn never_early_with_differing_delays_from_several_threads() {
    const WORKS: usize = 4;
    const THREADS: usize = 4;
    const ROUNDS: usize = 60;
    let sched = common::normal_priority_builder()
        .workers(2)
        .build()
        .unwrap();
    let origin = Instant::now();
    let bounds: Arc<Vec<AtomicU64>> = Arc::new((0..WORKS).map(|_| AtomicU64::new(0)).collect());
    let early = Arc::new(Mutex::new(Vec::new()));
    let runs = Arc::new(AtomicU64::new(0));
    let works: Arc<Vec<Work>> = Arc::new(
        (0..WORKS)
            .map(|i| {
                let (bounds, early, runs) = (bounds.clone(), early.clone(), runs.clone());
                sched.work(move |_| {
                    let now = origin.elapsed().as_nanos() as u64;
                    let bound = bounds[i].load(SeqCst);
                    if now < bound {
                        early
                            .lock()
                            .unwrap()
                            .push(format!("work {i}: {} ns early", bound - now));
                    }
                    runs.fetch_add(1, SeqCst);
                    if i % 2 == 0 { Next::Again } else { Next::Park }
                })
            })
            .collect(),
    );
    let round_start = Arc::new(Barrier::new(THREADS + 1));
    let round_end = Arc::new(Barrier::new(THREADS + 1));
    let base_ns = Arc::new(AtomicU64::new(0));
    let armers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (works, round_start, round_end, base_ns) = (
                works.clone(),
                round_start.clone(),
                round_end.clone(),
                base_ns.clone(),
            );
            std::thread::spawn(move || {
                let mut rng = Rng(0xA5A5 + t as u64);
                for _ in 0..ROUNDS {
                    round_start.wait();
                    let base = base_ns.load(SeqCst);
                    for _ in 0..200 {
                        let work = &works[(rng.next() % WORKS as u64) as usize];
                        let delay = Duration::from_nanos(base + rng.next() % 4_000_000);
                        if rng.next() % 3 == 0 {
                            work.schedule(delay);
                        } else {
                            work.reschedule(delay);
                        }
                    }
                    round_end.wait();
                }
            })
        })
        .collect();
    let mut rng = Rng(0x5EED);
    for _ in 0..ROUNDS {
        for work in works.iter() {
            work.cancel_sync();
        }
        let base = 500_000 + rng.next() % 3_000_000;
        base_ns.store(base, SeqCst);
        let bound = origin.elapsed().as_nanos() as u64 + base;
        for b in bounds.iter() {
            b.store(bound, SeqCst);
        }
        round_start.wait();
        round_end.wait();
        std::thread::sleep(Duration::from_micros(rng.next() % 4_000));
    }
    for armer in armers {
        armer.join().unwrap();
    }
    assert!(eventually(|| runs.load(SeqCst) > 0), "nothing ran at all");
    for work in works.iter() {
        work.cancel_sync();
    }
    let early = early.lock().unwrap();
    assert!(early.is_empty(), "early runs: {early:?}");
}

#[test]
fn a_works_period_agrees_with_its_deadline_under_three_racing_arms_and_again() {
    const SHORT: Duration = Duration::from_millis(2);
    const LONG_A: Duration = Duration::from_secs(30);
    const LONG_B: Duration = Duration::from_secs(40);
    let sched = Scheduler::builder().build().unwrap();
    let work = sched.work(|_| Next::Again);
    let (mut checked, mut mismatched, mut example) = (0, 0, None);
    let started = Instant::now();
    let mut round = 0u64;
    while started.elapsed() < Duration::from_secs(3) && round < 400 {
        round += 1;
        let stop = AtomicBool::new(false);
        thread::scope(|s| {
            for (t, delay) in [SHORT, LONG_A, LONG_B].into_iter().enumerate() {
                let (work, stop) = (&work, &stop);
                s.spawn(move || {
                    let mut rng = Rng(round * 3 + t as u64 + 1);
                    while !stop.load(SeqCst) {
                        match rng.next() % 4 {
                            0 => {
                                work.schedule(delay);
                            }
                            1 if t == 0 => {
                                work.cancel();
                            }
                            _ => {
                                work.reschedule(delay);
                            }
                        }
                    }
                });
            }
            thread::sleep(Duration::from_micros(500 + round % 1_000));
            stop.store(true, SeqCst);
        });
        let before = Instant::now();
        let period = work.period();
        let deadline = work.deadline();
        if let Some(deadline) = deadline {
            // Arms came within the last few ms: deadline - now is the period, give or
            // take the round (a SHORT work may be running and re-arming meanwhile).
            let ahead = deadline.saturating_duration_since(before);
            let agrees = match period {
                p if p == SHORT => ahead < Duration::from_secs(1),
                // (Long delays are timed with the coarse clock, up to its margin late.)
                p if p == LONG_A => {
                    ahead > LONG_A - Duration::from_secs(2)
                        && ahead < LONG_A + Duration::from_secs(1)
                }
                p if p == LONG_B => {
                    ahead > LONG_B - Duration::from_secs(2)
                        && ahead < LONG_B + Duration::from_secs(1)
                }
                _ => false,
            };
            checked += 1;
            if !agrees {
                mismatched += 1;
                example.get_or_insert((period, ahead));
            }
        }
        work.cancel();
    }
    work.cancel_sync();
    assert!(checked > 0);
    assert_no_round_broke(
        "period() comes from the arm of deadline()",
        mismatched,
        checked,
        &format!("(first mismatch (period, deadline - now): {example:?})"),
    );
}

#[cfg(target_os = "linux")]
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

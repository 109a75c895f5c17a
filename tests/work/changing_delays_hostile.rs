//! Hostile use of the lock-free re-arms with changing delays: the placement of the live
//! entry, the claim on a `work()`'s period, the coarse clock of long delays and the
//! 22-bit run maxima. Each test is legal, safe user code that tries to break one
//! promise; tests wait for states and assert counts, never timings.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Rng, eventually};
use nicework::{Next, Scheduler, Work};

use super::changing_delays::recording;

const MS: Duration = Duration::from_millis(1);
const UNIT: Duration = Duration::from_micros(100);

/// Spins (then yields) until `cond` holds.
fn spin_until(mut cond: impl FnMut() -> bool) {
    let mut n = 0u32;
    while !cond() {
        n += 1;
        if n < 200 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// The state-word ABA on the lock-free arm's "the period already is my delay" decision
/// (the loom model `period::a_state_word_that_comes_back_bit_for_bit`
/// finds it at one preemption): thread A re-arms with the period it reads, while the main
/// thread re-arms for 40 ms and then for a delay that brings the deadline (and the
/// epoch) back to the word A read. Each round checks, with the clock standing
/// still, that the deadline and the period come from the same arm.
#[test]
fn period_aba_the_state_word_comes_back_between_decision_and_cas() {
    let sched = Scheduler::manual();
    let (work, _ran) = recording(&sched, Next::Park);
    let work = Arc::new(work);
    let go = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let a = {
        let (work, go, done, stop) = (work.clone(), go.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(0x5EED);
            let mut round = 0;
            loop {
                spin_until(|| go.load(SeqCst) > round || stop.load(SeqCst));
                if stop.load(SeqCst) {
                    return;
                }
                round += 1;
                for _ in 0..rng.next() % 64 {
                    std::hint::spin_loop();
                }
                work.reschedule(192 * UNIT);
                done.store(round, SeqCst);
            }
        })
    };
    let rounds: u64 = if cfg!(debug_assertions) {
        20_000
    } else {
        100_000
    };
    let mut rng = Rng(0xABA);
    let mut violations = Vec::new();
    for round in 1..=rounds {
        // Deadlines on 1.6 ms granules, so the lowered one is served by the placement.
        work.reschedule(192 * UNIT);
        assert_eq!(sched.advance(96 * UNIT), 0, "round {round}: ran");
        let at = sched.now();
        go.store(round, SeqCst);
        for _ in 0..rng.next() % 32 {
            std::hint::spin_loop();
        }
        work.reschedule(400 * UNIT);
        work.reschedule(96 * UNIT);
        spin_until(|| done.load(SeqCst) == round);
        let deadline = work.deadline().expect("pending");
        let period = work.period();
        if deadline - at != period {
            violations.push((round, deadline - at, period));
        }
    }
    stop.store(true, SeqCst);
    a.join().unwrap();
    assert!(
        violations.is_empty(),
        "the deadline of one arm and the period of another in {} of {rounds} rounds \
         (round, deadline - now, period): {:?}",
        violations.len(),
        &violations[..violations.len().min(5)]
    );
}

/// A reference model on the manual clock: random re-arms (below and above the entry,
/// across the 3.5-minute placement reach, huge and zero), cancels, `schedule`,
/// `schedule_within` and advances that never step past the expected deadline, so a late
/// entry shows as a missing run at the deadline. The work must run exactly at its
/// deadline, never before, and `deadline - now == period()` after every arm.
#[test]
fn reference_model_below_above_and_across_the_reach() {
    for seed in 1..=12u64 {
        let sched = Scheduler::manual();
        let (work, ran) = recording(&sched, Next::Park);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
        let mut expected: Option<Instant> = None;
        let mut runs = 0;
        let reach = Duration::from_micros(209_715_200); // 2^17 granules of 1.6 ms
        for step in 0..3_000 {
            let now = sched.now();
            let delay = match rng.next() % 10 {
                0 => MS * (1 + (rng.next() % 5) as u32),
                1 => MS * (1 + (rng.next() % 400) as u32),
                2 => reach - MS * 200 + MS * (rng.next() % 400) as u32,
                3 => reach * 2 - MS * 200 + MS * (rng.next() % 400) as u32,
                4 => Duration::from_secs(3600) + MS * (rng.next() % 5000) as u32,
                5 => Duration::from_secs(2 + rng.next() % 4) + MS * (rng.next() % 1000) as u32,
                6 => MS * (rng.next() % 3) as u32 * 16 / 10 * 10,
                _ => {
                    // Just below or above the current deadline.
                    match expected {
                        Some(at) if at > now + 2 * MS => {
                            let d = at - now;
                            let j = MS * (rng.next() % 20) as u32;
                            if rng.next() % 2 == 0 && d > j + MS {
                                d - j
                            } else {
                                d + j
                            }
                        }
                        _ => MS * 7,
                    }
                }
            };
            // Whole milliseconds only (a whole tick of the default slack).
            let delay = Duration::from_millis(delay.as_millis() as u64);
            match rng.next() % 8 {
                0 => {
                    let was = expected.is_some();
                    assert_eq!(work.cancel(), was, "seed {seed} step {step}: cancel");
                    expected = None;
                }
                1 => {
                    let armed = work.schedule(delay);
                    assert_eq!(
                        armed,
                        expected.is_none(),
                        "seed {seed} step {step}: schedule"
                    );
                    if armed {
                        expected = Some(now + delay);
                        assert_eq!(work.period(), delay);
                    }
                }
                2 => {
                    let sooner = expected.is_none_or(|at| now + delay < at);
                    let moved = work.schedule_within(delay);
                    if delay > Duration::ZERO {
                        assert_eq!(moved, sooner, "seed {seed} step {step}: schedule_within");
                    }
                    if moved {
                        expected = Some(now + delay);
                    }
                }
                _ => {
                    let was = expected.is_some();
                    assert_eq!(work.reschedule(delay), was, "seed {seed} step {step}");
                    expected = Some(now + delay);
                    assert_eq!(work.period(), delay, "seed {seed} step {step}: period");
                    assert_eq!(
                        work.deadline(),
                        Some(now + delay),
                        "seed {seed} step {step}: deadline after reschedule({delay:?})"
                    );
                }
            }
            assert_eq!(
                work.deadline(),
                expected,
                "seed {seed} step {step}: deadline"
            );
            // Advance, never past the expected deadline.
            let mut by = match rng.next() % 4 {
                0 => MS,
                1 => MS * (rng.next() % 50) as u32,
                2 => Duration::from_secs(rng.next() % 300),
                _ => Duration::ZERO,
            };
            if let Some(at) = expected {
                by = by.min(at - now);
            }
            sched.advance(by);
            let after = sched.now();
            match expected {
                Some(at) if at <= after => {
                    runs += 1;
                    let ran = ran.lock().unwrap();
                    assert_eq!(ran.len(), runs, "seed {seed} step {step}: no run at {at:?}");
                    assert_eq!(
                        ran[runs - 1],
                        at,
                        "seed {seed} step {step}: not at the deadline"
                    );
                    expected = None;
                }
                _ => assert_eq!(
                    ran.lock().unwrap().len(),
                    runs,
                    "seed {seed} step {step}: ran early"
                ),
            }
        }
        let m = sched.metrics();
        assert!(
            m.timer_entries <= 2 * m.armed + 1100,
            "seed {seed}: {} entries for {} armed",
            m.timer_entries,
            m.armed
        );
    }
}

/// More than four links between two looks: each deadline below the last links an entry
/// (and claims an epoch), so stale entries of the same epoch (mod 4) pile up, some of them
/// earlier and some later than the live one; a deadline then lowered lock-free through
/// the placement must still run exactly then.
#[test]
fn epochs_wrap_with_stale_entries_of_the_same_epoch() {
    for lowering in 1..=9u32 {
        let sched = Scheduler::manual();
        let (work, ran) = recording(&sched, Next::Park);
        let start = sched.now();
        // Links at 500, 499, ... ms: each below the last, a new epoch each.
        for i in 0..lowering {
            work.reschedule(MS * (500 - i * 16));
        }
        let entry = 500 - (lowering - 1) * 16;
        // Raise far above (lock-free), then lower to just above the live entry (its
        // placement serves it), then to a mix.
        work.reschedule(MS * 900);
        work.reschedule(MS * (entry + 3));
        work.reschedule(MS * 700);
        work.reschedule(MS * (entry + 5));
        let due = start + MS * (entry + 5);
        assert_eq!(work.deadline(), Some(due));
        assert_eq!(work.period(), MS * (entry + 5));
        // Step through to the deadline: ms by ms near it.
        sched.advance(MS * (entry + 4));
        assert!(ran.lock().unwrap().is_empty(), "lowering {lowering}: early");
        sched.advance(MS);
        assert_eq!(
            *ran.lock().unwrap(),
            [due],
            "lowering {lowering}: late or lost"
        );
    }
}

/// The entry moves later (a new epoch) more than four times while the deadline jitters
/// above and below it; each time the lowered deadline must still be served in time.
#[test]
fn many_moves_later_with_jittered_lowering() {
    let sched = Scheduler::manual();
    let (work, ran) = recording(&sched, Next::Park);
    let mut rng = Rng(77);
    work.reschedule(MS * 10);
    for round in 0..2_000u32 {
        let now = sched.now();
        // Raise, so the worker moves the entry at its tick.
        work.reschedule(MS * (20 + (rng.next() % 30) as u32));
        sched.advance(MS * (1 + (rng.next() % 9) as u32));
        assert!(ran.lock().unwrap().is_empty(), "round {round}: ran");
        // Lower again, maybe below the moved entry.
        let now2 = sched.now();
        let d = MS * (12 + (rng.next() % 25) as u32);
        work.reschedule(d);
        let due = now2 + d;
        let _ = now;
        // Walk up to it in 1 ms steps (never past).
        while sched.now() + MS < due {
            let by = MS * (1 + (rng.next() % 3) as u32);
            let by = by.min(due - sched.now() - MS);
            sched.advance(by);
            assert!(ran.lock().unwrap().is_empty(), "round {round}: early");
            if rng.next() % 3 == 0 {
                break;
            }
        }
        if sched.now() + MS >= due {
            sched.advance(due - sched.now());
            assert_eq!(ran.lock().unwrap().as_slice(), [due], "round {round}: late");
            ran.lock().unwrap().clear();
            work.reschedule(MS * 10);
        }
    }
}

/// `every` and timeout works re-armed with delays that change at every call keep their
/// period, and a timeout never runs within idle of its latest touch.
#[test]
fn every_and_timeout_keep_their_period_under_changing_delays() {
    let sched = Scheduler::manual();
    let every_runs = Arc::new(Mutex::new(Vec::new()));
    let er = every_runs.clone();
    let every = sched.every(MS * 10, move |cx| {
        er.lock().unwrap().push(cx.scheduler().now());
        Next::Again
    });
    let timeout_runs = Arc::new(Mutex::new(Vec::new()));
    let tr = timeout_runs.clone();
    let timeout = sched.timeout(MS * 30, move |cx| {
        tr.lock().unwrap().push(cx.scheduler().now());
        Next::Park
    });
    let mut rng = Rng(4242);
    let mut last_touch = sched.now();
    for step in 0..5_000 {
        let d = MS * (1 + (rng.next() % 60) as u32);
        match rng.next() % 6 {
            0 => {
                every.reschedule(d);
            }
            1 => {
                timeout.reschedule(d);
            }
            2 => {
                timeout.touch();
                last_touch = sched.now();
            }
            3 => {
                every.cancel();
                every.schedule(d);
            }
            4 => {
                timeout.schedule_within(d);
            }
            _ => {}
        }
        assert_eq!(every.period(), MS * 10, "step {step}");
        assert_eq!(timeout.period(), MS * 30, "step {step}");
        let before = timeout_runs.lock().unwrap().len();
        sched.advance(MS * (rng.next() % 4) as u32);
        let runs = timeout_runs.lock().unwrap();
        for at in &runs[before..] {
            assert!(
                *at >= last_touch + MS * 30,
                "step {step}: a timeout ran within idle of its touch"
            );
        }
    }
    // `every`'s Again uses its 10 ms.
    every.reschedule(MS * 3);
    let now = sched.now();
    every_runs.lock().unwrap().clear();
    sched.advance(MS * 3);
    sched.advance(MS * 10);
    assert_eq!(*every_runs.lock().unwrap(), [now + MS * 3, now + MS * 13]);
}

/// Never early on the real clock with delays straddling the coarse-clock threshold
/// (3.2 s), the placement reach (3.5 min) and huge ones, re-armed with changing delays
/// from two threads: every deadline shown is at least `Instant::now()` before the call
/// plus the delay; and short ones actually run no earlier than that.
#[test]
fn never_early_across_the_coarse_threshold_and_the_reach() {
    let sched = Scheduler::new().unwrap();
    let works: Vec<Arc<Work>> = (0..4)
        .map(|_| Arc::new(sched.work(|_| Next::Park)))
        .collect();
    let violations = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let works = &works;
            let violations = &violations;
            s.spawn(move || {
                let mut rng = Rng(0xC0A5E + t);
                for _ in 0..20_000 {
                    let w = &works[(rng.next() % works.len() as u64) as usize];
                    let d = match rng.next() % 6 {
                        0 => Duration::from_millis(3_150 + rng.next() % 100),
                        1 => Duration::from_millis(209_600 + rng.next() % 300),
                        2 => Duration::from_secs(86_400 * (1 + rng.next() % 10_000)),
                        3 => {
                            Duration::from_secs(3600)
                                + Duration::from_nanos(rng.next() % 1_000_000_000)
                        }
                        4 => Duration::from_millis(3_199 + rng.next() % 3),
                        _ => Duration::from_secs(27 * 365 * 86_400 + rng.next() % 1_000_000),
                    };
                    let before = Instant::now();
                    w.reschedule(d);
                    if let (Some(at), Some(bound)) = (w.deadline(), before.checked_add(d)) {
                        // Another thread's later arm may move it later, never earlier
                        // than its own bound: only a deadline earlier than this arm's
                        // bound AND earlier than any arm's is a violation, so compare
                        // with the smallest delay in use (3.15 s).
                        if at < before + Duration::from_millis(3_150) {
                            violations.fetch_add(1, SeqCst);
                        }
                        let _ = bound;
                    }
                }
            });
        }
    });
    assert_eq!(
        violations.load(SeqCst),
        0,
        "a deadline earlier than now + delay"
    );
    // Single-threaded: exact bound per arm.
    let w = &works[0];
    let mut rng = Rng(99);
    for _ in 0..20_000 {
        let d = match rng.next() % 4 {
            0 => Duration::from_millis(3_100 + rng.next() % 300),
            1 => Duration::from_millis(209_000 + rng.next() % 2_000),
            2 => Duration::from_nanos(rng.next() % 5_000_000_000),
            _ => Duration::from_secs(rng.next() % 100_000),
        };
        let before = Instant::now();
        w.reschedule(d);
        if d > Duration::from_millis(50) {
            let at = w.deadline().expect("pending");
            assert!(
                at >= before + d,
                "deadline {:?} early for {d:?}",
                before + d - at
            );
        } else {
            w.cancel();
        }
    }
    // Short delays that run: never before their bound.
    let early = Arc::new(AtomicUsize::new(0));
    let bound = Arc::new(Mutex::new(None::<Instant>));
    let count = Arc::new(AtomicUsize::new(0));
    let (e, b, c) = (early.clone(), bound.clone(), count.clone());
    let runner = sched.work(move |_| {
        let now = Instant::now();
        if let Some(at) = *b.lock().unwrap() {
            if now < at {
                e.fetch_add(1, SeqCst);
            }
        }
        c.fetch_add(1, SeqCst);
        Next::Park
    });
    for i in 0..200u32 {
        let d = Duration::from_micros(100 + u64::from(i % 7) * 700);
        let before = Instant::now();
        *bound.lock().unwrap() = Some(before + d);
        runner.reschedule(d);
        assert!(
            eventually(|| count.load(SeqCst) > i as usize),
            "run {i} lost"
        );
    }
    assert_eq!(early.load(SeqCst), 0, "ran before now + delay");
}

/// Jittered re-arms and cancels from two threads on many works (real scheduler, deadlines
/// far enough never to run): the timer structure stays within about twice the armed works
/// plus the sweep floor.
#[test]
fn timer_entries_stay_bounded_under_jittered_rearms_and_cancels() {
    let sched = Scheduler::new().unwrap();
    let works: Vec<Work> = (0..64).map(|_| sched.work(|_| Next::Park)).collect();
    let max_seen = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let works = &works;
            let sched = &sched;
            let max_seen = &max_seen;
            s.spawn(move || {
                let mut rng = Rng(0xB0B + t);
                for i in 0..100_000u32 {
                    let w = &works[(rng.next() % 64) as usize];
                    let base = if rng.next() % 2 == 0 { 60 } else { 300 };
                    let d = Duration::from_secs(base) + Duration::from_millis(rng.next() % 5_000);
                    match rng.next() % 5 {
                        0 => {
                            w.cancel();
                        }
                        1 => {
                            w.schedule_within(d);
                        }
                        _ => {
                            w.reschedule(d);
                        }
                    }
                    if i % 1000 == 0 {
                        let m = sched.metrics();
                        let over = m.timer_entries.saturating_sub(2 * m.armed);
                        max_seen.fetch_max(over, SeqCst);
                    }
                }
            });
        }
    });
    let m = sched.metrics();
    assert!(
        m.timer_entries <= 2 * m.armed + 2 * 1024 + 2 * 64
            && max_seen.load(SeqCst) <= 2 * 1024 + 2 * 64,
        "{} entries for {} armed (worst excess {})",
        m.timer_entries,
        m.armed,
        max_seen.load(SeqCst)
    );
}

/// `busy_max`/`lateness_max` never exceed the true values, are within one part in
/// 32,768 of them, and `parks <= runs`.
#[test]
fn run_maxima_never_exceed_the_true_values() {
    let sched = Scheduler::new().unwrap();
    let max_late = Arc::new(AtomicU64::new(0));
    let min_busy = Arc::new(AtomicU64::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let (ml, mb, r) = (max_late.clone(), min_busy.clone(), runs.clone());
    let work = sched.work(move |cx| {
        let started = Instant::now();
        ml.fetch_max(cx.lateness().as_nanos() as u64, SeqCst);
        let n = r.fetch_add(1, SeqCst);
        // Busy for a while (a lower bound on the run's busy time).
        let spin = Duration::from_micros(50 + (n as u64 % 7) * 300);
        while started.elapsed() < spin {}
        mb.fetch_max(started.elapsed().as_nanos() as u64, SeqCst);
        if n % 3 == 0 {
            Next::Park
        } else {
            Next::After(Duration::from_micros(300))
        }
    });
    let mut rng = Rng(5);
    for i in 0..60 {
        work.reschedule(Duration::from_micros(rng.next() % 2_000));
        let before = runs.load(SeqCst);
        assert!(eventually(|| runs.load(SeqCst) > before), "run {i} lost");
        let s = work.stats();
        assert!(s.parks <= s.runs);
        assert!(s.busy_max <= s.busy_total, "{s:?}");
    }
    assert!(eventually(|| !work.is_running()));
    work.cancel_sync();
    let s = work.stats();
    let true_late = Duration::from_nanos(max_late.load(SeqCst));
    assert!(
        s.lateness_max <= true_late,
        "{:?} > {:?}",
        s.lateness_max,
        true_late
    );
    assert!(
        true_late.as_nanos() - s.lateness_max.as_nanos() <= true_late.as_nanos() >> 15,
        "{:?} vs {:?}",
        s.lateness_max,
        true_late
    );
    assert!(
        s.busy_max >= Duration::from_nanos(min_busy.load(SeqCst)) / 2,
        "{s:?}"
    );
    assert!(s.busy_max <= s.busy_total);
    assert!(s.parks <= s.runs);
}

/// `fork()` while other threads storm a `work()` with changing delays (so an arm may be
/// between taking the claim on the period and releasing it when the child is made): in the child,
/// `period()`, every arm, `cancel` and the drop of the handle return (the child exits 0);
/// a hang shows as a child that never exits.
#[cfg(unix)]
#[test]
fn fork_during_a_storm_of_period_changes() {
    let sched = Scheduler::new().unwrap();
    let work = Arc::new(sched.work(|_| Next::Park));
    work.reschedule(Duration::from_secs(100));
    let stop = Arc::new(AtomicBool::new(false));
    let stormers: Vec<_> = (0..2u64)
        .map(|t| {
            let (work, stop) = (work.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0xF0 + t);
                while !stop.load(SeqCst) {
                    work.reschedule(
                        Duration::from_secs(100) + Duration::from_nanos(rng.next() % 1_000_000),
                    );
                }
            })
        })
        .collect();
    for i in 0..40 {
        // SAFETY: the child only calls nicework and `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let p = work.period();
            let ok = p >= Duration::from_secs(100)
                && !work.reschedule(Duration::from_secs(5))
                && !work.schedule(Duration::from_secs(7));
            work.cancel();
            let _ = work.period();
            let _ = work.deadline();
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 3 }) };
        }
        let mut status = 0;
        let exited = eventually(|| {
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == pid }
        });
        if !exited {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            unsafe { libc::waitpid(pid, &mut status, 0) };
            panic!("fork {i}: the child hung");
        }
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "fork {i}: status {status}"
        );
    }
    stop.store(true, SeqCst);
    for s in stormers {
        s.join().unwrap();
    }
}

/// Shutdown (the last `Scheduler` dropped) during a storm of changing re-arms, with a
/// callback that returns `Again` (reading the period) and one that panics: every thread
/// finishes, the works are inert after, and each closure is freed exactly once.
#[test]
fn shutdown_during_a_storm_of_changing_rearms() {
    for round in 0..20 {
        let sched = Scheduler::new().unwrap();
        let (flag_a, freed_a) = common::drop_flag();
        let (flag_b, freed_b) = common::drop_flag();
        let again = Arc::new(sched.work(move |cx| {
            let _keep = &flag_a;
            let _ = cx.period();
            Next::Again
        }));
        let panicky = Arc::new(sched.work(move |cx| {
            let _keep = &flag_b;
            if cx.runs() % 5 == 0 {
                panic!("a panicking callback");
            }
            Next::Again
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let stormers: Vec<_> = (0..3u64)
            .map(|t| {
                let (a, p, stop) = (again.clone(), panicky.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(round * 7 + t + 1);
                    while !stop.load(SeqCst) {
                        let d = Duration::from_micros(rng.next() % 3_000);
                        match rng.next() % 6 {
                            0 => {
                                a.cancel();
                            }
                            1 => {
                                let _ = a.period();
                            }
                            2 => {
                                p.reschedule(d);
                            }
                            3 => {
                                a.disable();
                                a.reschedule(d);
                                a.enable();
                            }
                            _ => {
                                a.reschedule(d);
                            }
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(5));
        drop(sched);
        std::thread::sleep(Duration::from_millis(2));
        stop.store(true, SeqCst);
        for s in stormers {
            s.join().unwrap();
        }
        assert!(
            !again.reschedule(MS) && !again.is_pending(),
            "round {round}: armed after shutdown"
        );
        drop(Arc::try_unwrap(again).unwrap_or_else(|_| panic!("sole handle")));
        drop(Arc::try_unwrap(panicky).unwrap_or_else(|_| panic!("sole handle")));
        assert!(
            freed_a.load(SeqCst) && freed_b.load(SeqCst),
            "round {round}: a closure not freed"
        );
    }
}

/// `cancel_sync` while other threads re-arm with changing delays and the callback returns
/// `Again` (reading `Ctx::period`): it returns (no hang in the period waits), no run is in
/// progress at its return unless a re-arm after it started one, and the last handle's drop
/// frees the closure exactly once.
#[test]
fn cancel_sync_against_changing_rearms() {
    let sched = Scheduler::new().unwrap();
    for round in 0..50u64 {
        let (flag, freed) = common::drop_flag();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let work = Arc::new(sched.work(move |cx| {
            let _keep = &flag;
            r.fetch_add(1, SeqCst);
            let _ = cx.period();
            Next::Again
        }));
        work.reschedule(Duration::from_micros(100));
        let stop = Arc::new(AtomicBool::new(false));
        let stormers: Vec<_> = (0..2u64)
            .map(|t| {
                let (w, stop) = (work.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(round * 3 + t + 11);
                    while !stop.load(SeqCst) {
                        w.reschedule(Duration::from_micros(50 + rng.next() % 900));
                        if rng.next() % 8 == 0 {
                            let _ = w.period();
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(3));
        for _ in 0..20 {
            work.cancel_sync();
        }
        stop.store(true, SeqCst);
        for s in stormers {
            s.join().unwrap();
        }
        work.cancel_sync();
        assert!(!work.is_running() && !work.is_pending(), "round {round}");
        let seen = runs.load(SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(
            runs.load(SeqCst),
            seen,
            "round {round}: ran after the last cancel_sync"
        );
        drop(Arc::try_unwrap(work).unwrap_or_else(|_| panic!("sole handle")));
        assert!(freed.load(SeqCst), "round {round}: closure not freed");
    }
}

/// A `work()`'s period and deadline from the same arm under storms of two threads with
/// changing delays and a third that advances the manual clock (runs complete with
/// `Again` amid the arms); after each storm (clock standing still), `deadline - now ==
/// period()` and `Ctx::period` only ever shows delays some arm used.
#[test]
fn period_rule_storm_with_again_and_schedule_within() {
    const DELAYS_MS: [u64; 6] = [2, 3, 5, 8, 13, 21];
    let sched = Scheduler::manual();
    let bad = Arc::new(AtomicUsize::new(0));
    let b = bad.clone();
    let work = Arc::new(sched.work(move |cx| {
        let p = cx.period();
        if !DELAYS_MS.iter().any(|&d| Duration::from_millis(d) == p) {
            b.fetch_add(1, SeqCst);
        }
        Next::Again
    }));
    work.reschedule(MS * 2);
    for round in 0..300u64 {
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let (w, stop) = (work.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(round * 5 + t + 3);
                    // Arms after `stop` read the clock after the last advance.
                    let mut after_stop = 0;
                    while after_stop < 20 {
                        if stop.load(SeqCst) {
                            after_stop += 1;
                        }
                        let d = MS * DELAYS_MS[(rng.next() % 6) as usize] as u32;
                        match rng.next() % 4 {
                            0 => {
                                w.schedule(d);
                            }
                            1 => {
                                w.cancel();
                                w.reschedule(d);
                            }
                            _ => {
                                w.reschedule(d);
                            }
                        }
                    }
                })
            })
            .collect();
        for _ in 0..20 {
            sched.advance(MS);
        }
        stop.store(true, SeqCst);
        for t in threads {
            t.join().unwrap();
        }
        let now = sched.now();
        if let Some(at) = work.deadline() {
            let period = work.period();
            assert!(at >= now, "round {round}: pending in the past");
            assert_eq!(
                at - now,
                period,
                "round {round}: deadline and period of different arms"
            );
        } else {
            work.reschedule(MS * 2);
        }
    }
    assert_eq!(
        bad.load(SeqCst),
        0,
        "Ctx::period showed a delay no arm used"
    );
}

//! `schedule_within`, `deadline`, `Next::At` and touches during runs (which never override
//! the callback's decision) under random and racing use.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::eventually;
use nicework::{Next, Scheduler, Work};

const MS: Duration = Duration::from_millis(1);
const UNIT: Duration = Duration::from_micros(100);

/// A tiny deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// === schedule_within / deadline against a model, manual clock ===

#[test]
fn schedule_within_and_deadline_match_a_model_under_random_operations() {
    for seed in 0..40u64 {
        let sched = Scheduler::manual();
        let start = sched.now();
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let work = sched.work(move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            Next::Park
        });
        let mut rng = Lcg(seed * 7919 + 1);
        // Model, in 100 µs units since the start.
        let mut now: u64 = 0;
        let mut due: Option<u64> = None;
        let mut model_runs = 0u32;
        for step in 0..400 {
            // Zero delays are left out: see attack2_manual_min for what they do after a
            // cancel.
            let d = 1 + rng.below(50);
            let delay = UNIT * d as u32;
            let what = rng.below(6);
            let mut ctx =
                format!("seed {seed} step {step} op {what} delay {d} now {now} due {due:?}");
            match what {
                0 => {
                    let expect = due.is_none_or(|t| t > now + d);
                    assert_eq!(work.schedule_within(delay), expect, "{ctx}");
                    if expect {
                        due = Some(now + d);
                    }
                }
                1 => {
                    let expect = due.is_some();
                    assert_eq!(work.reschedule(delay), expect, "{ctx}");
                    due = Some(now + d);
                }
                2 => {
                    let expect = due.is_none();
                    assert_eq!(work.schedule(delay), expect, "{ctx}");
                    if expect {
                        due = Some(now + d);
                    }
                }
                3 => {
                    assert_eq!(work.cancel(), due.is_some(), "{ctx}");
                    due = None;
                }
                _ => {
                    let by = rng.below(30);
                    let ran = sched.advance(UNIT * by as u32);
                    ctx += &format!(" advanced {by}: {ran} runs");
                    if let Some(t) = due {
                        // Never early; at the latest once the wheel's tick (the slack, 10
                        // units) after it is reached (see attack2_manual_min); in between
                        // either, depending on where its timer entry sits.
                        let must = t.div_ceil(10) * 10 <= now + by;
                        let may = t <= now + by;
                        assert!(ran <= 1, "{ctx}");
                        assert!(may || ran == 0, "{ctx}: ran early");
                        assert!(!must || ran == 1, "{ctx}: not run by its tick");
                        if ran == 1 {
                            due = None;
                            model_runs += 1;
                        }
                    } else {
                        assert_eq!(ran, 0, "{ctx}: ran while not armed");
                    }
                    now += by;
                }
            }
            assert_eq!(
                work.deadline(),
                due.map(|t| start + UNIT * t as u32),
                "{ctx}: deadline()"
            );
            assert_eq!(work.is_pending(), due.is_some(), "{ctx}");
            assert_eq!(runs.load(Ordering::SeqCst), model_runs, "{ctx}: runs");
        }
    }
}

#[test]
fn deadline_rounds_up_to_100_us_and_is_never_earlier_than_asked() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let work = sched.work(|_| Next::Park);
    for ns in [1u64, 99_999, 100_000, 100_001, 1_234_567, 999_999_999] {
        work.reschedule(Duration::from_nanos(ns));
        let at = work.deadline().unwrap();
        assert!(at >= start + Duration::from_nanos(ns), "{ns} ns: early");
        assert!(
            at < start + Duration::from_nanos(ns) + UNIT,
            "{ns} ns: more than a unit late"
        );
        work.cancel();
        assert!(work.schedule_within(Duration::from_nanos(ns)));
        assert_eq!(
            work.deadline(),
            Some(at),
            "{ns} ns: schedule_within differs"
        );
        work.cancel();
    }
}

#[test]
fn deadline_is_none_while_running_after_stop_after_cancel_and_when_poisoned() {
    let sched = Scheduler::manual();
    let seen: Arc<Mutex<Vec<Option<Instant>>>> = Arc::default();
    let slot: Arc<Mutex<Option<Arc<Work>>>> = Arc::default();
    let (s, v) = (slot.clone(), seen.clone());
    let work = Arc::new(sched.work(move |cx| {
        let me = s.lock().unwrap().clone().unwrap();
        v.lock().unwrap().push(me.deadline());
        match cx.runs() {
            1 => Next::Stop,
            2 => {
                // Armed during the run: the deadline shows, the callback's Again is
                // ignored (already pending).
                assert!(me.schedule_within(5 * MS));
                v.lock().unwrap().push(me.deadline());
                Next::Again
            }
            _ => panic!("third run"),
        }
    }));
    *slot.lock().unwrap() = Some(work.clone());
    let start = sched.now();
    work.schedule(MS);
    sched.advance(MS);
    assert_eq!(work.deadline(), None, "after Stop");
    work.touch();
    assert_eq!(work.deadline(), None, "touch after Stop does not arm");
    work.schedule(2 * MS);
    assert_eq!(work.deadline(), Some(start + 3 * MS));
    sched.advance(2 * MS);
    assert_eq!(
        work.deadline(),
        Some(start + 8 * MS),
        "schedule_within in the run stands"
    );
    assert!(work.cancel());
    assert_eq!(work.deadline(), None, "after cancel");
    work.schedule(MS);
    sched.advance(MS);
    assert!(work.is_poisoned());
    assert_eq!(work.deadline(), None, "poisoned");
    assert!(!work.schedule_within(MS), "poisoned works cannot be armed");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![None, None, Some(start + 8 * MS), None]
    );
    slot.lock().unwrap().take();
}

#[test]
fn deadline_of_a_timeout_touched_many_times_follows_the_last_touch() {
    let sched = Scheduler::manual();
    let start = sched.now();
    let idle = 10 * MS;
    let reaper = sched.timeout(idle, |_| Next::Park);
    assert_eq!(reaper.deadline(), Some(start + idle));
    for i in 1..=50u32 {
        sched.advance(UNIT * 3);
        reaper.touch();
        assert_eq!(
            reaper.deadline(),
            Some(start + UNIT * (3 * i) + idle),
            "touch {i}"
        );
    }
    assert_eq!(reaper.stats().runs, 0);
    let due = reaper.deadline().unwrap();
    sched.advance(idle - UNIT);
    assert_eq!(reaper.stats().runs, 0);
    assert_eq!(
        reaper.deadline(),
        Some(due),
        "the re-arm for the rest keeps the deadline"
    );
    sched.advance(UNIT);
    assert_eq!(reaper.stats().runs, 1);
    assert_eq!(reaper.deadline(), None);
}

/// On a timeout work, `schedule_within`'s bool must agree with what `deadline()` shows:
/// true iff the (effective) deadline moved earlier or the work was armed.
#[test]
fn schedule_within_on_a_touched_timeout_reports_what_deadline_shows() {
    let sched = Scheduler::manual();
    let idle = 10 * MS;
    let reaper = sched.timeout(idle, |_| Next::Park);
    sched.advance(5 * MS);
    reaper.touch(); // effective due: 15 ms; own deadline field: 10 ms
    let before = reaper.deadline();
    let moved = reaper.schedule_within(3 * MS); // 8 ms < 10 ms, but the touch holds to 15
    let after = reaper.deadline();
    assert_eq!(
        moved,
        after < before,
        "schedule_within returned {moved} but deadline() went from {before:?} to {after:?}"
    );
}

// === schedule_within on a real clock: never late to decide, never early to run ===

/// A second `schedule_within` asking for a sooner time than the pending deadline must move
/// it (the kernel's `timer_reduce`), also for long delays where a coarse clock may be read.
#[test]
fn schedule_within_a_bit_sooner_than_a_long_pending_deadline_moves_it() {
    let sched = Scheduler::new().unwrap();
    let work = sched.work(|_| Next::Park);
    for (d, sooner_by) in [
        (Duration::from_secs(10), 5 * MS),
        (Duration::from_secs(10), 2 * MS),
        (Duration::from_secs(10), MS),
        (Duration::from_secs(60), 3 * MS),
        (Duration::from_secs(3600), 10 * MS),
    ] {
        work.cancel();
        assert!(work.schedule_within(d));
        let first = work.deadline().unwrap();
        let asked = d - sooner_by;
        let moved = work.schedule_within(asked);
        let after_call = Instant::now();
        let now_deadline = work.deadline().unwrap();
        assert!(
            now_deadline <= after_call + asked + UNIT,
            "{d:?} then {asked:?}: returned {moved}, the deadline stays {:?} past now + delay",
            now_deadline.saturating_duration_since(after_call + asked)
        );
        assert!(moved, "moved earlier, so it must say so (first {first:?})");
    }
}

#[test]
fn schedule_within_racing_reschedule_and_cancel_never_runs_early() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    // (start of the call + its delay, end of the call) for every arming call.
    let calls: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    // (start, end) of every run.
    let runs: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let running = Arc::new(AtomicBool::new(false));
    let overlap = Arc::new(AtomicBool::new(false));
    let (rr, rn, ov) = (runs.clone(), running.clone(), overlap.clone());
    let work = Arc::new(sched.work(move |_| {
        let s = Instant::now();
        if rn.swap(true, Ordering::SeqCst) {
            ov.store(true, Ordering::SeqCst);
        }
        std::hint::spin_loop();
        rn.store(false, Ordering::SeqCst);
        let e = Instant::now();
        rr.lock().unwrap().push((s, e));
        Next::Park
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for t in 0..4u64 {
        let (w, c, st) = (work.clone(), calls.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = Lcg(t + 11);
            while !st.load(Ordering::SeqCst) {
                let delay = Duration::from_micros(rng.below(4000));
                let begin = Instant::now();
                match (t, rng.below(4)) {
                    (0, 0) => {
                        w.cancel();
                        continue;
                    }
                    (_, 1) => {
                        w.reschedule(delay);
                    }
                    _ => {
                        w.schedule_within(delay);
                    }
                }
                c.lock().unwrap().push((begin + delay, Instant::now()));
                std::thread::sleep(Duration::from_micros(rng.below(700)));
            }
        }));
    }
    // Until enough runs to judge (under load they come slowly).
    assert!(eventually(|| runs.lock().unwrap().len() >= 40));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    work.cancel_sync();
    assert!(
        !overlap.load(Ordering::SeqCst),
        "ran on two threads at once"
    );
    let calls = calls.lock().unwrap().clone();
    let runs = runs.lock().unwrap().clone();
    // Run k was armed by a call that ended after run k-2 ended (a call that ended before
    // that was consumed by run k-1 at the latest, since run k-1 was taken after run k-2
    // completed); so it is due no earlier than the earliest such call's start + delay.
    for k in 0..runs.len() {
        let after = if k >= 2 { Some(runs[k - 2].1) } else { None };
        let bound = calls
            .iter()
            .filter(|(_, end)| after.is_none_or(|a| *end > a))
            .map(|(due, _)| *due)
            .min()
            .expect("a run without an arming call");
        assert!(
            runs[k].0 >= bound,
            "run {k} started {:?} before the earliest deadline any live call asked for",
            bound - runs[k].0
        );
    }
}

// === Next::At ===

#[test]
fn at_before_the_schedulers_creation_is_due_after_the_slack() {
    let long_ago = Instant::now();
    std::thread::sleep(2 * MS);
    let sched = Scheduler::manual();
    let start = sched.now();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let work = sched.work(move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Next::At(long_ago)
    });
    work.schedule(Duration::ZERO);
    assert_eq!(sched.advance(Duration::ZERO), 1);
    assert_eq!(
        work.deadline(),
        Some(start + MS),
        "past instants are due at now + slack"
    );
    assert_eq!(sched.advance(MS - UNIT), 0, "never early");
    assert_eq!(sched.advance(UNIT), 1);
    assert_eq!(
        sched.advance(100 * MS),
        100,
        "one run per slack: no burst, no spin"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 102);
}

#[test]
fn at_just_inside_and_outside_the_slack_with_sub_unit_instants() {
    let sched = Scheduler::manual();
    assert_eq!(sched.slack(), MS);
    let start = sched.now();
    let offsets: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(vec![
        Duration::from_nanos(1),
        MS - Duration::from_nanos(1),
        MS,
        MS + Duration::from_nanos(1),
        MS + UNIT - Duration::from_nanos(1),
        3 * MS + Duration::from_nanos(50_001),
    ]));
    let o = offsets.clone();
    let asked: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let a = asked.clone();
    let work = sched.work(move |cx| {
        let now = cx.scheduler().now();
        match o.lock().unwrap().pop() {
            Some(off) => {
                a.lock().unwrap().push((now, now + off));
                Next::At(now + off)
            }
            None => Next::Stop,
        }
    });
    work.schedule(Duration::ZERO);
    sched.advance(Duration::ZERO);
    for _ in 0..6 {
        let (now, at) = *asked.lock().unwrap().last().unwrap();
        let due = work.deadline().unwrap();
        let floor = at.max(now + MS);
        assert!(due >= floor, "due {:?} before {:?}", due - now, floor - now);
        assert!(
            due < floor + UNIT,
            "due {:?}, more than a unit after {:?}",
            due - now,
            floor - now
        );
        // Never early: one unit before, nothing runs.
        let before = due - sched.now() - UNIT;
        assert_eq!(
            sched.advance(before),
            0,
            "asked {:?}, due {:?}",
            at - now,
            due - now
        );
        // The manual wheel ticks at the slack: give it one (see attack2_manual_min).
        assert_eq!(
            sched.advance(MS),
            1,
            "asked {:?}, due {:?}",
            at - now,
            due - now
        );
    }
    let _ = start;
}

#[test]
fn at_far_in_the_future_never_runs_reports_a_deadline_and_can_be_brought_forward() {
    let sched = Scheduler::manual();
    let far = Instant::now() + Duration::from_secs(1 << 40);
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let work = sched.work(move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Next::At(far)
    });
    work.schedule(Duration::ZERO);
    assert_eq!(sched.advance(Duration::ZERO), 1);
    assert!(work.is_pending());
    let d = work.deadline().expect("pending");
    assert!(d > sched.now() + Duration::from_secs(3600 * 24 * 365));
    assert_eq!(sched.advance(Duration::from_secs(3600 * 24 * 365 * 20)), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // schedule_within brings it forward even from the saturated deadline.
    assert!(work.schedule_within(MS));
    assert_eq!(work.deadline(), Some(sched.now() + MS));
    assert_eq!(sched.advance(MS), 1);
    assert_eq!(sched.advance(Duration::MAX), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Touch, schedule_within and reschedule during a run that returns `At`.
#[test]
fn at_combined_with_touch_schedule_within_and_reschedule_during_the_run() {
    #[derive(Clone, Copy, Debug)]
    enum During {
        Touch,
        Within(Duration),
        Reschedule(Duration),
    }
    for during in [
        During::Touch,
        During::Within(2 * MS),
        During::Within(50 * MS),
        During::Reschedule(50 * MS),
        During::Reschedule(2 * MS),
    ] {
        let sched = Scheduler::manual();
        let start = sched.now();
        let slot: Arc<Mutex<Option<Arc<Work>>>> = Arc::default();
        let s = slot.clone();
        let work = Arc::new(sched.work(move |cx| {
            let me = s.lock().unwrap().clone().unwrap();
            match during {
                During::Touch => me.touch(),
                During::Within(d) => {
                    me.schedule_within(d);
                }
                During::Reschedule(d) => {
                    me.reschedule(d);
                }
            }
            Next::At(cx.scheduler().now() + 20 * MS)
        }));
        *slot.lock().unwrap() = Some(work.clone());
        work.schedule(MS); // period 1 ms: a touch that overrode At would show
        sched.advance(MS);
        let expect = match during {
            During::Touch => start + 21 * MS,
            // Armed during the run: that instance stands, the At is dropped.
            During::Within(d) | During::Reschedule(d) => start + MS + d,
        };
        assert_eq!(work.deadline(), Some(expect), "{during:?}");
        slot.lock().unwrap().take();
    }
}

// === on real threads: a touch never brings a run forward ===

fn touches_never_bring_a_run_forward(next_for: fn(u64, Instant) -> (Next, Instant)) {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    // (start, earliest allowed start of the next run) per run.
    let log: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let l = log.clone();
    let work = Arc::new(sched.work(move |cx| {
        let started = Instant::now();
        for _ in 0..200 {
            std::hint::spin_loop();
        }
        let end = Instant::now();
        let (next, earliest) = next_for(cx.runs(), end);
        l.lock().unwrap().push((started, earliest));
        next
    }));
    work.schedule(Duration::from_micros(200)); // period 200 µs: a touch arms for far sooner
    let stop = Arc::new(AtomicBool::new(false));
    let touches = Arc::new(AtomicUsize::new(0));
    let mut touchers = Vec::new();
    for _ in 0..3 {
        let (w, st, n) = (work.clone(), stop.clone(), touches.clone());
        touchers.push(std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                w.touch();
                n.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    assert!(eventually(|| log.lock().unwrap().len() >= 60));
    stop.store(true, Ordering::SeqCst);
    for t in touchers {
        t.join().unwrap();
    }
    work.cancel_sync();
    let log = log.lock().unwrap().clone();
    for k in 1..log.len() {
        assert!(
            log[k].0 >= log[k - 1].1,
            "run {} started {:?} before the previous run allowed",
            k + 1,
            log[k - 1].1 - log[k].0
        );
    }
}

#[test]
fn touches_racing_runs_that_return_after_never_bring_the_next_run_forward() {
    touches_never_bring_a_run_forward(|runs, end| {
        let d = Duration::from_micros(1000 + (runs % 5) * 700);
        (Next::After(d), end + d)
    });
}

#[test]
fn touches_racing_runs_that_return_at_never_bring_the_next_run_forward() {
    touches_never_bring_a_run_forward(|runs, end| {
        let at = end + Duration::from_micros(1500 + (runs % 3) * 1000);
        (Next::At(at), at)
    });
}

#[test]
fn touches_racing_runs_that_return_again_never_bring_the_next_run_forward() {
    // Period 200 µs, rounded up to the 1 ms slack.
    touches_never_bring_a_run_forward(|_, end| (Next::Again, end + MS));
}

/// Park racing touches from other threads: never lost, also when the run alternates
/// between Park and After. The work ends armed whenever a touch came after the run's
/// decision was read, so with touchers running it keeps running.
#[test]
fn park_racing_touches_on_a_real_scheduler_is_never_lost() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let work = Arc::new(sched.work(move |cx| {
        r.fetch_add(1, Ordering::SeqCst);
        if cx.runs() % 2 == 0 {
            Next::After(UNIT)
        } else {
            Next::Park
        }
    }));
    work.schedule(Duration::ZERO);
    let stop = Arc::new(AtomicBool::new(false));
    let toucher = {
        let (w, st) = (work.clone(), stop.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                w.touch();
                std::thread::sleep(Duration::from_micros(50));
            }
        })
    };
    assert!(eventually(|| runs.load(Ordering::SeqCst) >= 200));
    stop.store(true, Ordering::SeqCst);
    toucher.join().unwrap();
    // The last touch is never lost: the work is pending, running, or ran after it.
    let at_stop = runs.load(Ordering::SeqCst);
    assert!(
        eventually(|| !work.is_pending() && !work.is_running()),
        "never settles"
    );
    assert!(runs.load(Ordering::SeqCst) >= at_stop);
    work.cancel_sync();
}

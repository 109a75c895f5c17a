//! Leeways under hostile use: random arms, leeways (zero to `Duration::MAX`, narrowed
//! and widened on pending, cancelled and running works), cancels and runs against a
//! hosted plan that must never pass a pending window; a run that blocks until a later
//! work has run, with two workers; the manual scheduler's deadline order; wakeup counts
//! of lone and overlapping works; tick-stamped timeouts beside busy neighbours; leeways
//! set from inside the callback and after shutdown.
//!
//! Nothing asserts a timing: each check compares an instant with the deadline or the
//! window end it must not pass, or counts.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler};

use crate::common::*;

/// W1 (which ran quickly before) blocks until W2, armed 30 ms after it, has run.
/// With 2 workers the second worker must pick W2 up.
#[test]
fn blocking_run_waits_for_a_later_work_with_two_workers() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let flag = Arc::new((Mutex::new(0u64), Condvar::new()));
    let results: Arc<Mutex<Vec<bool>>> = Arc::default();
    let w1 = {
        let flag = flag.clone();
        let results = results.clone();
        sched.every(Duration::from_millis(100), move |cx| {
            if cx.runs() >= 3 {
                let (lock, cv) = &*flag;
                let seen = *lock.lock().unwrap();
                let guard = cv
                    .wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(3), |n| {
                        *n == seen
                    })
                    .unwrap();
                results.lock().unwrap().push(!guard.1.timed_out());
                if results.lock().unwrap().len() >= 3 {
                    return Next::Stop;
                }
            }
            Next::Again
        })
    };
    std::thread::sleep(Duration::from_millis(30));
    let w2 = {
        let flag = flag.clone();
        sched.every(Duration::from_millis(100), move |_| {
            let (lock, cv) = &*flag;
            *lock.lock().unwrap() += 1;
            cv.notify_all();
            Next::Again
        })
    };
    assert!(eventually(|| results.lock().unwrap().len() >= 3));
    let results = results.lock().unwrap().clone();
    drop((w1, w2));
    assert!(
        results.iter().all(|&r| r),
        "W2 was held up behind a blocked W1: {results:?}"
    );
}

fn leeway_pick(rng: &mut Rng) -> Duration {
    const L: [Duration; 10] = [
        Duration::ZERO,
        Duration::from_micros(50),
        Duration::from_micros(999),
        Duration::from_millis(1),
        Duration::from_micros(2_350),
        Duration::from_millis(40),
        Duration::from_secs(1),
        Duration::from_secs(3600),
        Duration::from_secs(1 << 40),
        Duration::MAX,
    ];
    L[(rng.next() % L.len() as u64) as usize]
}

fn delay_pick(rng: &mut Rng) -> Duration {
    match rng.next() % 6 {
        0 => Duration::ZERO,
        1 => Duration::from_micros(rng.next() % 3000),
        2 => Duration::from_millis(rng.next() % 100),
        3 => Duration::from_millis(rng.next() % 10_000),
        4 => Duration::from_secs(rng.next() % 100_000),
        _ => Duration::from_micros(100 + rng.next() % 5_000_000),
    }
}

/// On a hosted scheduler, `next_deadline()` is never past any pending work's
/// `deadline + max(leeway, slack)`, whatever sequence of arms, leeways, cancels and runs.
#[test]
fn hosted_next_deadline_within_every_window_random() {
    let seeds = rounds(8) as u64;
    let only: Option<u64> = std::env::var("ATTACK_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    for seed in 1..=seeds {
        if only.is_some_and(|o| o != seed) {
            continue;
        }
        hosted_round(seed);
    }
}

struct W {
    work: nicework::Work,
    leeway: Duration,
    id: usize,
    log: Vec<String>,
}

fn hosted_round(seed: u64) {
    let slack = Duration::from_micros(100 * (1 + seed % 30));
    let (sched, driver) = Scheduler::builder().slack(slack).build_hosted().unwrap();
    let slack = sched_slack(slack);
    let t0 = Instant::now();
    let ms = |i: Option<Instant>| i.map(|i| i.saturating_duration_since(t0).as_secs_f64() * 1e3);
    let mut rng = Rng(0x1234_5678_9abc_def1 ^ (seed * 0x9E37_79B9));
    let mut works: Vec<W> = Vec::new();
    let mut next_id = 0;
    let ran = Arc::new(AtomicUsize::new(0));
    for step in 0..1500 {
        let op = rng.next() % 14;
        let what: String;
        let mut touched: Option<usize> = None;
        let mut narrowed = false;
        let mut new_work =
            |work: nicework::Work, leeway: Duration, kind: String, works: &mut Vec<W>| {
                next_id += 1;
                works.push(W {
                    work,
                    leeway,
                    id: next_id,
                    log: vec![format!(
                        "{:.3}ms: {kind}",
                        ms(Some(Instant::now())).unwrap()
                    )],
                });
                works.len() - 1
            };
        match op {
            0 | 1 if works.len() < 40 => {
                let l = leeway_pick(&mut rng);
                let p = delay_pick(&mut rng).max(Duration::from_micros(1));
                let ran = ran.clone();
                let yields = rng.next() % 3 == 0;
                let w = sched
                    .every(p, move |_| {
                        ran.fetch_add(1, Ordering::Relaxed);
                        if yields { Next::Yield } else { Next::Again }
                    })
                    .leeway(l);
                what = format!("every({p:?}).leeway({l:?}) yields={yields}");
                touched = Some(new_work(w, l, what.clone(), &mut works));
            }
            2 if works.len() < 40 => {
                let l = leeway_pick(&mut rng);
                let d = delay_pick(&mut rng);
                let w = sched.once(d, |_| {}).leeway(l);
                what = format!("once({d:?}).leeway({l:?})");
                touched = Some(new_work(w, l, what.clone(), &mut works));
            }
            3 if works.len() < 40 => {
                let l = leeway_pick(&mut rng);
                let d = delay_pick(&mut rng).max(Duration::from_micros(1));
                let w = sched.timeout(d, |_| Next::Park).leeway(l);
                what = format!("timeout({d:?}).leeway({l:?})");
                touched = Some(new_work(w, l, what.clone(), &mut works));
            }
            4 | 5 if !works.is_empty() => {
                let i = (rng.next() as usize) % works.len();
                let l = leeway_pick(&mut rng);
                let mut w = works.swap_remove(i);
                let old = w.leeway;
                w.work = w.work.leeway(l);
                w.leeway = l;
                narrowed = l.max(slack) < old.max(slack);
                what = format!("leeway({old:?} -> {l:?})");
                works.push(w);
                touched = Some(works.len() - 1);
            }
            6 if !works.is_empty() => {
                let i = (rng.next() as usize) % works.len();
                let d = delay_pick(&mut rng);
                let r = works[i].work.schedule(d);
                what = format!("schedule({d:?}) -> {r}");
                touched = Some(i);
            }
            7 if !works.is_empty() => {
                let i = (rng.next() as usize) % works.len();
                let d = delay_pick(&mut rng);
                let r = works[i].work.reschedule(d);
                what = format!("reschedule({d:?}) -> {r}");
                touched = Some(i);
            }
            8 if !works.is_empty() => {
                let i = (rng.next() as usize) % works.len();
                works[i].work.touch();
                what = "touch".into();
                touched = Some(i);
            }
            9 if !works.is_empty() => {
                let i = (rng.next() as usize) % works.len();
                let r = works[i].work.cancel();
                what = format!("cancel -> {r}");
                touched = Some(i);
            }
            10 if !works.is_empty() && rng.next() % 4 == 0 => {
                let i = (rng.next() as usize) % works.len();
                works.swap_remove(i);
                what = "drop".into();
            }
            11 => {
                if rng.next() % 8 == 0 {
                    std::thread::sleep(Duration::from_millis(rng.next() % 4));
                }
                let n = driver.run_due();
                what = format!("run_due -> {n}");
            }
            _ => {
                what = "nothing".into();
            }
        }
        let after = Instant::now();
        if let Some(i) = touched {
            let line = format!(
                "{:.3}ms step {step}: {what}; pending={} deadline={:?}ms next={:?}ms",
                ms(Some(after)).unwrap(),
                works[i].work.is_pending(),
                ms(works[i].work.deadline()),
                ms(driver.next_deadline())
            );
            works[i].log.push(line);
        }
        // Check.
        let next = driver.next_deadline();
        for w in &works {
            if !w.work.is_pending() {
                continue;
            }
            let Some(d) = w.work.deadline() else { continue };
            let Some(mut end) = d.checked_add(w.leeway.max(slack)) else {
                continue;
            };
            // An overdue window (the host is late, or it was narrowed after it closed)
            // can only be served now.
            end = end.max(after);
            let _ = narrowed;
            let ok = next.is_some_and(|n| n <= end);
            if !ok {
                panic!(
                    "seed {seed} slack {slack:?} step {step} after {what}: next_deadline {:?}ms past work {}'s window end {:?}ms (deadline {:?}ms, leeway {:?}); now {:?}ms; its log:\n{}",
                    ms(next),
                    w.id,
                    ms(Some(end)),
                    ms(Some(d)),
                    w.leeway,
                    ms(Some(Instant::now())),
                    w.log.join("\n")
                );
            }
        }
    }
}

fn sched_slack(asked: Duration) -> Duration {
    let units = asked.as_micros().div_ceil(100).max(1) as u32;
    Duration::from_micros(100) * units
}

/// A cancelled work keeps its live entry; narrowing its leeway then re-arming must not
/// keep the old, wide window.
#[test]
fn hosted_narrowing_a_cancelled_work_then_rearming() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let w = sched
        .every(Duration::from_secs(10), |_| Next::Again)
        .leeway(Duration::from_secs(3600));
    w.cancel();
    let w = w.leeway(Duration::ZERO);
    assert!(w.schedule(Duration::from_secs(10)));
    let d = w.deadline().unwrap();
    let next = driver.next_deadline().unwrap();
    assert!(
        next <= d + Duration::from_millis(1),
        "next_deadline {:?} after the deadline + slack",
        next - d
    );
}

#[test]
fn hosted_narrowing_a_cancelled_work_then_touching() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let w = sched
        .every(Duration::from_secs(10), |_| Next::Again)
        .leeway(Duration::from_secs(3600));
    w.cancel();
    let w = w.leeway(Duration::from_millis(5));
    w.touch();
    assert!(w.is_pending());
    let d = w.deadline().unwrap();
    let next = driver.next_deadline().unwrap();
    assert!(
        next <= d + Duration::from_millis(5),
        "next_deadline {:?} after the deadline",
        next - d
    );
}

/// The same on a threaded scheduler: the re-armed work must run about 50 ms later,
/// not an hour later. (Timing margin: 5 s.)
#[test]
fn threaded_narrowing_a_cancelled_work_then_rearming_runs_in_time() {
    let sched = Scheduler::builder().build().unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let w = {
        let ran = ran.clone();
        sched
            .every(Duration::from_millis(50), move |_| {
                ran.store(true, Ordering::SeqCst);
                Next::Park
            })
            .leeway(Duration::from_secs(3600))
    };
    w.cancel();
    let w = w.leeway(Duration::ZERO);
    let start = Instant::now();
    assert!(w.schedule(Duration::from_millis(50)));
    while !ran.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        ran.load(Ordering::SeqCst),
        "not run 5 s after a 50 ms deadline with leeway 0"
    );
}

/// Threaded, 2 workers: random periods, leeways and next steps, leeways changed from
/// outside; no run starts before its deadline by the real clock, and `Ctx::leeway` never
/// shows more than the largest leeway the work was given.
#[test]
fn threaded_never_early_never_far_past_the_window() {
    use std::sync::atomic::AtomicU64;
    let sched = Scheduler::builder()
        .workers(2)
        .back_off(false)
        .build()
        .unwrap();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut rng = Rng(0xdead_beef_1234_5678);
    let mut works = Vec::new();
    for i in 0..60 {
        let leeway = match rng.next() % 5 {
            0 => Duration::ZERO,
            1 => Duration::from_micros(300),
            2 => Duration::from_millis(1 + rng.next() % 20),
            3 => Duration::from_millis(50 + rng.next() % 200),
            _ => Duration::from_millis(rng.next() % 5),
        };
        // (current, largest ever) leeway in ns
        let cur = Arc::new((
            AtomicU64::new(leeway.as_nanos() as u64),
            AtomicU64::new(leeway.as_nanos() as u64),
        ));
        let period = Duration::from_micros(500 + rng.next() % 40_000);
        let errors = errors.clone();
        let runs = runs.clone();
        let mut local = Rng(i as u64 * 7919 + 1);
        let c = cur.clone();
        let w = sched
            .every(period, move |cx| {
                let now = Instant::now();
                runs.fetch_add(1, Ordering::Relaxed);
                if now < cx.deadline() {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("#{i} early by {:?}", cx.deadline() - now));
                }
                let big =
                    Duration::from_nanos(c.1.load(Ordering::SeqCst)).max(Duration::from_millis(1));
                let got = cx.leeway();
                if got > big {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("#{i} cx.leeway {got:?} above {big:?}"));
                }
                match local.next() % 6 {
                    0 => Next::Yield,
                    1 => Next::After(Duration::from_micros(local.next() % 20_000)),
                    2 => Next::At(cx.deadline() + cx.period()),
                    _ => Next::Again,
                }
            })
            .leeway(leeway);
        works.push((w, cur));
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(600) {
        std::thread::sleep(Duration::from_millis(10));
        // Poke leeways of armed works from outside, narrowing and widening.
        let i = (rng.next() as usize) % works.len();
        let (w, cur) = works.swap_remove(i);
        let l = Duration::from_millis(rng.next() % 30);
        cur.1.fetch_max(l.as_nanos() as u64, Ordering::SeqCst);
        cur.0.store(l.as_nanos() as u64, Ordering::SeqCst);
        works.push((w.leeway(l), cur));
    }
    drop(works);
    let errors = errors.lock().unwrap();
    assert!(runs.load(Ordering::Relaxed) > 1000);
    assert!(
        errors.is_empty(),
        "{} errors, first: {:?}",
        errors.len(),
        &errors[..errors.len().min(10)]
    );
}

/// Manual scheduler: `Work::leeway`'s docs say "Scheduler::manual runs each work at its
/// deadline". Mixed with a work without leeway that is due later, one advance.
#[test]
fn manual_leeway_work_runs_at_its_deadline() {
    let sched = Scheduler::manual();
    let order: Arc<Mutex<Vec<(&'static str, Duration)>>> = Arc::default();
    let o = order.clone();
    let _a = sched
        .once(Duration::from_millis(10), move |cx| {
            o.lock().unwrap().push(("a", cx.lateness()))
        })
        .leeway(Duration::from_millis(100));
    let o = order.clone();
    let _b = sched.once(Duration::from_millis(50), move |cx| {
        o.lock().unwrap().push(("b", cx.lateness()))
    });
    assert_eq!(sched.advance(Duration::from_millis(200)), 2);
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        [("a", Duration::ZERO), ("b", Duration::ZERO)],
        "manual runs were not at their deadlines"
    );
}

/// Manual, without leeways: deadline order, ties in arrival order (unchanged semantics).
#[test]
fn manual_without_leeway_deadline_order_and_ties() {
    let sched = Scheduler::manual();
    let order: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut works = Vec::new();
    let delays = [30u64, 10, 20, 10, 30, 0, 20, 10];
    for (i, d) in delays.iter().enumerate() {
        let o = order.clone();
        works.push(sched.once(Duration::from_millis(*d), move |_| {
            o.lock().unwrap().push(i)
        }));
    }
    assert_eq!(sched.advance(Duration::from_millis(100)), delays.len());
    assert_eq!(*order.lock().unwrap(), [5, 1, 3, 7, 2, 6, 0, 4]);
}

/// Manual with periodic leeway work and a later no-leeway work in one advance: how many
/// runs does the periodic work get compared with no leeway?
#[test]
fn manual_periodic_with_leeway_loses_runs_in_one_advance() {
    let count = |leeway: Option<Duration>| {
        let sched = Scheduler::manual();
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        let c = sched.every(Duration::from_millis(30), move |_| {
            n2.fetch_add(1, Ordering::SeqCst);
            Next::Again
        });
        let _c = match leeway {
            Some(l) => c.leeway(l),
            None => c,
        };
        let _d = sched.once(Duration::from_millis(150), |_| {});
        sched.advance(Duration::from_millis(200));
        n.load(Ordering::SeqCst)
    };
    let without = count(None);
    let with = count(Some(Duration::from_secs(1)));
    assert_eq!(
        with, without,
        "runs in 200 ms of virtual time: {with} with a 1 s leeway, {without} without"
    );
}

fn lone_wakeups(workers: usize, period: Duration, leeway: Duration, runs: u64) -> (u64, u64) {
    let sched = Scheduler::builder().workers(workers).build().unwrap();
    let work = sched.every(period, |_| Next::Again).leeway(leeway);
    while work.stats().runs < 1 {
        std::thread::sleep(period / 4);
    }
    let (r0, w0) = (work.stats().runs, sched.metrics().worker_wakeups);
    while work.stats().runs < r0 + runs {
        std::thread::sleep(period / 4);
    }
    (work.stats().runs - r0, sched.metrics().worker_wakeups - w0)
}

#[test]
fn costs_lone_work_with_leeway_one_wakeup_per_run() {
    let configs = [
        (1, Duration::from_millis(20), Duration::from_millis(5), 30),
        (2, Duration::from_millis(20), Duration::from_millis(5), 30),
        (2, Duration::from_millis(20), Duration::from_millis(300), 4),
        (2, Duration::from_millis(300), Duration::from_millis(100), 3),
    ];
    // Each on its own scheduler, all at once: they sleep most of the time.
    let results: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = configs
            .iter()
            .map(|&(workers, period, leeway, runs)| {
                s.spawn(move || lone_wakeups(workers, period, leeway, runs))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (&(workers, period, leeway, _), &(r, w)) in configs.iter().zip(&results) {
        println!("{workers} workers {period:?} leeway {leeway:?}: {w} wakeups / {r} runs");
        assert!(
            w <= r + r / 2 + 2,
            "{workers} workers {period:?} leeway {leeway:?}: {w} wakeups / {r} runs"
        );
    }
}

/// Two works at the same period, 3 ms apart, leeway 10 ms: one wakeup for both, with 1
/// and 2 workers (the portable worker, which has no standby, also wakes a follower at
/// each group with 2). All parked: no wakeups.
#[test]
fn costs_overlapping_pair_shares_and_parked_costs_nothing() {
    // One and two workers at once, each on its own scheduler.
    std::thread::scope(|s| {
        for workers in [1usize, 2] {
            s.spawn(move || overlapping_pair_costs(workers));
        }
    });
}

fn overlapping_pair_costs(workers: usize) {
    let sched = Scheduler::builder().workers(workers).build().unwrap();
    let a = sched
        .every(Duration::from_millis(20), |_| Next::Again)
        .leeway(Duration::from_millis(10));
    std::thread::sleep(Duration::from_millis(3));
    let b = sched
        .every(Duration::from_millis(20), |_| Next::Again)
        .leeway(Duration::from_millis(10));
    while a.stats().runs < 3 || b.stats().runs < 3 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (ra, rb, w0) = (
        a.stats().runs,
        b.stats().runs,
        sched.metrics().worker_wakeups,
    );
    while a.stats().runs < ra + 30 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let runs = a.stats().runs - ra + b.stats().runs - rb;
    let wakeups = sched.metrics().worker_wakeups - w0;
    println!("{workers} workers: {wakeups} wakeups for {runs} runs of the pair");
    let standby = cfg!(all(target_os = "linux", not(nicework_portable)));
    let groups = if workers > 1 && !standby {
        runs
    } else {
        runs / 2
    };
    assert!(
        wakeups <= groups + runs / 4 + 2,
        "{workers} workers: {wakeups} wakeups for {runs} runs"
    );
    // Park both.
    a.cancel_sync();
    b.cancel_sync();
    std::thread::sleep(Duration::from_millis(50));
    let w1 = sched.metrics().worker_wakeups;
    std::thread::sleep(Duration::from_millis(500));
    let parked = sched.metrics().worker_wakeups - w1;
    assert!(
        parked <= 1,
        "{workers} workers: {parked} wakeups with all parked"
    );
}

/// Tick-stamped timeouts (a 1 s idle, and 300 ms ones whose leeway asks for ticks) never
/// fire before last touch + idle, with other works waking the workers often (so the
/// touch tick's early refresh window is used), 1 and 2 workers.
#[test]
fn touch_tick_timeouts_never_early_with_busy_neighbours() {
    // One and two workers at once, each on its own scheduler.
    std::thread::scope(|s| {
        for workers in [1usize, 2] {
            s.spawn(move || touch_tick_timeouts_never_early(workers));
        }
    });
}

fn touch_tick_timeouts_never_early(workers: usize) {
    let sched = Scheduler::builder().workers(workers).build().unwrap();
    let _noise = sched.every(Duration::from_millis(7), |_| Next::Again);
    let _noise2 = sched
        .every(Duration::from_millis(11), |_| Next::Again)
        .leeway(Duration::from_millis(20));
    let mut timeouts = Vec::new();
    // Each stamps with the tick: a 1 s idle, or a 300 ms one whose leeway of 200 ms asks
    // for a refresh every 100 ms.
    for (idle_ms, leeway) in [
        (1_000, None),
        (300, Some(Duration::from_millis(200))),
        (320, Some(Duration::from_millis(260))),
    ] {
        let idle = Duration::from_millis(idle_ms);
        let last_touch: Arc<Mutex<Option<Instant>>> = Arc::default();
        let fired: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let (lt, f) = (last_touch.clone(), fired.clone());
        let w = sched.timeout(idle, move |_| {
            let now = Instant::now();
            f.lock().unwrap().push(now);
            let _ = &lt;
            Next::Park
        });
        let w = match leeway {
            Some(l) => w.leeway(l),
            None => w,
        };
        timeouts.push((w, idle, leeway, last_touch, fired));
    }
    let start = Instant::now();
    // The longest gap between two rounds of touches: the checks below hold only while
    // the touches come faster than the idle (a stalled machine may stall the toucher).
    let (mut previous, mut longest_gap) = (start, Duration::ZERO);
    while start.elapsed() < Duration::from_millis(1100) {
        for (w, _, _, lt, _) in &timeouts {
            *lt.lock().unwrap() = Some(Instant::now());
            w.touch();
        }
        longest_gap = longest_gap.max(previous.elapsed());
        previous = Instant::now();
        std::thread::sleep(Duration::from_millis(13));
    }
    if longest_gap >= Duration::from_millis(500) {
        println!("{workers} workers: the toucher stalled for {longest_gap:?}; not judged");
        return;
    }
    // Wait for each to fire once after the last touch.
    for (w, idle, leeway, lt, fired) in &timeouts {
        let last = lt.lock().unwrap().unwrap();
        assert!(
            eventually(|| fired.lock().unwrap().iter().any(|&t| t >= last)),
            "{workers} workers, idle {idle:?} leeway {leeway:?}: never fired"
        );
        for &t in fired.lock().unwrap().iter() {
            // Every firing must be at least `idle` after the touch before it; the
            // touches were 13 ms apart, so any firing before `last` is early.
            assert!(
                t >= last,
                "{workers} workers, idle {idle:?} leeway {leeway:?}: fired during touches"
            );
            assert!(
                t >= last + *idle,
                "{workers} workers, idle {idle:?} leeway {leeway:?}: fired {:?} early",
                last + *idle - t
            );
            let late = t - (last + *idle);
            println!("{workers} workers idle {idle:?} leeway {leeway:?}: late {late:?}");
        }
        let _ = w;
    }
}

/// Leeway set from inside the work's own callback, then Yield increments: they ignore the
/// leeway and run promptly; the Again after them uses the 1 h leeway (so it does not run
/// within the test). Also huge leeways and leeway after the scheduler is gone.
#[test]
fn leeway_from_own_callback_then_yields_and_bad_input() {
    for workers in [1usize, 2] {
        let sched = Scheduler::builder()
            .workers(workers)
            .back_off(false)
            .build()
            .unwrap();
        let slot: Arc<Mutex<Option<nicework::Work>>> = Arc::default();
        let count = Arc::new(AtomicUsize::new(0));
        let (s2, c2) = (slot.clone(), count.clone());
        let work = sched.work(move |cx| {
            let n = c2.fetch_add(1, Ordering::SeqCst);
            if n == 0 {
                let mut g = s2.lock().unwrap();
                let w = g.take().unwrap();
                *g = Some(w.leeway(Duration::from_secs(3600)));
                let l = cx.leeway();
                assert!(
                    l <= Duration::from_secs(3600) && l >= Duration::from_millis(3_596_400),
                    "cx.leeway {l:?}"
                );
            }
            if n < 100 {
                Next::Yield
            } else {
                Next::After(Duration::from_millis(1))
            }
        });
        *slot.lock().unwrap() = Some(work);
        slot.lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .schedule(Duration::ZERO);
        assert!(
            eventually(|| count.load(Ordering::SeqCst) >= 101),
            "{workers}: yields stalled at {}",
            count.load(Ordering::SeqCst)
        );
        if workers == 1 {
            // Nothing else wakes a lone worker, so the After(1 ms) waits for its 1 h
            // window's end. With two, a wakeup of the standby (for a run it found slow)
            // runs it, as any wakeup runs every work whose deadline has come.
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(
                count.load(Ordering::SeqCst),
                101,
                "the After(1ms) ran within 100 ms despite a 1 h leeway"
            );
        }
        // Bad input.
        let w = sched
            .every(Duration::MAX, |_| Next::Again)
            .leeway(Duration::MAX);
        let w = w
            .leeway(Duration::ZERO)
            .leeway(Duration::MAX)
            .leeway(Duration::from_nanos(1));
        let o = sched.once(Duration::ZERO, |_| {}).leeway(Duration::MAX);
        let t = sched
            .timeout(Duration::MAX, |_| Next::Park)
            .leeway(Duration::MAX);
        t.touch();
        drop(sched);
        let w = w.leeway(Duration::from_secs(5));
        let o = o.leeway(Duration::ZERO);
        let t = t.leeway(Duration::ZERO);
        t.touch();
        assert!(
            !w.schedule(Duration::ZERO),
            "nothing is armed after shutdown"
        );
        drop((w, o, t));
        drop(slot);
    }
}

/// Hosted: huge leeway and a zero delay: next_deadline is never None while armed, and
/// `schedule(ZERO)` with a leeway runs by the window's end.
#[test]
fn hosted_huge_leeway_due_now() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let w = sched.work(|_| Next::Park).leeway(Duration::MAX);
    assert!(w.schedule(Duration::ZERO));
    let next = driver.next_deadline();
    assert!(next.is_some(), "armed but no next_deadline");
    // A work due now: next_deadline within the window (13.9 years) - and the doc says
    // `flush` runs it at once.
    assert!(w.flush());
    assert!(!w.is_pending());
}

/// Threaded: a work created with a wide leeway, another arm in between (so no rewindow),
/// then narrowed to zero: it must run near its deadline, not an hour later (margin 3 s).
/// Also the rewindow path (narrowing right after creation, after a widening).
#[test]
fn threaded_narrowing_after_other_arms_and_after_widening() {
    for workers in [1usize, 2] {
        for other_arm in [false, true] {
            let sched = Scheduler::builder().workers(workers).build().unwrap();
            let ran: Arc<Mutex<Option<Instant>>> = Arc::default();
            let r = ran.clone();
            let w = sched
                .every(Duration::from_millis(100), move |_| {
                    r.lock().unwrap().get_or_insert(Instant::now());
                    Next::Park
                })
                .leeway(Duration::from_secs(3600));
            let _other = other_arm.then(|| sched.every(Duration::from_secs(60), |_| Next::Again));
            let w = w.leeway(Duration::from_millis(5));
            let d = w.deadline().unwrap();
            assert!(eventually(
                || ran.lock().unwrap().is_some() || Instant::now() > d + Duration::from_secs(3)
            ),);
            let at = *ran.lock().unwrap();
            assert!(
                at.is_some_and(|t| t >= d && t <= d + Duration::from_secs(3)),
                "{workers} workers, other arm {other_arm}: ran at {:?} after the deadline",
                at.map(|t| t - d)
            );
        }
    }
}

/// Per-object timeout with a leeway; hosted; narrowing on a pending `timeout_for` after a
/// touch; next_deadline within the window.
#[test]
fn hosted_timeout_for_leeway() {
    use std::sync::Weak;
    struct Obj {
        reaper: nicework::Work,
    }
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let obj = Arc::new_cyclic(|me: &Weak<Obj>| Obj {
        reaper: sched
            .timeout_for(me, Duration::from_millis(500), |_o: &Obj, _cx| Next::Park)
            .leeway(Duration::from_secs(100)),
    });
    obj.reaper.touch();
    assert!(obj.reaper.is_pending());
    let d = obj.reaper.deadline().unwrap();
    let next = driver.next_deadline().unwrap();
    assert!(next >= d, "woke before the timeout could be due");
    assert!(next <= d + Duration::from_secs(100));
    let _ = sched.once(Duration::from_secs(1000), |_| {});
    // Narrow: needs `self` — via a per-object the Work is inside the Arc, so can't.
    drop(obj);
}

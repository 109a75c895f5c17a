//! Works that declare a leeway: they never run before their deadline by the real clock,
//! the scheduler never plans a wake past any pending work's window, `Ctx::leeway` reads
//! what was set (or the slack), and the builder step gives an armed work its window: at
//! once when it follows the arm, at once when it narrows, from the next instance when it
//! widens after other arms. A `Yield` increment ignores the leeway.
//!
//! Nothing asserts a timing: each check compares an instant with the deadline it must
//! not precede, or a planned wake with a window's end.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{EVENTUALLY, Rng, eventually};
use nicework::{Driver, Next, Scheduler, Work};

const SLACK: Duration = Duration::from_millis(1);

/// A random leeway: none for a quarter of the works, else up to 30 ms.
fn random_leeway(rng: &mut Rng) -> Option<Duration> {
    match rng.next() % 4 {
        0 => None,
        _ => Some(Duration::from_micros(rng.next() % 30_000)),
    }
}

/// A random work, its leeway (at least the slack) and whether it yields.
type RandomWork = (Work, Duration, bool);

/// Random works: periods of 2..40 ms, random leeways, re-armed by `Again`, `After`, `At`
/// or `Yield`. Each run checks that it did not begin before its deadline and counts.
fn random_works(
    sched: &Scheduler,
    count: usize,
    seed: u64,
    early: &Arc<Mutex<Vec<Duration>>>,
    runs: &Arc<AtomicU64>,
) -> Vec<RandomWork> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| {
            let period = Duration::from_micros(2_000 + rng.next() % 38_000);
            let (early, runs) = (early.clone(), runs.clone());
            let kind = rng.next() % 4;
            let mut n = 0u64;
            let work = sched.every(period, move |cx| {
                let now = Instant::now();
                if now < cx.deadline() {
                    early.lock().unwrap().push(cx.deadline() - now);
                }
                runs.fetch_add(1, SeqCst);
                n += 1;
                match kind {
                    0 => Next::Again,
                    1 => Next::After(period / 2 + Duration::from_micros(n % 7 * 300)),
                    2 => Next::At(cx.deadline() + period),
                    _ if n % 3 == 0 => Next::Yield,
                    _ => Next::Again,
                }
            });
            let leeway = random_leeway(&mut rng);
            let work = match leeway {
                Some(leeway) => work.leeway(leeway),
                None => work,
            };
            (work, leeway.unwrap_or_default().max(SLACK), kind == 3)
        })
        .collect()
}

#[test]
fn works_with_random_periods_and_leeways_never_run_before_their_deadline() {
    // One and two workers at once, each on its own scheduler.
    std::thread::scope(|s| {
        for workers in [1, 2] {
            s.spawn(move || random_works_never_early(workers));
        }
    });
}

fn random_works_never_early(workers: usize) {
    let sched = Scheduler::builder().workers(workers).build().unwrap();
    let early = Arc::new(Mutex::new(Vec::new()));
    let runs = Arc::new(AtomicU64::new(0));
    let works = random_works(&sched, 200, 0xC0A1_E5CE + workers as u64, &early, &runs);
    // Later leeways, on works armed long before: wider and narrower.
    let mut rng = Rng(99);
    let works: Vec<Work> = works
        .into_iter()
        .map(|(work, _, _)| match rng.next() % 3 {
            0 => work.leeway(Duration::from_micros(rng.next() % 40_000)),
            _ => work,
        })
        .collect();
    assert!(
        eventually(|| runs.load(SeqCst) >= 10_000),
        "{workers} worker(s): only {} runs",
        runs.load(SeqCst)
    );
    drop(works);
    let early = early.lock().unwrap();
    assert!(
        early.is_empty(),
        "{workers} worker(s): {} runs began before their deadline, by up to {:?}",
        early.len(),
        early.iter().max()
    );
}

/// The earliest window end among the pending works, each window `deadline + leeway`.
fn earliest_window_end(works: &[RandomWork]) -> Option<Instant> {
    works
        .iter()
        .filter_map(|(work, leeway, _)| work.deadline().map(|deadline| deadline + *leeway))
        .min()
}

#[test]
fn a_hosted_scheduler_never_plans_a_wake_past_a_pending_windows_end() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let early = Arc::new(Mutex::new(Vec::new()));
    let runs = Arc::new(AtomicU64::new(0));
    let works = random_works(&sched, 100, 0x5EED, &early, &runs);
    let mut wakes = 0u64;
    let mut shared_wakes = 0u64;
    while runs.load(SeqCst) < 3_000 {
        let wake = driver.next_deadline().expect("periodic works are pending");
        if let Some(end) = earliest_window_end(&works) {
            assert!(
                wake <= end,
                "the host is told to wake at {wake:?}, past a window that ends at {end:?}"
            );
        }
        if let Some(gap) = wake.checked_duration_since(Instant::now()) {
            std::thread::sleep(gap);
        }
        let before = runs.load(SeqCst);
        let started = Instant::now();
        driver.run_due();
        wakes += 1;
        shared_wakes += u64::from(runs.load(SeqCst) - before > 1);
        // Every wakeup runs every work whose deadline, rounded up to the slack, had come
        // when it started (a work that yielded runs again at the next call).
        for (work, _, _) in works.iter().filter(|(_, _, yields)| !yields) {
            if let Some(deadline) = work.deadline() {
                assert!(
                    deadline + SLACK > started || work.is_running(),
                    "a work due {:?} before the wakeup was left behind by it: {:?}, period \
                     {:?}, {:?}",
                    started - deadline,
                    work,
                    work.period(),
                    work.stats()
                );
            }
        }
    }
    println!(
        "{wakes} host wakeups for {} runs, {shared_wakes} of them shared",
        runs.load(SeqCst)
    );
    assert!(shared_wakes > 0, "no wakeup ran two works");
    assert!(
        early.lock().unwrap().is_empty(),
        "a run began before its deadline"
    );
}

/// The hosted scheduler's planned wake, as a distance from `from`.
fn planned_after(driver: &Driver, from: Instant) -> Duration {
    driver
        .next_deadline()
        .expect("a work is pending")
        .saturating_duration_since(from)
}

#[test]
fn ctx_leeway_reads_the_leeway_or_the_slack_where_that_is_more() {
    let sched = Scheduler::manual();
    let cases = [
        (None, SLACK),
        (Some(Duration::from_millis(5)), Duration::from_millis(5)),
        (Some(Duration::from_micros(100)), SLACK),
        (Some(Duration::ZERO), SLACK),
        (
            Some(Duration::from_millis(1500)),
            Duration::from_millis(1500),
        ),
    ];
    for (leeway, expected) in cases {
        let seen = Arc::new(Mutex::new(None));
        let saw = seen.clone();
        let work = sched.once(Duration::from_millis(1), move |cx| {
            *saw.lock().unwrap() = Some(cx.leeway());
        });
        let _work = match leeway {
            Some(leeway) => work.leeway(leeway),
            None => work,
        };
        sched.advance(Duration::from_millis(1));
        assert_eq!(*seen.lock().unwrap(), Some(expected), "leeway {leeway:?}");
    }
}

#[test]
fn a_huge_leeway_is_kept_as_about_fourteen_years_and_never_longer_than_asked() {
    let sched = Scheduler::manual();
    for leeway in [
        Duration::MAX,
        Duration::from_secs(u64::MAX / 2),
        Duration::from_secs(3600),
    ] {
        let seen = Arc::new(Mutex::new(Duration::ZERO));
        let saw = seen.clone();
        let _work = sched
            .once(Duration::from_millis(1), move |cx| {
                *saw.lock().unwrap() = cx.leeway();
            })
            .leeway(leeway);
        sched.advance(Duration::from_millis(1));
        let kept = *seen.lock().unwrap();
        assert!(kept <= leeway, "{leeway:?} kept as {kept:?}");
        assert!(
            kept >= (leeway - leeway / 1024).min(Duration::from_secs(13 * 365 * 24 * 3600)),
            "{leeway:?} kept as {kept:?}"
        );
    }
}

#[test]
fn a_leeway_right_after_the_arm_gives_the_pending_instance_its_window() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let before = Instant::now();
    let work = sched
        .every(Duration::from_secs(10), |_| Next::Again)
        .leeway(Duration::from_secs(2));
    let deadline = work.deadline().unwrap();
    let wake = driver.next_deadline().unwrap();
    assert!(
        wake > deadline + Duration::from_millis(1900),
        "{:?}",
        wake - deadline
    );
    assert!(wake <= deadline + Duration::from_secs(2));
    // The same for `once` and `timeout`.
    let once = sched
        .once(Duration::from_secs(5), |_| ())
        .leeway(Duration::from_secs(1));
    let timeout = sched
        .timeout(Duration::from_secs(3), |_| Next::Stop)
        .leeway(Duration::from_secs(1));
    let wake = planned_after(&driver, before);
    // The timeout's touches read the tick, refreshed every half leeway (500 ms), so its
    // window keeps the other half plus 1/16 of its idle, less the slack: 3.6865 s.
    assert!(
        wake >= Duration::from_millis(3_650) && wake <= Duration::from_millis(3_750),
        "the earliest window ends at the timeout's 3 s + 187.5 ms + 500 ms, planned at \
         {wake:?}"
    );
    drop((once, timeout, work));
}

#[test]
fn a_narrower_leeway_on_an_armed_work_applies_at_once() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let work = sched
        .every(Duration::from_secs(10), |_| Next::Again)
        .leeway(Duration::from_secs(5));
    // Another arm in between: the wheel's last placement is not this work's any more.
    let _other = sched.every(Duration::from_secs(100), |_| Next::Again);
    let work = work.leeway(Duration::from_millis(20));
    let deadline = work.deadline().unwrap();
    let wake = driver.next_deadline().unwrap();
    assert!(
        wake <= deadline + Duration::from_millis(20),
        "planned {:?} past the deadline, the leeway is 20 ms",
        wake.saturating_duration_since(deadline)
    );
}

#[test]
fn a_wider_leeway_after_other_arms_applies_from_the_next_instance() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let period = Duration::from_millis(20);
    let work = sched.every(period, |_| Next::Again);
    let _other = sched.every(Duration::from_secs(100), |_| Next::Again);
    let work = work.leeway(Duration::from_secs(1));
    let deadline = work.deadline().unwrap();
    assert!(
        driver.next_deadline().unwrap() <= deadline + SLACK,
        "the pending instance keeps its narrower window"
    );
    let start = Instant::now();
    while work.stats().runs == 0 {
        assert!(start.elapsed() < EVENTUALLY, "the work never ran");
        if let Some(gap) = driver
            .next_deadline()
            .unwrap()
            .checked_duration_since(Instant::now())
        {
            std::thread::sleep(gap);
        }
        driver.run_due();
    }
    let next = work.deadline().unwrap();
    let wake = driver.next_deadline().unwrap();
    assert!(
        wake > next + Duration::from_millis(900) && wake <= next + Duration::from_secs(1),
        "the next instance has the 1 s window: planned {:?} past its deadline",
        wake.saturating_duration_since(next)
    );
}

#[test]
fn a_yield_increment_runs_as_soon_as_others_had_their_turn_whatever_the_leeway() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let increments = Arc::new(AtomicU64::new(0));
    let counted = increments.clone();
    let work = sched.work(move |_| {
        if counted.fetch_add(1, SeqCst) < 5 {
            Next::Yield
        } else {
            Next::Park
        }
    });
    work.schedule(Duration::ZERO);
    assert_eq!(driver.run_due(), 1);
    // The pending increment, and every one after it, ignore the 10 s leeway.
    let _work = work.leeway(Duration::from_secs(10));
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < EVENTUALLY, "the increments stalled");
        driver.run_due();
        if increments.load(SeqCst) >= 6 {
            break;
        }
        let wake = driver.next_deadline().unwrap();
        assert!(
            wake <= Instant::now(),
            "a yielded increment is due at once, planned in {:?}",
            wake - Instant::now()
        );
    }
}

#[test]
fn a_leeway_after_shutdown_or_on_a_parked_work_is_kept_and_harmless() {
    let sched = Scheduler::builder().build().unwrap();
    let parked = sched.work(|cx| {
        assert_eq!(cx.leeway(), Duration::from_millis(50));
        Next::Park
    });
    let parked = parked.leeway(Duration::from_millis(50));
    assert!(!parked.is_pending());
    parked.schedule(Duration::ZERO);
    assert!(eventually(|| parked.stats().runs == 1));
    let armed = sched.every(Duration::from_secs(1), |_| Next::Again);
    drop(sched);
    let armed = armed.leeway(Duration::from_secs(1));
    assert!(!armed.is_pending(), "nothing is armed after shutdown");
    assert!(!armed.schedule(Duration::ZERO));
}

#[test]
fn works_list_their_leeway_and_an_id_spaces_scans_have_a_quarter_of_their_period() {
    let sched = Scheduler::manual();
    let _ids = nicework::IdSpace::builder()
        .scan_period(Duration::from_millis(400))
        .build(&sched);
    let _purge = sched
        .every(Duration::from_secs(1), |_| Next::Again)
        .leeway(Duration::from_millis(250))
        .named("purge");
    let _plain = sched.work(|_| Next::Park).named("plain");
    let mut seen = Vec::new();
    sched.works(|info| seen.push((info.name.to_string(), info.leeway)));
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "nicework.cid-compaction".to_string(),
                Duration::from_millis(100)
            ),
            ("plain".to_string(), SLACK),
            ("purge".to_string(), Duration::from_millis(250)),
        ]
    );
}

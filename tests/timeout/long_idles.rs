//! Timeouts whose idle is long enough for the coarse clock (`LONG`, above 100 coarse
//! margins on Linux; elsewhere the same tests run on the full clock) against flushes,
//! stopped works, bursts of touches from several threads, a hog, an idle-priority
//! worker under load, and shutdown: never early, touches never lost, and touches that
//! cost no wakeups. Orderings by `Instant` and counts; the waits are liveness bounds.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::eventually;
use nicework::{Next, Scheduler, Work};

/// An idle the coarse clock stamps: 100 × its 32 ms least margin is 3.2 s.
const LONG: Duration = Duration::from_millis(3_500);

/// A touch made *during* a run is never lost (the work ends armed, due no earlier than
/// touch + idle) -- also when the run was started by `flush`, which takes the work
/// without a decision that reads its stamp, and when the touch just before the flush
/// read the same coarse time as the touch during the run.
fn touch_during_a_flushed_run_on(sched: &Scheduler, drive: impl Fn() + Send + Sync) {
    let idle = LONG;
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let runs: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let record = runs.clone();
    let work = sched.timeout(idle, move |_| {
        record.lock().unwrap().push(Instant::now());
        if record.lock().unwrap().len() == 1 {
            started_tx.send(()).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
        }
        Next::Park
    });
    // A touch just before the flush.
    work.touch();
    let touched_in_run = std::thread::scope(|s| {
        s.spawn(|| assert!(work.flush()));
        started_rx.recv().unwrap();
        assert!(work.is_running());
        let at = Instant::now();
        work.touch(); // during the run: must re-arm it for touch + idle
        go_tx.send(()).unwrap();
        at
    });
    let ran_again = eventually(|| {
        drive();
        runs.lock().unwrap().len() >= 2
    });
    assert!(
        ran_again,
        "a touch during the flushed run was lost: pending={}, runs={}",
        work.is_pending(),
        runs.lock().unwrap().len()
    );
    let second = runs.lock().unwrap()[1];
    assert!(second >= touched_in_run + idle, "the re-arm came early");
}

#[test]
fn a_touch_during_a_flushed_run_re_arms_a_coarse_stamped_timeout() {
    let sched = Scheduler::new().unwrap();
    touch_during_a_flushed_run_on(&sched, || {});
}

#[test]
fn a_touch_during_a_flushed_run_re_arms_a_coarse_stamped_timeout_hosted() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Mutex::new(driver);
    touch_during_a_flushed_run_on(&sched, || {
        driver.lock().unwrap().run_due();
    });
}

/// Control: the same with a full-clock idle keeps the touch.
#[test]
fn control_a_touch_during_a_flushed_run_re_arms_a_full_clock_timeout() {
    let sched = Scheduler::new().unwrap();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let runs = Arc::new(AtomicU64::new(0));
    let count = runs.clone();
    let work = sched.timeout(Duration::from_millis(300), move |_| {
        if count.fetch_add(1, Ordering::SeqCst) == 0 {
            started_tx.send(()).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
        }
        Next::Park
    });
    work.touch();
    std::thread::scope(|s| {
        s.spawn(|| assert!(work.flush()));
        started_rx.recv().unwrap();
        work.touch();
        go_tx.send(()).unwrap();
    });
    assert!(eventually(|| runs.load(Ordering::SeqCst) >= 2));
}

/// "`touch()` ... after `Next::Stop` or `cancel_sync` it does nothing": on a hosted
/// scheduler with nothing armed, `next_deadline()` is `None` ("`None` when nothing is
/// armed"), also after a touch of a stopped coarse-stamped timeout, which stores a stamp
/// and wakes nothing.
#[test]
fn touching_a_stopped_coarse_stamped_timeout_arms_nothing_hosted() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let work = sched.timeout(LONG, |_| Next::Stop);
    assert!(work.flush());
    assert!(!work.is_pending());
    while driver.run_due() > 0 {}
    // Let whatever is left drain.
    assert!(eventually(|| {
        driver.run_due();
        driver.next_deadline().is_none()
    }));
    assert_eq!(sched.metrics().armed, 0);
    work.touch();
    assert!(!work.is_pending(), "a stopped work stays stopped");
    assert_eq!(
        driver.next_deadline(),
        None,
        "nothing is armed, but the host is asked to call back"
    );
}

/// The same on a threaded scheduler, counted in worker wakeups: touching a stopped work
/// for 1.5 s must cost (about) none. The count is the
/// kernel's, so it includes the worker's start and any wait for the core lock: the worker
/// runs at the caller's priority, so that a starved nice-19 worker does not start (or
/// meet the stale entry) inside the measured stretch, beside other tests' spinning
/// threads in a busy binary.
#[test]
fn touching_a_stopped_coarse_stamped_timeout_costs_no_wakeups() {
    let sched = common::normal_priority_builder().build().unwrap();
    let created = Instant::now();
    let work = sched.timeout(LONG, |_| Next::Stop);
    assert!(work.flush());
    // Past the stale entry the creation left at `LONG`, whose wakeup (and any wait for
    // the lock the worker meets in it, on a loaded machine) is not the touches' doing.
    std::thread::sleep(
        (created + LONG + Duration::from_millis(300)).saturating_duration_since(Instant::now()),
    );
    let before = sched.metrics().worker_wakeups;
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        work.touch();
        std::thread::sleep(Duration::from_millis(5));
    }
    let woke = sched.metrics().worker_wakeups - before;
    assert!(
        woke <= 4,
        "{woke} worker wakeups from touching a stopped work for 1.5 s"
    );
}

/// A timeout work, its touches, its runs and its idle.
type Probed = (
    Arc<Work>,
    Arc<Mutex<Vec<(Instant, Instant)>>>,
    Arc<Mutex<Vec<Instant>>>,
    Duration,
);

/// Never early, with several coarse-stamped works of different idles, some created late,
/// touched in bursts from four threads, on two workers one of which is often held by a
/// long run. For every run: no touch of that work that completed
/// before the run started lies within idle of it.
#[test]
fn many_works_bursty_touchers_and_a_hog_never_run_within_idle() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    type Log = Arc<Mutex<Vec<(Instant, Instant)>>>;
    let idles = [3_500u64, 3_600, 3_800, 4_200];
    let mut works: Vec<Probed> = Vec::new();
    let stop = Arc::new(AtomicBool::new(false));
    // A hog that holds a worker for 300 ms every 350 ms.
    let _hog = sched.every(Duration::from_millis(50), |_| {
        std::thread::sleep(Duration::from_millis(300));
        Next::Again
    });
    let add = |works: &mut Vec<_>, ms: u64| {
        let idle = Duration::from_millis(ms);
        let (w, runs) = crate::recording_timeout(&sched, idle);
        works.push((w, Log::default(), runs, idle));
    };
    for ms in idles {
        add(&mut works, ms);
    }
    let start = Instant::now();
    let mut threads = Vec::new();
    let spawn_touchers =
        |works: &[Probed], threads: &mut Vec<std::thread::JoinHandle<()>>, seed: u64| {
            for t in 0..2u64 {
                let targets: Vec<_> = works
                    .iter()
                    .map(|(w, log, _, _)| (w.clone(), log.clone()))
                    .collect();
                let stop = stop.clone();
                threads.push(std::thread::spawn(move || {
                    let mut x = seed * 7919 + t * 104_729 + 1;
                    while !stop.load(Ordering::SeqCst) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let (w, log) = &targets[(x % targets.len() as u64) as usize];
                        let started = Instant::now();
                        w.touch();
                        log.lock().unwrap().push((started, Instant::now()));
                        // Bursts with gaps around the idles, so some runs come mid-test.
                        let pause = if x % 97 == 0 { 1_100 } else { 3 };
                        std::thread::sleep(Duration::from_millis(pause));
                    }
                }));
            }
        };
    spawn_touchers(&works, &mut threads, 1);
    // Works created late.
    std::thread::sleep(Duration::from_millis(800));
    for ms in [3_500u64, 4_500] {
        add(&mut works, ms);
    }
    spawn_touchers(&works[idles.len()..], &mut threads, 2);
    while start.elapsed() < Duration::from_millis(1900) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let mut total_runs = 0;
    for (w, log, runs, idle) in &works {
        assert!(
            eventually(|| !runs.lock().unwrap().is_empty() && !w.is_pending()),
            "a touched work ran and parked"
        );
        let log = log.lock().unwrap();
        for run in runs.lock().unwrap().iter() {
            if let Some(last) = log
                .iter()
                .filter(|(_, done)| done < run)
                .map(|(s, _)| *s)
                .max()
            {
                assert!(
                    *run >= last + *idle,
                    "idle {idle:?}: ran {:?} after a touch",
                    *run - last
                );
            }
            total_runs += 1;
        }
    }
    assert!(total_runs >= works.len());
}

/// Shutdown, drop and cancel_sync while touches and deadline reads race.
#[test]
fn drop_shutdown_and_cancel_sync_while_touches_race_never_hang() {
    for round in 0..6 {
        let sched = Scheduler::builder().workers(1 + round % 2).build().unwrap();
        let works: Vec<_> = (0..4)
            .map(|i| Arc::new(sched.timeout(LONG + Duration::from_millis(100 * i), |_| Next::Park)))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let touchers: Vec<_> = works
            .iter()
            .map(|w| {
                let (w, stop) = (w.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        w.touch();
                        let _ = w.deadline();
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(150));
        works[0].cancel_sync();
        if round % 2 == 1 {
            let _ = works[1].cancel_sync();
        }
        // Shut down (the last handle) while the touchers still touch and read deadlines.
        drop(sched);
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        for t in touchers {
            t.join().unwrap();
        }
        drop(works);
    }
}

/// Never early with a `SCHED_IDLE` worker under CPU load (spinners on every core, so the
/// worker is starved), two threads touching a coarse-stamped timeout; then, with the load
/// gone, it runs and parks, and costs (about) no wakeups.
#[test]
fn an_idle_priority_worker_under_load_never_runs_early_and_parks_after() {
    let sched = Scheduler::builder()
        .priority(nicework::Priority::Idle)
        .build()
        .unwrap();
    let idle = LONG;
    let log: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let (work, runs) = crate::recording_timeout(&sched, idle);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = common::spinners(2, &stop);
    for t in 0..2u64 {
        let (work, log, stop) = (work.clone(), log.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                work.touch();
                log.lock().unwrap().push((started, Instant::now()));
                i += 1;
                // Thread 0 pauses longer than idle now and then, so runs may come.
                let pause = if t == 0 && i % 200 == 0 { 3_700 } else { 4 };
                std::thread::sleep(Duration::from_millis(pause));
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(1300));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(eventually(|| !runs.lock().unwrap().is_empty()
        && !work.is_pending()
        && !work.is_running()));
    let log = log.lock().unwrap();
    for run in runs.lock().unwrap().iter() {
        let last = log
            .iter()
            .filter(|(_, done)| done < run)
            .map(|(s, _)| *s)
            .max()
            .unwrap();
        assert!(*run >= last + idle, "ran {:?} after a touch", *run - last);
    }
    // Parked: let any stale entry's wakeup pass, then count.
    std::thread::sleep(Duration::from_millis(300));
    let before = sched.metrics().worker_wakeups;
    std::thread::sleep(Duration::from_millis(600));
    let woke = sched.metrics().worker_wakeups - before;
    assert!(woke <= 1, "{woke} wakeups with nothing touched or armed");
}

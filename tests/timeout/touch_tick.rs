//! The touch tick (timeouts of 1 s and more stamp touches with the scheduler's tick, not
//! a clock) against flushes, stopped works, reads of `deadline()`, bursts, starved and
//! idle-priority workers, shutdown and `fork()`. Orderings by `Instant` and counts; the
//! waits are liveness bounds, and the two lateness tests bound lateness generously.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::eventually;
use nicework::{Next, Scheduler, Work};

/// A touch made *during* a run is never lost (the work ends armed, due no earlier than
/// touch + idle) -- also when the run was started by `flush`, which takes the work
/// without a decision that reads its stamp. The tick must still move past the stamp the
/// run was taken with, or a touch during the run would read the same tick as the touch
/// just before the flush, store nothing, and the run's completion would miss it.
fn touch_during_a_flushed_run_on(sched: &Scheduler, drive: impl Fn() + Send + Sync) {
    let idle = Duration::from_secs(1);
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
    // A touch just before the flush: the stamp is the current tick.
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
fn a_touch_during_a_flushed_run_re_arms_a_tick_stamped_timeout() {
    let sched = Scheduler::new().unwrap();
    touch_during_a_flushed_run_on(&sched, || {});
}

#[test]
fn a_touch_during_a_flushed_run_re_arms_a_tick_stamped_timeout_hosted() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Mutex::new(driver);
    touch_during_a_flushed_run_on(&sched, || {
        driver.lock().unwrap().run_due();
    });
}

/// Control: the same with a full-clock idle (below 1 s) keeps the touch.
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
/// armed"). A touch of a stopped tick-stamped timeout still stores a stamp and wakes the
/// tick's refresher, which then asks the host to call back every idle/16.
#[test]
fn touching_a_stopped_tick_stamped_timeout_arms_nothing_hosted() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let work = sched.timeout(Duration::from_secs(1), |_| Next::Stop);
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
/// for 1.5 s must cost (about) none, not 16 refreshes a second. The count is the
/// kernel's, so it includes the worker's start and any wait for the core lock: the worker
/// runs at the caller's priority, so that a starved nice-19 worker does not start (or
/// meet the stale entry) inside the measured stretch, beside other tests' spinning
/// threads in a busy binary.
#[test]
fn touching_a_stopped_tick_stamped_timeout_costs_no_wakeups() {
    let sched = common::normal_priority_builder().build().unwrap();
    let created = Instant::now();
    let work = sched.timeout(Duration::from_secs(1), |_| Next::Stop);
    assert!(work.flush());
    // Past the stale entry the creation left at 1 s, whose wakeup (and any wait for the
    // lock the worker meets in it, on a loaded machine) is not the touches' doing.
    std::thread::sleep(
        (created + Duration::from_millis(1300)).saturating_duration_since(Instant::now()),
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

/// The history's bound of an untouched stamp may move later, but by the module's claim
/// "at most 1/16 of its age" in ticks, which the docs turn into "at most 1/16 of its
/// idle late". A read such as `deadline()` publishes no tick, so a burst of another
/// work's touches and reads, as a monitoring loop makes, must not push an older stamp out
/// of the exact levels: if reads published ticks, its bound would become the time of a
/// coarse multiple published *in the burst*, and a work touched once and left alone
/// would move about a whole idle later, with no touch. The idle is long beside the
/// test's steps (about 1.1 s), so that a test thread slowed down (ASan's, in CI) still
/// reads the deadline before the run.
#[test]
fn a_burst_of_deadline_reads_moves_an_untouched_timeout_far_later() {
    let sched = Scheduler::new().unwrap();
    let idle = Duration::from_secs(4);
    let ran: Arc<Mutex<Option<Instant>>> = Arc::default();
    let record = ran.clone();
    let victim = sched.timeout(idle, move |_| {
        *record.lock().unwrap() = Some(Instant::now());
        Next::Park
    });
    let other = sched.timeout(Duration::from_secs(3600), |_| Next::Park);
    let touched = Instant::now();
    victim.touch();
    // Let the refresher (every idle/16, 250 ms) publish the tick after the stamp.
    std::thread::sleep(Duration::from_millis(600));
    let before = victim.deadline().unwrap();
    std::thread::sleep(Duration::from_millis(400));
    // Another work's touch + deadline(), as a monitoring loop would: one tick each.
    let until = Instant::now() + Duration::from_millis(100);
    let mut reads = 0u64;
    while Instant::now() < until {
        other.touch();
        let _ = other.deadline();
        reads += 1;
    }
    let after = victim.deadline().unwrap();
    assert!(eventually(|| ran.lock().unwrap().is_some()));
    let ran = ran.lock().unwrap().unwrap();
    assert!(ran >= touched + idle);
    assert!(
        after <= before + idle / 16,
        "untouched, its deadline moved {:?} later (after {reads} deadline reads of \
         another work); it ran {:?} after its only touch",
        after - before,
        ran - touched
    );
}

/// A timeout work, its touches, its runs and its idle.
type Probed = (
    Arc<Work>,
    Arc<Mutex<Vec<(Instant, Instant)>>>,
    Arc<Mutex<Vec<Instant>>>,
    Duration,
);

/// Never early, with several tick-stamped works of different idles, some created late,
/// touched in bursts from four threads, on two workers one of which is often held by a
/// long run (so refreshes are late). For every run: no touch of that work that completed
/// before the run started lies within idle of it.
#[test]
fn many_works_bursty_touchers_and_a_hog_never_run_within_idle() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    type Log = Arc<Mutex<Vec<(Instant, Instant)>>>;
    let idles = [1000u64, 1100, 1300, 1700];
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
    // Works created late, after many ticks.
    std::thread::sleep(Duration::from_millis(800));
    for ms in [1000u64, 2000] {
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

/// Cheap when idle, hosted: once touches stop and the work ran, the refresher parks and
/// the host is told nothing is due (`next_deadline() == None`).
#[test]
fn a_hosted_refresher_parks_after_a_burst() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let idle = Duration::from_secs(1);
    let runs = Arc::new(AtomicU64::new(0));
    let count = runs.clone();
    let work = sched.timeout(idle, move |_| {
        count.fetch_add(1, Ordering::SeqCst);
        Next::Park
    });
    let mut last = Instant::now();
    let until = Instant::now() + Duration::from_millis(600);
    while Instant::now() < until {
        last = Instant::now();
        work.touch();
        driver.run_due();
        std::thread::sleep(Duration::from_millis(3));
    }
    let mut ran_at = None;
    assert!(eventually(|| {
        if driver.run_due() > 0 && ran_at.is_none() {
            ran_at = Some(Instant::now());
        }
        if let Some(at) = driver.next_deadline() {
            std::thread::sleep(
                at.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(50)),
            );
        }
        runs.load(Ordering::SeqCst) == 1 && driver.next_deadline().is_none()
    }));
    assert!(ran_at.unwrap() >= last + idle);
}

/// Shutdown, drop and cancel_sync while the refresher is scheduled and touches race.
#[test]
fn drop_shutdown_and_cancel_sync_while_the_refresher_runs_never_hang() {
    for round in 0..6 {
        let sched = Scheduler::builder().workers(1 + round % 2).build().unwrap();
        let works: Vec<_> = (0..4)
            .map(|i| Arc::new(sched.timeout(Duration::from_millis(1000 + 100 * i), |_| Next::Park)))
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

/// Forks up to 20 times while a parent thread touches a tick-stamped timeout and reads
/// its deadline in a loop (so it holds the touch tick's std mutex most of the time);
/// each child runs `child` and `_exit`s. Returns how many children hung (killed after
/// 10 s); stops at the first.
#[cfg(unix)]
fn forks_while_the_tick_lock_is_hammered(child: impl Fn(&Scheduler, &Work)) -> usize {
    let sched = Scheduler::new().unwrap();
    let work = Arc::new(sched.timeout(Duration::from_secs(5), |_| Next::Park));
    work.touch();
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (work, stop) = (work.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                work.touch();
                let _ = work.deadline();
            }
        })
    };
    // Spinners, so the hammer is often preempted (possibly inside the lock).
    let spinners = common::spinners(3, &stop);
    std::thread::sleep(Duration::from_millis(50));
    let mut hung = 0;
    for _ in 0..100 {
        // SAFETY: the child only runs `child` (nicework and std) and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            child(&sched, &work);
            // SAFETY: leaves the child at once.
            unsafe { libc::_exit(0) };
        }
        match common::child::wait_for_forked_child(pid, Duration::from_secs(10)) {
            Some(code) => assert_eq!(code, 0, "the child failed"),
            None => {
                hung += 1;
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    hammer.join().unwrap();
    for spinner in spinners {
        spinner.join().unwrap();
    }
    hung
}

/// `deadline()` of a tick-stamped timeout in a `fork()`ed child: every call a user
/// thread makes must be safe there (no lock another thread held at the fork). It now
/// takes the touch tick's own std mutex (`upper_time_ns`, via `deadline_ns` ->
/// `postponed_to` -> `touch_due`) with no fork gate; a parent thread that read
/// deadlines held it at the fork, and the child blocks forever.
#[cfg(unix)]
#[test]
fn a_forked_child_reads_a_timeout_deadline_while_a_parent_thread_held_the_tick_lock() {
    let hung = forks_while_the_tick_lock_is_hammered(|_, work| {
        let _ = work.deadline();
    });
    assert_eq!(hung, 0, "a forked child hung in Work::deadline()");
}

/// The same for `Scheduler::timeout` with an idle of 1 s or more in the child
/// (`tick_touch` -> `register_idle` takes the tick's mutex, no fork gate).
#[cfg(unix)]
#[test]
fn a_forked_child_makes_a_long_timeout_while_a_parent_thread_held_the_tick_lock() {
    let hung = forks_while_the_tick_lock_is_hammered(|sched, _| {
        std::mem::forget(sched.timeout(Duration::from_secs(2), |_| Next::Park));
    });
    assert_eq!(hung, 0, "a forked child hung in Scheduler::timeout()");
}

/// Never early with a `SCHED_IDLE` worker under CPU load (spinners on every core, so the
/// refresher is starved), two threads touching a 1.1 s timeout; then, with the load
/// gone, it runs and parks, and the parked refresher costs (about) no wakeups.
#[test]
fn an_idle_priority_worker_under_load_never_runs_early_and_parks_after() {
    let sched = Scheduler::builder()
        .priority(nicework::Priority::Idle)
        .build()
        .unwrap();
    let idle = Duration::from_millis(1100);
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
                let pause = if t == 0 && i % 200 == 0 { 1300 } else { 4 };
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
    // Parked: give the refresher two intervals to notice, then count.
    std::thread::sleep(Duration::from_millis(300));
    let before = sched.metrics().worker_wakeups;
    std::thread::sleep(Duration::from_millis(600));
    let woke = sched.metrics().worker_wakeups - before;
    assert!(woke <= 1, "{woke} wakeups with nothing touched or armed");
}

/// "Runs within about touch + idle + idle/16": the refresher's interval is the shortest
/// registered idle / 16, also when a refresh was already scheduled for a longer idle (a
/// touch of a 1 h timeout: in 225 s): a 1 s timeout created afterwards must get its
/// refreshes every 62.5 ms, or its last stamp's successor would only be published when
/// it is judged, and it would run a whole idle late.
#[test]
fn a_short_timeout_created_after_a_long_ones_touch_is_not_an_idle_late() {
    let sched = Scheduler::new().unwrap();
    let long = sched.timeout(Duration::from_secs(3600), |_| Next::Park);
    long.touch(); // schedules the refresher in 3600 s / 16
    let far = nicework::hooks::next_tick_refresh(&sched).expect("a touch schedules it");
    let idle = Duration::from_secs(1);
    let ran: Arc<Mutex<Option<Instant>>> = Arc::default();
    let record = ran.clone();
    let created = Instant::now();
    let short = sched.timeout(idle, move |_| {
        *record.lock().unwrap() = Some(Instant::now());
        Next::Park
    });
    // The schedule, not a measured lateness: the refresh moved from 225 s away to within
    // 1/16 of the short idle of its creation (or already ran and was rescheduled so).
    let next = nicework::hooks::next_tick_refresh(&sched).expect("still scheduled");
    assert!(
        next < far && next <= Instant::now() + idle / 16,
        "the refresher runs in {:?}, not within idle/16 of the short timeout's creation \
         (scheduled {:?} after it)",
        next.saturating_duration_since(Instant::now()),
        next.saturating_duration_since(created)
    );
    let mut last = Instant::now();
    let until = last + Duration::from_millis(1300);
    while Instant::now() < until {
        last = Instant::now();
        short.touch();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(eventually(|| ran.lock().unwrap().is_some()));
    let ran = ran.lock().unwrap().unwrap();
    assert!(ran >= last + idle, "early");
}

/// The threshold of the one precision rule: from 1 s up a timeout stamps with the tick
/// (its touch schedules the refresher), below it with the full clock (its touch
/// schedules nothing). A state, not a timing.
#[test]
fn idles_from_one_second_stamp_with_the_tick_and_shorter_ones_with_the_clock() {
    let ms = Duration::from_millis(1);
    for (idle, ticks) in [(ms * 999, false), (ms * 1000, true), (ms * 60_000, true)] {
        let sched = Scheduler::new().unwrap();
        let work = sched.timeout(idle, |_| Next::Park);
        work.touch();
        assert_eq!(
            nicework::hooks::next_tick_refresh(&sched).is_some(),
            ticks,
            "idle {idle:?}"
        );
    }
}

/// The refresher follows the shortest idle of the *live* tick-stamped timeouts: while a
/// 1 s timeout lives, touching a 160 s one refreshes every 62.5 ms; once the short one is
/// dropped, every 10 s. Counted in refresh schedules (when the next refresh is due), not
/// in time.
#[test]
fn the_refresh_interval_grows_back_when_the_shortest_idles_work_is_dropped() {
    let sched = Scheduler::new().unwrap();
    let long = sched.timeout(Duration::from_secs(160), |_| Next::Park);
    let short = sched.timeout(Duration::from_secs(1), |_| Next::Park);
    long.touch();
    let next = nicework::hooks::next_tick_refresh(&sched).expect("the touch schedules it");
    assert!(
        next <= Instant::now() + Duration::from_millis(63),
        "the 1 s timeout's interval (62.5 ms) serves while it lives"
    );
    drop(short);
    // Touch the long one until a refresh is scheduled at the long idle's interval.
    assert!(
        eventually(|| {
            long.touch();
            std::thread::sleep(Duration::from_millis(1));
            nicework::hooks::next_tick_refresh(&sched)
                .is_some_and(|at| at > Instant::now() + Duration::from_secs(1))
        }),
        "the refresher kept the dropped short timeout's interval"
    );
}

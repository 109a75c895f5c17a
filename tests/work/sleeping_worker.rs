//! The worker's sleep (on the timerfd or the portable alarm): arms, cancels and re-arms
//! racing the poller going to sleep; earlier arms waking it; zero wakeups while parked;
//! shutdown racing arms. Waits are liveness bounds, never timings;
//! assertions are counts and "never before the deadline".

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

use crate::common::{EVENTUALLY, Rng, eventually};

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);

fn sched(workers: usize) -> Scheduler {
    Scheduler::builder().workers(workers).build().unwrap()
}

/// A work that records each run's time, never earlier than `not_before` (checked).
struct Probe {
    work: Work,
    runs: Arc<AtomicUsize>,
    early: Arc<AtomicUsize>,
    not_before: Arc<Mutex<Option<Instant>>>,
}

fn probe(sched: &Scheduler) -> Probe {
    let runs = Arc::new(AtomicUsize::new(0));
    let early = Arc::new(AtomicUsize::new(0));
    let not_before: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let (r, e, nb) = (runs.clone(), early.clone(), not_before.clone());
    let work = sched.work(move |_| {
        let now = Instant::now();
        if let Some(at) = *nb.lock().unwrap() {
            if now < at {
                e.fetch_add(1, Ordering::SeqCst);
            }
        }
        r.fetch_add(1, Ordering::SeqCst);
        Next::Park
    });
    Probe {
        work,
        runs,
        early,
        not_before,
    }
}

impl Probe {
    /// Arms with `delay` and records the earliest legal run time first.
    fn arm(&self, delay: Duration) {
        *self.not_before.lock().unwrap() = Some(Instant::now() + delay);
        self.work.reschedule(delay);
    }
}

// An earlier arm wakes the sleeping poller, with a far anchor: the poller sleeps for an
// hour; a short arm from another thread, timed to land around the poller's way to sleep,
// must wake it.
#[test]
fn a_short_arm_racing_the_poller_to_sleep_wakes_it() {
    for workers in [1, 2, 4] {
        let sched = sched(workers);
        let _anchor = sched.work(|_| Next::Park);
        assert!(_anchor.schedule(HOUR));
        let p = probe(&sched);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ workers as u64);
        for i in 0..50 {
            let before = p.runs.load(Ordering::SeqCst);
            // Spin a random few microseconds so the arm lands anywhere in the poller's
            // program/sleep window.
            let spin = Instant::now() + Duration::from_micros(rng.next() % 300);
            while Instant::now() < spin {}
            let delay = Duration::from_micros(rng.next() % 2_000);
            p.arm(delay);
            assert!(
                eventually(|| p.runs.load(Ordering::SeqCst) > before),
                "workers={workers} iteration {i}: a {delay:?} arm never ran (lost wakeup)"
            );
        }
        assert_eq!(p.early.load(Ordering::SeqCst), 0, "ran before its deadline");
    }
}

// An earlier arm wakes the sleeping poller: armed for an hour, then another for 10 ms,
// from other threads.
#[test]
fn an_hour_then_ten_ms_runs_the_ten_ms_one() {
    for workers in [1, 2, 3] {
        let sched = sched(workers);
        for _ in 0..20 {
            let far = sched.work(|_| Next::Park);
            let p = probe(&sched);
            let s = std::thread::spawn(move || {
                far.schedule(HOUR);
                far
            });
            let far = s.join().unwrap();
            std::thread::sleep(2 * MS);
            std::thread::scope(|scope| {
                scope.spawn(|| p.arm(10 * MS));
            });
            assert!(eventually(|| p.runs.load(Ordering::SeqCst) == 1));
            assert_eq!(p.early.load(Ordering::SeqCst), 0);
            far.cancel();
        }
    }
}

// An earlier arm wakes the sleeping poller, by reschedule: the same work moved from an
// hour to now-ish.
#[test]
fn a_work_moved_from_an_hour_to_a_millisecond_runs() {
    for workers in [1, 2, 4] {
        let sched = sched(workers);
        let p = probe(&sched);
        let mut rng = Rng(77 + workers as u64);
        for i in 0..35 {
            let before = p.runs.load(Ordering::SeqCst);
            p.work.reschedule(HOUR);
            let spin = Instant::now() + Duration::from_micros(rng.next() % 500);
            while Instant::now() < spin {}
            let delay = Duration::from_micros(rng.next() % 1_500);
            p.arm(delay);
            assert!(
                eventually(|| p.runs.load(Ordering::SeqCst) > before),
                "workers={workers} iteration {i}: moved earlier, never ran"
            );
        }
        assert_eq!(p.early.load(Ordering::SeqCst), 0);
    }
}

// Many threads re-arm their works earlier and later in a loop, cancel some,
// then each arms one last short delay: every last arm runs, none early.
#[test]
fn many_threads_rearming_earlier_and_later_lose_no_final_arm() {
    for workers in [1, 2, 4] {
        let sched = sched(workers);
        let threads = 6;
        let probes: Vec<Arc<Probe>> = (0..threads).map(|_| Arc::new(probe(&sched))).collect();
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = probes
            .iter()
            .enumerate()
            .map(|(t, p)| {
                let p = p.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(1234 + t as u64 * 7 + workers as u64);
                    barrier.wait();
                    for round in 0..25 {
                        for _ in 0..20 {
                            match rng.next() % 6 {
                                0 => {
                                    p.work.reschedule(HOUR);
                                }
                                1 => {
                                    p.work.reschedule(Duration::from_micros(rng.next() % 3_000));
                                }
                                2 => {
                                    p.work.cancel();
                                }
                                3 => {
                                    p.work
                                        .schedule_within(Duration::from_micros(rng.next() % 5_000));
                                }
                                4 => {
                                    p.work
                                        .reschedule(Duration::from_millis(50 + rng.next() % 50));
                                }
                                _ => {
                                    p.work.touch();
                                }
                            }
                        }
                        // The final arm of the round must run.
                        let before = p.runs.load(Ordering::SeqCst);
                        p.work.cancel();
                        let delay = Duration::from_micros(rng.next() % 2_000);
                        *p.not_before.lock().unwrap() = Some(Instant::now() + delay);
                        p.work.reschedule(delay);
                        assert!(
                            eventually(|| p.runs.load(Ordering::SeqCst) > before),
                            "workers={workers} thread {t} round {round}: final arm lost"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        for p in &probes {
            assert_eq!(
                p.early.load(Ordering::SeqCst),
                0,
                "a run before its deadline"
            );
        }
    }
}

fn settle(sched: &Scheduler) {
    crate::common::settle_wakeups(sched);
}

// Parked after cancels and re-arms, 1, 2 and 4 workers: once the old deadlines
// passed, the count stays flat.
#[test]
fn parked_after_cancels_and_rearms_sleeps_without_wakeups() {
    // The worker counts run side by side: each waits for its wakeups to hold still.
    std::thread::scope(|scope| {
        for workers in [1, 2, 4] {
            scope.spawn(move || {
                let sched = sched(workers);
                let works: Vec<Work> = (0..200).map(|_| sched.work(|_| Next::Park)).collect();
                let mut rng = Rng(99 + workers as u64);
                for w in &works {
                    w.schedule(Duration::from_micros(rng.next() % 30_000));
                }
                for (i, w) in works.iter().enumerate() {
                    match i % 4 {
                        0 => {
                            w.cancel();
                        }
                        1 => {
                            w.reschedule(HOUR);
                            w.cancel();
                        }
                        2 => {
                            w.reschedule(Duration::from_millis(5));
                        }
                        _ => {
                            w.reschedule(HOUR);
                            w.reschedule(Duration::from_millis(1));
                            w.cancel_sync();
                        }
                    }
                }
                assert!(eventually(|| sched.metrics().armed == 0));
                std::thread::sleep(Duration::from_millis(60)); // the last old deadline passes
                settle(&sched);
                let before = sched.metrics().worker_wakeups;
                std::thread::sleep(Duration::from_millis(200));
                assert_eq!(
                    sched.metrics().worker_wakeups,
                    before,
                    "workers={workers}: an idle worker woke up"
                );
            });
        }
    });
}

// With a Duration::MAX work armed (never due): no wakeups either.
#[test]
fn a_never_due_work_costs_no_wakeups() {
    // The worker counts run side by side: each waits for its wakeups to hold still.
    std::thread::scope(|scope| {
        for workers in [1, 2] {
            scope.spawn(move || {
                let sched = sched(workers);
                let never = sched.work(|_| Next::Park);
                assert!(never.schedule(Duration::MAX));
                let zero = probe(&sched);
                zero.arm(Duration::ZERO);
                assert!(eventually(|| zero.runs.load(Ordering::SeqCst) == 1));
                settle(&sched);
                let before = sched.metrics().worker_wakeups;
                std::thread::sleep(Duration::from_millis(200));
                assert_eq!(sched.metrics().worker_wakeups, before, "workers={workers}");
                assert!(never.is_pending());
                assert_eq!(never.stats().runs, 0);
                // A later short arm still wakes the poller sleeping for "never".
                zero.arm(3 * MS);
                assert!(eventually(|| zero.runs.load(Ordering::SeqCst) == 2));
                // Re-program for MAX again and again (each earlier than none, later than the
                // last): the worker keeps sleeping.
                for _ in 0..50 {
                    never.reschedule(Duration::MAX);
                    never.reschedule(HOUR * 24 * 365);
                }
                settle(&sched);
                let before = sched.metrics().worker_wakeups;
                std::thread::sleep(Duration::from_millis(200));
                assert_eq!(sched.metrics().worker_wakeups, before, "workers={workers}");
            });
        }
    });
}

// A work re-armed later and later (a touch-like reaper): how many wakeups per run. The
// poller wakes at most once per entry tick it slept for: bounded by the re-arms, not
// a storm. Printed for comparison between builds.
#[test]
fn rearming_later_repeatedly_does_not_storm() {
    for workers in [1, 2] {
        let sched = sched(workers);
        let p = probe(&sched);
        p.arm(40 * MS);
        std::thread::sleep(5 * MS);
        settle_short();
        let before = sched.metrics().worker_wakeups;
        let rearms = 40;
        for _ in 0..rearms {
            p.arm(40 * MS); // later each time: lock-free, no kick
            std::thread::sleep(5 * MS);
        }
        assert!(eventually(|| p.runs.load(Ordering::SeqCst) == 1));
        let during = sched.metrics().worker_wakeups - before;
        eprintln!("workers={workers}: {during} wakeups for {rearms} later re-arms over ~200ms");
        // The old entries come due every ~40 ms over ~240 ms: a handful of wakeups.
        // Anything in the order of the re-arm count means a wakeup per program.
        assert!(
            during < rearms as u64,
            "workers={workers}: {during} wakeups"
        );
        assert_eq!(p.early.load(Ordering::SeqCst), 0);
    }
}

fn settle_short() {
    std::thread::sleep(20 * MS);
}

// Dropping the last handle while threads arm (and re-arm earlier) joins
// every worker, with 1..8 workers.
#[test]
fn shutdown_racing_arms_never_hangs() {
    let mut rng = Rng(4242);
    for round in 0..12 {
        let workers = 1 + (round % 8);
        let sched = sched(workers);
        let stop = Arc::new(AtomicBool::new(false));
        let works: Vec<Arc<Work>> = (0..8)
            .map(|_| Arc::new(sched.work(|_| Next::Again)))
            .collect();
        let armers: Vec<_> = works
            .iter()
            .cloned()
            .enumerate()
            .map(|(t, w)| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(t as u64 + 1);
                    while !stop.load(Ordering::Relaxed) {
                        match rng.next() % 4 {
                            0 => {
                                w.reschedule(HOUR);
                            }
                            1 => {
                                w.reschedule(Duration::ZERO);
                            }
                            2 => {
                                w.schedule_within(Duration::from_micros(rng.next() % 500));
                            }
                            _ => {
                                w.cancel();
                            }
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_micros(rng.next() % 3_000));
        drop_within_bound(sched, &format!("round {round}, {workers} workers"));
        stop.store(true, Ordering::Relaxed);
        for a in armers {
            a.join().unwrap();
        }
        for w in &works {
            assert!(!w.is_pending() || !w.schedule(Duration::ZERO));
        }
    }
}

/// Drops the last handle on another thread and fails if that shutdown hangs.
fn drop_within_bound(sched: Scheduler, what: &str) {
    let (tx, rx) = mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(sched);
        let _ = tx.send(());
    });
    assert!(rx.recv_timeout(EVENTUALLY).is_ok(), "{what}: shutdown hung");
    dropper.join().unwrap();
}

// Shutdown while every worker is a parked sleeper (poller with no deadline,
// followers on the condvar), and while the poller sleeps for a far deadline.
#[test]
fn shutdown_of_idle_and_far_sleeping_workers_never_hangs() {
    for workers in [1, 2, 4, 16] {
        for far in [false, true] {
            let sched = sched(workers);
            let w = sched.work(|_| Next::Park);
            if far {
                w.schedule(HOUR);
            }
            std::thread::sleep(10 * MS);
            drop_within_bound(sched, &format!("{workers} workers, far={far}"));
            assert!(!w.schedule(Duration::ZERO));
        }
    }
}

// A zero-delay arm racing a long arm of another work, from two threads at once, many
// times: the zero one runs each time.
#[test]
fn zero_and_hour_arms_from_two_threads() {
    for workers in [1, 2] {
        let sched = sched(workers);
        let far = Arc::new(sched.work(|_| Next::Park));
        let p = Arc::new(probe(&sched));
        for i in 0..50 {
            let before = p.runs.load(Ordering::SeqCst);
            far.cancel();
            let barrier = Arc::new(Barrier::new(2));
            let (f, b1) = (far.clone(), barrier.clone());
            let t = std::thread::spawn(move || {
                b1.wait();
                f.schedule(HOUR);
            });
            barrier.wait();
            p.arm(Duration::ZERO);
            t.join().unwrap();
            assert!(
                eventually(|| p.runs.load(Ordering::SeqCst) > before),
                "workers={workers} iteration {i}"
            );
        }
    }
}

// Periodic works at a few ms across workers never run early and keep running.
#[test]
fn periodic_works_never_run_early_under_rearm_noise() {
    let sched = sched(2);
    let early = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicU64::new(0));
    let works: Vec<Work> = (0..4)
        .map(|i| {
            let (early, runs) = (early.clone(), runs.clone());
            let period = Duration::from_millis(2 + i);
            let last: Mutex<Option<Instant>> = Mutex::new(None);
            sched.every(period, move |_| {
                let now = Instant::now();
                let mut last = last.lock().unwrap();
                if let Some(prev) = *last {
                    // Fixed delay from the end of the previous run: never sooner.
                    if now < prev + period {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                }
                runs.fetch_add(1, Ordering::SeqCst);
                *last = Some(Instant::now());
                Next::Again
            })
        })
        .collect();
    let noise = sched.work(|_| Next::Park);
    let start = Instant::now();
    let mut rng = Rng(5);
    while start.elapsed() < Duration::from_millis(500) {
        noise.reschedule(Duration::from_micros(rng.next() % 10_000));
        if rng.next() % 3 == 0 {
            noise.cancel();
        }
    }
    assert!(eventually(|| runs.load(Ordering::SeqCst) > 100));
    assert_eq!(early.load(Ordering::SeqCst), 0);
    drop(works);
}

/// A waker that sets a flag and signals a condvar (a host's event-loop wake).
struct HostWake {
    woken: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl std::task::Wake for HostWake {
    fn wake(self: Arc<Self>) {
        *self.woken.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

// Hosted: a host that sleeps until `next_deadline` or its waker, while another
// thread arms far then near (and cancels) in a loop: every near arm runs, none early.
#[test]
fn a_hosted_loop_sleeping_on_next_deadline_and_waker_runs_every_near_arm() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let wake = Arc::new(HostWake {
        woken: Mutex::new(false),
        cv: std::sync::Condvar::new(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let host = {
        let (wake, stop) = (wake.clone(), stop.clone());
        std::thread::spawn(move || {
            driver.set_waker(std::task::Waker::from(wake.clone()));
            while !stop.load(Ordering::SeqCst) {
                driver.run_due();
                let mut woken = wake.woken.lock().unwrap();
                if *woken {
                    *woken = false;
                    continue;
                }
                // Read after the waker is registered (it is, from before the loop).
                let timeout = match driver.next_deadline() {
                    Some(at) => at.saturating_duration_since(Instant::now()),
                    None => Duration::from_secs(3600),
                };
                let (mut woken, _) = wake.cv.wait_timeout(woken, timeout).unwrap();
                *woken = false;
            }
            driver
        })
    };
    let far = sched.work(|_| Next::Park);
    let p = probe(&sched);
    let mut rng = Rng(31337);
    for i in 0..100 {
        let before = p.runs.load(Ordering::SeqCst);
        far.reschedule(HOUR);
        let spin = Instant::now() + Duration::from_micros(rng.next() % 300);
        while Instant::now() < spin {}
        if rng.next() % 2 == 0 {
            far.cancel();
        }
        p.arm(Duration::from_micros(rng.next() % 2_000));
        assert!(
            eventually(|| p.runs.load(Ordering::SeqCst) > before),
            "iteration {i}: the host never ran a near arm"
        );
    }
    assert_eq!(p.early.load(Ordering::SeqCst), 0);
    stop.store(true, Ordering::SeqCst);
    far.reschedule(Duration::ZERO); // wakes the host so it sees `stop`
    let driver = host.join().unwrap();
    assert_eq!(sched.metrics().worker_wakeups, 0);
    drop(driver);
    assert!(!p.work.schedule(Duration::ZERO));
}

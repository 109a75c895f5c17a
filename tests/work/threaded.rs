//! The work semantics on real schedulers: worker threads, the timerfd, priorities.
//! Waits are liveness bounds; assertions are on counts and states, never on timings.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::{EVENTUALLY, drop_flag, eventually};
use nicework::{Next, Scheduler, Work};

const MS: Duration = Duration::from_millis(1);

// One work never runs on two threads at once.
#[test]
fn a_work_never_runs_on_two_workers_at_once() {
    // Normal-priority workers: the subject is non-reentrancy, and nice-19 workers beside
    // a loaded machine's busy threads may not run the work once before the pokers end.
    let sched = common::normal_priority_builder()
        .workers(2)
        .build()
        .unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let (i, o, r) = (inside.clone(), overlaps.clone(), runs.clone());
    let work = Arc::new(sched.work(move |_| {
        if i.swap(true, Ordering::SeqCst) {
            o.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_micros(200));
        i.store(false, Ordering::SeqCst);
        r.fetch_add(1, Ordering::SeqCst);
        Next::Yield
    }));
    work.schedule(Duration::ZERO);
    let pokers: Vec<_> = (0..2)
        .map(|_| {
            let work = work.clone();
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    work.touch();
                    work.schedule(Duration::ZERO);
                    work.reschedule(Duration::ZERO);
                    std::thread::yield_now();
                }
            })
        })
        .collect();
    for poker in pokers {
        poker.join().unwrap();
    }
    // The work yields for ever: it runs on until cancelled.
    assert!(common::eventually(|| runs.load(Ordering::SeqCst) > 0));
    work.cancel_sync();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[test]
fn a_due_work_runs_on_a_worker_thread() {
    let sched = Scheduler::builder().name("semantic").build().unwrap();
    let (tx, rx) = mpsc::channel();
    let work = sched.work(move |_| {
        tx.send(std::thread::current().name().map(str::to_owned))
            .unwrap();
        Next::Park
    });
    work.schedule(5 * MS);
    let name = rx.recv_timeout(EVENTUALLY).unwrap();
    assert_eq!(name.as_deref(), Some("semantic-0"));
}

// A zero delay runs at the next opportunity.
#[test]
fn zero_delay_does_not_wait_for_the_next_tick() {
    // With a 10 s slack the next tick is up to 10 s away; delay zero must not wait for it.
    let sched = Scheduler::builder()
        .slack(Duration::from_secs(10))
        .build()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let work = sched.work(move |_| {
        tx.send(()).unwrap();
        Next::Park
    });
    let start = Instant::now();
    work.schedule(Duration::ZERO);
    rx.recv_timeout(EVENTUALLY).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "ran on a tick, not at once"
    );
}

#[test]
fn an_earlier_deadline_reprograms_the_sleeping_worker() {
    let sched = Scheduler::new().unwrap();
    let far = sched.work(|_| Next::Park);
    far.schedule(Duration::from_secs(3600));
    std::thread::sleep(20 * MS); // the worker is now asleep until the far deadline
    let (tx, rx) = mpsc::channel();
    let near = sched.work(move |_| {
        tx.send(()).unwrap();
        Next::Park
    });
    near.schedule(10 * MS);
    rx.recv_timeout(EVENTUALLY).unwrap();
    assert!(far.is_pending());
}

// Cancel_sync and drop refuse re-arms and wait for the run in progress.
#[test]
fn cancel_sync_waits_for_the_running_callback_and_refuses_its_rearm() {
    let sched = Scheduler::new().unwrap();
    let started = Arc::new(Barrier::new(2));
    let finished = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicUsize::new(0));
    let (s, f, r) = (started.clone(), finished.clone(), runs.clone());
    let work = sched.work(move |_| {
        if r.fetch_add(1, Ordering::SeqCst) == 0 {
            s.wait();
            std::thread::sleep(50 * MS);
        }
        f.store(true, Ordering::SeqCst);
        Next::After(Duration::ZERO)
    });
    work.schedule(Duration::ZERO);
    started.wait();
    assert!(work.is_running());
    work.cancel_sync();
    assert!(
        finished.load(Ordering::SeqCst),
        "returned while the callback ran"
    );
    assert!(
        !work.is_running() && !work.is_pending(),
        "the callback's re-arm was refused"
    );
    let after = runs.load(Ordering::SeqCst);
    std::thread::sleep(30 * MS);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        after,
        "ran after cancel_sync returned"
    );
}

#[test]
fn drop_waits_for_the_running_callback_and_frees_the_closure() {
    let sched = Scheduler::new().unwrap();
    let started = Arc::new(Barrier::new(2));
    let (guard, dropped) = drop_flag();
    let in_callback = Arc::new(AtomicBool::new(false));
    let (s, inside) = (started.clone(), in_callback.clone());
    let work = sched.work(move |_| {
        let _keep = &guard;
        inside.store(true, Ordering::SeqCst);
        s.wait();
        std::thread::sleep(30 * MS);
        inside.store(false, Ordering::SeqCst);
        Next::Again
    });
    work.schedule(Duration::ZERO);
    started.wait();
    drop(work);
    assert!(!in_callback.load(Ordering::SeqCst));
    assert!(dropped.load(Ordering::SeqCst));
}

// From inside the own callback nothing waits for itself.
#[test]
fn cancel_flush_and_drop_from_inside_the_callback_on_a_worker() {
    let sched = Scheduler::new().unwrap();
    let slot: Arc<Mutex<Option<Work>>> = Arc::default();
    let inner = slot.clone();
    let (tx, rx) = mpsc::channel();
    let (guard, dropped) = drop_flag();
    let work = sched.every(MS, move |_| {
        let _keep = &guard;
        let mut slot = inner.lock().unwrap();
        let work = slot.as_ref().unwrap();
        let flushed = work.flush();
        work.cancel_sync();
        drop(slot.take());
        tx.send(flushed).unwrap();
        Next::Again
    });
    *slot.lock().unwrap() = Some(work);
    assert!(
        !rx.recv_timeout(EVENTUALLY).unwrap(),
        "flush from inside returned true"
    );
    assert!(eventually(|| dropped.load(Ordering::SeqCst)));
    assert_eq!(sched.metrics().armed, 0);
}

// A panic is caught and poisons only its work.
#[test]
fn a_panic_on_a_worker_poisons_only_that_work() {
    let sched = Scheduler::new().unwrap();
    let bad = sched.every(MS, |_| panic!("boom on a worker"));
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let _good = sched.every(MS, move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Next::Again
    });
    assert!(eventually(|| bad.is_poisoned()));
    let seen = runs.load(Ordering::SeqCst);
    assert!(
        eventually(|| runs.load(Ordering::SeqCst) > seen + 5),
        "worker died"
    );
    assert_eq!(bad.stats().runs, 1);
}

// Idle costs nothing.
#[test]
fn with_every_work_parked_the_worker_sleeps_without_wakeups() {
    let sched = Scheduler::new().unwrap();
    let works: Vec<Work> = (0..10_000)
        .map(|_| sched.every(MS, |_| Next::Park))
        .collect();
    assert!(eventually(|| works.iter().all(|w| w.stats().runs == 1)));
    assert!(eventually(|| sched.metrics().armed == 0));
    std::thread::sleep(20 * MS); // let the last (spurious) expiry pass
    let before = sched.metrics().worker_wakeups;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        sched.metrics().worker_wakeups,
        before,
        "the idle worker woke up"
    );
}

/// An arm made by another thread while the callback runs, which the callback ends with
/// `Stop`, is not lost: `schedule` returned `true` and its instance runs after this one.
#[test]
fn another_threads_arm_during_a_run_that_returns_stop_runs() {
    let sched = Scheduler::new().unwrap();
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let work = Arc::new(sched.work(move |_| {
        if r.fetch_add(1, Ordering::SeqCst) == 0 {
            started_tx.send(()).unwrap();
            release_rx.lock().unwrap().recv_timeout(EVENTUALLY).unwrap();
        }
        Next::Stop
    }));
    assert!(work.schedule(Duration::ZERO));
    started.recv_timeout(EVENTUALLY).unwrap();
    let other = work.clone();
    let armed = std::thread::spawn(move || other.schedule(Duration::ZERO))
        .join()
        .unwrap();
    assert!(armed, "a running work can be armed");
    release.send(()).unwrap();
    assert!(eventually(
        || runs.load(Ordering::SeqCst) == 2 && !work.is_running()
    ));
    assert!(!work.is_pending());
    work.touch();
    assert!(
        !work.is_pending(),
        "stopped by the second run: touch does not arm it"
    );
}

// A touch racing with a run that parks is never lost.
#[test]
fn touch_racing_with_park_is_never_lost() {
    let sched = Scheduler::new().unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let work = sched.work(move |_| {
        s.fetch_add(1, Ordering::SeqCst);
        Next::Park
    });
    work.schedule(Duration::ZERO);
    for round in 0..3000 {
        let before = started.load(Ordering::SeqCst);
        work.touch();
        // Covered: the work is armed, or a run starts after the touch. (A touch that finds
        // the work pending may be followed at once by the worker taking that instance, so
        // "pending" can turn into "about to start" between the touch and this check: wait
        // for either state instead of sampling once. A lost touch leaves the work parked
        // for good, and this times out.)
        assert!(
            eventually(|| work.is_pending() || started.load(Ordering::SeqCst) > before),
            "touch lost in round {round}"
        );
        if round % 3 == 0 {
            std::thread::sleep(Duration::from_micros(1100));
        }
    }
}

// Fixed-delay re-arm, lateness recorded.
#[test]
fn a_stalled_work_is_rearmed_from_the_end_of_its_run_and_lateness_is_recorded() {
    let sched = Scheduler::new().unwrap();
    let ends = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let e = ends.clone();
    let work = sched.every(5 * MS, move |cx| {
        std::thread::sleep(20 * MS); // each run is longer than the period
        e.lock().unwrap().push((cx.deadline(), Instant::now()));
        Next::Again
    });
    assert!(eventually(|| ends.lock().unwrap().len() >= 4));
    work.cancel_sync();
    let ends = ends.lock().unwrap();
    for pair in ends.windows(2) {
        let (_, previous_end) = pair[0];
        let (deadline, _) = pair[1];
        assert!(
            deadline >= previous_end + 5 * MS,
            "burst catch-up instead of fixed delay"
        );
    }
    // A work kept waiting by another one's long run records its lateness.
    let blocker_started = Arc::new(Barrier::new(2));
    let b = blocker_started.clone();
    let blocker = sched.work(move |_| {
        b.wait();
        std::thread::sleep(50 * MS);
        Next::Park
    });
    let late = sched.work(|_| Next::Park);
    blocker.schedule(Duration::ZERO);
    blocker_started.wait();
    late.schedule(Duration::ZERO);
    assert!(eventually(|| late.stats().runs == 1));
    assert!(late.stats().lateness_max >= 10 * MS);
}

// The worker runs at its priority from its first run.
// Nice values and `SCHED_IDLE` are Linux's (see `Priority` for what other OSes set).
#[cfg(target_os = "linux")]
#[test]
fn the_worker_runs_at_its_priority_from_the_first_run() {
    use nicework::Priority;

    for (priority, nice, policy) in [
        (Priority::Nice(19), 19, libc::SCHED_OTHER),
        (Priority::Nice(7), 7, libc::SCHED_OTHER),
        (Priority::Idle, 19, libc::SCHED_IDLE),
        (Priority::Normal, common::current_nice(), libc::SCHED_OTHER),
    ] {
        let sched = Scheduler::builder().priority(priority).build().unwrap();
        let (tx, rx) = mpsc::channel();
        let work = sched.work(move |_| {
            tx.send((common::current_nice(), common::current_policy()))
                .unwrap();
            Next::Park
        });
        work.schedule(Duration::ZERO);
        assert_eq!(
            rx.recv_timeout(EVENTUALLY).unwrap(),
            (nice, policy),
            "{priority}"
        );
    }
}

#[test]
fn several_workers_share_due_works() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let threads = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let arrived = Arc::new(AtomicUsize::new(0));
    let works: Vec<Work> = (0..2)
        .map(|_| {
            let (t, a) = (threads.clone(), arrived.clone());
            sched.work(move |_| {
                t.lock().unwrap().insert(std::thread::current().id());
                // Both runs must overlap to record two threads; a bounded wait, so a
                // failure is reported instead of blocking the worker forever.
                a.fetch_add(1, Ordering::SeqCst);
                eventually(|| a.load(Ordering::SeqCst) == 2);
                Next::Park
            })
        })
        .collect();
    for work in &works {
        work.schedule(Duration::ZERO);
    }
    assert!(eventually(|| works.iter().all(|w| w.stats().runs == 1)));
    assert_eq!(threads.lock().unwrap().len(), 2);
}

#[test]
fn flush_of_a_running_work_waits_for_it() {
    let sched = Scheduler::new().unwrap();
    let started = Arc::new(Barrier::new(2));
    let done = Arc::new(AtomicBool::new(false));
    let (s, d) = (started.clone(), done.clone());
    let work = sched.work(move |_| {
        s.wait();
        std::thread::sleep(30 * MS);
        d.store(true, Ordering::SeqCst);
        Next::Park
    });
    work.schedule(Duration::ZERO);
    started.wait();
    assert!(work.flush());
    assert!(done.load(Ordering::SeqCst));
}

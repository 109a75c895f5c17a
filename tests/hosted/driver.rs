//! Hosted schedulers (`build_hosted`): the host's thread runs the works through the
//! `Driver`, in real time, with `next_deadline`, the waker and the descriptor telling it
//! when. Waits are for states; nothing asserts a duration.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use common::wakers::counting_waker;
#[cfg(unix)]
use common::wakers::readable;
use common::{EVENTUALLY, drop_flag, eventually};
use nicework::{Driver, Error, IdSpace, Next, Priority, Scheduler};

/// Runs the host loop until `done` holds: sleeps until the next deadline (at most 1 ms,
/// so a test never depends on one wake source), then `run_due`.
fn host_until(driver: &Driver, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > EVENTUALLY {
            return false;
        }
        driver.run_due();
        let until = driver
            .next_deadline()
            .unwrap_or_else(|| Instant::now() + Duration::from_millis(1));
        let nap = until
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(1));
        std::thread::sleep(nap);
    }
    true
}

#[test]
fn workers_or_priority_on_a_hosted_build_are_an_error() {
    let err = Scheduler::builder().workers(2).build_hosted().unwrap_err();
    assert!(matches!(err, Error::NotHosted("workers")), "{err:?}");
    assert_eq!(
        err.to_string(),
        "workers does not apply to a hosted scheduler: the host's threads run its works"
    );
    let err = Scheduler::builder()
        .priority(Priority::Normal)
        .build_hosted()
        .unwrap_err();
    assert!(matches!(err, Error::NotHosted("priority")), "{err:?}");
    // The other settings apply.
    let (sched, _driver) = Scheduler::builder()
        .name("host")
        .slack(Duration::from_millis(2))
        .build_hosted()
        .unwrap();
    assert_eq!((sched.workers(), sched.is_manual()), (0, false));
}

#[test]
fn run_due_runs_due_works_on_the_calling_thread_in_deadline_order() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let me = std::thread::current().id();
    let works: Vec<_> = [3u64, 1, 2]
        .into_iter()
        .map(|ms| {
            let order = order.clone();
            let work = sched.work(move |_| {
                assert_eq!(std::thread::current().id(), me);
                order.lock().unwrap().push(ms);
                Next::Park
            });
            work.schedule(Duration::from_millis(ms));
            work
        })
        .collect();
    assert_eq!(driver.run_due(), 0, "nothing is due yet");
    std::thread::sleep(Duration::from_millis(10));
    assert!(host_until(&driver, || order.lock().unwrap().len() == 3));
    assert_eq!(*order.lock().unwrap(), [1, 2, 3]);
    assert_eq!(driver.next_deadline(), None, "every work parked");
    assert_eq!(driver.run_due(), 0);
    drop(works);
}

#[test]
fn next_deadline_is_never_after_the_earliest_deadline_plus_the_slack() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let slack = Duration::from_millis(1);
    let work = sched.work(|_| Next::Park);
    for ms in [5_000u64, 50, 700, 3, 40_000] {
        work.reschedule(Duration::from_millis(ms));
        let deadline = work.deadline().unwrap();
        let next = driver.next_deadline().unwrap();
        assert!(
            next <= deadline + slack,
            "{ms} ms: {next:?} after {deadline:?}"
        );
    }
    work.cancel();
    // The cancelled entry may still wake the host once; it runs nothing.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(driver.run_due(), 0);
}

/// The case a manual scheduler gets wrong: a timeout touched from another thread in real
/// time never reaps while the touches come faster than its idle time.
#[test]
fn a_timeout_touched_from_another_thread_does_not_run_while_touched() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let idle = Duration::from_millis(60);
    let ran_at = Arc::new(Mutex::new(Vec::new()));
    let seen = ran_at.clone();
    let reaper = Arc::new(sched.timeout(idle, move |_| {
        seen.lock().unwrap().push(Instant::now());
        Next::Stop
    }));
    let last_touch = Arc::new(Mutex::new(Instant::now()));
    let touching = Arc::new(AtomicBool::new(true));
    let toucher = {
        let (reaper, last_touch, touching) = (reaper.clone(), last_touch.clone(), touching.clone());
        std::thread::spawn(move || {
            for _ in 0..40 {
                reaper.touch();
                *last_touch.lock().unwrap() = Instant::now();
                std::thread::sleep(Duration::from_millis(5));
            }
            touching.store(false, SeqCst);
        })
    };
    assert!(host_until(&driver, || !touching.load(SeqCst)));
    toucher.join().unwrap();
    assert!(ran_at.lock().unwrap().is_empty(), "reaped while touched");
    assert!(host_until(&driver, || !ran_at.lock().unwrap().is_empty()));
    let ran = ran_at.lock().unwrap()[0];
    assert!(ran >= *last_touch.lock().unwrap() + idle, "reaped early");
}

/// A work that returns `Yield` four times, then `Park`, and the count of its runs.
pub(crate) fn yielding_five_times(sched: &Scheduler) -> (nicework::Work, Arc<AtomicUsize>) {
    let increments = Arc::new(AtomicUsize::new(0));
    let counted = increments.clone();
    let work = sched.work(move |_| {
        if counted.fetch_add(1, SeqCst) + 1 < 5 {
            Next::Yield
        } else {
            Next::Park
        }
    });
    (work, increments)
}

#[test]
fn a_yield_runs_once_per_run_due_call() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let (work, increments) = yielding_five_times(&sched);
    // A zero-delay reschedule from inside its own callback does not loop either.
    let again = Arc::new(AtomicUsize::new(0));
    let count = again.clone();
    let self_arming = Arc::new(Mutex::new(None::<Arc<nicework::Work>>));
    let slot = self_arming.clone();
    let looping = Arc::new(sched.work(move |_| {
        count.fetch_add(1, SeqCst);
        if let Some(me) = slot.lock().unwrap().as_ref() {
            me.reschedule(Duration::ZERO);
        }
        Next::Park
    }));
    *self_arming.lock().unwrap() = Some(looping.clone());
    work.schedule(Duration::ZERO);
    looping.schedule(Duration::ZERO);
    for call in 1..=3 {
        let runs = driver.run_due();
        assert!(runs <= 2, "call {call}: {runs} runs");
        assert!(increments.load(SeqCst) <= call);
        assert!(again.load(SeqCst) <= call);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(host_until(&driver, || increments.load(SeqCst) == 5));
    self_arming.lock().unwrap().take();
    looping.cancel();
}

#[test]
fn run_due_from_inside_a_callback_returns_0() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Arc::new(driver);
    let inner_runs = Arc::new(Mutex::new(None));
    let other = sched.work(|_| Next::Park);
    other.schedule(Duration::ZERO);
    let (d, seen) = (driver.clone(), inner_runs.clone());
    let work = sched.work(move |_| {
        *seen.lock().unwrap() = Some(d.run_due());
        Next::Park
    });
    work.schedule(Duration::ZERO);
    assert!(host_until(&driver, || inner_runs.lock().unwrap().is_some()));
    assert_eq!(*inner_runs.lock().unwrap(), Some(0));
    // A manual scheduler's callback cannot drive a hosted one either.
    let manual = Scheduler::manual();
    let (d, seen) = (driver.clone(), inner_runs.clone());
    let _w = manual.every(Duration::from_millis(1), move |_| {
        *seen.lock().unwrap() = Some(d.run_due() + 100);
        Next::Park
    });
    other.reschedule(Duration::ZERO);
    manual.advance(Duration::from_millis(1));
    assert_eq!(*inner_runs.lock().unwrap(), Some(100));
    drop(work);
}

#[test]
fn id_space_compaction_runs_under_run_due_and_shows_in_next_deadline() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let ids = IdSpace::builder()
        .scan_period(Duration::from_millis(10))
        .build(&sched);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| drop(ids.enter())).join().unwrap();
        }
    });
    let _mine = ids.enter();
    assert!(driver.next_deadline().is_some(), "the scan is armed");
    assert!(host_until(&driver, || ids.compaction_stats().runs >= 2));
    assert_eq!(ids.enter().get(), 0);
}

#[test]
fn dropping_the_driver_shuts_the_scheduler_down() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = ran.clone();
    let pending = sched.work(move |_| {
        counted.fetch_add(1, SeqCst);
        Next::Again
    });
    pending.schedule(Duration::from_millis(1));
    let (flag, freed) = drop_flag();
    let detached = sched.work(move |_| {
        let _keep = &flag;
        Next::Again
    });
    detached.schedule(Duration::from_secs(60));
    detached.detach();
    let (waker_count, waker) = counting_waker();
    driver.set_waker(waker);
    drop(driver);
    assert!(
        freed.load(SeqCst),
        "a detached work ends with the scheduler"
    );
    assert!(!pending.is_pending());
    assert!(!pending.schedule(Duration::ZERO), "no arm after shutdown");
    assert_eq!(sched.metrics().armed, 0);
    assert_eq!(waker_count.0.load(SeqCst), 1, "the host was told once");
    assert_eq!(ran.load(SeqCst), 0);
}

#[test]
fn dropping_the_driver_while_a_work_runs_on_the_host_lets_the_run_finish() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Arc::new(driver);
    let (started_tx, started) = mpsc::channel();
    let (release_tx, release) = mpsc::channel::<()>();
    let work = sched.work(move |_| {
        started_tx.send(()).unwrap();
        release.recv_timeout(EVENTUALLY).unwrap();
        Next::Again
    });
    work.schedule(Duration::ZERO);
    let host = {
        let driver = driver.clone();
        std::thread::spawn(move || driver.run_due())
    };
    started.recv_timeout(EVENTUALLY).unwrap();
    let dropper = std::thread::spawn(move || drop(Arc::into_inner(driver)));
    // The host still holds its clone; the last one goes once run_due returns.
    release_tx.send(()).unwrap();
    assert_eq!(host.join().unwrap(), 1);
    dropper.join().unwrap();
    assert!(eventually(|| !work.is_running()));
    assert!(
        !work.is_pending(),
        "the run's own Again is refused after shutdown"
    );
    drop(sched);
}

#[test]
fn the_waker_is_woken_when_the_next_deadline_moves_earlier_and_may_call_back_in() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Arc::new(driver);
    let (count, waker) = counting_waker();
    driver.set_waker(waker);
    let work = sched.work(|_| Next::Park);
    work.schedule(Duration::from_secs(10));
    assert_eq!(count.0.load(SeqCst), 1, "first deadline");
    work.reschedule(Duration::from_secs(20));
    assert_eq!(
        count.0.load(SeqCst),
        1,
        "later: the host already wakes earlier"
    );
    // From another thread, earlier.
    let w = Arc::new(work);
    let other = w.clone();
    std::thread::spawn(move || other.reschedule(Duration::from_secs(1)))
        .join()
        .unwrap();
    assert_eq!(count.0.load(SeqCst), 2, "moved earlier from another thread");
    // A waker that calls into nicework from inside wake (no lock is held then).
    struct Reentrant(Arc<Driver>, AtomicUsize);
    impl Wake for Reentrant {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.run_due();
            let _ = self.0.next_deadline();
            self.1.fetch_add(1, SeqCst);
        }
    }
    let reentrant = Arc::new(Reentrant(driver.clone(), AtomicUsize::new(0)));
    driver.set_waker(Waker::from(reentrant.clone()));
    w.reschedule(Duration::from_millis(500));
    assert_eq!(reentrant.1.load(SeqCst), 1);
    assert_eq!(count.0.load(SeqCst), 2, "the replaced waker is not woken");
    // A flush of a pending work runs on the caller, as everywhere.
    assert!(w.flush());
    assert_eq!(w.stats().runs, 1);
    drop(reentrant);
}

// Linux's timerfd turns readable at the deadline; the portable descriptor is a pipe that
// turns readable when the deadline moves earlier (the next test).
#[cfg(all(target_os = "linux", not(nicework_portable)))]
#[test]
fn the_descriptor_is_readable_once_the_next_deadline_passes_and_cleared_by_run_due() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    assert!(!readable(&driver));
    let work = sched.work(|_| Next::Park);
    work.schedule(Duration::from_secs(30));
    assert!(!readable(&driver));
    // Moved earlier from another thread: readable at the new deadline.
    let work = Arc::new(work);
    let other = work.clone();
    std::thread::spawn(move || other.reschedule(Duration::from_millis(3)))
        .join()
        .unwrap();
    assert!(eventually(|| readable(&driver)));
    assert_eq!(driver.run_due(), 1);
    assert!(!readable(&driver), "run_due clears it");
    // The first arm's entry stays until its tick (entries leave lazily): at most one more
    // look, 30 s out, that runs nothing.
    let next = driver.next_deadline();
    assert!(
        next.is_none_or(|at| at > Instant::now() + Duration::from_secs(20)),
        "{next:?}"
    );
}

#[test]
fn a_driver_moved_to_another_thread_runs_the_works_there() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let ran_on = Arc::new(Mutex::new(None));
    let seen = ran_on.clone();
    let _work = sched.every(Duration::from_millis(1), move |_| {
        *seen.lock().unwrap() = Some(std::thread::current().id());
        Next::Park
    });
    let host = std::thread::spawn(move || {
        assert!(host_until(&driver, || ran_on.lock().unwrap().is_some()));
        (std::thread::current().id(), *ran_on.lock().unwrap())
    });
    let (host_id, ran) = host.join().unwrap();
    assert_eq!(ran, Some(host_id));
}

/// An fd-driven host never finds the descriptor readable while `run_due` returns 0 and
/// the next deadline is still ahead (it would spin), also while the last `Scheduler`
/// handle is dropped and the scheduler shuts down under it.
/// The portable descriptor (other unixes, and Linux with `--cfg nicework_portable`) turns
/// readable whenever the next deadline moves earlier, from any thread, and `run_due`
/// clears it, also when nothing is due yet; a later deadline leaves it alone.
#[cfg(all(unix, not(all(target_os = "linux", not(nicework_portable)))))]
#[test]
fn the_portable_descriptor_is_readable_when_the_next_deadline_moves_earlier() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    assert!(!readable(&driver), "nothing armed");
    let work = sched.work(|_| Next::Park);
    work.schedule(Duration::from_secs(3600)); // the first deadline: earlier than none
    assert!(readable(&driver));
    assert_eq!(driver.run_due(), 0, "nothing is due yet");
    assert!(
        !readable(&driver),
        "run_due cleared it without running anything"
    );
    work.reschedule(Duration::from_secs(7200)); // later: nothing to tell
    assert!(!readable(&driver));
    std::thread::scope(|s| {
        s.spawn(|| sched.work(|_| Next::Stop).schedule(Duration::from_secs(60)));
    });
    assert!(readable(&driver), "moved earlier from another thread");
    assert_eq!(driver.run_due(), 0);
    assert!(!readable(&driver));
    let soon = sched.work(|_| Next::Stop);
    soon.schedule(Duration::from_millis(1));
    assert!(readable(&driver));
    assert!(eventually(|| {
        driver.run_due();
        soon.stats().runs == 1
    }));
    drop(sched);
    assert!(
        !readable(&driver),
        "quiet at shutdown: nothing is due again"
    );
}

// The descriptor is unix's (see `Driver`'s `AsFd`).
#[cfg(unix)]
#[test]
fn the_descriptor_is_never_readable_while_run_due_finds_nothing_due_around_shutdown() {
    let mut spins = 0;
    for _ in 0..30 {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let work = sched.every(Duration::from_millis(2), |_| Next::Again);
        work.schedule(Duration::from_millis(1));
        let started = AtomicBool::new(false);
        spins += std::thread::scope(|s| {
            let host = s.spawn(|| {
                let mut spins = 0;
                started.store(true, SeqCst);
                let end = Instant::now() + Duration::from_millis(30);
                while Instant::now() < end {
                    if readable(&driver)
                        && driver.run_due() == 0
                        && readable(&driver)
                        && driver
                            .next_deadline()
                            .is_none_or(|next| next > Instant::now())
                    {
                        spins += 1;
                    }
                }
                spins
            });
            while !started.load(SeqCst) {
                std::hint::spin_loop();
            }
            std::thread::sleep(Duration::from_millis(5));
            drop(sched);
            host.join().unwrap()
        });
        assert!(!work.schedule(Duration::ZERO));
        assert!(!readable(&driver), "disarmed at shutdown");
        assert_eq!(driver.next_deadline(), None);
    }
    assert_eq!(spins, 0, "run_due left a readable descriptor {spins} times");
}

//! A host thread held inside a long callback must not silence the others: while host
//! thread A's `run_due` runs a callback that waits for the test, an arm from another
//! thread that moves the earliest deadline earlier, and a deadline that passes, make the
//! descriptor readable (and the arm wakes the waker), so host thread B, which watches
//! only the descriptor (or only the waker and `next_deadline`), runs those works while A
//! is still inside. And `run_due` runs a work that yields once per call, and
//! `run_due_at_most` bounds a call, leaving the rest due at once.
//!
//! The descriptor-only hosts need the timerfd (Linux): the portable pipe turns readable
//! only when the next deadline may have moved earlier, and its hosts poll it with
//! `next_deadline` as their timeout, which the waker test covers.
//!
//! Every wait is for a state, bounded by `EVENTUALLY`; nothing asserts a duration.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use common::EVENTUALLY;
use common::wakers::counting_waker;
use nicework::{Driver, Next, Scheduler, Work};

/// A work whose callback says it started, then waits until `release` sends (or is
/// dropped), and a receiver for its start.
fn held_work(sched: &Scheduler) -> (Work, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let release_rx = std::sync::Mutex::new(release_rx);
    let work = sched.work(move |_| {
        let _ = started_tx.send(());
        let _ = release_rx.lock().unwrap().recv_timeout(EVENTUALLY);
        Next::Park
    });
    (work, started, release)
}

/// A work that counts its runs.
fn counted_work(sched: &Scheduler) -> (Work, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let work = sched.work(move |_| {
        counted.fetch_add(1, SeqCst);
        Next::Park
    });
    (work, runs)
}

/// Blocks until the driver's descriptor is readable or `EVENTUALLY` passes.
#[cfg(all(target_os = "linux", not(nicework_portable)))]
fn wait_readable(driver: &Driver) -> bool {
    use std::os::fd::{AsFd, AsRawFd};

    let mut pfd = libc::pollfd {
        fd: driver.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout_ms = EVENTUALLY.as_millis() as libc::c_int;
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    rc == 1 && pfd.revents & libc::POLLIN != 0
}

/// Host thread B: watches only the descriptor, then runs what is due, until `done`.
#[cfg(all(target_os = "linux", not(nicework_portable)))]
fn host_on_the_descriptor(driver: &Driver, done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > EVENTUALLY || !wait_readable(driver) {
            return false;
        }
        driver.run_due();
    }
    true
}

/// Starts host thread A's `run_due` on `held`, and returns once its callback runs.
fn hold_a_host(
    driver: &Arc<Driver>,
    held: &Work,
    started: &mpsc::Receiver<()>,
) -> std::thread::JoinHandle<usize> {
    held.schedule(Duration::ZERO);
    let host_a = {
        let driver = driver.clone();
        std::thread::spawn(move || driver.run_due())
    };
    started
        .recv_timeout(EVENTUALLY)
        .expect("host A runs the held work");
    host_a
}

#[cfg(all(target_os = "linux", not(nicework_portable)))]
#[test]
fn an_arm_during_another_hosts_long_callback_makes_the_descriptor_readable() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Arc::new(driver);
    let (held, started, release) = held_work(&sched);
    let (later, runs) = counted_work(&sched);
    let host_a = hold_a_host(&driver, &held, &started);
    // Nothing else is armed: the arm moves the earliest deadline earlier.
    assert!(later.schedule(Duration::from_millis(30)));
    assert!(
        host_on_the_descriptor(&driver, || runs.load(SeqCst) == 1),
        "host B never saw the arm made while host A was inside a callback"
    );
    assert!(held.is_running(), "host A is still inside its callback");
    release.send(()).unwrap();
    assert_eq!(host_a.join().unwrap(), 1);
}

#[cfg(all(target_os = "linux", not(nicework_portable)))]
#[test]
fn a_deadline_that_passes_during_another_hosts_long_callback_makes_the_descriptor_readable() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Arc::new(driver);
    let (held, started, release) = held_work(&sched);
    let (later, runs) = counted_work(&sched);
    // Armed before host A starts: it is in the timer structure, not due yet.
    assert!(later.schedule(Duration::from_millis(30)));
    let host_a = hold_a_host(&driver, &held, &started);
    assert!(
        host_on_the_descriptor(&driver, || runs.load(SeqCst) == 1),
        "host B never saw a deadline pass while host A was inside a callback"
    );
    assert!(held.is_running(), "host A is still inside its callback");
    release.send(()).unwrap();
    assert_eq!(host_a.join().unwrap(), 1);
}

#[test]
fn an_arm_during_another_hosts_long_callback_wakes_the_waker_and_shows_in_next_deadline() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Arc::new(driver);
    let (held, started, release) = held_work(&sched);
    let (later, runs) = counted_work(&sched);
    let host_a = hold_a_host(&driver, &held, &started);
    let (wakes, waker) = counting_waker();
    driver.set_waker(waker);
    assert!(later.schedule(Duration::from_millis(30)));
    assert!(wakes.0.load(SeqCst) >= 1, "the arm woke no waker");
    let next = driver.next_deadline().expect("a work is armed");
    assert!(next <= later.deadline().unwrap() + Duration::from_millis(2));
    // Host B on `next_deadline` alone: it sleeps until then, and runs the work.
    let start = Instant::now();
    while runs.load(SeqCst) == 0 && start.elapsed() < EVENTUALLY {
        let until = driver.next_deadline().unwrap_or_else(Instant::now);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        driver.run_due();
    }
    assert_eq!(runs.load(SeqCst), 1);
    assert!(held.is_running(), "host A is still inside its callback");
    release.send(()).unwrap();
    assert_eq!(host_a.join().unwrap(), 1);
}

#[test]
fn a_yield_runs_exactly_once_per_call_with_calls_back_to_back() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let (work, increments) = crate::driver::yielding_five_times(&sched);
    work.schedule(Duration::ZERO);
    for call in 1..=5 {
        assert_eq!(driver.run_due(), 1, "call {call}");
        assert_eq!(increments.load(SeqCst), call);
        if call < 5 {
            // The next increment is due at once: the host is told to come back now.
            assert!(driver.next_deadline().unwrap() <= Instant::now());
            #[cfg(unix)]
            assert!(common::wakers::readable(&driver), "call {call}");
        }
    }
    assert_eq!(driver.run_due(), 0);
    assert!(!work.is_pending());
}

#[test]
fn run_due_at_most_bounds_a_call_and_leaves_the_rest_due_at_once() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let works: Vec<Work> = (0..10)
        .map(|_| {
            let runs = runs.clone();
            sched.work(move |_| {
                runs.fetch_add(1, SeqCst);
                Next::Park
            })
        })
        .collect();
    for work in &works {
        work.schedule(Duration::ZERO);
    }
    assert_eq!(driver.run_due_at_most(0), 0);
    assert_eq!(runs.load(SeqCst), 0);
    assert_eq!(driver.run_due_at_most(3), 3);
    assert!(driver.next_deadline().unwrap() <= Instant::now());
    #[cfg(all(target_os = "linux", not(nicework_portable)))]
    assert!(common::wakers::readable(&driver));
    assert_eq!(driver.run_due_at_most(3), 3);
    assert_eq!(driver.run_due_at_most(usize::MAX), 4);
    assert_eq!(runs.load(SeqCst), 10);
    assert_eq!(driver.next_deadline(), None);
    #[cfg(all(target_os = "linux", not(nicework_portable)))]
    assert!(!common::wakers::readable(&driver));
}

#[test]
fn a_shutdown_from_a_callback_disarms_the_works_held_back_for_the_next_call() {
    // X yields (held back for the next call once it ran); W arms Y due at once, behind
    // X; Y drops the last handle. Y must come due in the call's own time unit, so retry
    // until the three run in one call.
    for _ in 0..2_000 {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let (flag, x_dropped) = common::drop_flag();
        let x = sched.work(move |_| {
            let _ = &flag;
            Next::Yield
        });
        let owner = Arc::new(std::sync::Mutex::new(Some(sched.clone())));
        let y = {
            let owner = owner.clone();
            Arc::new(sched.work(move |_| {
                drop(owner.lock().unwrap().take());
                Next::Park
            }))
        };
        let w = {
            let y = y.clone();
            sched.work(move |_| {
                y.schedule(Duration::ZERO);
                Next::Park
            })
        };
        x.schedule(Duration::ZERO);
        w.schedule(Duration::ZERO);
        drop(sched);
        if driver.run_due() != 3 {
            continue;
        }
        assert!(
            !x.is_pending(),
            "a held-back work stayed armed after the shutdown"
        );
        assert_eq!(x.deadline(), None);
        assert!(!x.schedule(Duration::ZERO), "shut down: arms are refused");
        x.detach();
        assert!(
            x_dropped.load(SeqCst),
            "a detached work's life ends at shutdown"
        );
        return;
    }
    panic!("the three works never ran in one call");
}

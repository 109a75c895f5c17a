//! Hosted schedulers and the waits without blocking under hostile use: two hosts at
//! once, wakers that call back in (and drop the driver or the scheduler), foreign arms
//! against an fd-driven host, futures polled from many threads, dropped early, or raced
//! with shutdown. Each asserts states and counts, never a duration.
use crate::common;

use std::future::Future;
#[cfg(unix)]
use std::os::fd::{AsFd, AsRawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

#[cfg(unix)]
use common::wakers::readable;
use common::wakers::{Wakes, counting_waker as counting, poll};
use common::{EVENTUALLY, drop_flag};
use nicework::{Driver, Next, Scheduler};

thread_local! { static CALL: std::cell::Cell<u64> = const { std::cell::Cell::new(0) }; }

/// A number for the calling thread, unique in the process.
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, SeqCst);
    }
    NUMBER.with(|n| *n)
}

#[test]
fn two_threads_run_due_never_run_a_work_twice_at_once_or_twice_per_call() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let bad = Arc::new(AtomicUsize::new(0));
    let mut works = Vec::new();
    for i in 0..8 {
        let busy = Arc::new(AtomicBool::new(false));
        let last: Arc<Mutex<(u64, u64)>> = Arc::new(Mutex::new((u64::MAX, 0)));
        let bad = bad.clone();
        let w = sched.every(Duration::from_millis(1), move |_| {
            if busy.swap(true, SeqCst) {
                bad.fetch_add(1, SeqCst);
            }
            let tid = thread_number();
            let call = CALL.with(|c| c.get());
            {
                let mut l = last.lock().unwrap();
                if *l == (tid, call) {
                    bad.fetch_add(1000, SeqCst);
                }
                *l = (tid, call);
            }
            std::hint::spin_loop();
            std::thread::sleep(Duration::from_micros(50 * (i % 3)));
            busy.store(false, SeqCst);
            if i % 2 == 0 {
                Next::Yield
            } else {
                Next::After(Duration::ZERO)
            }
        });
        w.schedule(Duration::ZERO);
        works.push(w);
    }
    let stop = Instant::now() + Duration::from_millis(400);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while Instant::now() < stop {
                    CALL.with(|c| c.set(c.get() + 1));
                    driver.run_due();
                }
            });
        }
    });
    assert_eq!(bad.load(SeqCst), 0);
    assert!(
        works.iter().all(|w| w.stats().runs > 5),
        "{:?}",
        works.iter().map(|w| w.stats().runs).collect::<Vec<_>>()
    );
}

#[test]
fn yield_plus_other_work_in_one_run_due() {
    let (sched, driver) = Scheduler::builder().back_off(false).build_hosted().unwrap();
    let y = Arc::new(AtomicUsize::new(0));
    let yc = y.clone();
    let wy = sched.work(move |_| {
        if yc.fetch_add(1, SeqCst) < 3 {
            Next::Yield
        } else {
            Next::Park
        }
    });
    let p = Arc::new(AtomicUsize::new(0));
    let pc = p.clone();
    let wp = sched.work(move |_| {
        pc.fetch_add(1, SeqCst);
        Next::Park
    });
    wy.schedule(Duration::ZERO);
    wp.schedule(Duration::ZERO);
    assert_eq!(driver.run_due(), 2);
    assert_eq!((y.load(SeqCst), p.load(SeqCst)), (1, 1));
    // The yield is due now: next_deadline must say so, and the next call runs it.
    let nd = driver.next_deadline().expect("yield armed");
    assert!(
        nd <= Instant::now() + Duration::from_millis(2),
        "{:?}",
        nd - Instant::now()
    );
    let deadline = Instant::now() + EVENTUALLY;
    while y.load(SeqCst) < 4 {
        assert!(Instant::now() < deadline);
        driver.run_due();
    }
    assert_eq!(p.load(SeqCst), 1);
}

struct SetWakerInWake {
    driver: Arc<Mutex<Option<Arc<Driver>>>>,
    n: AtomicUsize,
    other: Arc<Wakes>,
}
impl Wake for SetWakerInWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.n.fetch_add(1, SeqCst);
        let d = self.driver.lock().unwrap().clone();
        if let Some(d) = d {
            // Replace ourselves, then read the deadline and run_due inside the wake.
            d.set_waker(Waker::from(self.other.clone()));
            let _ = d.next_deadline();
            let _ = d.run_due();
            d.set_waker(Waker::from(self.clone()));
        }
    }
}

#[test]
fn set_waker_and_run_due_from_inside_wake() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Arc::new(driver);
    let (other, _) = counting();
    let me = Arc::new(SetWakerInWake {
        driver: Arc::new(Mutex::new(Some(driver.clone()))),
        n: AtomicUsize::new(0),
        other,
    });
    driver.set_waker(Waker::from(me.clone()));
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let w = sched.work(move |_| {
        r.fetch_add(1, SeqCst);
        Next::Park
    });
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        w.schedule(Duration::ZERO);
        tx.send(()).unwrap();
        w
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("deadlock: arm from another thread with a re-entrant waker");
    let w = t.join().unwrap();
    assert!(me.n.load(SeqCst) >= 1);
    // Also an arm on this thread.
    w.schedule(Duration::ZERO);
    assert!(me.n.load(SeqCst) >= 1);
    me.driver.lock().unwrap().take();
}

/// A waker that counts its wakes and drops what its slot holds (the `Driver`, the last
/// `Scheduler`) inside the first one.
struct DropInWake<T> {
    slot: Mutex<Option<T>>,
    n: AtomicUsize,
}
impl<T: Send + 'static> Wake for DropInWake<T> {
    fn wake(self: Arc<Self>) {
        self.n.fetch_add(1, SeqCst);
        let held = self.slot.lock().unwrap().take();
        drop(held);
    }
}

#[test]
fn waker_drops_the_driver_inside_wake() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let (flag, freed) = drop_flag();
    let me = Arc::new(DropInWake::<Driver> {
        slot: Mutex::new(None),
        n: AtomicUsize::new(0),
    });
    driver.set_waker(Waker::from(me.clone()));
    *me.slot.lock().unwrap() = Some(driver);
    let w = sched.work(move |_| {
        let _k = &flag;
        Next::Park
    });
    let d = sched.work(|_| Next::Park);
    assert!(
        d.schedule(Duration::from_secs(5)),
        "the arm that woke the waker"
    );
    d.detach();
    // Woken once for the arm (it dropped the driver), then once at shutdown (the same waker).
    assert!(me.slot.lock().unwrap().is_none());
    assert!(!w.schedule(Duration::ZERO), "arm after shutdown accepted");
    assert!(!w.is_pending());
    assert!(me.n.load(SeqCst) <= 2, "{}", me.n.load(SeqCst));
    drop(w);
    assert!(freed.load(SeqCst));
    drop(sched);
}

#[test]
fn waker_drops_last_scheduler_inside_wake_then_fd_and_run_due_do_not_spin() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let me = Arc::new(DropInWake::<Scheduler> {
        slot: Mutex::new(None),
        n: AtomicUsize::new(0),
    });
    driver.set_waker(Waker::from(me.clone()));
    let w = sched.work(|_| Next::Park);
    *me.slot.lock().unwrap() = Some(sched);
    let t = std::thread::spawn(move || {
        let ok = w.schedule(Duration::from_millis(1));
        (ok, w)
    });
    let (_ok, w) = t.join().unwrap();
    assert!(me.slot.lock().unwrap().is_none());
    assert!(!w.schedule(Duration::ZERO));
    assert_eq!(driver.next_deadline(), None);
    // The host loops on the fd: readable at most once, and run_due clears it. (Windows
    // has no descriptor: its host loops on run_due alone.)
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut readable_count = 0;
    for _ in 0..50 {
        #[cfg(unix)]
        if readable(&driver) {
            readable_count += 1;
        }
        assert_eq!(driver.run_due(), 0);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        readable_count <= 1,
        "fd readable {readable_count} times after shutdown"
    );
    #[cfg(unix)]
    assert!(!readable(&driver));
}

// The descriptor is unix's (see `Driver`'s `AsFd`).
#[cfg(unix)]
#[test]
fn last_scheduler_dropped_while_host_loops_on_fd() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let w = sched.every(Duration::from_millis(2), |_| Next::Again);
    w.schedule(Duration::ZERO);
    let stop = Arc::new(AtomicBool::new(false));
    let spins = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut wakes_without_runs = 0usize;
            let end = Instant::now() + Duration::from_millis(300);
            while Instant::now() < end {
                let mut pfd = libc::pollfd {
                    fd: driver.as_fd().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                let rc = unsafe { libc::poll(&mut pfd, 1, 50) };
                if rc == 1 {
                    let nd0 = driver
                        .next_deadline()
                        .map(|d| d.saturating_duration_since(Instant::now()));
                    let n = driver.run_due();
                    if n == 0 {
                        wakes_without_runs += 1;
                        eprintln!(
                            "empty wake at {:?} nd-before {:?} nd-after {:?} readable-after {}",
                            Instant::now(),
                            nd0,
                            driver
                                .next_deadline()
                                .map(|d| d.saturating_duration_since(Instant::now())),
                            readable(&driver)
                        );
                    }
                }
            }
            wakes_without_runs
        });
        std::thread::sleep(Duration::from_millis(50));
        eprintln!("drop at {:?}", Instant::now());
        drop(sched);
        eprintln!(
            "dropped at {:?} nd {:?} readable {}",
            Instant::now(),
            driver
                .next_deadline()
                .map(|d| d.saturating_duration_since(Instant::now())),
            readable(&driver)
        );
        stop.store(true, SeqCst);
        h.join().unwrap()
    });
    eprintln!("spins {spins}");
    assert!(spins <= 3, "fd readable with nothing to run {spins} times");
    assert!(!w.schedule(Duration::ZERO));
}

/// An epoll-style host: whenever the fd is readable, run_due; the fd must not stay
/// readable once run_due returned when the next deadline is later.
// Linux's timerfd only: the portable descriptor (a pipe) turns readable again at every
// arm that moves the deadline earlier, which these foreign arms do every few
// microseconds, so there a readable pipe after `run_due` is a new signal, not one left
// behind (`hosted::driver`'s portable-descriptor test pins that `run_due` drains it).
#[cfg(all(target_os = "linux", not(nicework_portable)))]
#[test]
fn fd_never_stays_readable_after_run_due_under_foreign_arms() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let works: Vec<_> = (0..16).map(|_| sched.work(|_| Next::Park)).collect();
    let tos: Vec<_> = (0..4)
        .map(|_| sched.timeout(Duration::from_millis(3), |_| Next::Again))
        .collect();
    let stop = AtomicBool::new(false);
    let stuck = std::thread::scope(|s| {
        s.spawn(|| {
            let mut x = 12345u64;
            while !stop.load(SeqCst) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let w = &works[(x % 16) as usize];
                let d = Duration::from_micros(x % 5000);
                match (x >> 8) % 5 {
                    0 => {
                        w.schedule(d);
                    }
                    1 => {
                        w.reschedule(d);
                    }
                    2 => {
                        w.cancel();
                    }
                    3 => {
                        tos[(x as usize >> 12) % 4].touch();
                    }
                    _ => {
                        w.schedule_within(d);
                    }
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        let mut stuck = 0;
        let end = Instant::now() + Duration::from_millis(800);
        while Instant::now() < end {
            let mut pfd = libc::pollfd {
                fd: driver.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, 20) };
            if rc == 1 {
                let n = driver.run_due();
                if n == 0 && readable(&driver) {
                    let nd = driver.next_deadline();
                    if nd.is_none_or(|nd| nd > Instant::now() + Duration::from_micros(200)) {
                        stuck += 1;
                    }
                }
            }
        }
        stop.store(true, SeqCst);
        stuck
    });
    assert_eq!(
        stuck, 0,
        "fd readable after run_due returned 0 with the deadline later"
    );
}

/// next_deadline is never later than an armed deadline (+ slack), checked right after arms
/// while a host thread runs run_due.
#[test]
fn next_deadline_bound_under_concurrent_host() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let stop = AtomicBool::new(false);
    let broke = AtomicUsize::new(0);
    let checks = AtomicUsize::new(0);
    let slack = Duration::from_millis(1);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(SeqCst) {
                driver.run_due();
                std::thread::sleep(Duration::from_micros(300));
            }
        });
        for seed in 1..=2u64 {
            let (sched, driver, broke, checks) = (&sched, &driver, &broke, &checks);
            s.spawn(move || {
                let works: Vec<_> = (0..8)
                    .map(|_| sched.every(Duration::from_millis(3), |_| Next::Again))
                    .collect();
                let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15);
                let end = Instant::now() + Duration::from_millis(600);
                while Instant::now() < end {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let w = &works[(x % 8) as usize];
                    let d = Duration::from_millis(50 + x % 3000);
                    match (x >> 8) % 3 {
                        0 => {
                            w.schedule(d);
                        }
                        1 => {
                            w.reschedule(d);
                        }
                        _ => {
                            w.schedule_within(d);
                        }
                    }
                    // The earliest of this thread's works' deadlines (all far in the future).
                    let earliest = works
                        .iter()
                        .filter_map(|w| w.deadline())
                        .filter(|d| *d > Instant::now() + Duration::from_millis(20))
                        .min();
                    let nd = driver.next_deadline();
                    if let Some(e) = earliest {
                        checks.fetch_add(1, SeqCst);
                        if nd.is_none_or(|nd| nd > e + slack) {
                            broke.fetch_add(1, SeqCst);
                            eprintln!(
                                "nd {:?} earliest {:?}",
                                nd.map(|n| n.saturating_duration_since(Instant::now())),
                                e - Instant::now()
                            );
                        }
                    }
                }
                for w in &works {
                    w.cancel();
                }
            });
        }
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, SeqCst);
    });
    assert_eq!(broke.load(SeqCst), 0, "of {}", checks.load(SeqCst));
}

#[test]
fn timeout_and_idspace_on_hosted_after_driver_drop() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let ids = nicework::IdSpace::builder()
        .scan_period(Duration::from_millis(5))
        .build(&sched);
    let g = ids.enter();
    let to = sched.timeout(Duration::from_millis(5), |_| Next::Again);
    to.touch();
    drop(driver);
    to.touch();
    assert!(!to.is_pending());
    drop(g);
    let g2 = ids.enter();
    drop(g2);
    drop(ids);
    drop(to);
    drop(sched);
}

// ===== async cancels =====

/// A hosted work whose run is held on a host thread until released.
struct Held {
    sched: Scheduler,
    driver: Arc<Driver>,
    release: mpsc::Sender<()>,
    host: std::thread::JoinHandle<()>,
    /// The host loops until this is cleared.
    hosting: Arc<AtomicBool>,
    runs: Arc<AtomicUsize>,
    freed: Arc<AtomicBool>,
    frees: Arc<AtomicUsize>,
    in_cb: Arc<AtomicBool>,
    bad_free: Arc<AtomicBool>,
}

struct CountDrop {
    frees: Arc<AtomicUsize>,
    in_cb: Arc<AtomicBool>,
    bad: Arc<AtomicBool>,
    _f: common::DropFlag,
}
impl Drop for CountDrop {
    fn drop(&mut self) {
        if self.in_cb.load(SeqCst) {
            self.bad.store(true, SeqCst);
        }
        self.frees.fetch_add(1, SeqCst);
    }
}

fn held(next: Next) -> (Held, nicework::Work) {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let driver = Arc::new(driver);
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let (flag, freed) = drop_flag();
    let frees = Arc::new(AtomicUsize::new(0));
    let in_cb = Arc::new(AtomicBool::new(false));
    let bad_free = Arc::new(AtomicBool::new(false));
    let guard = CountDrop {
        frees: frees.clone(),
        in_cb: in_cb.clone(),
        bad: bad_free.clone(),
        _f: flag,
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let (r, ic) = (runs.clone(), in_cb.clone());
    let work = sched.work(move |cx| {
        let _k = &guard;
        ic.store(true, SeqCst);
        r.fetch_add(1, SeqCst);
        let _ = started_tx.send(());
        let _ = release_rx.recv_timeout(EVENTUALLY);
        let _ = cx;
        ic.store(false, SeqCst);
        next
    });
    work.schedule(Duration::ZERO);
    let d = driver.clone();
    let hosting = Arc::new(AtomicBool::new(true));
    let still_hosting = hosting.clone();
    let host = std::thread::spawn(move || {
        let start = Instant::now();
        while still_hosting.load(SeqCst) && start.elapsed() < EVENTUALLY {
            d.run_due();
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    started.recv_timeout(EVENTUALLY).unwrap();
    (
        Held {
            sched,
            driver,
            release,
            host,
            hosting,
            runs,
            freed,
            frees,
            in_cb,
            bad_free,
        },
        work,
    )
}

#[test]
fn drop_async_polled_from_many_threads_and_after_scheduler_dropped() {
    let (h, work) = held(Next::Again);
    let fut = Arc::new(Mutex::new(Box::pin(work.drop_async())));
    let (wakes, waker) = counting();
    assert!(poll(fut.lock().unwrap().as_mut(), &waker).is_pending());
    // Many threads poll it (each with its own waker) while the run goes on.
    std::thread::scope(|s| {
        for _ in 0..4 {
            let fut = fut.clone();
            s.spawn(move || {
                for _ in 0..200 {
                    let (_c, w) = counting();
                    let _ = poll(fut.lock().unwrap().as_mut(), &w);
                }
            });
        }
    });
    // Drop the scheduler handle while pending; the driver still lives on the host.
    drop(h.sched);
    assert!(!h.freed.load(SeqCst), "freed while the callback runs");
    assert!(poll(fut.lock().unwrap().as_mut(), &waker).is_pending());
    h.release.send(()).unwrap();
    let end = Instant::now() + EVENTUALLY;
    while wakes.0.load(SeqCst) == 0 {
        assert!(Instant::now() < end, "never woken");
        std::thread::yield_now();
    }
    assert!(poll(fut.lock().unwrap().as_mut(), &waker).is_ready());
    assert!(h.freed.load(SeqCst));
    assert_eq!(h.frees.load(SeqCst), 1);
    assert!(!h.bad_free.load(SeqCst));
    assert_eq!(h.runs.load(SeqCst), 1);
    h.hosting.store(false, SeqCst);
    h.host.join().unwrap();
    assert_eq!(h.runs.load(SeqCst), 1);
    let _ = (&h.in_cb, &h.driver);
}

#[test]
fn drop_async_dropped_early_then_driver_dropped_frees_once() {
    let (h, work) = held(Next::Again);
    let mut fut = Box::pin(work.drop_async());
    let (_w, waker) = counting();
    assert!(poll(fut.as_mut(), &waker).is_pending());
    drop(fut);
    assert!(!h.freed.load(SeqCst));
    h.release.send(()).unwrap();
    h.hosting.store(false, SeqCst);
    h.host.join().unwrap();
    assert_eq!(h.frees.load(SeqCst), 1);
    assert!(!h.bad_free.load(SeqCst));
    assert_eq!(h.runs.load(SeqCst), 1, "re-armed after the early drop");
    drop(h.driver);
    drop(h.sched);
    assert_eq!(h.frees.load(SeqCst), 1);
}

#[test]
fn run_wakers_do_not_leak_across_polls_and_drops() {
    let (h, work) = held(Next::Again);
    let mut fut = Box::pin(work.cancel_async());
    let mut counts = Vec::new();
    for _ in 0..1000 {
        let (c, w) = counting();
        assert!(poll(fut.as_mut(), &w).is_pending());
        drop(w);
        counts.push(c);
    }
    // Only the last registration may be held.
    let held_refs = counts.iter().filter(|c| Arc::strong_count(c) > 1).count();
    assert!(held_refs <= 1, "{held_refs} wakers kept");
    drop(fut);
    assert!(
        counts.iter().all(|c| Arc::strong_count(c) == 1),
        "waker kept after the future was dropped"
    );
    // A second future, polled then the run ends: the waker is woken and freed.
    let mut fut = Box::pin(work.cancel_async());
    let (c, w) = counting();
    assert!(poll(fut.as_mut(), &w).is_pending());
    drop(w);
    h.release.send(()).unwrap();
    let end = Instant::now() + EVENTUALLY;
    while c.0.load(SeqCst) == 0 {
        assert!(Instant::now() < end);
        std::thread::yield_now();
    }
    assert_eq!(Arc::strong_count(&c), 1);
    assert!(poll(fut.as_mut(), &Waker::noop().clone()).is_ready());
    // Second poll after Ready.
    assert!(poll(fut.as_mut(), &Waker::noop().clone()).is_ready());
    drop(fut);
    h.hosting.store(false, SeqCst);
    h.host.join().unwrap();
    assert_eq!(h.runs.load(SeqCst), 1);
    assert!(
        work.schedule(Duration::ZERO),
        "cancel_async is not a permanent refusal"
    );
    drop(work);
    assert_eq!(h.frees.load(SeqCst), 1);
}

#[test]
fn cancel_async_racing_cancel_sync_flush_and_drop() {
    // Threaded scheduler: a run in progress; cancel_async pending; cancel_sync and flush on
    // other threads; then drop_async. Nothing blocks forever, frees exactly once.
    for round in 0..20 {
        let sched = Scheduler::builder().workers(2).build().unwrap();
        let frees = Arc::new(AtomicUsize::new(0));
        let in_cb = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(AtomicBool::new(false));
        let (flag, _freed) = drop_flag();
        let guard = CountDrop {
            frees: frees.clone(),
            in_cb: in_cb.clone(),
            bad: bad.clone(),
            _f: flag,
        };
        let runs = Arc::new(AtomicUsize::new(0));
        let (r, ic) = (runs.clone(), in_cb.clone());
        let work = Arc::new(sched.work(move |_| {
            let _k = &guard;
            ic.store(true, SeqCst);
            r.fetch_add(1, SeqCst);
            std::thread::sleep(Duration::from_millis(3));
            ic.store(false, SeqCst);
            Next::After(Duration::ZERO)
        }));
        work.schedule(Duration::ZERO);
        while runs.load(SeqCst) == 0 {
            std::thread::yield_now();
        }
        let (_c, w) = counting();
        std::thread::scope(|s| {
            let wk = work.clone();
            s.spawn(move || {
                wk.cancel_sync();
            });
            let wk = work.clone();
            s.spawn(move || {
                wk.flush();
            });
            let wk = work.clone();
            s.spawn(move || {
                if round % 2 == 0 {
                    wk.schedule(Duration::ZERO);
                }
            });
            let mut f = Box::pin(work.cancel_async());
            let end = Instant::now() + EVENTUALLY;
            while poll(f.as_mut(), &w).is_pending() {
                assert!(Instant::now() < end);
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        let work = Arc::into_inner(work).unwrap();
        let mut f = Box::pin(work.drop_async());
        let end = Instant::now() + EVENTUALLY;
        while poll(f.as_mut(), &w).is_pending() {
            assert!(Instant::now() < end);
            std::thread::sleep(Duration::from_micros(100));
        }
        assert_eq!(frees.load(SeqCst), 1, "round {round}");
        // Counted once it resolved: an instance armed by the third thread may start
        // before `drop_async` is called, and the future then waits for it.
        let before = runs.load(SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(runs.load(SeqCst), before, "ran after drop_async resolved");
        assert!(!bad.load(SeqCst));
        drop(sched);
    }
}

#[test]
fn drop_async_racing_scheduler_shutdown_threaded() {
    for _ in 0..30 {
        let sched = Scheduler::builder().workers(1).build().unwrap();
        let frees = Arc::new(AtomicUsize::new(0));
        let in_cb = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(AtomicBool::new(false));
        let (flag, _freed) = drop_flag();
        let guard = CountDrop {
            frees: frees.clone(),
            in_cb: in_cb.clone(),
            bad: bad.clone(),
            _f: flag,
        };
        let ic = in_cb.clone();
        let started = Arc::new(AtomicBool::new(false));
        let st = started.clone();
        let work = sched.work(move |_| {
            let _k = &guard;
            ic.store(true, SeqCst);
            st.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            ic.store(false, SeqCst);
            Next::Again
        });
        work.schedule(Duration::ZERO);
        while !started.load(SeqCst) {
            std::thread::yield_now();
        }
        let mut f = Box::pin(work.drop_async());
        let (c, w) = counting();
        let pending = poll(f.as_mut(), &w).is_pending();
        let t = std::thread::spawn(move || drop(sched));
        if pending {
            let end = Instant::now() + EVENTUALLY;
            while c.0.load(SeqCst) == 0 {
                assert!(Instant::now() < end, "not woken");
                std::thread::yield_now();
            }
        }
        // Move the future to another thread and poll there.
        let r = std::thread::spawn(move || {
            let r = poll(f.as_mut(), &Waker::noop().clone()).is_ready();
            drop(f);
            r
        })
        .join()
        .unwrap();
        assert!(r);
        t.join().unwrap();
        assert_eq!(frees.load(SeqCst), 1);
        assert!(!bad.load(SeqCst));
    }
}

type Slot = Mutex<Option<Pin<Box<dyn Future<Output = ()> + Send>>>>;
struct PollInWake {
    slot: Arc<Slot>,
    ready: AtomicBool,
    drop_it: bool,
}
impl Wake for PollInWake {
    fn wake(self: Arc<Self>) {
        let me = Waker::from(self.clone());
        let mut g = self.slot.lock().unwrap();
        if self.drop_it {
            let f = g.take();
            drop(g);
            drop(f);
            self.ready.store(true, SeqCst);
            return;
        }
        if let Some(f) = g.as_mut() {
            if poll(f.as_mut(), &me).is_ready() {
                self.ready.store(true, SeqCst);
                *g = None;
            }
        }
    }
}

#[test]
fn drop_async_waker_polls_or_drops_the_future_inside_wake() {
    for drop_it in [false, true] {
        let (h, work) = held(Next::Again);
        let slot: Arc<Slot> = Arc::new(Mutex::new(Some(Box::pin(work.drop_async()))));
        let pw = Arc::new(PollInWake {
            slot: slot.clone(),
            ready: AtomicBool::new(false),
            drop_it,
        });
        let w = Waker::from(pw.clone());
        assert!(poll(slot.lock().unwrap().as_mut().unwrap().as_mut(), &w).is_pending());
        h.release.send(()).unwrap();
        let end = Instant::now() + EVENTUALLY;
        while !pw.ready.load(SeqCst) {
            assert!(Instant::now() < end, "drop_it {drop_it}: never resolved");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(h.frees.load(SeqCst), 1, "drop_it {drop_it}");
        assert!(!h.bad_free.load(SeqCst));
        h.hosting.store(false, SeqCst);
        h.host.join().unwrap();
        assert_eq!(h.runs.load(SeqCst), 1);
        assert_eq!(h.frees.load(SeqCst), 1);
    }
}

/// The host's waker drops a pending drop_async future inside wake (the arm that wakes it
/// comes from the run's completion on the host thread).
#[test]
fn cancel_async_on_hosted_from_another_works_callback() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let b = Arc::new(sched.work(|_| Next::Again));
    b.schedule(Duration::ZERO);
    let bb = b.clone();
    let res = Arc::new(Mutex::new(None));
    let r = res.clone();
    let a = sched.work(move |_| {
        let mut f = Box::pin(bb.cancel_async());
        *r.lock().unwrap() = Some(poll(f.as_mut(), &Waker::noop().clone()));
        Next::Park
    });
    a.schedule(Duration::ZERO);
    let end = Instant::now() + EVENTUALLY;
    while res.lock().unwrap().is_none() {
        assert!(Instant::now() < end);
        driver.run_due();
    }
    assert!(res.lock().unwrap().unwrap().is_ready());
    std::thread::sleep(Duration::from_millis(3));
    driver.run_due();
    let runs = b.stats().runs;
    std::thread::sleep(Duration::from_millis(3));
    driver.run_due();
    assert_eq!(b.stats().runs, runs);
}

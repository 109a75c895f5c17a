//! Lending priority: `flush()` runs a pending work on the caller; `flush()`,
//! `cancel_sync()`, drop, and the futures of `cancel_async()` and `drop_async()` (from
//! the thread that polls them) raise a running worker only where the process may; `flush()`
//! takes over `Yield` increments. The privileged paths run as root; the same checks re-run as user 65534
//! (no right: the flusher only waits), and, in an ignored test that needs
//! `CAP_SYS_RESOURCE`, as user 65534 with `RLIMIT_NICE` 15 (the worker is raised only as
//! far as nice 5).

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::{
    AsNobody, EVENTUALLY, current_nice, current_policy, eventually, gettid, nice_of, policy_of,
};
use nicework::{Next, Priority, Scheduler};

#[test]
fn flush_of_a_pending_work_runs_on_the_caller_at_its_priority() {
    let sched = Scheduler::new().unwrap();
    let ran_on = Arc::new(Mutex::new(None));
    let seen = ran_on.clone();
    let work = sched.work(move |_| {
        *seen.lock().unwrap() = Some((gettid(), current_nice()));
        Next::Park
    });
    work.schedule(Duration::from_secs(3600));
    assert!(work.flush());
    assert_eq!(*ran_on.lock().unwrap(), Some((gettid(), current_nice())));
    let stats = sched.metrics().lending;
    assert_eq!((stats.helped, stats.raised, stats.waited), (1, 0, 0));
    assert!(!work.is_pending());
}

/// What the run in progress saw of its own thread while a flusher waited for it.
struct RunningRun {
    sched: Scheduler,
    work: nicework::Work,
    started: mpsc::Receiver<()>,
    observed: Arc<Mutex<Option<(i32, i32)>>>,
}

/// A work that, once running on the worker, waits until it was raised above `base` (or
/// until a flusher gave up raising it), then records its nice and policy.
fn running_work(priority: Priority) -> RunningRun {
    let sched = Scheduler::builder().priority(priority).build().unwrap();
    let (started_tx, started) = mpsc::channel();
    let observed = Arc::new(Mutex::new(None));
    let record = observed.clone();
    let work = sched.work(move |cx| {
        let (base_nice, base_policy) = (current_nice(), current_policy());
        started_tx.send(()).unwrap();
        let lent_or_refused = eventually(|| {
            let stats = cx.scheduler().metrics().lending;
            let moved = current_nice() != base_nice || current_policy() != base_policy;
            moved || stats.waited > 0
        });
        assert!(lent_or_refused, "no flusher came");
        *record.lock().unwrap() = Some((current_nice(), current_policy()));
        Next::Park
    });
    work.schedule(Duration::ZERO);
    started.recv_timeout(EVENTUALLY).unwrap();
    RunningRun {
        sched,
        work,
        started,
        observed,
    }
}

/// The calls that wait for a run in progress, each of which lends: the futures lend from
/// the thread that polls them (here the test's, blocked in `block_on`).
#[derive(Debug, Clone, Copy)]
enum Waiter {
    Flush,
    CancelSync,
    Drop,
    CancelAsync,
    DropAsync,
}

const WAITERS: [Waiter; 5] = [
    Waiter::Flush,
    Waiter::CancelSync,
    Waiter::Drop,
    Waiter::CancelAsync,
    Waiter::DropAsync,
];

/// Polls `future` on this thread until it resolves, parking between polls.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut future = std::pin::pin!(future);
    let start = std::time::Instant::now();
    loop {
        let mut cx = std::task::Context::from_waker(&waker);
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        assert!(start.elapsed() < EVENTUALLY, "the future never resolved");
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

/// Flushes a work running on the worker and checks the raise and the restore against
/// the scheduler's `raise_limit()`.
fn check_flush_of_a_running_work(priority: Priority) {
    check_wait_for_a_running_work(priority, Waiter::Flush);
}

/// Waits for a work running on the worker with `waiter` and checks the raise and the
/// restore against the scheduler's `raise_limit()`.
fn check_wait_for_a_running_work(priority: Priority, waiter: Waiter) {
    let RunningRun {
        sched,
        work,
        started,
        observed,
    } = running_work(priority);
    let worker = nicework::hooks::worker_tids(&sched)[0];
    let before = (nice_of(worker), policy_of(worker));
    let flusher_nice = current_nice();
    match waiter {
        Waiter::Flush => assert!(work.flush()),
        Waiter::CancelSync => assert!(!work.cancel_sync(), "running, not pending"),
        Waiter::Drop => drop(work),
        Waiter::CancelAsync => assert!(!block_on(work.cancel_async()), "running, not pending"),
        Waiter::DropAsync => block_on(work.drop_async()),
    }
    let (seen_nice, seen_policy) = observed
        .lock()
        .unwrap()
        .unwrap_or_else(|| panic!("{waiter:?} returned before the run recorded"));
    let stats = sched.metrics().lending;
    match sched.raise_limit() {
        Some(limit) => {
            let expected = flusher_nice.max(limit);
            assert_eq!(
                seen_nice, expected,
                "{waiter:?}: raised to the waiter's nice, within the limit"
            );
            assert_eq!(
                seen_policy,
                libc::SCHED_OTHER,
                "{waiter:?}: raised out of SCHED_IDLE too"
            );
            assert_eq!((stats.raised, stats.waited), (1, 0), "{waiter:?}");
        }
        None => {
            assert_eq!(
                (seen_nice, seen_policy),
                before,
                "{waiter:?}: without the right nothing moves"
            );
            assert_eq!((stats.raised, stats.waited), (0, 1), "{waiter:?}");
        }
    }
    assert_eq!(
        (nice_of(worker), policy_of(worker)),
        before,
        "{waiter:?}: the worker is back at its own priority when the wait returns"
    );
    assert_eq!(
        current_nice(),
        flusher_nice,
        "{waiter:?}: the waiter's own nice is untouched"
    );
    assert!(started.try_recv().is_err(), "the work ran once");
}

#[test]
fn flush_raises_a_running_nice_19_worker_where_allowed_and_puts_it_back() {
    if common::is_root() {
        assert_eq!(Scheduler::new().unwrap().raise_limit(), Some(-20));
    }
    check_flush_of_a_running_work(Priority::Nice(19));
}

#[test]
fn flush_raises_a_running_sched_idle_worker_where_allowed_and_puts_it_back() {
    check_flush_of_a_running_work(Priority::Idle);
}

#[test]
fn cancel_sync_raises_the_run_it_waits_for_where_allowed_and_puts_it_back() {
    check_wait_for_a_running_work(Priority::Nice(19), Waiter::CancelSync);
    check_wait_for_a_running_work(Priority::Idle, Waiter::CancelSync);
}

#[test]
fn drop_raises_the_run_it_waits_for_where_allowed_and_puts_it_back() {
    check_wait_for_a_running_work(Priority::Nice(19), Waiter::Drop);
    check_wait_for_a_running_work(Priority::Idle, Waiter::Drop);
}

#[test]
fn cancel_async_raises_the_run_it_waits_for_from_its_polling_thread_and_puts_it_back() {
    check_wait_for_a_running_work(Priority::Nice(19), Waiter::CancelAsync);
    check_wait_for_a_running_work(Priority::Idle, Waiter::CancelAsync);
}

#[test]
fn drop_async_raises_the_run_it_waits_for_from_its_polling_thread_and_puts_it_back() {
    check_wait_for_a_running_work(Priority::Nice(19), Waiter::DropAsync);
    check_wait_for_a_running_work(Priority::Idle, Waiter::DropAsync);
}

#[test]
fn a_flusher_at_a_lower_priority_than_the_worker_lends_nothing() {
    let run = running_work(Priority::Normal);
    let flusher = std::thread::spawn(move || {
        // SAFETY: plain system call; raising one's own nice is always allowed.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, gettid() as libc::id_t, 19) };
        assert!(run.work.flush());
        let stats = run.sched.metrics().lending;
        assert_eq!((stats.raised, stats.waited), (0, 1));
        *run.observed.lock().unwrap()
    });
    let (seen_nice, _) = flusher.join().unwrap().unwrap();
    assert_eq!(
        seen_nice,
        current_nice(),
        "the worker kept its inherited nice"
    );
}

/// A work of `INCREMENTS` `Yield` increments that records the thread and nice of each.
struct Incremental {
    work: nicework::Work,
    /// (thread, nice) of each increment, in order.
    ran: Arc<Mutex<Vec<(i32, i32)>>>,
}

const INCREMENTS: usize = 200;

/// `first` runs inside the first increment, on the worker, before it returns `Yield`.
fn incremental(sched: &Scheduler, first: impl FnOnce() + Send + 'static) -> Incremental {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let record = ran.clone();
    let mut first = Some(first);
    let work = sched.work(move |_| {
        std::hint::black_box((0..20_000u64).sum::<u64>());
        let n = {
            let mut ran = record.lock().unwrap();
            ran.push((gettid(), current_nice()));
            ran.len()
        };
        if let Some(first) = first.take() {
            first();
        }
        if n < INCREMENTS {
            Next::Yield
        } else {
            Next::Park
        }
    });
    Incremental { work, ran }
}

#[test]
fn flush_takes_over_the_yield_increments_on_a_worker() {
    // One worker. The first increment runs on it; a second work then holds the worker,
    // so the next increment is pending, not running, when `flush` is called, whatever
    // the machine's load (on an idle machine the worker would otherwise race the flusher
    // for every increment: see `flush_during_a_running_increment_takes_over_the_rest`).
    let sched = Scheduler::new().unwrap();
    let worker = nicework::hooks::worker_tids(&sched)[0];
    let (first_tx, first_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let inc = incremental(&sched, move || {
        first_tx.send(()).unwrap();
        release_rx.recv_timeout(EVENTUALLY).unwrap();
    });
    let flushed = Arc::new(AtomicBool::new(false));
    let (blocking_tx, blocking_rx) = mpsc::channel();
    let until_flushed = flushed.clone();
    let blocker = sched.work(move |_| {
        blocking_tx.send(()).unwrap();
        assert!(eventually(|| until_flushed.load(Ordering::SeqCst)));
        Next::Park
    });
    inc.work.schedule(Duration::ZERO);
    first_rx
        .recv_timeout(EVENTUALLY)
        .expect("the first increment ran");
    // Due before the increment's `Yield` re-arm, so it runs next ("`Yield` runs again
    // after the other due works").
    assert!(blocker.schedule(Duration::ZERO));
    release_tx.send(()).unwrap();
    blocking_rx
        .recv_timeout(EVENTUALLY)
        .expect("the blocker ran");
    assert!(inc.work.is_pending() && !inc.work.is_running());

    assert!(inc.work.flush());
    flushed.store(true, Ordering::SeqCst);
    let ran = inc.ran.lock().unwrap().clone();
    assert_eq!(ran.len(), INCREMENTS, "flush returned at the end");
    assert!(!inc.work.is_pending() && !inc.work.is_running());
    assert_eq!(ran[0].0, worker, "the first increment ran on the worker");
    let flusher = gettid();
    assert!(
        ran[1..].iter().all(|&(tid, _)| tid == flusher),
        "the flusher ran the remaining increments"
    );
    let stats = sched.metrics().lending;
    assert_eq!(
        (stats.helped, stats.raised, stats.waited),
        (INCREMENTS as u64 - 1, 0, 0)
    );
    // Released by `flushed`; it may or may not have returned yet. Dropping the handle
    // waits for a run in progress.
    drop(blocker);
}

#[test]
fn flush_during_a_running_increment_takes_over_the_rest() {
    // `back_off(false)`: every `Yield` re-arms due at once, whatever the machine's load,
    // as it does with back-off on an idle machine (`cargo test --test lending` alone).
    let sched = Scheduler::builder().back_off(false).build().unwrap();
    let waiting = sched.clone();
    // The first increment returns only once the flusher waits for it.
    let inc = incremental(&sched, move || {
        assert!(eventually(|| {
            let stats = waiting.metrics().lending;
            stats.raised + stats.waited > 0
        }));
    });
    inc.work.schedule(Duration::ZERO);
    assert!(eventually(|| inc.work.is_running()));
    let flusher = gettid();
    assert!(inc.work.flush());
    let ran = inc.ran.lock().unwrap().clone();
    assert_eq!(ran.len(), INCREMENTS, "flush returned at the end");
    let on_worker: Vec<_> = ran[1..]
        .iter()
        .filter(|&&(tid, _)| tid != flusher)
        .collect();
    let nices: std::collections::BTreeSet<i32> = on_worker.iter().map(|&&(_, n)| n).collect();
    assert!(
        on_worker.is_empty(),
        "the flusher waited while the worker ran {} of the {} remaining increments (at nice \
         {nices:?}); lending stats {:?}",
        on_worker.len(),
        INCREMENTS - 1,
        sched.metrics().lending
    );
}

#[test]
fn increments_back_off_while_every_cpu_is_busy_and_not_when_disabled() {
    // The back-off compares the machine-wide runnable count with the online CPUs.
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let spinners = common::spinners(cpus + 1, &stop);
    let increments = |sched: &Scheduler| {
        let runs = Arc::new(AtomicU64::new(0));
        let counter = runs.clone();
        let work = sched.work(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
            std::hint::black_box((0..10_000u64).sum::<u64>());
            Next::Yield
        });
        work.schedule(Duration::ZERO);
        (work, runs)
    };
    let backing_off = Scheduler::new().unwrap();
    assert!(backing_off.backs_off());
    let (work, _runs) = increments(&backing_off);
    assert!(
        eventually(|| backing_off.metrics().deferred_yields >= 3),
        "increments were never deferred with {} runnable spinners on {cpus} CPUs",
        cpus + 1
    );
    work.cancel_sync();
    let plain = Scheduler::builder().back_off(false).build().unwrap();
    let (work, runs) = increments(&plain);
    assert!(eventually(|| runs.load(Ordering::Relaxed) >= 50));
    work.cancel_sync();
    assert_eq!(plain.metrics().deferred_yields, 0);
    stop.store(true, Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
}

/// The unprivileged side when the tests run as root: re-runs itself as user 65534 with
/// `RLIMIT_NICE` 0. Skipped (with a printed reason) where that is impossible: not root, or
/// no `setpriv`.
#[test]
fn without_the_right_a_flusher_only_waits_as_uid_65534_needs_root_and_setpriv() {
    match common::as_uid_65534(
        &common::exact_name(
            module_path!(),
            "without_the_right_a_flusher_only_waits_as_uid_65534_needs_root_and_setpriv",
        ),
        &[],
    ) {
        Ok(AsNobody::Here) => {
            common::drop_rlimit_nice();
            let sched = Scheduler::new().unwrap();
            assert_eq!(sched.raise_limit(), None, "no CAP_SYS_NICE, RLIMIT_NICE 0");
            for waiter in WAITERS {
                check_wait_for_a_running_work(Priority::Nice(19), waiter);
                check_wait_for_a_running_work(Priority::Idle, waiter);
            }
        }
        Ok(AsNobody::Passed) => {}
        Err(reason) => println!("skipped: {reason}"),
    }
}

/// Never skipped when run: it fails if its set-up is impossible.
#[test]
#[ignore = "needs CAP_SYS_RESOURCE to raise RLIMIT_NICE; run with --ignored as a privileged root"]
fn with_rlimit_nice_15_a_flusher_raises_only_to_nice_5_as_uid_65534_needs_cap_sys_resource() {
    let outcome = common::as_uid_65534(
        &common::exact_name(
            module_path!(),
            "with_rlimit_nice_15_a_flusher_raises_only_to_nice_5_as_uid_65534_needs_cap_sys_resource",
        ),
        &["prlimit", "--nice=15:15"],
    );
    match outcome.unwrap_or_else(|reason| panic!("cannot run: {reason}")) {
        AsNobody::Here => {
            let sched = Scheduler::new().unwrap();
            assert_eq!(sched.raise_limit(), Some(5), "RLIMIT_NICE 15 allows nice 5");
            for waiter in WAITERS {
                check_wait_for_a_running_work(Priority::Nice(19), waiter);
                check_wait_for_a_running_work(Priority::Idle, waiter);
            }
        }
        AsNobody::Passed => {}
    }
}

/// A future polled by two threads in turn (A, B, A, B, ...) lends once per thread, not
/// once per poll: the counts say two waiters, whatever the right to raise.
#[test]
fn a_future_polled_by_two_threads_in_turn_lends_once_per_thread() {
    let sched = Scheduler::builder()
        .priority(Priority::Nice(19))
        .build()
        .unwrap();
    let (started_tx, started) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let go = Mutex::new(go);
    let work = sched.work(move |_| {
        started_tx.send(()).unwrap();
        let _ = go.lock().unwrap().recv_timeout(EVENTUALLY);
        Next::Park
    });
    work.schedule(Duration::ZERO);
    started.recv_timeout(EVENTUALLY).unwrap();
    let future = Mutex::new(Box::pin(work.cancel_async()));
    let poll = || {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(future.lock().unwrap().as_mut().poll(&mut cx).is_pending());
    };
    std::thread::scope(|s| {
        let (to_b, b_polls) = mpsc::channel::<()>();
        let (b_done, b_polled) = mpsc::channel::<()>();
        let poll_b = &poll;
        s.spawn(move || {
            for () in b_polls {
                poll_b();
                b_done.send(()).unwrap();
            }
        });
        for _ in 0..3 {
            poll();
            to_b.send(()).unwrap();
            b_polled.recv().unwrap();
        }
    });
    let stats = sched.metrics().lending;
    assert_eq!(
        stats.raised + stats.waited,
        2,
        "six polls from two threads: {stats:?}"
    );
    go_tx.send(()).unwrap();
    assert!(
        !block_on(future.into_inner().unwrap()),
        "running, not pending"
    );
}

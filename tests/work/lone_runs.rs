//! Wakeups that follow deadlines under attack: far deadlines through a hosted driver (the
//! wheel's earliest tick per slot, past its horizon), arms made while a lone run holds its
//! worker and nothing else is armed (the poller keeps its role; an arm wakes a follower),
//! and `once` and `try_flush` racing runs. Waits are liveness bounds (`eventually`,
//! 20 s); assertions are counts and "never early / never twice".

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

use crate::common::{self, EVENTUALLY, Rng, eventually};

const MS: Duration = Duration::from_millis(1);
const DAY: Duration = Duration::from_secs(24 * 3600);

// --- the wheel's `first_tick` past the horizon, seen through a hosted Driver ----------

/// With the smallest slack the wheel's horizon is 2^36 ticks of 100 us (79.5 days). A
/// work armed for 100 days is clamped into level-5 slot 16; one armed for 30 days sits in
/// slot 24. The wake for the first occupied slot (16) must not be its earliest tick (day
/// 100), or a host sleeping until `next_deadline` (or a worker sleeping on the timer)
/// misses the 30-day work by 70 days.
#[test]
fn hosted_next_deadline_is_not_hidden_by_a_work_beyond_the_horizon() {
    let (sched, driver) = Scheduler::builder()
        .slack(Duration::from_micros(100))
        .build_hosted()
        .unwrap();
    let far = sched.work(|_| Next::Park);
    let near = sched.work(|_| Next::Park);
    let now = sched.work(|_| Next::Park);
    let start = Instant::now();
    assert!(far.schedule(100 * DAY));
    assert!(near.schedule(30 * DAY));
    assert!(now.schedule(Duration::ZERO));
    assert_eq!(driver.run_due(), 1);
    let next = driver.next_deadline().expect("two works are armed");
    let days = next.duration_since(start).as_secs_f64() / DAY.as_secs_f64();
    assert!(
        next <= start + 30 * DAY + Duration::from_secs(1),
        "next_deadline is {days:.1} days out; a work is due in 30 days"
    );
}

/// The default slack (1 ms): a `Duration::MAX` work (never due) sits in level-5 slot 51
/// and hides any work due 646..795 days out.
#[test]
fn hosted_next_deadline_is_not_hidden_by_a_never_due_work() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let never = sched.work(|_| Next::Park);
    let near = sched.work(|_| Next::Park);
    let now = sched.work(|_| Next::Park);
    let start = Instant::now();
    assert!(never.schedule(Duration::MAX));
    assert!(near.schedule(700 * DAY));
    assert!(now.schedule(Duration::ZERO));
    assert_eq!(driver.run_due(), 1);
    // With the bug the wake is the never-due tick, which reads as "nothing armed".
    let next = driver
        .next_deadline()
        .expect("next_deadline is None (nothing armed) while a work is due in 700 days");
    let days = next.duration_since(start).as_secs_f64() / DAY.as_secs_f64();
    assert!(
        next <= start + 700 * DAY + Duration::from_secs(1),
        "next_deadline is {days:.0} days out; a work is due in 700 days"
    );
}

// --- an arm while nobody watches the timer --------------------------------------------

/// A work whose runs block until released; tells when each run starts.
fn held(sched: &Scheduler) -> (Work, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (started_tx, started) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let work = sched.work(move |_| {
        let _ = started_tx.send(());
        let _ = go_rx.lock().unwrap().recv_timeout(2 * EVENTUALLY);
        Next::Park
    });
    (work, started, go)
}

/// Records runs, and runs before the recorded earliest legal time.
#[derive(Clone, Default)]
struct Probe {
    runs: Arc<AtomicUsize>,
    early: Arc<AtomicUsize>,
    not_before: Arc<Mutex<Option<Instant>>>,
}

impl Probe {
    fn note_run(&self) {
        if let Some(at) = *self.not_before.lock().unwrap() {
            if Instant::now() < at {
                self.early.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.runs.fetch_add(1, Ordering::SeqCst);
    }
    fn expect_at(&self, delay: Duration) {
        *self.not_before.lock().unwrap() = Some(Instant::now() + delay);
    }
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// 2 and 4 workers: one runs a long callback that was the only armed work; other
/// threads arm plain works, `once`s, timeouts (and touch them) and an `every`; each must
/// run while the long callback is still held.
#[test]
fn arms_from_other_threads_while_a_lone_run_holds_its_worker_run_promptly() {
    for workers in [2, 4] {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        let mut rng = Rng(0x1234_5678 + workers as u64);
        for round in 0..15 {
            let (long, started, go) = held(&sched);
            assert!(long.schedule(Duration::from_micros(rng.next() % 2000)));
            started
                .recv_timeout(EVENTUALLY)
                .expect("the long work started");
            // Let the other workers settle into their sleep (no poller: the lone run's
            // worker kept the role).
            std::thread::sleep(Duration::from_micros(rng.next() % 3000));
            let p = Probe::default();
            let delay = Duration::from_micros(500 + rng.next() % 5000);
            p.expect_at(delay);
            let kind = round % 4;
            let work = {
                let p = p.clone();
                std::thread::scope(|s| {
                    s.spawn(|| match kind {
                        0 => {
                            let w = sched.work(move |_| {
                                p.note_run();
                                Next::Park
                            });
                            assert!(w.schedule(delay));
                            w
                        }
                        1 => sched.once(delay, move |_| p.note_run()),
                        2 => {
                            let w = sched.timeout(delay, move |_| {
                                p.note_run();
                                Next::Park
                            });
                            w.touch();
                            w
                        }
                        _ => sched.every(delay, move |_| {
                            p.note_run();
                            Next::Park
                        }),
                    })
                    .join()
                    .unwrap()
                })
            };
            assert!(
                eventually(|| p.runs() >= 1),
                "workers={workers} round {round} kind {kind}: a {delay:?} arm made while a \
                 lone run held its worker did not run while it was held"
            );
            assert_eq!(p.early.load(Ordering::SeqCst), 0, "ran early");
            go.send(()).unwrap();
            drop(work);
            long.cancel_sync();
        }
    }
}

/// The same, but the arm comes from inside the long callback itself (on the worker, not
/// as its completion's re-arm), and from inside another short work's callback.
#[test]
fn arms_from_inside_a_held_callback_run_promptly() {
    for workers in [2, 4] {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        for round in 0..15 {
            let p = Probe::default();
            let delay = Duration::from_micros(300 + (round as u64 * 997) % 5000);
            let target = {
                let p = p.clone();
                sched.work(move |_| {
                    p.note_run();
                    Next::Park
                })
            };
            let target = Arc::new(target);
            let (release_tx, release_rx) = mpsc::channel::<()>();
            let release_rx = Mutex::new(release_rx);
            let (t2, p2) = (target.clone(), p.clone());
            let long = sched.work(move |_| {
                p2.expect_at(delay);
                assert!(t2.schedule(delay));
                let _ = release_rx.lock().unwrap().recv_timeout(2 * EVENTUALLY);
                Next::Park
            });
            assert!(long.schedule(Duration::from_micros(round as u64 * 131 % 2000)));
            assert!(
                eventually(|| p.runs() == 1),
                "workers={workers} round {round}: armed from inside a held callback, \
                 never ran while it was held"
            );
            assert_eq!(p.early.load(Ordering::SeqCst), 0);
            release_tx.send(()).unwrap();
            long.cancel_sync();
        }
    }
}

/// Completion re-arms (`Next::After`, `Next::Again`) of a work on one worker while the
/// other workers are all held: the completing worker must watch its own re-arm (kick
/// skips it), so the work keeps running at its period.
#[test]
fn a_periodic_work_keeps_running_while_every_other_worker_is_held() {
    for workers in [1, 2, 4] {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        let holders: Vec<_> = (0..workers - 1).map(|_| held(&sched)).collect();
        for (work, started, _) in &holders {
            assert!(work.schedule(Duration::ZERO));
            started.recv_timeout(EVENTUALLY).expect("holder started");
        }
        let p = Probe::default();
        let p2 = p.clone();
        let periodic = sched.work(move |cx| {
            p2.note_run();
            let n = p2.runs();
            if n >= 40 {
                return Next::Park;
            }
            let _ = cx;
            if n % 2 == 0 {
                p2.expect_at(2 * MS);
                Next::After(2 * MS)
            } else {
                p2.expect_at(MS);
                Next::Again
            }
        });
        p.expect_at(MS);
        assert!(periodic.schedule(MS));
        assert!(
            eventually(|| p.runs() == 40),
            "workers={workers}: a self-re-arming work stalled at {} runs while the other \
             workers were held",
            p.runs()
        );
        assert_eq!(p.early.load(Ordering::SeqCst), 0);
        for (_, _, go) in &holders {
            go.send(()).unwrap();
        }
    }
}

/// An arm racing the end of a lone run: thread T arms a short work at a random moment
/// around the moment the running work completes and re-arms itself for an hour (its
/// re-arm is the one `kick` skips). The short work must run, with 1, 2 and 4 workers.
#[test]
fn an_arm_racing_the_completion_of_a_lone_run_is_watched() {
    for workers in [1, 2, 4] {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        let mut rng = Rng(0xfeed + workers as u64);
        let spin_us = Arc::new(AtomicUsize::new(0));
        let s2 = spin_us.clone();
        let lone = sched.work(move |_| {
            let until = Instant::now() + Duration::from_micros(s2.load(Ordering::SeqCst) as u64);
            while Instant::now() < until {}
            Next::After(Duration::from_secs(3600))
        });
        let p = Probe::default();
        let p2 = p.clone();
        let short = sched.work(move |_| {
            p2.note_run();
            Next::Park
        });
        for round in 0..60 {
            spin_us.store((rng.next() % 400) as usize, Ordering::SeqCst);
            let before = p.runs();
            lone.reschedule(Duration::ZERO);
            let wait = Instant::now() + Duration::from_micros(rng.next() % 600);
            while Instant::now() < wait {}
            let delay = Duration::from_micros(rng.next() % 3000);
            p.expect_at(delay);
            short.reschedule(delay);
            assert!(
                eventually(|| p.runs() > before),
                "workers={workers} round {round}: an arm racing a lone run's completion \
                 never ran"
            );
        }
        assert_eq!(p.early.load(Ordering::SeqCst), 0);
    }
}

// --- zero wakeups while parked, after the new paths -----------------------------------

/// Lone runs that kept the poller role, once works (run, cancelled, detached), try_flush
/// and flush of pending works, timeouts touched and stopped: then everything is parked
/// and the wakeup count stays flat, with 1, 2 and 4 workers.
#[test]
fn parked_after_lone_runs_onces_and_try_flushes_sleeps_without_wakeups() {
    std::thread::scope(|scope| {
        for workers in [1, 2, 4] {
            scope.spawn(move || {
                let sched = Scheduler::builder().workers(workers).build().unwrap();
                let ran = Arc::new(AtomicUsize::new(0));
                let r = ran.clone();
                let lone = sched.work(move |cx| {
                    let n = r.fetch_add(1, Ordering::SeqCst);
                    let _ = cx;
                    if n < 20 { Next::After(MS) } else { Next::Park }
                });
                assert!(lone.schedule(MS));
                assert!(eventually(|| ran.load(Ordering::SeqCst) > 20));
                let onces: Vec<Work> = (0..20)
                    .map(|i| sched.once(Duration::from_millis(i % 5), |_| {}))
                    .collect();
                for (i, w) in onces.iter().enumerate() {
                    match i % 3 {
                        0 => {
                            w.try_flush();
                        }
                        1 => {
                            w.cancel();
                        }
                        _ => {}
                    }
                }
                for w in onces {
                    if w.is_pending() {
                        w.detach();
                    }
                }
                let t = sched.timeout(5 * MS, |_| Next::Park);
                for _ in 0..10 {
                    t.touch();
                    std::thread::sleep(Duration::from_micros(300));
                }
                assert!(eventually(|| t.stats().runs == 1));
                let w = sched.work(|_| Next::Park);
                w.schedule(Duration::from_secs(3600));
                assert!(w.try_flush());
                w.schedule(Duration::from_secs(3600));
                w.cancel();
                // The hour-long entry is stale now: sweep or not, it wakes nobody but
                // at its tick. Let the short deadlines pass.
                std::thread::sleep(50 * MS);
                crate::common::settle_wakeups(&sched);
                let before = sched.metrics().worker_wakeups;
                std::thread::sleep(Duration::from_millis(1500));
                let after = sched.metrics().worker_wakeups;
                assert_eq!(
                    after,
                    before,
                    "workers={workers}: {} wakeups while every work was parked",
                    after - before
                );
            });
        }
    });
}

// --- once races -----------------------------------------------------------------------

struct DropCount(Arc<AtomicUsize>);
impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Many rounds: a `once` due around now is raced by threads doing flush, try_flush,
/// reschedule, schedule, cancel_sync, touch, and the handle's drop or detach, on a real
/// scheduler with 2 workers. Each round: at most one run, exactly one closure drop, no
/// run after a cancel_sync/drop returned, and no `try_flush` true without its run.
#[test]
fn once_races_never_run_twice_and_drop_the_closure_once() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let mut rng = Rng(0xabcdef);
    let mut total_runs = 0;
    for round in 0..150 {
        let runs = Arc::new(AtomicUsize::new(0));
        let drops = Arc::new(AtomicUsize::new(0));
        let after_cancel = Arc::new(AtomicUsize::new(0));
        let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let guard = DropCount(drops.clone());
        let (r, ac, c) = (runs.clone(), after_cancel.clone(), cancelled.clone());
        let delay = Duration::from_micros(rng.next() % 400);
        let work = Arc::new(sched.once(delay, move |_| {
            let _g = guard;
            if c.load(Ordering::SeqCst) {
                ac.fetch_add(1, Ordering::SeqCst);
            }
            r.fetch_add(1, Ordering::SeqCst);
            std::hint::spin_loop();
        }));
        let ops: Vec<u64> = (0..3).map(|_| rng.next()).collect();
        let barrier = Arc::new(Barrier::new(ops.len()));
        let try_true = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for &op in &ops {
                let (work, barrier, try_true, cancelled) = (
                    work.clone(),
                    barrier.clone(),
                    try_true.clone(),
                    cancelled.clone(),
                );
                s.spawn(move || {
                    barrier.wait();
                    let spin = Instant::now() + Duration::from_micros(op % 300);
                    while Instant::now() < spin {}
                    match (op >> 20) % 7 {
                        0 => {
                            work.flush();
                        }
                        1 => {
                            if work.try_flush() {
                                try_true.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        2 => {
                            work.reschedule(Duration::from_micros(op % 200));
                        }
                        3 => {
                            work.schedule(Duration::ZERO);
                        }
                        4 => {
                            work.cancel_sync();
                            // Anything after this is a run after cancel_sync returned,
                            // unless some other thread re-armed it meanwhile.
                        }
                        5 => work.touch(),
                        _ => {
                            let _ = cancelled;
                        }
                    }
                });
            }
        });
        assert!(try_true.load(Ordering::SeqCst) <= 1);
        // Finish: either let it run, or drop/detach it.
        let work = Arc::into_inner(work).unwrap();
        match round % 3 {
            0 => {
                // The flag goes up once drop returned: a run that sees it began after.
                drop(work);
                cancelled.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(500));
                assert_eq!(
                    after_cancel.load(Ordering::SeqCst),
                    0,
                    "ran after drop returned"
                );
            }
            1 => work.detach(),
            _ => {
                // Wait for the run to be complete (counted under the lock with the
                // consumption), not just started.
                let _ = eventually(|| !work.is_pending() || work.stats().runs == 1);
                if work.stats().runs == 1 {
                    assert!(
                        !work.schedule(Duration::ZERO),
                        "a spent once accepted an arm"
                    );
                }
                work.cancel_sync();
                cancelled.store(true, Ordering::SeqCst);
                drop(work);
                assert_eq!(after_cancel.load(Ordering::SeqCst), 0);
            }
        }
        assert!(
            eventually(|| drops.load(Ordering::SeqCst) == 1),
            "round {round}: closure dropped {} times",
            drops.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_micros(500));
        let n = runs.load(Ordering::SeqCst);
        assert!(n <= 1, "round {round}: once ran {n} times");
        assert!(
            try_true.load(Ordering::SeqCst) <= n,
            "try_flush true without a run"
        );
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        total_runs += n;
    }
    assert!(total_runs > 0);
}

/// A once that calls `cancel_sync`, `try_flush`, `flush` and every arm on itself from
/// inside its run (through a handle it reaches by a shared slot), and a once that
/// panics: each returns, the once runs once, its closure is dropped once.
#[test]
fn once_calling_itself_from_inside_its_run() {
    for workers in [0usize, 1, 2] {
        let (sched, manual) = if workers == 0 {
            (Scheduler::manual(), true)
        } else {
            (
                Scheduler::builder().workers(workers).build().unwrap(),
                false,
            )
        };
        let slot: Arc<Mutex<Option<Arc<Work>>>> = Arc::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let drops = Arc::new(AtomicUsize::new(0));
        let results = Arc::new(Mutex::new(Vec::new()));
        let (s2, r2, res2) = (slot.clone(), runs.clone(), results.clone());
        let guard = DropCount(drops.clone());
        let work = Arc::new(sched.once(2 * MS, move |_| {
            let _g = guard;
            r2.fetch_add(1, Ordering::SeqCst);
            let me = loop {
                if let Some(me) = s2.lock().unwrap().clone() {
                    break me;
                }
                std::thread::yield_now();
            };
            let mut res = res2.lock().unwrap();
            res.push(me.try_flush());
            res.push(me.flush());
            res.push(me.schedule(Duration::ZERO));
            res.push(me.reschedule(MS));
            res.push(me.cancel_sync());
            res.push(me.schedule(Duration::ZERO));
        }));
        *slot.lock().unwrap() = Some(work.clone());
        if manual {
            sched.advance(10 * MS);
            sched.advance(10 * MS);
        }
        assert!(eventually(|| drops.load(Ordering::SeqCst) == 1));
        std::thread::sleep(20 * MS);
        if manual {
            sched.advance(10 * MS);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(!work.is_pending(), "a spent once stays disarmed");
        assert!(!work.schedule(Duration::ZERO));
        assert!(!work.try_flush());
        let res = results.lock().unwrap().clone();
        assert!(
            !res[0] && !res[1],
            "flushes from inside its own run: {res:?}"
        );
        slot.lock().unwrap().take();
        drop(Arc::into_inner(work).unwrap());
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}

// --- try_flush never blocks -----------------------------------------------------------

/// A yielding work on 2 workers held on a channel in one increment; `try_flush` from
/// other threads at random moments (including while a flush() waits and while
/// increments change hands) never blocks, returns true only when the caller ran an
/// increment, and no increment runs twice at once. FLUSH_TAKEOVER left behind by a
/// try_flush must not stop the workers from taking the increments afterwards.
#[test]
fn try_flush_on_a_yielding_work_never_blocks_and_leaves_the_increments_to_workers() {
    // The subject is `try_flush`, and the workers run beside three spinning threads.
    // Without back-off: with it, a worker defers each increment while every CPU is busy
    // (by design, up to 128 ms each), and on a machine saturated by other tests the 500
    // increments of a round then outlast the wait for them.
    let sched = common::normal_priority_builder()
        .workers(2)
        .back_off(false)
        .build()
        .unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicUsize::new(0));
    let increments = Arc::new(AtomicUsize::new(0));
    let on_callers = Arc::new(AtomicUsize::new(0));
    let (ru, ov, inc, oc) = (
        running.clone(),
        overlap.clone(),
        increments.clone(),
        on_callers.clone(),
    );
    let worker_names = std::thread::current().name().map(str::to_owned);
    let _ = worker_names;
    let work = Arc::new(sched.work(move |_| {
        if ru.fetch_add(1, Ordering::SeqCst) != 0 {
            ov.fetch_add(1, Ordering::SeqCst);
        }
        let on_worker = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("nicework"));
        if !on_worker {
            oc.fetch_add(1, Ordering::SeqCst);
        }
        let spin = Instant::now() + Duration::from_micros(50);
        while Instant::now() < spin {}
        let n = inc.fetch_add(1, Ordering::SeqCst);
        ru.fetch_sub(1, Ordering::SeqCst);
        if n % 500 == 499 {
            Next::Park
        } else {
            Next::Yield
        }
    }));
    let trues = Arc::new(AtomicUsize::new(0));
    for round in 0..10 {
        let start = increments.load(Ordering::SeqCst);
        assert!(work.schedule(Duration::ZERO));
        std::thread::scope(|s| {
            for t in 0..3 {
                let (work, trues) = (work.clone(), trues.clone());
                s.spawn(move || {
                    let mut rng = Rng(round * 7 + t + 1);
                    for _ in 0..20 {
                        let spin = Instant::now() + Duration::from_micros(rng.next() % 500);
                        while Instant::now() < spin {}
                        let (tx, rx) = mpsc::channel();
                        let w = work.clone();
                        std::thread::spawn(move || {
                            let r = w.try_flush();
                            let _ = tx.send(r);
                        });
                        // try_flush may run increments on its caller (until a worker
                        // takes one); it never waits for a worker's.
                        match rx.recv_timeout(EVENTUALLY) {
                            Ok(true) => {
                                trues.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(false) => {}
                            Err(_) => panic!("try_flush did not return"),
                        }
                    }
                });
            }
        });
        assert!(
            eventually(|| increments.load(Ordering::SeqCst) >= start + 500),
            "round {round}: the increments stalled at {} after try_flush calls \
             (pending {}, running {}, deadline in {:?}, {:?})",
            increments.load(Ordering::SeqCst) - start,
            work.is_pending(),
            work.is_running(),
            work.deadline()
                .map(|d| d.saturating_duration_since(Instant::now())),
            sched.metrics(),
        );
        assert!(eventually(
            || !work.is_pending() && running.load(Ordering::SeqCst) == 0
        ));
    }
    assert_eq!(overlap.load(Ordering::SeqCst), 0, "two increments at once");
    assert!(trues.load(Ordering::SeqCst) <= on_callers.load(Ordering::SeqCst));
}

//! The standby (`src/scheduler/standby.rs`: with two workers or more on Linux, an idle
//! worker sleeps on a timer of its own, which a busy worker sets for what it leaves
//! behind) against arms from other threads while one worker blocks: a due-now arm
//! followed at once by a far one, a stream of far arms, a stream of short ones (none may
//! move the watch past works it was set for); k - 1 blocked callbacks with k workers;
//! callbacks that block on each other's works; shutdown in every state of the standby;
//! never early under churn; `flush` while the other worker stands by. Each test also
//! runs on the portable worker, where a follower takes the place of the standby.
//!
//! Nothing asserts a timing: a work that must run is waited for with `eventually`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler};

use crate::common::*;

/// A flag a callback can block on (bounded, so a failing test still ends).
#[derive(Default)]
struct Gate {
    set: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.set.lock().unwrap() = true;
        self.cv.notify_all();
    }
    fn is_open(&self) -> bool {
        *self.set.lock().unwrap()
    }
    /// Waits up to `bound`; returns whether it opened.
    fn wait(&self, bound: Duration) -> bool {
        let guard = self.set.lock().unwrap();
        let (guard, _) = self.cv.wait_timeout_while(guard, bound, |s| !*s).unwrap();
        *guard
    }
}

/// A blocker and its target on `sched`: the blocker, once run, blocks until the target
/// has run (or `release` opens, or the bound passes), so that its worker stays busy while
/// the target must be run by another. Returns (blocker, target, target ran, release,
/// blocker started).
fn blocker_and_target(
    sched: &Scheduler,
    bound: Duration,
) -> (
    nicework::Work,
    nicework::Work,
    Arc<Gate>,
    Arc<Gate>,
    Arc<AtomicBool>,
) {
    let (ran, release) = (Arc::new(Gate::default()), Arc::new(Gate::default()));
    let started = Arc::new(AtomicBool::new(false));
    let blocker = {
        let (ran, release, started) = (ran.clone(), release.clone(), started.clone());
        sched.work(move |_| {
            started.store(true, Ordering::SeqCst);
            if !ran.wait(bound) {
                release.wait(bound);
            }
            Next::Park
        })
    };
    let target = {
        let ran = ran.clone();
        sched.work(move |_| {
            ran.open();
            Next::Park
        })
    };
    (blocker, target, ran, release, started)
}

/// Worker A (the poller) takes L from the main timer with nothing else armed, so the
/// standby's watch stays disarmed. L blocks until W1 has run. A user thread then arms W1
/// due now (which fires the watch at once) and, right after, a far `once`, whose arm
/// must not move the watch (or clear its expiry) before the standby has read it.
#[test]
fn due_now_then_far_arm_while_one_worker_blocks() {
    let rounds = rounds(10);
    let mut late = 0;
    for round in 0..rounds {
        let sched = Scheduler::builder().workers(2).build().unwrap();
        let (l, w1, w1_ran, release, l_started) =
            blocker_and_target(&sched, Duration::from_secs(30));
        // From the main timer: the poller takes it, the standby stays asleep.
        l.schedule(Duration::from_millis(20));
        assert!(eventually(|| l_started.load(Ordering::SeqCst)));
        std::thread::sleep(Duration::from_millis(5));
        w1.schedule(Duration::ZERO);
        let far = sched.once(FAR, |_| {});
        if !eventually(|| w1_ran.is_open()) {
            late += 1;
            eprintln!("round {round}: W1 (due now) never ran; one worker idle");
        }
        release.open();
        w1_ran.open();
        drop(far);
        drop((l, w1));
        drop(sched);
    }
    assert_eq!(
        late, 0,
        "{late} of {rounds} rounds lost the idle worker's wakeup"
    );
}

/// A worker busy with L (which blocks until W2 ran); W2 was armed before it took L, so
/// the watch is set for W2's window end + 2 slacks. A user thread keeps creating far
/// `once` works (each arm kicks the scheduler); none may move the watch past W2.
#[test]
fn arms_from_other_threads_never_push_the_watch_past_a_due_work() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let (l, w2, w2_ran, release, l_started) = blocker_and_target(&sched, Duration::from_secs(40));
    w2.schedule(Duration::from_millis(300));
    l.schedule(Duration::from_millis(20));
    assert!(eventually(|| l_started.load(Ordering::SeqCst)));
    let stop = Arc::new(AtomicBool::new(false));
    let spammer = {
        let sched = sched.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let start = Instant::now();
            while !stop.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(2) {
                kept.push(sched.once(FAR, |_| {}));
                std::thread::sleep(Duration::from_micros(100));
            }
            kept
        })
    };
    let ran = eventually(|| w2_ran.is_open());
    stop.store(true, Ordering::SeqCst);
    let kept = spammer.join().unwrap();
    release.open();
    w2_ran.open();
    drop(kept);
    drop((l, w2));
    assert!(
        ran,
        "W2 (due at 300 ms) never ran while one worker stood by"
    );
}

/// With k workers, k-1 callbacks block until a probe work ran; the probe is armed due
/// now, with a delay, from a user thread, and from inside the last blocking callback.
#[test]
fn k_minus_one_blocked_callbacks_leave_one_worker() {
    for workers in [2usize, 3, 4] {
        for variant in 0..4 {
            for _ in 0..rounds(2) {
                let sched = Scheduler::builder().workers(workers).build().unwrap();
                let probe_ran = Arc::new(Gate::default());
                let started = Arc::new(AtomicUsize::new(0));
                let probe = Arc::new({
                    let probe_ran = probe_ran.clone();
                    sched.work(move |_| {
                        probe_ran.open();
                        Next::Park
                    })
                });
                // A periodic neighbour keeps the wheel non-empty (so the watch is set).
                let tick = Arc::new(AtomicUsize::new(0));
                let neighbour = {
                    let tick = tick.clone();
                    sched.every(Duration::from_millis(7), move |_| {
                        tick.fetch_add(1, Ordering::SeqCst);
                        Next::Again
                    })
                };
                let blockers: Vec<_> = (0..workers - 1)
                    .map(|i| {
                        let probe_ran = probe_ran.clone();
                        let started = started.clone();
                        let probe = probe.clone();
                        let last = i == workers - 2;
                        let w = sched.work(move |_| {
                            started.fetch_add(1, Ordering::SeqCst);
                            if last && variant == 3 {
                                probe.schedule(Duration::from_millis(15));
                            }
                            probe_ran.wait(Duration::from_secs(30));
                            Next::Park
                        });
                        w.schedule(Duration::from_millis(10 + 3 * i as u64));
                        w
                    })
                    .collect();
                assert!(eventually(|| started.load(Ordering::SeqCst) == workers - 1));
                match variant {
                    0 => {
                        probe.schedule(Duration::ZERO);
                    }
                    1 => {
                        probe.schedule(Duration::from_millis(25));
                    }
                    2 => {
                        probe.schedule(Duration::from_secs(5));
                        probe.reschedule(Duration::from_millis(1));
                    }
                    _ => {}
                }
                let ok = eventually(|| probe_ran.is_open());
                let t0 = tick.load(Ordering::SeqCst);
                let ticking = eventually(|| tick.load(Ordering::SeqCst) > t0 + 3);
                probe_ran.open();
                drop(blockers);
                drop(neighbour);
                assert!(ok, "workers {workers} variant {variant}: probe never ran");
                assert!(
                    ticking,
                    "workers {workers} variant {variant}: neighbour stalled"
                );
            }
        }
    }
}

/// Two callbacks block on each other's helper works (3 workers: one left for both helpers).
#[test]
fn two_callbacks_block_on_each_others_works() {
    for _ in 0..rounds(10) {
        let sched = Scheduler::builder().workers(3).build().unwrap();
        let g1 = Arc::new(Gate::default());
        let g2 = Arc::new(Gate::default());
        let h1 = {
            let g1 = g1.clone();
            Arc::new(sched.work(move |_| {
                g1.open();
                Next::Park
            }))
        };
        let h2 = {
            let g2 = g2.clone();
            Arc::new(sched.work(move |_| {
                g2.open();
                Next::Park
            }))
        };
        let done = Arc::new(AtomicUsize::new(0));
        let a = {
            let (h2, g1, done) = (h2.clone(), g1.clone(), done.clone());
            sched.work(move |_| {
                h2.schedule(Duration::from_millis(3));
                if g1.wait(Duration::from_secs(30)) {
                    done.fetch_add(1, Ordering::SeqCst);
                }
                Next::Park
            })
        };
        let b = {
            let (h1, g2, done) = (h1.clone(), g2.clone(), done.clone());
            sched.work(move |_| {
                h1.schedule(Duration::ZERO);
                if g2.wait(Duration::from_secs(30)) {
                    done.fetch_add(1, Ordering::SeqCst);
                }
                Next::Park
            })
        };
        a.schedule(Duration::from_millis(5));
        b.schedule(Duration::from_millis(5));
        assert!(
            eventually(|| done.load(Ordering::SeqCst) == 2),
            "mutual blocking stalled"
        );
    }
}

/// Shutdown: dropping the last handle from another thread with the standby asleep, with
/// a watch armed for a busy worker, and from inside a callback while the other stands by.
#[test]
fn shutdown_with_the_standby_in_every_state() {
    for round in 0..rounds(30) {
        let workers = 2 + round % 3;
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        let case = round % 4;
        let release = Arc::new(Gate::default());
        let started = Arc::new(AtomicBool::new(false));
        let mut keep = Vec::new();
        match case {
            0 => {}
            1 => {
                // A worker busy, the watch set for a neighbour.
                keep.push(sched.every(Duration::from_millis(50), |_| Next::Again));
                let (release2, started2) = (release.clone(), started.clone());
                let w = sched.work(move |_| {
                    let (release, started) = (&release2, &started2);
                    started.store(true, Ordering::SeqCst);
                    release.wait(Duration::from_millis(200));
                    Next::Park
                });
                w.schedule(Duration::from_millis(2));
                keep.push(w);
                assert!(eventually(|| started.load(Ordering::SeqCst)));
            }
            2 => {
                // Churn: works running back to back; drop lands anywhere.
                for i in 0..8 {
                    keep.push(sched.every(Duration::from_micros(300 + 100 * i), |_| Next::Again));
                }
                std::thread::sleep(Duration::from_millis((round % 7) as u64));
            }
            _ => {
                // The last handle dropped from inside a callback.
                let slot: Arc<Mutex<Option<Scheduler>>> = Arc::default();
                keep.push(sched.every(Duration::from_millis(3), |_| Next::Again));
                let dropper = {
                    let slot = slot.clone();
                    let started = started.clone();
                    sched.work(move |_| {
                        drop(slot.lock().unwrap().take());
                        started.store(true, Ordering::SeqCst);
                        Next::Park
                    })
                };
                dropper.schedule(Duration::from_millis(4));
                keep.push(dropper);
                *slot.lock().unwrap() = Some(sched);
                let ok = eventually(|| started.load(Ordering::SeqCst));
                drop(keep);
                assert!(ok);
                continue;
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            drop(sched);
            tx.send(()).unwrap();
        });
        release.open();
        assert!(
            rx.recv_timeout(Duration::from_secs(20)).is_ok(),
            "round {round} case {case}: shutdown hung"
        );
        t.join().unwrap();
        drop(keep);
    }
}

/// Never early by the real clock under multi-worker churn with leeways, re-arms from
/// other threads, and blocking callbacks.
#[test]
fn never_early_under_churn() {
    for workers in [2usize, 3, 4] {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        let early = Arc::new(AtomicUsize::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let mut works = Vec::new();
        for i in 0..24u64 {
            let (early, runs) = (early.clone(), runs.clone());
            let mut rng = Rng(i * 7919 + 13);
            let w = sched.work(move |cx| {
                if Instant::now() < cx.deadline() {
                    early.fetch_add(1, Ordering::SeqCst);
                }
                runs.fetch_add(1, Ordering::SeqCst);
                let r = rng.next();
                if r % 11 == 0 {
                    std::thread::sleep(Duration::from_millis(r % 5));
                }
                match r % 5 {
                    0 => Next::After(Duration::from_micros(r % 3000)),
                    1 => Next::Yield,
                    2 => Next::At(Instant::now() + Duration::from_micros(r % 2000)),
                    _ => Next::After(Duration::from_micros(100 + r % 500)),
                }
            });
            let w = if i % 3 == 0 {
                w.leeway(Duration::from_micros(i * 200))
            } else {
                w
            };
            w.schedule(Duration::from_micros(i * 100));
            works.push(Arc::new(w));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let works = works.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(t + 99);
                    while !stop.load(Ordering::SeqCst) {
                        let r = rng.next();
                        let w = &works[(r % works.len() as u64) as usize];
                        let d = Duration::from_micros(r % 4000);
                        match (r >> 8) % 4 {
                            0 => {
                                w.schedule(d);
                            }
                            1 => {
                                w.reschedule(d);
                            }
                            2 => {
                                w.schedule_within(d);
                            }
                            _ => {
                                w.cancel();
                                w.schedule(Duration::ZERO);
                            }
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(600));
        stop.store(true, Ordering::SeqCst);
        for t in threads {
            t.join().unwrap();
        }
        drop(works);
        drop(sched);
        assert!(runs.load(Ordering::SeqCst) > 100);
        assert_eq!(
            early.load(Ordering::SeqCst),
            0,
            "workers {workers}: early runs"
        );
    }
}

/// flush() from a user thread of a work running on one worker while the other stands by.
#[test]
fn flush_of_a_running_work_while_the_other_stands_by() {
    for _ in 0..rounds(20) {
        let sched = Scheduler::builder().workers(2).build().unwrap();
        let started = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicUsize::new(0));
        let w = {
            let (started, runs) = (started.clone(), runs.clone());
            sched.work(move |_| {
                started.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
                runs.fetch_add(1, Ordering::SeqCst);
                Next::Park
            })
        };
        let other_ran = Arc::new(AtomicBool::new(false));
        let other = {
            let other_ran = other_ran.clone();
            sched.work(move |_| {
                other_ran.store(true, Ordering::SeqCst);
                Next::Park
            })
        };
        other.schedule(Duration::from_millis(8));
        w.schedule(Duration::from_millis(2));
        assert!(eventually(|| started.load(Ordering::SeqCst)));
        let (tx, rx) = std::sync::mpsc::channel();
        let w = Arc::new(w);
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            let flushed = w2.flush();
            tx.send(flushed).unwrap();
        });
        let flushed = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("flush hung");
        t.join().unwrap();
        // `false` only if the run ended before the flush began (a slowed build can take
        // longer than the run's 20 ms to start the flushing thread); it never hangs.
        assert!(flushed || runs.load(Ordering::SeqCst) == 1);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(eventually(|| other_ran.load(Ordering::SeqCst)));
        // A pending one flushed from a user thread runs there, with a blocked worker.
        let gate = Arc::new(Gate::default());
        let blocker = {
            let gate = gate.clone();
            sched.work(move |_| {
                gate.wait(Duration::from_secs(30));
                Next::Park
            })
        };
        blocker.schedule(Duration::ZERO);
        w.schedule(Duration::from_millis(1));
        assert!(w.flush() || runs.load(Ordering::SeqCst) == 2);
        assert!(eventually(|| runs.load(Ordering::SeqCst) == 2));
        gate.open();
    }
}

/// As above with ordinary 100 ms arms: a user thread arming short `once` works every
/// 100 µs while one worker blocks (until W2 ran) must not starve W2 or the `once` works.
#[test]
fn a_steady_stream_of_short_arms_starves_no_work() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let (l, w2, w2_ran, _release, l_started) = blocker_and_target(&sched, Duration::from_secs(40));
    w2.schedule(Duration::from_millis(100));
    l.schedule(Duration::from_millis(10));
    assert!(eventually(|| l_started.load(Ordering::SeqCst)));
    let once_runs = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let spammer = {
        let (sched, stop, once_runs) = (sched.clone(), stop.clone(), once_runs.clone());
        std::thread::spawn(move || {
            let mut made = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let once_runs = once_runs.clone();
                sched
                    .once(Duration::from_millis(100), move |_| {
                        once_runs.fetch_add(1, Ordering::SeqCst);
                    })
                    .detach();
                made += 1;
                std::thread::sleep(Duration::from_micros(100));
            }
            made
        })
    };
    let t0 = Instant::now();
    let ran = eventually(|| w2_ran.is_open());
    eprintln!(
        "W2 (due 100 ms after L started) ran {:?} later: {ran}",
        t0.elapsed()
    );
    let once_ran_before_stop = once_runs.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let made = spammer.join().unwrap();
    w2_ran.open();
    drop((l, w2));
    assert!(
        ran,
        "W2 never ran; {once_ran_before_stop} of {made} `once` works ran while the stream lasted"
    );
}

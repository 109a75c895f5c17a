//! `Work::detach` under races: with shutdown, with runs on other workers, with the
//! own callback, with disable counts; counted with Drop-counting captures.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::eventually;
use nicework::{Next, Scheduler, Work};

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);

/// Counts its drops; the callback checks `dropped` to see it was never freed under it.
struct Counted {
    drops: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn counted() -> (Counted, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    (
        Counted {
            drops: drops.clone(),
        },
        drops,
    )
}

fn two_workers() -> Scheduler {
    Scheduler::builder().workers(2).build().unwrap()
}

/// Polls until the scheduler that `probe` belongs to has shut down: a pending work's
/// `reschedule` returns true until then.
fn wait_for_shutdown(probe: &Work) {
    assert!(
        eventually(|| !probe.reschedule(HOUR)),
        "the scheduler never shut down"
    );
}

// === detach racing shutdown while the work is running and armed again ===

/// A work rescheduled from outside while it runs (so it is pending and running at once),
/// whose pending instance a second worker found due and dropped (it is still running),
/// then detached, then its scheduler dropped while it still runs. Its life must end at
/// shutdown at the latest: the closure is freed exactly once when the run ends.
fn rescheduled_during_run_then_detached_then_shutdown(next: Next) {
    let sched = two_workers();
    let (flag, drops) = counted();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let work = sched.work(move |_| {
        assert_eq!(
            flag.drops.load(Ordering::SeqCst),
            0,
            "ran after being freed"
        );
        r.fetch_add(1, Ordering::SeqCst);
        let _ = started_tx.send(());
        let _ = release_rx.recv();
        next
    });
    let probe = sched.work(|_| Next::Park);
    assert!(probe.schedule(HOUR));
    assert!(work.schedule(Duration::ZERO));
    started_rx.recv().unwrap();
    // Pending and running at once; the other worker finds the entry due and drops it
    // (the work is running), so only the probe's entry stays.
    assert!(!work.reschedule(Duration::ZERO));
    assert!(work.is_pending() && work.is_running());
    assert!(
        eventually(|| sched.metrics().timer_entries == 1),
        "the second worker never looked at the due entry"
    );
    work.detach();
    assert_eq!(drops.load(Ordering::SeqCst), 0, "freed while running");
    let dropper = std::thread::spawn(move || drop(sched));
    wait_for_shutdown(&probe);
    release_tx.send(()).unwrap();
    dropper.join().unwrap();
    // The workers were joined: the run has ended and the work's life with it.
    if drops.load(Ordering::SeqCst) != 1 {
        // The probe holds the last reference to the scheduler's state, whose timer
        // would then free a work whose closure is alive (a debug assertion in a
        // destructor while this test unwinds would abort the whole binary).
        std::mem::forget(probe);
    }
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "a detached work whose run ended after shutdown must be freed exactly once \
         (next = {next:?}, runs = {})",
        runs.load(Ordering::SeqCst)
    );
}

#[test]
fn detached_work_pending_and_running_at_shutdown_is_freed_when_it_returns_stop() {
    rescheduled_during_run_then_detached_then_shutdown(Next::Stop);
}

#[test]
fn detached_work_pending_and_running_at_shutdown_is_freed_when_it_returns_again() {
    rescheduled_during_run_then_detached_then_shutdown(Next::Again);
}

/// The same without detach: after the scheduler was dropped, a work whose run straddled
/// the shutdown is not left pending (arming calls are refused after shutdown).
#[test]
fn a_work_rescheduled_during_a_run_that_straddles_shutdown_is_not_left_pending() {
    let sched = two_workers();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let work = sched.work(move |_| {
        let _ = started_tx.send(());
        let _ = release_rx.recv();
        Next::Stop
    });
    let probe = sched.work(|_| Next::Park);
    assert!(probe.schedule(HOUR));
    assert!(work.schedule(Duration::ZERO));
    started_rx.recv().unwrap();
    assert!(!work.reschedule(Duration::ZERO));
    assert!(eventually(|| sched.metrics().timer_entries == 1));
    let dropper = std::thread::spawn(move || drop(sched));
    wait_for_shutdown(&probe);
    release_tx.send(()).unwrap();
    dropper.join().unwrap();
    assert!(!work.is_running());
    assert!(
        !work.is_pending(),
        "pending after its scheduler shut down: nothing will ever run it"
    );
}

// === detach racing shutdown from another thread ===

#[test]
fn detach_racing_scheduler_drop_frees_exactly_once_and_never_under_a_run() {
    for round in 0..300 {
        let sched = if round % 2 == 0 {
            two_workers()
        } else {
            Scheduler::new().unwrap()
        };
        let mut all = Vec::new();
        let mut works = Vec::new();
        let stop_runs_after_drop = Arc::new(AtomicBool::new(false));
        let late_runs = Arc::new(AtomicU32::new(0));
        for i in 0..8 {
            let (flag, drops) = counted();
            let dead = stop_runs_after_drop.clone();
            let late = late_runs.clone();
            let work = sched.work(move |_| {
                assert_eq!(
                    flag.drops.load(Ordering::SeqCst),
                    0,
                    "ran after being freed"
                );
                if dead.load(Ordering::SeqCst) {
                    late.fetch_add(1, Ordering::SeqCst);
                }
                match i % 4 {
                    0 => Next::Again,
                    1 => Next::Yield,
                    2 => Next::After(Duration::from_micros(150)),
                    _ => Next::At(std::time::Instant::now()),
                }
            });
            work.schedule(Duration::from_micros(100 * i));
            works.push(work);
            all.push(drops);
        }
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let b = barrier.clone();
        let dead = stop_runs_after_drop.clone();
        let dropper = std::thread::spawn(move || {
            b.wait();
            drop(sched);
            dead.store(true, Ordering::SeqCst);
        });
        barrier.wait();
        for work in works {
            work.detach();
        }
        dropper.join().unwrap();
        for (i, drops) in all.iter().enumerate() {
            assert!(
                eventually(|| drops.load(Ordering::SeqCst) >= 1),
                "round {round}: work {i} never freed"
            );
            assert_eq!(drops.load(Ordering::SeqCst), 1, "round {round}: work {i}");
        }
        assert_eq!(
            late_runs.load(Ordering::SeqCst),
            0,
            "round {round}: a run started after the scheduler's drop returned"
        );
    }
}

// === thousands of detached one-shots ===

#[test]
fn thousands_of_detached_one_shots_on_two_workers_run_once_and_are_freed() {
    const N: usize = 5000;
    let sched = two_workers();
    let drops = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let twice = Arc::new(AtomicUsize::new(0));
    for i in 0..N {
        let flag = Counted {
            drops: drops.clone(),
        };
        let r = runs.clone();
        let t = twice.clone();
        let mut ran = false;
        let work = sched.work(move |_| {
            let _keep = &flag;
            if ran {
                t.fetch_add(1, Ordering::SeqCst);
            }
            ran = true;
            r.fetch_add(1, Ordering::SeqCst);
            if i % 2 == 0 { Next::Stop } else { Next::Park }
        });
        work.schedule(Duration::from_micros((i % 7) as u64 * 100));
        work.detach();
    }
    assert!(
        eventually(|| drops.load(Ordering::SeqCst) == N),
        "freed {} of {N}",
        drops.load(Ordering::SeqCst)
    );
    assert_eq!(runs.load(Ordering::SeqCst), N);
    assert_eq!(twice.load(Ordering::SeqCst), 0);
    std::thread::sleep(5 * MS);
    assert_eq!(drops.load(Ordering::SeqCst), N);
    assert_eq!(sched.metrics().armed, 0);
}

// === detach from inside the own callback, on a real scheduler ===

#[test]
fn detach_from_inside_the_own_callback_on_two_workers_frees_after_the_run() {
    for _ in 0..200 {
        let sched = two_workers();
        let (flag, drops) = counted();
        let slot: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
        let s = slot.clone();
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let work = sched.work(move |_| {
            let n = r.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(me) = s.lock().unwrap().take() {
                me.detach();
            }
            // Still running: the closure must be alive.
            std::thread::yield_now();
            assert_eq!(
                flag.drops.load(Ordering::SeqCst),
                0,
                "freed under its own run"
            );
            if n >= 3 { Next::Stop } else { Next::Yield }
        });
        *slot.lock().unwrap() = Some(work);
        slot.lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .schedule(Duration::ZERO);
        assert!(eventually(|| drops.load(Ordering::SeqCst) == 1));
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        drop(slot);
    }
}

/// A work detached from its own callback while the scheduler is dropped from another
/// thread: freed exactly once.
#[test]
fn detach_inside_the_callback_racing_scheduler_drop() {
    for round in 0..200 {
        let sched = two_workers();
        let (flag, drops) = counted();
        let slot: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
        let s = slot.clone();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let runs = Arc::new(AtomicU32::new(0));
        let detached_in = Arc::new(AtomicU32::new(0));
        let (r, din) = (runs.clone(), detached_in.clone());
        let work = sched.work(move |_| {
            let n = r.fetch_add(1, Ordering::SeqCst) + 1;
            let _ = started_tx.send(());
            std::thread::yield_now();
            if let Some(me) = s.lock().unwrap().take() {
                me.detach();
                din.store(n, Ordering::SeqCst);
            }
            assert_eq!(
                flag.drops.load(Ordering::SeqCst),
                0,
                "freed under its own run"
            );
            Next::Again
        });
        work.schedule(Duration::ZERO);
        *slot.lock().unwrap() = Some(work);
        started_rx.recv().unwrap();
        drop(sched);
        // The handle may still be in the slot if no run took it before the shutdown:
        // then dropping it frees the closure (which holds the slot: take it out, or the
        // user-made cycle keeps it).
        let left = slot.lock().unwrap().take();
        let handle_left = left.is_some();
        drop(left);
        drop(slot);
        assert!(
            eventually(|| drops.load(Ordering::SeqCst) >= 1),
            "round {round}: never freed; runs {}, detached in run {}, handle left {handle_left}",
            runs.load(Ordering::SeqCst),
            detached_in.load(Ordering::SeqCst)
        );
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}

// === detached works and their callbacks ===

#[test]
fn a_detached_work_that_panics_on_a_worker_is_freed_once_and_the_worker_carries_on() {
    let sched = two_workers();
    let (flag, drops) = counted();
    let work = sched.work(move |cx| {
        let _keep = &flag;
        if cx.runs() == 3 {
            panic!("detached boom");
        }
        Next::Yield
    });
    work.schedule(Duration::ZERO);
    work.detach();
    assert!(eventually(|| drops.load(Ordering::SeqCst) == 1));
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let other = sched.work(move |_| {
        r.store(true, Ordering::SeqCst);
        Next::Park
    });
    other.schedule(Duration::ZERO);
    assert!(eventually(|| ran.load(Ordering::SeqCst)));
    std::thread::sleep(5 * MS);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

/// A detached work whose callback creates and detaches other works through
/// `cx.scheduler()`, a small tree of one-shots: every closure is freed once.
#[test]
fn detached_works_spawning_detached_works_through_cx_scheduler() {
    let sched = two_workers();
    let drops = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    fn spawn(sched: &Scheduler, depth: u32, drops: Arc<AtomicUsize>, runs: Arc<AtomicUsize>) {
        let flag = Counted {
            drops: drops.clone(),
        };
        let work = sched.work(move |cx| {
            let _keep = &flag;
            runs.fetch_add(1, Ordering::SeqCst);
            if depth > 0 {
                spawn(cx.scheduler(), depth - 1, drops.clone(), runs.clone());
                spawn(cx.scheduler(), depth - 1, drops.clone(), runs.clone());
            }
            Next::Stop
        });
        work.schedule(Duration::ZERO);
        work.detach();
    }
    spawn(&sched, 9, drops.clone(), runs.clone());
    let total = (1usize << 10) - 1;
    assert!(
        eventually(|| drops.load(Ordering::SeqCst) == total),
        "freed {} of {total}",
        drops.load(Ordering::SeqCst)
    );
    assert_eq!(runs.load(Ordering::SeqCst), total);
}

/// A detached work holding a clone of its own scheduler's handle keeps the scheduler
/// alive (a cycle the user made); when it stops, both go.
#[test]
fn a_detached_work_holding_its_schedulers_handle_drops_it_after_stopping() {
    let sched = two_workers();
    let (flag, drops) = counted();
    let mut held = Some(sched.clone());
    let work = sched.work(move |cx| {
        let _keep = &flag;
        if cx.runs() < 5 {
            return Next::Yield;
        }
        // Dropping the last handle from inside the callback.
        held.take();
        Next::Stop
    });
    work.schedule(Duration::ZERO);
    work.detach();
    drop(sched);
    assert!(eventually(|| drops.load(Ordering::SeqCst) == 1));
    std::thread::sleep(5 * MS);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

// === detach and disable counts ===

/// A disabled work that is detached is freed at once; a later work (which may reuse its
/// address) must start with no disable levels: one disable and one enable leave it
/// armable.
#[test]
fn a_detached_disabled_work_leaves_no_disable_level_behind() {
    let sched = Scheduler::manual();
    for round in 0..200 {
        let (flag, drops) = counted();
        let old = sched.work(move |_| {
            let _keep = &flag;
            Next::Park
        });
        old.disable();
        old.detach();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        let (flag, _) = counted();
        let fresh = sched.work(move |_| {
            let _keep = &flag;
            Next::Park
        });
        fresh.disable();
        fresh.enable();
        assert!(
            !fresh.is_disabled(),
            "round {round}: a matched disable/enable left a fresh work disabled"
        );
        assert!(fresh.schedule(Duration::ZERO), "round {round}");
        sched.advance(Duration::ZERO);
    }
}

/// The same on a work disabled while it runs, detached from inside its callback.
#[test]
fn a_work_disabled_and_detached_during_its_run_leaves_no_disable_level_behind() {
    let sched = Scheduler::manual();
    for round in 0..100 {
        let slot: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
        let s = slot.clone();
        let work = sched.work(move |_| {
            if let Some(me) = s.lock().unwrap().take() {
                me.disable();
                me.detach();
            }
            Next::Again
        });
        work.schedule(Duration::ZERO);
        *slot.lock().unwrap() = Some(work);
        sched.advance(Duration::ZERO);
        assert!(slot.lock().unwrap().is_none());
        let s2 = slot.clone();
        let fresh = sched.work(move |_| {
            let _keep = &s2;
            Next::Park
        });
        fresh.disable();
        fresh.enable();
        assert!(
            fresh.schedule(Duration::ZERO),
            "round {round}: a matched disable/enable left a fresh work disabled"
        );
        sched.advance(Duration::ZERO);
    }
}

// === detach on the global scheduler ===

#[test]
fn detached_one_shots_on_the_global_scheduler_run_and_are_freed() {
    let g = nicework::global();
    let drops = Arc::new(AtomicUsize::new(0));
    for _ in 0..100 {
        let flag = Counted {
            drops: drops.clone(),
        };
        let work = g.work(move |_| {
            let _keep = &flag;
            Next::Stop
        });
        work.schedule(Duration::ZERO);
        work.detach();
    }
    assert!(eventually(|| drops.load(Ordering::SeqCst) == 100));
}

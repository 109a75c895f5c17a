//! What `cancel_sync` refuses, and for how long:
//!
//! - every re-arm from the moment it is called: a lock-free `reschedule` racing with it
//!   (from another thread, or while the callback cancels itself) must not leave the work
//!   pending once the cancel is over;
//! - `disable`/`enable` nest only with each other: an `enable()` without a matching
//!   `disable()` never lifts the re-arm refusal of a `cancel_sync` (or drop) that waits
//!   for a running instance, so that instance's own `Next::Again` is refused and the work
//!   does not run again after `cancel_sync` returned;
//! - `touch` after `cancel_sync` does not re-arm, and many `cancel_sync` waiters against
//!   `enable`/`disable`/`touch` never let the work run and never stick.
//!
//! The races against a lock-free `reschedule` repeat rounds ([`common::rounds`]) and
//! assert that no round broke the promise. The two racing threads are pinned to two CPUs
//! (if the process may use two), and one side waits for the state the other creates (the
//! canceller asleep in its wait, read from `/proc`, which makes them Linux's) rather than
//! for luck: waits are for states, nothing asserts a timing.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use nicework::{Next, Scheduler, Work};

// The races against a lock-free re-arm read thread states in `/proc` and pin threads to
// CPUs: Linux's.
#[cfg(target_os = "linux")]
use common::{
    EVENTUALLY, FAR, assert_no_round_broke, eventually, pin_to_cpu, racing_sched, rounds,
    spin_until_eventually, thread_state, two_cpus,
};
#[cfg(target_os = "linux")]
use std::sync::atomic::{AtomicI32, Ordering::SeqCst};
#[cfg(target_os = "linux")]
use std::sync::{OnceLock, Weak, mpsc};
#[cfg(target_os = "linux")]
use std::thread;

/// A work that returns `Again` and, on its first run, holds the worker until released.
fn held_once(sched: &Scheduler) -> (Arc<Work>, Arc<Barrier>, Arc<Barrier>, Arc<AtomicU64>) {
    let started = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    let runs = Arc::new(AtomicU64::new(0));
    let work = {
        let (started, release, runs) = (started.clone(), release.clone(), runs.clone());
        Arc::new(sched.work(move |_| {
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                started.wait();
                release.wait();
            }
            Next::Again
        }))
    };
    (work, started, release, runs)
}

/// Waits until a `cancel_sync` on another thread refuses arms: `schedule` is refused
/// while the work is not pending. (A `schedule` that lands before the `cancel_sync`
/// arms the work; the `cancel_sync` then disarms it, and the next attempt is refused.)
fn wait_until_cancel_sync_refuses(work: &Work) {
    assert!(
        common::eventually(|| !work.schedule(Duration::from_secs(3600)) && !work.is_pending()),
        "cancel_sync never started refusing"
    );
}

fn unmatched_enable_against_a_waiting_cancel_sync(sched: &Scheduler, drive: impl FnOnce()) {
    let (work, started, release, runs) = held_once(sched);
    assert!(work.schedule(Duration::ZERO));
    drive();
    started.wait(); // the first run is executing and holds until released
    let canceller = {
        let work = work.clone();
        std::thread::spawn(move || work.cancel_sync())
    };
    wait_until_cancel_sync_refuses(&work);
    work.enable(); // unmatched: must do nothing
    work.enable();
    assert!(!work.is_disabled());
    assert!(
        !work.schedule(Duration::ZERO),
        "enable() lifted cancel_sync's refusal"
    );
    release.wait();
    canceller.join().unwrap();
    // The run returned `Again` while cancel_sync waited: refused, so nothing is armed.
    assert!(!work.is_running());
    assert!(
        !work.is_pending(),
        "the work re-armed after cancel_sync returned"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // After cancel_sync, schedule arms it again.
    assert!(work.schedule(Duration::from_secs(3600)));
}

#[test]
fn an_unmatched_enable_does_not_undo_a_waiting_cancel_sync_on_a_worker() {
    let sched = Scheduler::builder().workers(1).build().unwrap();
    unmatched_enable_against_a_waiting_cancel_sync(&sched, || {});
}

#[test]
fn an_unmatched_enable_does_not_undo_a_waiting_cancel_sync_on_the_manual_scheduler() {
    let sched = Scheduler::manual();
    let driver = sched.clone();
    let mut advancing = None;
    unmatched_enable_against_a_waiting_cancel_sync(&sched, || {
        advancing = Some(std::thread::spawn(move || driver.advance(Duration::ZERO)));
    });
    assert_eq!(advancing.unwrap().join().unwrap(), 1);
}

#[test]
fn enable_still_matches_disable_while_a_cancel_sync_waits() {
    // A user's own disable/enable pair around a waiting cancel_sync nests as before.
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let (work, started, release, _runs) = held_once(&sched);
    assert!(work.schedule(Duration::ZERO));
    started.wait();
    assert!(!work.disable());
    let canceller = {
        let work = work.clone();
        std::thread::spawn(move || work.cancel_sync())
    };
    wait_until_cancel_sync_refuses(&work);
    release.wait();
    canceller.join().unwrap();
    assert!(
        work.is_disabled(),
        "cancel_sync consumed the user's disable level"
    );
    assert!(!work.schedule(Duration::ZERO));
    work.enable();
    assert!(!work.is_disabled());
    assert!(work.schedule(Duration::from_secs(3600)));
}

/// After `cancel_sync` the callback runs again only after `schedule` or `reschedule`:
/// a `touch` does not re-arm it.
#[test]
fn touch_does_not_rearm_a_work_after_cancel_sync() {
    let sched = Scheduler::manual();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let w = sched.every(Duration::from_millis(10), move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Next::Park
    });
    sched.advance(Duration::from_millis(10));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    w.cancel_sync();
    w.touch();
    sched.advance(Duration::from_millis(50));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a cancel_sync'ed work ran again after touch() without any schedule()"
    );
}

/// Many concurrent cancel_sync waiters + enable/disable/schedule/touch. After every
/// cancel_sync returned (and nobody scheduled), no new run may start; and once everything
/// returned the work is schedulable again (CANCEL_WAITING not stuck).
#[test]
fn many_cancel_sync_waiters_never_let_the_work_run_and_never_stick() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    for round in 0..20 {
        let started = Arc::new(AtomicUsize::new(0));
        let s = started.clone();
        let w = Arc::new(sched.work(move |_| {
            s.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            Next::After(Duration::ZERO)
        }));
        w.schedule(Duration::ZERO);
        while started.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut noise = Vec::new();
        for k in 0..3 {
            let (w, stop) = (w.clone(), stop.clone());
            noise.push(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match k {
                        0 => w.enable(),
                        1 => {
                            w.disable();
                            w.enable();
                        }
                        _ => w.touch(),
                    }
                }
            }));
        }
        let n = 6;
        let barrier = Arc::new(Barrier::new(n));
        let waiters: Vec<_> = (0..n)
            .map(|_| {
                let (w, b, s) = (w.clone(), barrier.clone(), started.clone());
                std::thread::spawn(move || {
                    b.wait();
                    w.cancel_sync();
                    assert!(!w.is_running(), "cancel_sync returned while running");
                    s.load(Ordering::SeqCst)
                })
            })
            .collect();
        let seen: Vec<usize> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
        let max_seen = *seen.iter().max().unwrap();
        // touch() is noise: by design/impl it may re-arm after cancel_sync; stop it first.
        stop.store(true, Ordering::SeqCst);
        for t in noise {
            t.join().unwrap();
        }
        let _ = max_seen;
        w.cancel_sync();
        let after = started.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            started.load(Ordering::SeqCst),
            after,
            "round {round}: ran after final cancel_sync"
        );
        // not stuck refusing
        assert!(!w.is_disabled(), "round {round}: disable count leaked");
        assert!(
            w.schedule(Duration::from_secs(100)),
            "round {round}: refusal stuck after all cancel_syncs"
        );
        w.cancel_sync();
    }
}

// ---------------------------------------------------------------------------------------
// A lock-free re-arm racing `cancel_sync`.
// ---------------------------------------------------------------------------------------

/// One round: a run in progress, a live timer entry (so `reschedule` is lock-free), one
/// thread re-arming the work with `reschedule` whenever it finds it not pending, while
/// another (on another CPU) calls `cancel_sync`. The rescheduler stops once the cancel
/// sleeps, waiting for the run, and before the run is released; so every reschedule
/// happened before or during the `cancel_sync`, and the work must not be pending when it
/// returned. Returns whether it was.
#[cfg(target_os = "linux")]
fn cancel_sync_against_a_rescheduler(sched: &Scheduler) -> bool {
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let work = sched.work(move |_| {
        let _ = started_tx.send(());
        let _ = release_rx.recv();
        Next::Park
    });
    // Declared after `work`, so dropped first: a failing assertion releases the run
    // before the work's drop waits for it.
    let release_tx = release_tx;
    assert!(work.schedule(Duration::ZERO));
    started_rx
        .recv_timeout(EVENTUALLY)
        .expect("the work never started running");
    // Armed during its run: this links a timer entry, so the reschedules below are one
    // CAS each, without the lock.
    work.reschedule(FAR);
    assert!(work.is_pending() && work.is_running());

    let stop = AtomicBool::new(false);
    let canceller_tid = AtomicI32::new(0);
    let cpus = two_cpus();
    let pending_after = thread::scope(|s| {
        let rescheduler = s.spawn(|| {
            if let Some((cpu, _)) = cpus {
                pin_to_cpu(cpu);
            }
            while !stop.load(SeqCst) {
                // Re-arm the moment the cancel disarmed it.
                if !work.is_pending() {
                    work.reschedule(FAR);
                }
                std::hint::spin_loop();
            }
        });
        let canceller = s.spawn(|| {
            if let Some((_, cpu)) = cpus {
                pin_to_cpu(cpu);
            }
            canceller_tid.store(common::gettid(), SeqCst);
            work.cancel_sync()
        });
        // cancel_sync sleeps: it waits for the run, and refuses every re-arm.
        let waiting = eventually(|| {
            let tid = canceller_tid.load(SeqCst);
            tid != 0 && thread_state(tid) == Some('S')
        });
        stop.store(true, SeqCst);
        rescheduler.join().unwrap();
        // Every reschedule is over; now let the run end, and with it the cancel_sync.
        release_tx.send(()).unwrap();
        canceller.join().unwrap();
        assert!(waiting, "cancel_sync never waited for the run");
        assert!(!work.is_running());
        work.is_pending()
    });
    work.cancel_sync();
    pending_after
}

#[cfg(target_os = "linux")]
#[test]
fn cancel_sync_refuses_a_lock_free_reschedule_racing_it() {
    let sched = racing_sched();
    let total = rounds(300);
    let broke = (0..total)
        .filter(|_| cancel_sync_against_a_rescheduler(&sched))
        .count();
    assert_no_round_broke(
        "cancel_sync against a concurrent reschedule",
        broke,
        total,
        "(the work was pending after cancel_sync returned, re-armed by a reschedule \
         that came after the cancel began and before it returned)",
    );
}

/// One round: the callback cancels its own work with `cancel_sync` while another thread
/// reschedules it in a loop; the callback then stops the rescheduler and waits until its
/// last reschedule returned before it returns. Each reschedule came before the cancel
/// (and was disarmed by it) or after it began and before the run ended (and must be
/// refused), so the work must not be pending after the run. Returns whether it was.
#[cfg(target_os = "linux")]
fn cancel_sync_inside_the_callback_against_a_rescheduler(sched: &Scheduler) -> bool {
    struct Round {
        me: OnceLock<Weak<Work>>,
        started: AtomicBool,
        reschedules: AtomicUsize,
        stop: AtomicBool,
        stopped: AtomicBool,
    }
    let round = Arc::new(Round {
        me: OnceLock::new(),
        started: AtomicBool::new(false),
        reschedules: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
    });
    let work = {
        let round = round.clone();
        Arc::new(sched.work(move |_| {
            round.started.store(true, SeqCst);
            spin_until_eventually(|| round.reschedules.load(SeqCst) >= 50);
            let me = round.me.get().unwrap().upgrade().unwrap();
            me.cancel_sync(); // from inside: disarms, refuses re-arms until the run ends
            round.stop.store(true, SeqCst);
            spin_until_eventually(|| round.stopped.load(SeqCst));
            Next::Park
        }))
    };
    round.me.set(Arc::downgrade(&work)).unwrap();
    assert!(work.schedule(Duration::ZERO));
    thread::scope(|s| {
        s.spawn(|| {
            // Not before the run began: a reschedule would move the run 60 s away.
            spin_until_eventually(|| round.started.load(SeqCst));
            while !round.stop.load(SeqCst) {
                work.reschedule(FAR);
                round.reschedules.fetch_add(1, SeqCst);
            }
            round.stopped.store(true, SeqCst);
        });
        assert!(
            eventually(|| work.stats().runs == 1 && !work.is_running()),
            "the run never ended"
        );
    });
    let pending_after = work.is_pending();
    work.cancel_sync();
    pending_after
}

#[cfg(target_os = "linux")]
#[test]
fn cancel_sync_inside_the_callback_refuses_a_reschedule_racing_it() {
    let sched = racing_sched();
    let total = rounds(300);
    let broke = (0..total)
        .filter(|_| cancel_sync_inside_the_callback_against_a_rescheduler(&sched))
        .count();
    assert_no_round_broke(
        "cancel_sync inside the callback against a concurrent reschedule",
        broke,
        total,
        "(the work was pending after the run, re-armed by a reschedule that came after \
         the in-callback cancel_sync began and before the run ended)",
    );
}

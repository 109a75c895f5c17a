//! Late thread-local destructors: nicework's own thread-locals may be gone when a user's
//! thread-local destructor runs, and there:
//!
//! - dropping the last `Scheduler` (real or manual), `flush`, dropping a running work and
//!   `cancel_sync` of a running work must not abort the process, and the waits still wait
//!   for the run;
//! - `global()` first used there runs works;
//! - a callback flushed there cancels, flushes and drops itself, and a wait cycle through
//!   such a callback is broken;
//! - `run_chunked` completes, also from inside a callback flushed there.
//!
//! Each case runs in a child process ([`common::child`]): the failure it guards against is
//! an abort or a hang. The cases of the last scheduler, of `flush` and of a running work
//! are built on Linux only (those of a running work wait for the late thread's state in
//! `/proc`); waits are for states, bounded, and nothing asserts a timing.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock, Weak, mpsc};
use std::time::Duration;

use common::child::{in_a_late_destructor, is_child};
use common::{BOUND, drop_flag, flush_waits};
use nicework::{Next, Scheduler, Work};

// The late thread's wait for a run is seen as its state in `/proc`: Linux's.
#[cfg(target_os = "linux")]
use common::{EVENTUALLY, eventually, thread_state};
#[cfg(target_os = "linux")]
use std::sync::atomic::AtomicI32;

#[cfg(target_os = "linux")]
#[test]
fn dropping_the_last_real_scheduler_in_a_late_thread_local_destructor_does_not_abort() {
    const NAME: &str =
        "dropping_the_last_real_scheduler_in_a_late_thread_local_destructor_does_not_abort";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    let sched = Scheduler::builder().build().unwrap();
    let work = sched.every(Duration::from_secs(3600), |_| Next::Again);
    in_a_late_destructor(move || drop(sched)).join().unwrap();
    common::assert_inert(&work); // the drop shut the scheduler down
    println!("CHILD-OK");
}

#[cfg(target_os = "linux")]
#[test]
fn dropping_the_last_manual_scheduler_in_a_late_thread_local_destructor_does_not_abort() {
    const NAME: &str =
        "dropping_the_last_manual_scheduler_in_a_late_thread_local_destructor_does_not_abort";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    let sched = Scheduler::manual();
    let work = sched.every(Duration::from_secs(3600), |_| Next::Again);
    in_a_late_destructor(move || drop(sched)).join().unwrap();
    common::assert_inert(&work);
    println!("CHILD-OK");
}

#[cfg(target_os = "linux")]
#[test]
fn flush_in_a_late_thread_local_destructor_runs_the_pending_work() {
    const NAME: &str = "flush_in_a_late_thread_local_destructor_runs_the_pending_work";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    let sched = Scheduler::manual();
    let runs = Arc::new(AtomicU64::new(0));
    let counter = runs.clone();
    let work = sched.work(move |_| {
        counter.fetch_add(1, SeqCst);
        Next::Park
    });
    assert!(work.schedule(Duration::from_secs(3600)));
    let flushed = Arc::new(AtomicBool::new(false));
    let out = flushed.clone();
    in_a_late_destructor(move || out.store(work.flush(), SeqCst))
        .join()
        .unwrap();
    assert!(flushed.load(SeqCst), "flush returned false");
    assert_eq!(runs.load(SeqCst), 1, "flush did not run the pending work");
    drop(sched);
    println!("CHILD-OK");
}

/// A real scheduler and a work whose callback runs (on the worker) until released; the
/// handle, and a flag that its closure was dropped, are given to `end` in a late
/// destructor, and the run is released once that thread sleeps (waiting for the run).
/// Returns the scheduler.
#[cfg(target_os = "linux")]
fn end_a_running_work_in_a_late_destructor(
    end: impl FnOnce(Work, &AtomicBool) + Send + 'static,
) -> Scheduler {
    let sched = Scheduler::builder().build().unwrap();
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (flag, dropped) = common::drop_flag();
    let work = sched.work(move |_| {
        let _keep = &flag;
        let _ = started_tx.send(());
        let _ = release_rx.recv();
        Next::Park
    });
    let release_tx = release_tx; // dropped before `work`: a failure releases the run
    assert!(work.schedule(Duration::ZERO));
    started_rx
        .recv_timeout(EVENTUALLY)
        .expect("the work never started running");
    let tid = Arc::new(AtomicI32::new(0));
    let late_tid = tid.clone();
    let late = in_a_late_destructor(move || {
        late_tid.store(common::gettid(), SeqCst);
        end(work, &dropped);
    });
    // Released once the late destructor sleeps in its wait for the run (or, failing that,
    // after the liveness bound: the checks still apply).
    eventually(|| {
        let tid = tid.load(SeqCst);
        tid != 0 && thread_state(tid) == Some('S')
    });
    release_tx.send(()).unwrap();
    late.join().unwrap();
    sched
}

#[cfg(target_os = "linux")]
#[test]
fn dropping_a_running_work_in_a_late_thread_local_destructor_waits_for_the_run() {
    const NAME: &str =
        "dropping_a_running_work_in_a_late_thread_local_destructor_waits_for_the_run";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    let freed = Arc::new(Mutex::new(None));
    let out = freed.clone();
    let sched = end_a_running_work_in_a_late_destructor(move |work, dropped| {
        drop(work);
        *out.lock().unwrap() = Some(dropped.load(SeqCst));
    });
    assert_eq!(
        *freed.lock().unwrap(),
        Some(true),
        "the work's closure was not freed when its drop returned"
    );
    drop(sched);
    println!("CHILD-OK");
}

#[cfg(target_os = "linux")]
#[test]
fn cancel_sync_of_a_running_work_in_a_late_thread_local_destructor_waits_for_the_run() {
    const NAME: &str =
        "cancel_sync_of_a_running_work_in_a_late_thread_local_destructor_waits_for_the_run";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    let after = Arc::new(Mutex::new(None));
    let out = after.clone();
    let sched = end_a_running_work_in_a_late_destructor(move |work, _| {
        work.cancel_sync();
        *out.lock().unwrap() = Some((work.is_running(), work.is_pending(), work.stats().runs));
    });
    assert_eq!(
        *after.lock().unwrap(),
        Some((false, false, 1)),
        "(running, pending, runs) when cancel_sync returned: it did not wait for the run"
    );
    drop(sched);
    println!("CHILD-OK");
}

#[test]
fn global_first_used_in_a_late_thread_local_destructor_runs_works() {
    const NAME: &str = "global_first_used_in_a_late_thread_local_destructor_runs_works";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    let ran = Arc::new(AtomicBool::new(false));
    let out = ran.clone();
    in_a_late_destructor(move || {
        let (tx, rx) = mpsc::channel();
        let work = nicework::global().work(move |_| {
            let _ = tx.send(());
            Next::Park
        });
        assert!(work.schedule(Duration::ZERO));
        rx.recv_timeout(BOUND)
            .expect("the global scheduler ran nothing");
        drop(work);
        out.store(true, SeqCst);
    })
    .join()
    .unwrap();
    assert!(ran.load(SeqCst));
    println!("CHILD-OK");
}

#[test]
fn a_callback_flushed_in_a_late_destructor_cancels_flushes_and_drops_itself() {
    const NAME: &str = "a_callback_flushed_in_a_late_destructor_cancels_flushes_and_drops_itself";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    let results = Arc::new(Mutex::new(Vec::new()));
    let out = results.clone();
    in_a_late_destructor(move || {
        let sched = Scheduler::manual();
        // cancel_sync and flush of itself, then a re-arm of its own: refused.
        let slot: Arc<OnceLock<Weak<Work>>> = Arc::new(OnceLock::new());
        let inner_flush = Arc::new(AtomicBool::new(true));
        let work = {
            let (slot, inner_flush) = (slot.clone(), inner_flush.clone());
            Arc::new(sched.work(move |_| {
                let me = slot.get().unwrap().upgrade().unwrap();
                me.cancel_sync();
                inner_flush.store(me.flush(), SeqCst);
                Next::Again
            }))
        };
        slot.set(Arc::downgrade(&work)).unwrap();
        work.schedule(Duration::ZERO);
        let flushed = work.flush();
        out.lock().unwrap().push((
            "cancel_sync+flush",
            flushed && !inner_flush.load(SeqCst) && !work.is_pending(),
        ));
        // drop of itself: the closure is freed after the run.
        let holder: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
        let (flag, freed) = drop_flag();
        let work = {
            let holder = holder.clone();
            sched.work(move |_| {
                let _keep = &flag;
                drop(holder.lock().unwrap().take());
                Next::Again
            })
        };
        work.schedule(Duration::ZERO);
        *holder.lock().unwrap() = Some(work);
        let ran = sched.advance(Duration::ZERO);
        out.lock()
            .unwrap()
            .push(("drop", ran == 1 && freed.load(SeqCst)));
    })
    .join()
    .unwrap();
    let results = results.lock().unwrap().clone();
    assert_eq!(
        results,
        vec![("cancel_sync+flush", true), ("drop", true)],
        "in a late destructor"
    );
    println!("CHILD-OK");
}

#[test]
fn a_wait_cycle_through_a_callback_flushed_in_a_late_destructor_is_broken() {
    const NAME: &str = "a_wait_cycle_through_a_callback_flushed_in_a_late_destructor_is_broken";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    in_a_late_destructor(move || {
        let sched = Scheduler::builder().build().unwrap();
        let manual = Scheduler::manual();
        let a_slot: Arc<OnceLock<Weak<Work>>> = Arc::new(OnceLock::new());
        let b_slot: Arc<OnceLock<Weak<Work>>> = Arc::new(OnceLock::new());
        let b_started = Arc::new(AtomicBool::new(false));
        let waits_before = flush_waits(&sched);
        // B, on the worker: waits until A's flush sleeps in its wait for B, then
        // cancel_syncs A (a cycle: it must not wait).
        let b = {
            let (a_slot, b_started, sched2) = (a_slot.clone(), b_started.clone(), sched.clone());
            Arc::new(sched.work(move |_| {
                b_started.store(true, SeqCst);
                common::spin_until(BOUND, || flush_waits(&sched2) > waits_before);
                if let Some(a) = a_slot.get().and_then(Weak::upgrade) {
                    a.cancel_sync();
                }
                Next::Park
            }))
        };
        // A, flushed on this (late) thread: flushes B while B runs.
        let a = {
            let (b_slot, b_started) = (b_slot.clone(), b_started.clone());
            Arc::new(manual.work(move |_| {
                common::spin_until(BOUND, || b_started.load(SeqCst));
                if let Some(b) = b_slot.get().and_then(Weak::upgrade) {
                    b.flush();
                }
                Next::Again
            }))
        };
        a_slot.set(Arc::downgrade(&a)).unwrap();
        b_slot.set(Arc::downgrade(&b)).unwrap();
        b.schedule(Duration::ZERO);
        a.schedule(Duration::ZERO);
        assert!(a.flush());
        assert!(!a.is_pending(), "A's own re-arm was not refused");
        drop(a);
        drop(b);
    })
    .join()
    .unwrap();
    println!("CHILD-OK");
}

#[test]
fn run_chunked_in_a_late_thread_local_destructor_completes() {
    const NAME: &str = "run_chunked_in_a_late_thread_local_destructor_completes";
    if !is_child(NAME) {
        return common::child::assert_child_passes(module_path!(), NAME);
    }
    let total = Arc::new(AtomicU64::new(0));
    let out = total.clone();
    in_a_late_destructor(move || {
        let sched = Scheduler::builder().workers(2).build().unwrap();
        sched
            .run_chunked(0..10_000, 16, |range| {
                out.fetch_add(range.len() as u64, SeqCst);
                Ok::<(), ()>(())
            })
            .unwrap();
        // And from inside a callback flushed there.
        let manual = Scheduler::manual();
        let (sched2, out2) = (sched.clone(), out.clone());
        let work = manual.work(move |_| {
            sched2
                .run_chunked(0..1_000, 4, |range| {
                    out2.fetch_add(range.len() as u64, SeqCst);
                    Ok::<(), ()>(())
                })
                .unwrap();
            Next::Park
        });
        work.schedule(Duration::ZERO);
        assert!(work.flush());
    })
    .join()
    .unwrap();
    assert_eq!(total.load(SeqCst), 11_000);
    println!("CHILD-OK");
}

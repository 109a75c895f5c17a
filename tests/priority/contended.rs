//! `Ctx::contended`: the machine's contention as a long callback reads it between
//! batches. True while more threads are runnable than the machine has CPUs (spinners, one
//! more than the CPUs), false once the machine is idle again, and the batch that asks it
//! ends early and yields, so the rest runs after the others.
//!
//! On the portable build the signal is the one-minute load average, which follows the
//! spinners up to a minute late: there the tests only check that asking never fails.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::eventually;
use nicework::{Next, Scheduler};

/// What `cx.contended()` says in a run now (a manual scheduler runs it on this thread).
fn contended_in_a_run(sched: &Scheduler) -> bool {
    let seen = Arc::new(AtomicBool::new(false));
    let saw = seen.clone();
    let _work = sched.once(Duration::ZERO, move |cx| {
        saw.store(cx.contended(), Ordering::SeqCst)
    });
    assert_eq!(sched.advance(Duration::ZERO), 1);
    seen.load(Ordering::SeqCst)
}

/// The machine's online CPUs, as the signal counts them.
fn cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize
}

#[test]
#[cfg_attr(
    nicework_portable,
    ignore = "the load average follows up to a minute late"
)]
fn contended_is_true_while_every_cpu_is_busy_and_false_once_idle() {
    let sched = Scheduler::manual();
    let stop = Arc::new(AtomicBool::new(false));
    let spinners = common::spinners(cpus() + 1, &stop);
    let busy = eventually(|| {
        std::thread::sleep(Duration::from_millis(2));
        contended_in_a_run(&sched)
    });
    stop.store(true, Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    assert!(
        busy,
        "never contended with {} spinners on {} CPUs",
        cpus() + 1,
        cpus()
    );
    assert!(
        eventually(|| {
            std::thread::sleep(Duration::from_millis(2));
            !contended_in_a_run(&sched)
        }),
        "still contended after the spinners stopped"
    );
}

#[test]
#[cfg_attr(
    nicework_portable,
    ignore = "the load average follows up to a minute late"
)]
fn a_batch_that_asks_yields_while_contended_and_finishes_after() {
    const ENTRIES: u64 = 100_000;
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let (left, yields) = (
        Arc::new(AtomicU64::new(ENTRIES)),
        Arc::new(AtomicU64::new(0)),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let spinners = common::spinners(cpus() + 1, &stop);
    // Wait until the signal is on, so the batch meets it.
    assert!(eventually(|| {
        std::thread::sleep(Duration::from_millis(2));
        contended_in_a_run(&Scheduler::manual())
    }));
    let drain = {
        let (left, yields) = (left.clone(), yields.clone());
        sched.work(move |cx| {
            while left.load(Ordering::Relaxed) > 0 {
                left.fetch_sub(1, Ordering::Relaxed);
                if left.load(Ordering::Relaxed) % 1_000 == 0 && cx.contended() {
                    yields.fetch_add(1, Ordering::Relaxed);
                    return Next::Yield;
                }
            }
            Next::Park
        })
    };
    drain.schedule(Duration::ZERO);
    assert!(
        eventually(|| yields.load(Ordering::Relaxed) > 0),
        "the batch never ended early while contended"
    );
    stop.store(true, Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    assert!(
        eventually(|| left.load(Ordering::Relaxed) == 0),
        "the rest never ran"
    );
}

#[test]
fn asking_in_a_tight_loop_never_fails() {
    let sched = Scheduler::manual();
    let asked = Arc::new(AtomicU64::new(0));
    let counter = asked.clone();
    let _work = sched.once(Duration::ZERO, move |cx| {
        for _ in 0..100_000 {
            std::hint::black_box(cx.contended());
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    assert_eq!(sched.advance(Duration::ZERO), 1);
    assert_eq!(asked.load(Ordering::Relaxed), 100_000);
}

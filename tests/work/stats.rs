//! `stats()` snapshots: `parks <= runs` in every snapshot, and both counts only grow,
//! with runs on the workers and runs by `flush` on the caller.
//!
//! Each test checks every snapshot it takes while the work is re-armed and runs, and
//! counts the bad ones; nothing asserts a timing. The run count of the test that re-arms
//! from one thread scales with [`common::rounds`], and that test is built on Linux only.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::thread;
use std::time::Duration;

use nicework::{Next, Scheduler};

#[cfg(target_os = "linux")]
use crate::common::{assert_no_round_broke, rounds};
#[cfg(target_os = "linux")]
use std::time::Instant;

#[cfg(target_os = "linux")]
#[test]
fn stats_never_show_more_parks_than_runs() {
    let sched = Scheduler::builder().build().unwrap();
    let work = sched.work(|_| Next::Park);
    let target_runs = rounds(50_000) as u64;
    let (mut snapshots, mut bad, mut example) = (0usize, 0usize, None);
    let started = Instant::now();
    // One thread re-arms the work whenever it is not pending (it parks on every run, on
    // the worker) and snapshots its stats in between. Bounded by runs, and by a budget so
    // that a slow machine still ends in seconds.
    loop {
        if !work.is_pending() {
            work.schedule(Duration::ZERO);
        }
        let stats = work.stats();
        snapshots += 1;
        if stats.parks > stats.runs {
            bad += 1;
            example.get_or_insert((stats.runs, stats.parks));
        }
        if stats.runs >= target_runs || started.elapsed() > Duration::from_secs(1) {
            break;
        }
    }
    work.cancel_sync();
    assert!(work.stats().runs > 0);
    assert_no_round_broke(
        "stats() never shows more parks than runs",
        bad,
        snapshots,
        &format!(
            "(snapshots; {} runs; first bad (runs, parks): {example:?})",
            work.stats().runs
        ),
    );
}

#[test]
fn stats_counts_never_show_more_parks_than_runs_and_never_go_back() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let flip = AtomicU64::new(0);
    let work = sched.work(move |_| {
        if flip.fetch_add(1, SeqCst) % 3 == 0 {
            Next::After(Duration::ZERO)
        } else {
            Next::Park
        }
    });
    let stop = AtomicBool::new(false);
    let bad = Mutex::new(Vec::new());
    thread::scope(|s| {
        // Re-armers: one flushes (runs on the caller), one schedules (runs on workers).
        s.spawn(|| {
            while !stop.load(SeqCst) {
                work.schedule(Duration::ZERO);
                work.flush();
            }
        });
        s.spawn(|| {
            while !stop.load(SeqCst) {
                work.schedule(Duration::ZERO);
            }
        });
        for _ in 0..2 {
            s.spawn(|| {
                let (mut runs, mut parks) = (0, 0);
                while !stop.load(SeqCst) {
                    let stats = work.stats();
                    if stats.parks > stats.runs || stats.runs < runs || stats.parks < parks {
                        bad.lock()
                            .unwrap()
                            .push(((runs, parks), (stats.runs, stats.parks)));
                    }
                    (runs, parks) = (stats.runs, stats.parks);
                }
            });
        }
        thread::sleep(Duration::from_millis(500));
        stop.store(true, SeqCst);
    });
    work.cancel_sync();
    assert!(work.stats().runs > 0);
    let bad = bad.into_inner().unwrap();
    assert!(
        bad.is_empty(),
        "{} bad snapshots, first (previous, now) as (runs, parks): {:?}",
        bad.len(),
        bad.first()
    );
}

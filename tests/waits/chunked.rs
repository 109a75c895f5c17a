//! `Scheduler::run_chunked`: padata-style parallel cleanup.

use crate::common;

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::Duration;

use common::{EVENTUALLY, gettid};
use nicework::{Next, Scheduler};

/// Runs a job over `len` elements and checks each was visited exactly once; returns the
/// set of threads that ran chunks.
fn visit_all(sched: &Scheduler, len: usize, min_chunk: usize) -> HashSet<i32> {
    let visits: Vec<AtomicU8> = (0..len).map(|_| AtomicU8::new(0)).collect();
    let threads = Mutex::new(HashSet::new());
    let chunks = AtomicUsize::new(0);
    sched
        .run_chunked(0..len, min_chunk, |range| {
            assert!(range.len() >= min_chunk.max(1) || range.end == len);
            threads.lock().unwrap().insert(gettid());
            chunks.fetch_add(1, Ordering::Relaxed);
            for i in range {
                visits[i].fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), ()>(())
        })
        .unwrap();
    let wrong: Vec<usize> = (0..len)
        .filter(|&i| visits[i].load(Ordering::Relaxed) != 1)
        .collect();
    assert!(
        wrong.is_empty(),
        "visited other than once: {:?}",
        &wrong[..wrong.len().min(10)]
    );
    threads.into_inner().unwrap()
}

#[test]
fn every_element_is_visited_exactly_once() {
    for workers in [1, 2, 4] {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        for (len, min_chunk) in [(100_003, 7), (1, 1), (12, 5), (4_096, 0), (999, 1_000)] {
            visit_all(&sched, len, min_chunk);
        }
    }
    visit_all(&Scheduler::manual(), 10_007, 3);
}

#[test]
fn a_range_not_starting_at_zero_is_covered_exactly() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let seen = Mutex::new(Vec::new());
    sched
        .run_chunked(1_000..5_000, 10, |range| {
            seen.lock().unwrap().push(range);
            Ok::<(), ()>(())
        })
        .unwrap();
    let mut seen = seen.into_inner().unwrap();
    seen.sort_by_key(|r| r.start);
    assert_eq!(seen.first().unwrap().start, 1_000);
    assert_eq!(seen.last().unwrap().end, 5_000);
    assert!(seen.windows(2).all(|w| w[0].end == w[1].start));
    // 3 threads × 4 chunks each: 4000 / 12 = 333 per chunk.
    assert_eq!(seen.len(), 4_000usize.div_ceil(333));
}

#[test]
fn the_first_error_stops_handing_out_chunks() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let started = AtomicUsize::new(0);
    let result = sched.run_chunked(0..100_000, 1, |range| {
        started.fetch_add(1, Ordering::Relaxed);
        Err(range.start)
    });
    let first = result.unwrap_err();
    assert_eq!(first % (100_000 / 12), 0, "an error of some chunk: {first}");
    // Each of the 3 threads may have claimed one chunk before it saw the stop flag.
    let started = started.into_inner();
    assert!((1..=3).contains(&started), "{started} of 13 chunks ran");
}

#[test]
fn a_panic_propagates_to_the_caller_after_the_helpers_stopped() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let in_flight = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        sched.run_chunked(0..120, 1, |range| {
            in_flight.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            if range.contains(&60) {
                in_flight.fetch_sub(1, Ordering::SeqCst);
                panic!("chunk with 60");
            }
            in_flight.fetch_sub(1, Ordering::SeqCst);
            finished.fetch_add(1, Ordering::SeqCst);
            Ok::<(), ()>(())
        })
    }));
    let payload = outcome.expect_err("the panic reached the caller");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"chunk with 60"));
    assert_eq!(
        in_flight.load(Ordering::SeqCst),
        0,
        "a helper still runs a chunk"
    );
    let after = finished.load(Ordering::SeqCst);
    assert!(
        after < 12,
        "the panic stopped the job early ({after} chunks finished)"
    );
    // The scheduler and its workers are fine afterwards.
    visit_all(&sched, 1_000, 1);
}

#[test]
fn a_min_chunk_longer_than_the_range_runs_inline_on_the_caller() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let calls = Mutex::new(Vec::new());
    sched
        .run_chunked(10..110, 500, |range| {
            calls.lock().unwrap().push((gettid(), range));
            Ok::<(), ()>(())
        })
        .unwrap();
    assert_eq!(calls.into_inner().unwrap(), [(gettid(), 10..110)]);
}

#[test]
fn an_empty_range_returns_at_once_without_calling_f() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let calls = AtomicUsize::new(0);
    #[allow(clippy::reversed_empty_ranges)]
    for range in [0..0, 5..5, 9..3] {
        let result = sched.run_chunked(range, 1, |_| {
            calls.fetch_add(1, Ordering::Relaxed);
            Err("called")
        });
        assert_eq!(result, Ok(()));
    }
    assert_eq!(calls.into_inner(), 0);
}

#[test]
fn one_worker_and_the_caller_share_the_job() {
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let worker = nicework::hooks::worker_tids(&sched)[0];
    let helper_started = std::sync::atomic::AtomicBool::new(false);
    let threads = Mutex::new(HashSet::new());
    // The caller's chunks wait until the helper has one, so both surely take part
    // however slowly the nice-19 helper gets a CPU.
    sched
        .run_chunked(0..8, 1, |_| {
            threads.lock().unwrap().insert(gettid());
            if gettid() == worker {
                helper_started.store(true, Ordering::SeqCst);
            } else {
                assert!(common::eventually(|| helper_started.load(Ordering::SeqCst)));
            }
            Ok::<(), ()>(())
        })
        .unwrap();
    let threads = threads.into_inner().unwrap();
    assert_eq!(threads, HashSet::from([gettid(), worker]));
}

#[test]
fn from_inside_a_work_on_a_single_worker_the_caller_runs_every_chunk() {
    for workers in [1, 2] {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        let worker_tids: HashSet<i32> = nicework::hooks::worker_tids(&sched).into_iter().collect();
        let (tx, rx) = mpsc::channel();
        let work = sched.work(move |cx| {
            let caller = gettid();
            let threads = Mutex::new(HashSet::new());
            let visits: Vec<AtomicU8> = (0..10_000).map(|_| AtomicU8::new(0)).collect();
            cx.scheduler()
                .run_chunked(0..visits.len(), 1, |range| {
                    threads.lock().unwrap().insert(gettid());
                    for i in range {
                        visits[i].fetch_add(1, Ordering::Relaxed);
                    }
                    Ok::<(), ()>(())
                })
                .unwrap();
            let once = visits.iter().all(|v| v.load(Ordering::Relaxed) == 1);
            tx.send((caller, threads.into_inner().unwrap(), once))
                .unwrap();
            Next::Park
        });
        work.schedule(Duration::ZERO);
        let (caller, threads, once) = rx.recv_timeout(EVENTUALLY).expect("no deadlock");
        assert!(once, "every element exactly once");
        if workers == 1 {
            // The caller is the only worker, so the helper is never taken by a worker:
            // the caller's flush runs it.
            assert_eq!(
                threads,
                HashSet::from([caller]),
                "only the caller could run chunks"
            );
        } else {
            // Which of the two workers claims how many chunks is a race (under valgrind
            // the other worker may claim them all before the caller claims one); the
            // library only promises that chunks run on the caller or on a helper, and
            // helpers run on the scheduler's workers (the caller is one of them).
            assert!(
                worker_tids.contains(&caller),
                "the callback ran on a worker"
            );
            assert!(!threads.is_empty());
            assert!(
                threads.is_subset(&worker_tids),
                "chunks ran only on this scheduler's workers: {threads:?} vs {worker_tids:?}"
            );
        }
    }
}

#[test]
fn after_the_scheduler_shut_down_a_job_from_its_callback_runs_inline() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let (started_tx, started_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (tx, rx) = mpsc::channel();
    let work = sched.work(move |cx| {
        started_tx.send(gettid()).unwrap();
        go_rx.recv().unwrap();
        // The last counted handle is gone: no helper can be armed any more.
        let threads = Mutex::new(HashSet::new());
        let visits = (0..1_000).map(|_| AtomicU8::new(0)).collect::<Vec<_>>();
        let result = cx.scheduler().run_chunked(0..1_000, 1, |range| {
            threads.lock().unwrap().insert(gettid());
            for i in range {
                visits[i].fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), ()>(())
        });
        let once = visits.iter().all(|v| v.load(Ordering::Relaxed) == 1);
        tx.send((result, once, threads.into_inner().unwrap()))
            .unwrap();
        Next::Park
    });
    // Shutdown cancels every armed work (`calls_after_the_scheduler_was_dropped_are_inert`):
    // this one, never due, is cleared by the drop's shutdown and by nothing else, so it
    // tells when the shutdown happened.
    let probe = sched.work(|_| Next::Park);
    assert!(probe.schedule(Duration::MAX));
    work.schedule(Duration::ZERO);
    // The run must be in progress before the drop: a shutdown that finds the work still
    // armed cancels it, and then it never runs.
    let caller = started_rx.recv_timeout(EVENTUALLY).expect("the work ran");
    let dropper = std::thread::spawn(move || drop(sched));
    // The drop shuts down (then waits for this run); release the run only after that.
    assert!(
        common::eventually(|| !probe.is_pending()),
        "the drop never shut the scheduler down"
    );
    go_tx.send(()).unwrap();
    let (result, once, threads) = rx.recv_timeout(EVENTUALLY).expect("no deadlock");
    assert_eq!(result, Ok(()));
    assert!(once, "every element exactly once");
    assert_eq!(
        threads,
        HashSet::from([caller]),
        "no helper could be armed after shutdown: the callback ran every chunk"
    );
    dropper.join().unwrap();
    assert!(!work.is_pending() && !work.is_running());
}

#[test]
fn the_caller_lends_its_priority_to_a_helper_still_running() {
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let worker = nicework::hooks::worker_tids(&sched)[0];
    let helper_started = std::sync::atomic::AtomicBool::new(false);
    let helper_nice = Mutex::new(None);
    let caller_nice = common::current_nice();
    // Two chunks: the caller's waits until the helper has one, and the helper's waits
    // until the caller, out of chunks, flushed it.
    sched
        .run_chunked(0..2, 1, |_| {
            if gettid() == worker {
                helper_started.store(true, Ordering::SeqCst);
                let flushed = common::eventually(|| {
                    let stats = sched.metrics().lending;
                    stats.raised + stats.waited > 0
                });
                assert!(flushed, "the caller never flushed the helper");
                *helper_nice.lock().unwrap() = Some(common::current_nice());
            } else {
                assert!(common::eventually(|| helper_started.load(Ordering::SeqCst)));
            }
            Ok::<(), ()>(())
        })
        .unwrap();
    let stats = sched.metrics().lending;
    let seen = helper_nice
        .into_inner()
        .unwrap()
        .expect("the helper ran a chunk");
    match sched.raise_limit() {
        Some(limit) => {
            assert_eq!(stats.raised, 1);
            assert_eq!(
                seen,
                caller_nice.max(limit),
                "the helper ran at the caller's nice"
            );
        }
        None => {
            assert_eq!(stats.waited, 1);
            assert_eq!(seen, 19, "without the right the helper stays at nice 19");
        }
    }
    assert_eq!(
        common::nice_of(worker),
        19,
        "the helper's worker is back at nice 19"
    );
}

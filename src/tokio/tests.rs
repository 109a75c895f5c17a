//! `drive` on both runtime flavours: it runs the works, hears arms from other threads,
//! bounds its turns (the executor's other tasks run between them, counted), shares the
//! executor with a work that yields for ever, and resolves when the last `Scheduler`
//! handle is dropped. Waits are for states, bounded; nothing asserts a duration.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use super::{TURN, drive};
use crate::{Next, Scheduler, Work};

const BOUND: Duration = Duration::from_secs(20);

fn runtime(multi_thread: bool) -> ::tokio::runtime::Runtime {
    if multi_thread {
        ::tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    } else {
        ::tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }
}

fn counting(sched: &Scheduler, period: Duration) -> (Work, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let work = sched.every(period, move |_| {
        counted.fetch_add(1, SeqCst);
        Next::Again
    });
    (work, runs)
}

async fn until(cond: impl Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    while !cond() {
        if start.elapsed() > BOUND {
            return false;
        }
        ::tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

fn runs_works_and_resolves_when_the_last_handle_drops(multi_thread: bool) {
    runtime(multi_thread).block_on(async {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let host = ::tokio::spawn(drive(driver));
        let (work, runs) = counting(&sched, Duration::from_millis(2));
        assert!(until(|| runs.load(SeqCst) >= 5).await);
        // An arm from a thread outside the runtime, earlier than anything armed.
        let (other, other_runs) = {
            let sched = sched.clone();
            std::thread::spawn(move || {
                let runs = Arc::new(AtomicUsize::new(0));
                let counted = runs.clone();
                let w = sched.work(move |_| {
                    counted.fetch_add(1, SeqCst);
                    Next::Park
                });
                w.schedule(Duration::from_millis(1));
                (w, runs)
            })
            .join()
            .unwrap()
        };
        assert!(until(|| other_runs.load(SeqCst) == 1).await);
        drop((work, other));
        assert!(!host.is_finished());
        drop(sched);
        ::tokio::time::timeout(BOUND, host)
            .await
            .expect("drive resolves once the last handle is dropped")
            .unwrap();
    });
}

#[test]
fn on_a_current_thread_runtime_it_runs_works_and_resolves_when_the_last_handle_drops() {
    runs_works_and_resolves_when_the_last_handle_drops(false);
}

#[test]
fn on_a_multi_thread_runtime_it_runs_works_and_resolves_when_the_last_handle_drops() {
    runs_works_and_resolves_when_the_last_handle_drops(true);
}

#[test]
fn a_batch_due_at_once_runs_in_turns_with_the_executors_other_tasks_between() {
    runtime(false).block_on(async {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let heartbeat = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let beats = {
            let (heartbeat, stop) = (heartbeat.clone(), stop.clone());
            ::tokio::spawn(async move {
                while !stop.load(SeqCst) {
                    heartbeat.fetch_add(1, SeqCst);
                    ::tokio::task::yield_now().await;
                }
            })
        };
        const WORKS: usize = 20 * TURN;
        // Per heartbeat value, how many works ran. Tokio wakes the tasks that yielded
        // together, in either order, so two turns may fall between two beats; without
        // turns the whole batch would.
        let per_beat = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let ran = Arc::new(AtomicUsize::new(0));
        let works: Vec<Work> = (0..WORKS)
            .map(|_| {
                let (heartbeat, per_beat, ran) = (heartbeat.clone(), per_beat.clone(), ran.clone());
                sched.work(move |_| {
                    *per_beat
                        .lock()
                        .unwrap()
                        .entry(heartbeat.load(SeqCst))
                        .or_insert(0usize) += 1;
                    ran.fetch_add(1, SeqCst);
                    Next::Park
                })
            })
            .collect();
        for work in &works {
            work.schedule(Duration::ZERO);
        }
        let host = ::tokio::spawn(drive(driver));
        assert!(until(|| ran.load(SeqCst) == WORKS).await);
        stop.store(true, SeqCst);
        beats.await.unwrap();
        let most = per_beat.lock().unwrap().values().copied().max().unwrap();
        assert!(most <= 2 * TURN, "{most} runs between two heartbeats");
        drop(works);
        drop(sched);
        ::tokio::time::timeout(BOUND, host).await.unwrap().unwrap();
    });
}

#[test]
fn a_work_that_yields_for_ever_shares_the_executor() {
    runtime(false).block_on(async {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let increments = Arc::new(AtomicUsize::new(0));
        let counted = increments.clone();
        let poller = sched.work(move |_| {
            counted.fetch_add(1, SeqCst);
            Next::Yield
        });
        poller.schedule(Duration::ZERO);
        let host = ::tokio::spawn(drive(driver));
        // This task runs (on the one executor thread) while the poller keeps yielding.
        let mut seen = 0;
        for _ in 0..100 {
            ::tokio::task::yield_now().await;
            seen = increments.load(SeqCst);
        }
        assert!(until(|| increments.load(SeqCst) > seen).await);
        poller.cancel_sync();
        drop(poller);
        drop(sched);
        ::tokio::time::timeout(BOUND, host).await.unwrap().unwrap();
    });
}

#[test]
fn dropping_the_task_shuts_the_scheduler_down() {
    runtime(true).block_on(async {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let (work, runs) = counting(&sched, Duration::from_millis(2));
        let host = ::tokio::spawn(drive(driver));
        assert!(until(|| runs.load(SeqCst) >= 2).await);
        host.abort();
        let _ = host.await;
        assert!(
            !work.schedule(Duration::ZERO),
            "shut down: arms are refused"
        );
    });
}

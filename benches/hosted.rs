//! The tokio driver against a hand loop, in one run (`cargo bench --features tokio --bench
//! hosted`; add `-- quick` for fewer rounds). Prints medians of:
//!
//! - **per run**: `BATCH` works due at once, run by `nicework::tokio::drive` on a
//!   current-thread runtime, against the same batch run by `run_due()` in a hand loop on
//!   a plain thread: the cost the task's turns, waker and `AsyncFd` add per run.
//! - **heartbeat gap**: the longest time another task of the same current-thread runtime
//!   waits between two polls while 100,000 works due at once run: under `drive`
//!   (bounded by its turns of `TURN` runs), and under one task that calls `run_due()`
//!   once (the whole batch in one poll), the hand-written host `drive` replaces.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

const BATCH: usize = 10_000;
const BIG_BATCH: usize = 100_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `n` parked works that count their runs.
fn works(sched: &Scheduler, n: usize, runs: &Arc<AtomicUsize>) -> Vec<Work> {
    (0..n)
        .map(|_| {
            let runs = runs.clone();
            sched.work(move |_| {
                runs.fetch_add(1, Ordering::Relaxed);
                Next::Park
            })
        })
        .collect()
}

fn arm_all(works: &[Work]) {
    for work in works {
        work.schedule(Duration::ZERO);
    }
}

/// Nanoseconds per run of one batch through a hand loop of `run_due()`.
fn hand_loop_per_run() -> f64 {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let works = works(&sched, BATCH, &runs);
    arm_all(&works);
    let start = Instant::now();
    while runs.load(Ordering::Relaxed) < BATCH {
        driver.run_due();
    }
    start.elapsed().as_nanos() as f64 / BATCH as f64
}

/// Nanoseconds per run of one batch through `drive` on a current-thread runtime.
fn drive_per_run() -> f64 {
    runtime().block_on(async {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let works = works(&sched, BATCH, &runs);
        let host = tokio::spawn(nicework::tokio::drive(driver));
        tokio::task::yield_now().await;
        arm_all(&works);
        let start = Instant::now();
        while runs.load(Ordering::Relaxed) < BATCH {
            tokio::task::yield_now().await;
        }
        let per_run = start.elapsed().as_nanos() as f64 / BATCH as f64;
        drop(works);
        drop(sched);
        host.await.unwrap();
        per_run
    })
}

/// The longest gap between two polls of a heartbeat task while `BIG_BATCH` works due at
/// once run, under `drive` or under one task calling `run_due()` once.
fn heartbeat_gap(under_drive: bool) -> Duration {
    runtime().block_on(async {
        let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let works = works(&sched, BIG_BATCH, &runs);
        arm_all(&works);
        let stop = Arc::new(AtomicBool::new(false));
        let longest_ns = Arc::new(AtomicU64::new(0));
        let heartbeat = {
            let (stop, longest_ns) = (stop.clone(), longest_ns.clone());
            tokio::spawn(async move {
                let mut last = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    tokio::task::yield_now().await;
                    let gap = last.elapsed().as_nanos() as u64;
                    longest_ns.fetch_max(gap, Ordering::Relaxed);
                    last = Instant::now();
                }
            })
        };
        tokio::task::yield_now().await;
        let host = if under_drive {
            Some(tokio::spawn(nicework::tokio::drive(driver)))
        } else {
            tokio::spawn(async move {
                driver.run_due();
            })
            .await
            .unwrap();
            None
        };
        while runs.load(Ordering::Relaxed) < BIG_BATCH {
            tokio::task::yield_now().await;
        }
        stop.store(true, Ordering::Relaxed);
        heartbeat.await.unwrap();
        drop(works);
        drop(sched);
        if let Some(host) = host {
            host.await.unwrap();
        }
        Duration::from_nanos(longest_ns.load(Ordering::Relaxed))
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|arg| arg == "quick");
    let rounds = if quick { 3 } else { 9 };
    let mut hand = Vec::new();
    let mut drive = Vec::new();
    for _ in 0..rounds {
        hand.push(hand_loop_per_run());
        drive.push(drive_per_run());
    }
    let (hand, drive) = (median(hand), median(drive));
    println!(
        "per run ({BATCH} due at once): drive {drive:.0} ns, hand loop {hand:.0} ns, {:.2}x",
        drive / hand
    );
    let mut bounded = Vec::new();
    let mut whole = Vec::new();
    for _ in 0..rounds.min(5) {
        bounded.push(heartbeat_gap(true).as_secs_f64() * 1e3);
        whole.push(heartbeat_gap(false).as_secs_f64() * 1e3);
    }
    println!(
        "heartbeat gap ({BIG_BATCH} due at once): drive {:.2} ms (turns of {}), one run_due() {:.1} ms",
        median(bounded),
        nicework::tokio::TURN,
        median(whole)
    );
}

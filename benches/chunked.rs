//! `run_chunked` benchmarks. `cargo bench --bench chunked` (add `quick` for 3 rounds).
//!
//! 1. A CPU-bound job (~200 ms of CPU in 16-unit chunks) on an idle machine: one thread
//!    (the same job on a manual scheduler, which runs it inline) against two (the caller
//!    plus one helper, `workers(1)`), and `std::thread::scope` with two threads splitting
//!    the range in halves as the peer.
//! 2. A ~100 ms job while two nice-0 threads saturate both CPUs: the foreground's loss
//!    during the job (its rate while the job runs against its rate alone, the same round)
//!    and the job's completion time. Three ways to run it:
//!    - a nice-0 thread calls `run_chunked` (its chunks at nice 0, helpers at nice 19,
//!      and it lends its priority to the last helpers);
//!    - a maintenance work (nice 19) calls it and a nice-0 thread waits for the result
//!      without lending;
//!    - the same work, and the nice-0 thread `flush()`es it: the worker that is the
//!      job's caller is raised to nice 0 for the rest of the run (where allowed);
//!    - the work on a `Priority::Idle` scheduler, plain wait.

mod common;

use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Saturation, calibrate, median, rounds, unit};
use nicework::{Next, Priority, Scheduler};

fn job(sched: &Scheduler, units: usize) {
    sched
        .run_chunked(0..units, 16, |range| {
            for i in range {
                black_box(unit(i as u64));
            }
            Ok::<(), ()>(())
        })
        .unwrap();
}

fn scoped_halves(units: usize) {
    std::thread::scope(|s| {
        for half in [0..units / 2, units / 2..units] {
            s.spawn(move || {
                for i in half {
                    black_box(unit(i as u64));
                }
            });
        }
    });
}

fn timed(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64() * 1e3
}

fn idle_speedup(units: usize) {
    let inline = Scheduler::manual();
    let two = Scheduler::builder().workers(1).build().unwrap();
    let (mut one_ms, mut two_ms, mut scoped_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds() {
        one_ms.push(timed(|| job(&inline, units)));
        two_ms.push(timed(|| job(&two, units)));
        scoped_ms.push(timed(|| scoped_halves(units)));
    }
    let (one, two, scoped) = (median(one_ms), median(two_ms), median(scoped_ms));
    println!(
        "\nrun_chunked, CPU-bound, idle machine ({} rounds)",
        rounds()
    );
    println!("{:<48} {:>9} {:>10}", "", "ms", "speed-up");
    println!("{:<48} {:>9.1} {:>9.2}×", "1 thread (inline)", one, 1.0);
    println!(
        "{:<48} {:>9.1} {:>9.2}×",
        "2 threads: caller + 1 helper at nice 19",
        two,
        one / two
    );
    println!(
        "{:<48} {:>9.1} {:>9.2}×",
        "peer: std::thread::scope, 2 halves at nice 0",
        scoped,
        one / scoped
    );
}

#[derive(Clone, Copy)]
enum Caller {
    Nice0Thread,
    WorkPlainWait,
    WorkFlushed,
}

/// Runs the job one way while `saturation` spins; returns (ms, foreground units/s during
/// the job).
fn under_saturation(
    sched: &Scheduler,
    saturation: &Saturation,
    caller: Caller,
    units: usize,
) -> (f64, f64) {
    let start = Instant::now();
    let before = saturation.iterations();
    match caller {
        Caller::Nice0Thread => job(sched, units),
        Caller::WorkPlainWait | Caller::WorkFlushed => {
            let (tx, rx) = mpsc::channel();
            let background = sched.clone();
            let work = sched.work(move |_| {
                job(&background, units);
                tx.send(()).unwrap();
                Next::Park
            });
            work.schedule(Duration::ZERO);
            if matches!(caller, Caller::WorkFlushed) {
                while !work.is_running() && rx.try_recv().is_err() {
                    std::thread::yield_now();
                }
                work.flush();
            } else {
                rx.recv().unwrap();
            }
        }
    }
    let elapsed = start.elapsed();
    let rate = (saturation.iterations() - before) as f64 / elapsed.as_secs_f64();
    (elapsed.as_secs_f64() * 1e3, rate)
}

fn saturated(units: usize) {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let idle_sched = Scheduler::builder()
        .workers(2)
        .priority(Priority::Idle)
        .build()
        .unwrap();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let ways = [
        (
            Caller::Nice0Thread,
            &sched,
            "a nice-0 thread calls run_chunked (lends)",
        ),
        (
            Caller::WorkPlainWait,
            &sched,
            "a nice-19 work calls it; plain wait",
        ),
        (
            Caller::WorkFlushed,
            &sched,
            "a nice-19 work calls it; flush() (raises)",
        ),
        (
            Caller::WorkPlainWait,
            &idle_sched,
            "a SCHED_IDLE work calls it; plain wait",
        ),
    ];
    let mut results = vec![(Vec::new(), Vec::new()); ways.len()];
    let mut idle_ms = Vec::new();
    for round in 0..rounds().min(5) {
        idle_ms.push(timed(|| job(&sched, units)));
        let saturation = Saturation::start(cpus);
        std::thread::sleep(Duration::from_millis(50));
        for k in 0..ways.len() {
            let i = (k + round) % ways.len();
            let alone_start = (Instant::now(), saturation.iterations());
            std::thread::sleep(Duration::from_millis(200));
            let alone = (saturation.iterations() - alone_start.1) as f64
                / alone_start.0.elapsed().as_secs_f64();
            let (ms, rate) = under_saturation(ways[i].1, &saturation, ways[i].0, units);
            results[i].0.push(ms);
            results[i].1.push(1.0 - rate / alone);
        }
    }
    let idle = median(idle_ms);
    println!(
        "\nrun_chunked, ~100 ms job, while {cpus} nice-0 threads saturate {cpus} CPUs (workers(2), raise_limit {:?})",
        sched.raise_limit()
    );
    println!("{:<48} {:>9} {:>8} {:>9}", "", "ms", "× idle", "fg loss");
    println!(
        "{:<48} {:>9.0} {:>7.2}× {:>9}",
        "idle machine, nice-0 caller", idle, 1.0, "-"
    );
    for (i, (_, _, label)) in ways.iter().enumerate() {
        let ms = median(results[i].0.clone());
        let loss = median(results[i].1.clone());
        println!(
            "{label:<48} {ms:>9.0} {:>7.2}× {:>8.2}%",
            ms / idle,
            loss * 100.0
        );
    }
}

fn main() {
    let unit_200ms = calibrate(Duration::from_millis(200)) as usize;
    idle_speedup(unit_200ms);
    saturated(unit_200ms / 2);
}

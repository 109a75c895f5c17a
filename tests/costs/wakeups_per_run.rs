//! Wakeups follow deadlines: a lone periodic work costs one worker wakeup per run, with
//! one worker or two, for a period that waits in the wheel's finest level and for one
//! that waits in a coarse slot (which a wakeup at the slot's start would cost twice).
//! Counted against a generous bound (the benchmark `cargo bench --bench work -- per-run`
//! prints the figure); no timing is asserted.

use std::time::Duration;

use nicework::{Next, Scheduler};

/// Runs a lone `every(period)` work on `workers` workers until it ran `runs` more times;
/// returns (runs, worker wakeups) over that window.
fn wakeups_per_run(workers: usize, period: Duration, runs: u64) -> (u64, u64) {
    let sched = Scheduler::builder().workers(workers).build().unwrap();
    let work = sched.every(period, |_| Next::Again);
    // The first run starts the window, so start-up costs are not counted.
    while work.stats().runs < 1 {
        std::thread::sleep(period / 4);
    }
    let (first_runs, first_wakeups) = (work.stats().runs, sched.metrics().worker_wakeups);
    while work.stats().runs < first_runs + runs {
        std::thread::sleep(period / 4);
    }
    (
        work.stats().runs - first_runs,
        sched.metrics().worker_wakeups - first_wakeups,
    )
}

#[test]
fn a_lone_periodic_work_costs_one_wakeup_per_run_with_one_or_two_workers() {
    // 20 ms waits in level 0 of the 1 ms wheel; 300 ms in a 64 ms slot of level 1.
    let cases = [
        (1, Duration::from_millis(20), 40),
        (2, Duration::from_millis(20), 40),
        (1, Duration::from_millis(300), 4),
        (2, Duration::from_millis(300), 4),
    ];
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&(workers, period, runs)| s.spawn(move || wakeups_per_run(workers, period, runs)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (&(workers, period, _), &(runs, wakeups)) in cases.iter().zip(&results) {
        println!("{workers} worker(s), {period:?}: {wakeups} wakeups for {runs} runs");
        // One per run; the bound leaves room for a few more (a run late enough to be
        // observed mid-sleep, lock contention counted by the kernel), but not for two
        // per run.
        assert!(
            wakeups <= runs + runs / 2 + 2,
            "{workers} worker(s), {period:?}: {wakeups} wakeups for {runs} runs"
        );
    }
}

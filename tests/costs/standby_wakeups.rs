//! Wakeup counts with two to four workers: a lone periodic work costs one wakeup per run
//! beside far works and a touched timeout, everything parked after churn (blocking
//! runs, touches, arms then cancels) costs none, and groups of works whose windows
//! overlap cost one wakeup per group where there is a standby (Linux; the portable
//! worker also wakes a follower at each group). Counted by the kernel (or by the
//! portable workers); no timing is asserted.

use std::time::Duration;

use crate::counting;
use nicework::{Next, Scheduler};

/// Whether the workers have a standby (see `src/scheduler/standby.rs`).
const STANDBY: bool = cfg!(all(target_os = "linux", not(nicework_portable)));

fn lone(workers: usize, with_far: bool, with_timeout: bool, runs: u64) -> (u64, u64) {
    let sched = Scheduler::builder().workers(workers).build().unwrap();
    let _far = with_far.then(|| sched.every(Duration::from_secs(60), |_| Next::Again));
    // A timeout touched from a user thread now and then.
    let timeout = with_timeout.then(|| sched.timeout(Duration::from_secs(30), |_| Next::Park));
    let period = Duration::from_millis(20);
    let work = sched.every(period, |_| Next::Again);
    while work.stats().runs < 2 {
        std::thread::sleep(period / 4);
    }
    let (r0, w0) = (work.stats().runs, sched.metrics().worker_wakeups);
    while work.stats().runs < r0 + runs {
        if let Some(t) = &timeout {
            t.touch();
        }
        std::thread::sleep(period / 4);
    }
    (work.stats().runs - r0, sched.metrics().worker_wakeups - w0)
}

#[test]
fn lone_periodic_costs_one_wakeup_per_run_beside_far_works() {
    // Allocates while others count live bytes: see `wakeups_coalesced`.
    let _measuring = counting::measuring();
    let configs: Vec<(usize, bool, bool)> = [2usize, 3, 4]
        .into_iter()
        .flat_map(|workers| {
            [(false, false), (true, false), (true, true)]
                .map(|(far, timeout)| (workers, far, timeout))
        })
        .collect();
    // Each on its own scheduler, all at once: they sleep most of the time.
    let results: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = configs
            .iter()
            .map(|&(workers, far, timeout)| s.spawn(move || lone(workers, far, timeout, 30)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (&(workers, far, timeout), &(runs, wakeups)) in configs.iter().zip(&results) {
        {
            println!(
                "{workers} workers far={far} timeout={timeout}: {wakeups} wakeups / {runs} runs"
            );
            // Without a standby, a run beside other armed works also wakes a follower to
            // watch the timer.
            let per_run = if STANDBY || !far { 1 } else { 2 };
            assert!(
                wakeups <= runs * per_run + runs / 2 + 2,
                "{workers} workers far={far} timeout={timeout}: {wakeups} wakeups / {runs} runs"
            );
        }
    }
}

/// After a busy period with blocking runs, watches set from other threads and cancelled
/// works, everything parked costs no wakeup.
#[test]
fn parked_after_churn_costs_nothing() {
    // Allocates while others count live bytes: see `wakeups_coalesced`.
    let _measuring = counting::measuring();
    let parked = |workers: usize| {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        let mut works = Vec::new();
        for i in 0..10u64 {
            let w = sched.work(move |_| {
                if i % 3 == 0 {
                    std::thread::sleep(Duration::from_millis(4));
                }
                Next::Park
            });
            w.schedule(Duration::from_millis(i));
            works.push(w);
        }
        let t = sched.timeout(Duration::from_millis(50), |_| Next::Park);
        for _ in 0..20 {
            t.touch();
            std::thread::sleep(Duration::from_millis(1));
        }
        // Armed and then cancelled: the watch may fire once for them.
        for w in &works {
            w.schedule(Duration::from_millis(30));
            w.cancel();
        }
        t.cancel();
        std::thread::sleep(Duration::from_millis(300));
        let w0 = sched.metrics().worker_wakeups;
        std::thread::sleep(Duration::from_millis(500));
        sched.metrics().worker_wakeups - w0
    };
    // Each on its own scheduler, all at once: they sleep most of the time.
    let counts: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = [2usize, 3, 4]
            .map(|workers| s.spawn(move || parked(workers)))
            .into_iter()
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (workers, wakeups) in [2usize, 3, 4].into_iter().zip(counts) {
        println!("{workers} workers: {wakeups} wakeups parked");
        assert!(
            wakeups <= 1,
            "{workers} workers: {wakeups} wakeups while parked"
        );
    }
}

/// Groups of works whose windows overlap, with 2, 3 and 4 workers: one wakeup per group.
#[test]
fn overlapping_groups_with_more_workers() {
    // Allocates while others count live bytes: see `wakeups_coalesced`.
    let _measuring = counting::measuring();
    let groups_and_wakeups = |workers: usize| {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        let period = Duration::from_millis(50);
        let works: Vec<_> = (0..8u64)
            .map(|i| {
                let w = sched
                    .every(period, |_| Next::Again)
                    .leeway(Duration::from_millis(20));
                std::thread::sleep(Duration::from_millis(1 + i % 3));
                w
            })
            .collect();
        std::thread::sleep(period * 3);
        let (w0, r0) = (sched.metrics().worker_wakeups, works[0].stats().runs);
        std::thread::sleep(period * 20);
        let (w1, r1) = (sched.metrics().worker_wakeups, works[0].stats().runs);
        (r1 - r0, w1 - w0)
    };
    // Each on its own scheduler, all at once: they sleep most of the time.
    let results: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = [2usize, 3, 4]
            .map(|workers| s.spawn(move || groups_and_wakeups(workers)))
            .into_iter()
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (workers, (groups, wakeups)) in [2usize, 3, 4].into_iter().zip(results) {
        println!("{workers} workers: {wakeups} wakeups for {groups} groups");
        // Without a standby each group also wakes a follower (or two, with more workers
        // idle, as the first follower hands the rest on).
        let per_group = if STANDBY { 1 } else { workers as u64 };
        assert!(
            wakeups <= groups * per_group + groups / 2 + 2,
            "{workers} workers: {wakeups} wakeups for {groups} groups"
        );
    }
}

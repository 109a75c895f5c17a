//! Works that declare a leeway share wakeups: a thousand `every(1 s)` works created at a
//! hundred phases 10 ms apart wake the workers about ten times a second with a 100 ms
//! leeway and once with a 1 s one, with one worker or two, where without a leeway every
//! phase costs a wakeup. Counted by the kernel (`Metrics::worker_wakeups`) over whole
//! seconds, against the bounds the design sets; no timing is asserted. The benchmark
//! `cargo bench --bench work -- coalesced` prints the figures.
//!
//! The portable worker has no standby (see `src/scheduler/standby.rs`): with two workers
//! each group of due works also wakes a follower, so its bound there is twice as high.
//!
//! Each test holds the byte-counting lock: it allocates megabytes while it counts, which
//! must not land in another test's count of live bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::counting;
use nicework::{Next, Scheduler, Work};

/// Whether two workers share a group of due works' one wakeup: there is a standby.
const STANDBY: bool = cfg!(all(target_os = "linux", not(nicework_portable)));

const WORKS: usize = 1_000;
const PHASES: usize = 100;
const PERIOD: Duration = Duration::from_secs(1);
/// Whole periods counted, after half a period to settle.
const COUNTED_PERIODS: u32 = 3;

/// How the works re-arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rate {
    /// `Next::Again`: the period counts from the end of each run.
    FixedDelay,
    /// `Next::At(deadline + period)`: a period after each deadline, however late the run.
    FixedRate,
}

/// Creates the works phase by phase, lets a period pass, then counts the workers'
/// wakeups and the runs over `COUNTED_PERIODS` periods; returns (wakeups/s, runs/s).
fn wakeups_per_second(workers: usize, leeway: Option<Duration>, rate: Rate) -> (f64, f64) {
    let sched = Scheduler::builder().workers(workers).build().unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let mut works: Vec<Work> = Vec::with_capacity(WORKS);
    for phase in 0..PHASES {
        for _ in 0..WORKS / PHASES {
            let runs = runs.clone();
            let work = sched.every(PERIOD, move |cx| {
                runs.fetch_add(1, Ordering::Relaxed);
                match rate {
                    Rate::FixedDelay => Next::Again,
                    Rate::FixedRate => Next::At(cx.deadline() + PERIOD),
                }
            });
            works.push(match leeway {
                Some(leeway) => work.leeway(leeway),
                None => work,
            });
        }
        if phase + 1 < PHASES {
            std::thread::sleep(PERIOD / PHASES as u32);
        }
    }
    std::thread::sleep(PERIOD / 2);
    let (wakeups, ran, start) = (
        sched.metrics().worker_wakeups,
        runs.load(Ordering::Relaxed),
        Instant::now(),
    );
    std::thread::sleep(PERIOD * COUNTED_PERIODS);
    let seconds = start.elapsed().as_secs_f64();
    (
        (sched.metrics().worker_wakeups - wakeups) as f64 / seconds,
        (runs.load(Ordering::Relaxed) - ran) as f64 / seconds,
    )
}

/// The same works on a hosted scheduler whose host sleeps until `next_deadline()` and
/// calls `run_due()`: returns the host's wakeups per second.
fn host_wakeups_per_second(leeway: Duration) -> f64 {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let wakeups = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let host = {
        let (wakeups, stop) = (wakeups.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // A host with nothing armed would sleep on the descriptor; polling every
                // 5 ms while the works are made keeps this test portable.
                let wake = driver
                    .next_deadline()
                    .unwrap_or_else(|| Instant::now() + Duration::from_millis(5));
                if let Some(gap) = wake.checked_duration_since(Instant::now()) {
                    std::thread::sleep(gap);
                }
                driver.run_due();
                wakeups.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut works = Vec::with_capacity(WORKS);
    for _ in 0..PHASES {
        for _ in 0..WORKS / PHASES {
            works.push(sched.every(PERIOD, |_| Next::Again).leeway(leeway));
        }
        std::thread::sleep(PERIOD / PHASES as u32);
    }
    std::thread::sleep(PERIOD / 2);
    let (before, start) = (wakeups.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(PERIOD * COUNTED_PERIODS);
    let counted = wakeups.load(Ordering::Relaxed) - before;
    let seconds = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    drop(works);
    drop(sched);
    host.join().unwrap();
    counted as f64 / seconds
}

/// What one case counts: a threaded scheduler's workers, or a host.
#[derive(Debug, Clone, Copy)]
enum Case {
    /// Workers, leeway, re-arm, at most this many wakeups per second.
    Threaded(usize, Option<Duration>, Rate, f64),
    /// A host with this leeway, at most this many wakeups per second.
    Hosted(Duration, f64),
}

/// Every case at once (they sleep most of the time), each on its own scheduler: about
/// seven seconds in all.
#[test]
fn a_thousand_periodic_works_share_wakeups_by_their_leeway() {
    let _measuring = counting::measuring();
    use Rate::*;
    let cases = [
        Case::Threaded(1, Some(Duration::from_millis(100)), FixedDelay, 11.0),
        Case::Threaded(2, Some(Duration::from_millis(100)), FixedDelay, 11.0),
        Case::Threaded(1, Some(Duration::from_secs(1)), FixedDelay, 2.0),
        Case::Threaded(2, Some(Duration::from_secs(1)), FixedDelay, 2.0),
        Case::Threaded(1, Some(Duration::from_secs(1)), FixedRate, 2.0),
        Case::Hosted(Duration::from_millis(100), 11.0),
        // The other side: without a leeway the windows do not overlap, and each phase
        // keeps its wakeup (so the cases above do not pass for want of phases).
        Case::Threaded(1, None, FixedDelay, f64::INFINITY),
    ];
    let results: Vec<(f64, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&case| {
                s.spawn(move || match case {
                    Case::Threaded(workers, leeway, rate, _) => {
                        wakeups_per_second(workers, leeway, rate)
                    }
                    Case::Hosted(leeway, _) => (host_wakeups_per_second(leeway), f64::NAN),
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (&case, &(wakeups, runs)) in cases.iter().zip(&results) {
        let Case::Threaded(workers, leeway, rate, bound) = case else {
            let Case::Hosted(leeway, bound) = case else {
                unreachable!()
            };
            println!("hosted, leeway {leeway:?}: {wakeups:.1} host wakeups/s");
            assert!(
                wakeups <= bound,
                "{wakeups:.1} host wakeups/s, at most {bound}"
            );
            continue;
        };
        println!(
            "{workers} worker(s), leeway {leeway:?}, {rate:?}: {wakeups:.1} wakeups/s, \
             {runs:.0} runs/s"
        );
        if leeway.is_none() {
            assert!(
                wakeups >= PHASES as f64 * 0.9,
                "{wakeups:.1} wakeups/s for {PHASES} phases without a leeway"
            );
            continue;
        }
        // Every work keeps running: `Again` counts the period from the end of the run, so
        // a work that runs late by its leeway runs every period to period + leeway (plus
        // the time its run takes); a fixed rate runs once a period. A counted window may
        // hold one run of each more, or up to one and a half fewer.
        let seconds = f64::from(COUNTED_PERIODS) * PERIOD.as_secs_f64();
        let longest = match rate {
            FixedDelay => (PERIOD + leeway.unwrap_or_default()).as_secs_f64(),
            FixedRate => PERIOD.as_secs_f64(),
        };
        let (fewest, most) = (
            WORKS as f64 * (seconds / longest - 1.5).max(0.0) / seconds,
            WORKS as f64 * (seconds / PERIOD.as_secs_f64() + 1.0) / seconds,
        );
        assert!(
            (fewest..=most).contains(&runs),
            "{workers} worker(s), leeway {leeway:?}, {rate:?}: {runs:.0} runs/s, not in \
             {fewest:.0}..={most:.0}"
        );
        let bound = if workers > 1 && !STANDBY {
            2.0 * bound
        } else {
            bound
        };
        assert!(
            wakeups <= bound,
            "{workers} worker(s), leeway {leeway:?}, {rate:?}: {wakeups:.1} wakeups/s, at most \
             {bound}"
        );
    }
}

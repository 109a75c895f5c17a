//! Memory under churn: millions of works armed far out and cancelled/dropped, and one work
//! alternating a later and an earlier far deadline. Timer entries and live heap bytes
//! must stay bounded.

use crate::counting::{self, live_bytes};

use std::time::Duration;

use nicework::{Next, Scheduler};

/// Debug builds (the plain `cargo test`) run a tenth of the iterations: still many
/// sweeps' worth, at a tenth of the time.
const ITERATIONS_DIVISOR: u64 = if cfg!(debug_assertions) { 10 } else { 1 };

fn check(sched: &Scheduler, armed: usize, what: &str) {
    let m = sched.metrics();
    assert!(
        m.timer_entries <= 2 * armed + 2 * 1024 + 64,
        "{what}: {} timer entries for {armed} armed works",
        m.timer_entries
    );
}

fn churn(sched: &Scheduler, label: &str) {
    let baseline = live_bytes();
    let mut peak = 0isize;
    for i in 0..1_000_000 / ITERATIONS_DIVISOR {
        let w = sched.work(|_| Next::Park);
        let far = Duration::from_secs(3600 + i % 1000);
        match i % 4 {
            0 => {
                w.reschedule(far);
            }
            1 => {
                w.schedule(far);
                w.cancel();
            }
            2 => {
                w.reschedule(far);
                w.reschedule(far - Duration::from_secs(60));
                w.cancel();
            }
            _ => {
                w.reschedule(far);
                w.cancel();
                w.reschedule(far - Duration::from_secs(1));
            }
        }
        drop(w);
        if i % 10_000 == 0 {
            check(sched, 0, label);
            peak = peak.max(live_bytes() - baseline);
        }
    }
    check(sched, 0, label);
    assert!(
        peak < 4 << 20,
        "{label}: live heap grew by {peak} bytes while churning dropped works"
    );
}

#[test]
fn create_arm_cancel_drop_a_million_far_works_stays_bounded() {
    let _measuring = counting::measuring();
    let manual = Scheduler::manual();
    churn(&manual, "manual");
    let real = Scheduler::builder().workers(2).build().unwrap();
    churn(&real, "real");
}

#[test]
fn alternating_later_and_earlier_far_deadlines_stay_bounded() {
    let _measuring = counting::measuring();
    for sched in [
        Scheduler::manual(),
        Scheduler::builder().workers(2).build().unwrap(),
    ] {
        let w = sched.work(|_| Next::Park);
        let baseline = live_bytes();
        let mut max_entries = 0;
        let mut min_entries = usize::MAX;
        for i in 0..200_000 / ITERATIONS_DIVISOR {
            if i % 2 == 0 {
                w.reschedule(Duration::from_secs(3600));
            } else {
                w.reschedule(Duration::from_secs(59 * 60));
            }
            let e = sched.metrics().timer_entries;
            max_entries = max_entries.max(e);
            if i > 100_000 / ITERATIONS_DIVISOR {
                min_entries = min_entries.min(e);
            }
        }
        eprintln!("alternating: timer entries max {max_entries}, min after warm-up {min_entries}");
        // A sweep leaves only the live entry, also when a stale entry's epoch matches
        // the live one's (epochs wrap): it keeps one entry per work.
        assert!(
            max_entries <= 2 + 2 * 1024 + 64,
            "alternating: up to {max_entries} timer entries for 1 armed work (min after a sweep {min_entries})"
        );
        let grown = live_bytes() - baseline;
        assert!(
            grown < 1 << 20,
            "alternating: live heap grew by {grown} bytes"
        );
        assert!(w.is_pending());
    }
}

/// Many works kept armed far out while others churn: entries stay within 2x armed + ~2k.
#[test]
fn armed_population_plus_churn_stays_within_twice_armed() {
    let _measuring = counting::measuring();
    let sched = Scheduler::manual();
    let keep: Vec<_> = (0..50_000u64)
        .map(|i| {
            let w = sched.work(|_| Next::Park);
            w.reschedule(Duration::from_secs(7200 + i));
            w
        })
        .collect();
    for round in 0..20u64 {
        for (i, w) in keep.iter().enumerate() {
            // Move each one earlier (a new entry each time) ...
            w.reschedule(Duration::from_secs(7000 - round * 10 - (i as u64 % 5)));
        }
        check(&sched, keep.len(), "armed + earlier moves");
    }
    for w in &keep {
        assert!(w.is_pending());
    }
}

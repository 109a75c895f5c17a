//! Timer entries are removed lazily (a cancelled, re-armed-earlier or dropped work's entry
//! stays until its tick), so these tests pin the bound: the structure never holds more
//! than about twice the armed works plus a constant, however the works churn. Counts
//! only, never timings.

use std::time::Duration;

use nicework::{Next, Scheduler, Work};

const HOUR: Duration = Duration::from_secs(3600);
/// Stale entries tolerated beyond half the structure before a sweep (`SWEEP_FLOOR`),
/// twice: the bound is about 2 × armed + 2 × this.
const FLOOR: usize = 1024;

fn bound(armed: usize) -> usize {
    2 * armed + 2 * FLOOR + 2
}

#[test]
fn dropping_far_armed_works_leaves_a_bounded_number_of_entries() {
    let sched = Scheduler::new().unwrap();
    let mut works: Vec<Work> = (0..100_000)
        .map(|_| {
            let work = sched.work(|_| Next::Park);
            work.schedule(HOUR);
            work
        })
        .collect();
    works.truncate(1_000);
    let metrics = sched.metrics();
    assert_eq!(metrics.armed, 1_000);
    assert!(
        metrics.timer_entries <= bound(1_000),
        "{} entries for 1,000 armed works",
        metrics.timer_entries
    );
}

#[test]
fn cancelled_and_re_armed_works_reuse_their_entries() {
    let sched = Scheduler::new().unwrap();
    let works: Vec<Work> = (0..10_000).map(|_| sched.work(|_| Next::Park)).collect();
    for _ in 0..20 {
        for work in &works {
            work.reschedule(HOUR);
            work.cancel();
        }
    }
    let metrics = sched.metrics();
    assert_eq!(metrics.armed, 0);
    assert!(
        metrics.timer_entries <= works.len(),
        "{} entries: at most one per work",
        metrics.timer_entries
    );
}

#[test]
fn moving_a_deadline_earlier_again_and_again_stays_bounded() {
    let sched = Scheduler::new().unwrap();
    let work = sched.work(|_| Next::Park);
    for i in 0..200_000u32 {
        // Each move earlier than the live entry places a new entry; the old one is stale.
        let minutes = if i % 2 == 0 { 60 } else { 59 };
        work.reschedule(Duration::from_secs(60 * minutes));
    }
    let metrics = sched.metrics();
    assert_eq!(metrics.armed, 1);
    assert!(
        metrics.timer_entries <= bound(1),
        "{} entries for one armed work",
        metrics.timer_entries
    );
}

#[test]
fn a_manual_scheduler_drops_stale_entries_at_their_tick() {
    let sched = Scheduler::manual();
    let works: Vec<Work> = (0..100).map(|_| sched.work(|_| Next::Park)).collect();
    for work in &works {
        work.schedule(Duration::from_millis(10));
        work.cancel();
    }
    assert_eq!(sched.metrics().timer_entries, 100);
    assert_eq!(sched.advance(Duration::from_millis(10)), 0);
    assert_eq!(sched.metrics().timer_entries, 0);
    drop(works);
}

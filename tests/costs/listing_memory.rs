//! The registry of live works (`Scheduler::works`) follows the live works down: once
//! most of many works are gone, so are their slots.

use crate::counting::{self, live_bytes};

use nicework::{Next, Scheduler, Work};

#[test]
fn the_registry_gives_back_its_slots_when_the_works_go() {
    let _measuring = counting::measuring();
    let sched = Scheduler::manual();
    let kept: Vec<Work> = (0..10).map(|_| sched.work(|_| Next::Park)).collect();
    let baseline = live_bytes();
    for _ in 0..3 {
        // Dropped newest first and oldest first, so the slots empty from either end.
        let mut works: Vec<Work> = (0..50_000).map(|_| sched.work(|_| Next::Park)).collect();
        let grown = live_bytes() - baseline;
        while works.len() > 25_000 {
            works.pop();
        }
        works.reverse();
        while let Some(work) = works.pop() {
            drop(work);
        }
        drop(works);
        let left = live_bytes() - baseline;
        println!("50,000 works: {grown} B; after dropping them: {left} B");
        // A registry that kept its slots would keep 400 KB (50,000 words); the margin is
        // for what `wakeups_per_run`, which counts no bytes, allocates meanwhile.
        assert!(
            left <= 64 * 1024,
            "{left} B left after 50,000 works came and went ({grown} B with them)"
        );
    }
    let mut listed = 0;
    sched.works(|_| listed += 1);
    assert_eq!(listed, kept.len());
}

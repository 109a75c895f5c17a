//! Memory stays flat: 200 rounds of creating and dropping 10,000 works and an `IdSpace`
//! used by 16 threads.

use crate::{common, counting};

use std::time::Duration;

use nicework::{IdSpace, Next, PerCid, Scheduler};

/// How a round arms its works.
#[derive(Clone, Copy, PartialEq)]
enum Arming {
    /// A mix of armed, due and parked works: the measured rounds.
    Mixed,
    /// All armed for later: the timer wheel's peak.
    AllLater,
    /// All due at once: the ready queue's peak.
    AllNow,
}

fn round(sched: &Scheduler, round: usize, arming: Arming) {
    let works: Vec<_> = (0..10_000)
        .map(|i| {
            let payload = vec![i as u8; 16];
            let work = sched.work(move |_| {
                std::hint::black_box(&payload);
                Next::Park
            });
            // A mix of armed, parked and run works.
            match (arming, i % 3) {
                (Arming::AllLater, _) | (Arming::Mixed, 0) => {
                    work.schedule(Duration::from_millis(50));
                }
                (Arming::AllNow, _) | (Arming::Mixed, 1) => {
                    work.schedule(Duration::ZERO);
                }
                _ => {}
            }
            work
        })
        .collect();
    let ids = IdSpace::builder()
        .scan_period(Duration::from_millis(1))
        .build(sched);
    let slots: PerCid<Vec<u64>> = PerCid::new(&ids, Vec::new);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let (ids, slots) = (&ids, &slots);
                s.spawn(move || {
                    let _cid = ids.enter();
                    slots.with(|slot| slot.push((round * 16 + t) as u64));
                })
            })
            .collect();
        // Explicit joins: the end of a scope does not wait for the threads' thread-local
        // destructors, which free their id records.
        for thread in threads {
            thread.join().unwrap();
        }
    });
    drop(works);
    drop(slots);
    drop(ids);
    // The dropped works' timer entries leave at their ticks (see `Shared::note_stale`);
    // wait for that, so every round ends in the same state.
    assert!(common::eventually(|| sched.metrics().timer_entries == 0));
}

#[test]
fn live_heap_bytes_are_flat_over_200_rounds() {
    let _measuring = counting::measuring();
    let sched = Scheduler::builder().workers(2).build().unwrap();
    // Warm up lazily initialized state (thread-local caches, tracing's callsite
    // registry) and grow the timer wheel and the ready queue to their peaks once: with
    // every work armed at once, then every work due at once. Capacity that stays is not
    // a leak; growth round after round would be.
    round(&sched, 0, Arming::AllLater);
    round(&sched, 1, Arming::AllNow);
    for r in 2..22 {
        round(&sched, r, Arming::Mixed);
    }
    // Timer entries of the rounds' works are gone (each round waits for it), so what
    // is left is capacity.
    let start = counting::live_bytes();
    for r in 22..222 {
        round(&sched, r, Arming::Mixed);
    }
    let end = counting::live_bytes();
    println!("live heap bytes: {start} at round 22, {end} at round 222");
    // One round allocates about 1.5 MB; a leak of even one work per round would show.
    assert!(
        end <= start + 4_096,
        "live heap grew by {} bytes over 200 rounds",
        end - start
    );
}

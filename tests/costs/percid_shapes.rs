//! `PerCid`'s memory follows the live concurrency in shapes other than `percid_shrink`'s:
//! big slots, eight `PerCid`s on one space, repeated grow/shrink cycles, and a pair whose
//! scheduler was dropped.

use crate::{common, counting, shrink_heap};

use nicework::{IdSpace, MIN_SCAN_PERIOD, PerCid, Scheduler};

type Pair = (IdSpace, Vec<PerCid<[u64; 64]>>);

#[test]
fn memory_shapes() {
    // A process of its own: which of the pair's threads frees a block they share, a
    // survivor after the count or a transient before it, depends on what else runs in
    // the process (+1.2 KB on a 2.5 KB pair, beside this binary's other tests).
    const NAME: &str = "memory_shapes";
    if !common::child::is_child(NAME) {
        common::child::assert_child_passes(module_path!(), NAME);
        return;
    }
    let _measuring = counting::measuring();
    let sched = Scheduler::manual();
    // Big slots, eight PerCids on one space, repeated grow/shrink cycles.
    let make = || {
        let ids = IdSpace::builder()
            .scan_period(MIN_SCAN_PERIOD)
            .build(&sched);
        let slots = (0..8).map(|_| PerCid::new(&ids, || [0u64; 64])).collect();
        (ids, slots)
    };
    let touch = |(_, slots): &Pair| {
        for p in slots {
            p.with(|slot| slot[0] += 1);
        }
    };
    let settle = |_: &Pair| {
        sched.advance(MIN_SCAN_PERIOD);
    };
    shrink_heap::heap_after_shrink(make, touch, settle, 4, 4);
    let fresh = shrink_heap::heap_after_shrink(make, touch, settle, 4, 4);
    let mut results = Vec::new();
    for cycle in 0..5 {
        let shrunk = shrink_heap::heap_after_shrink(make, touch, settle, 64, 4);
        results.push(shrunk);
        assert!(
            shrunk as f64 <= 1.2 * fresh as f64,
            "cycle {cycle}: after 64 -> 4: {shrunk} B, fresh {fresh} B"
        );
    }
    // A pair whose scheduler was dropped: the trims run at thread exit only.
    let make_orphan = || {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        let slots = (0..8).map(|_| PerCid::new(&ids, || [0u64; 64])).collect();
        drop(sched);
        (ids, slots)
    };
    let none = |_: &Pair| ();
    // One more thread comes and goes after the survivors moved down.
    let one_exit = |pair: &Pair| {
        // An explicit join waits for the thread's exit hook (and its trim).
        std::thread::scope(|s| s.spawn(|| touch(pair)).join().unwrap());
    };
    shrink_heap::heap_after_shrink(make_orphan, touch, none, 4, 4);
    let fresh_orphan = shrink_heap::heap_after_shrink(make_orphan, touch, none, 4, 4);
    let after_exit = shrink_heap::heap_after_shrink(make_orphan, touch, one_exit, 64, 4);
    let no_exit = shrink_heap::heap_after_shrink(make_orphan, touch, none, 64, 4);
    println!(
        "fresh {fresh}, cycles {results:?}; no scheduler: fresh {fresh_orphan}, \
         after one more exit {after_exit}, survivors moved down, no exit {no_exit}"
    );
    assert!(
        after_exit as f64 <= 1.2 * fresh_orphan as f64,
        "no scheduler, after one more exit: {after_exit} B, fresh {fresh_orphan} B"
    );
    println!("CHILD-OK");
}

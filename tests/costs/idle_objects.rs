//! The kernel's per-mm delayed work made 20,000 invocations in 30 s for idle processes.
//! 10,000 idle objects with nicework works for 30 s: 0 callback runs and 0 worker
//! wakeups, counted (the test takes 30 s of wall time; it asserts counts only).
//!
//! The objects are made and freed under [`counting::measuring`], and the 30 s pass without
//! it: an idle scheduler allocates nothing (it does nothing), so the byte counts of this
//! binary's other tests run meanwhile.

use crate::{common, counting};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nicework::{Next, Scheduler, Work};

/// An object with a periodic cleanup that parks while the object is idle.
struct Object {
    dirty: AtomicBool,
    cleanup: Mutex<Option<Work>>,
}

#[test]
fn ten_thousand_idle_objects_cost_no_runs_and_no_wakeups_for_30_s() {
    const OBJECTS: usize = 10_000;
    let measuring = counting::measuring();
    let sched = Scheduler::new().unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let objects: Vec<Arc<Object>> = (0..OBJECTS)
        .map(|_| {
            let object = Arc::new(Object {
                dirty: AtomicBool::new(true),
                cleanup: Mutex::new(None),
            });
            let counter = runs.clone();
            let work = sched.every_for(&object, Duration::from_millis(10), move |object, _| {
                counter.fetch_add(1, Ordering::Relaxed);
                if object.dirty.swap(false, Ordering::SeqCst) {
                    Next::Again
                } else {
                    Next::Park
                }
            });
            *object.cleanup.lock().unwrap() = Some(work);
            object
        })
        .collect();
    // Each object runs twice (clean up, then find nothing and park), then is idle.
    let all_parked = || {
        objects.iter().all(|o| {
            let cleanup = o.cleanup.lock().unwrap();
            let work = cleanup.as_ref().unwrap();
            !work.is_pending() && !work.is_running() && work.stats().parks == 1
        })
    };
    assert!(common::eventually(all_parked));
    assert_eq!(sched.metrics().armed, 0);
    std::thread::sleep(Duration::from_millis(100)); // let the worker reach its sleep
    let (runs_before, wakeups_before) =
        (runs.load(Ordering::SeqCst), sched.metrics().worker_wakeups);
    drop(measuring);
    std::thread::sleep(Duration::from_secs(30));
    let _measuring = counting::measuring();
    let runs_during = runs.load(Ordering::SeqCst) - runs_before;
    let wakeups_during = sched.metrics().worker_wakeups - wakeups_before;
    println!("{OBJECTS} idle objects, 30 s: {runs_during} runs, {wakeups_during} worker wakeups");
    assert_eq!(runs_during, 0);
    assert_eq!(wakeups_during, 0);
    // Still alive: a touch brings one back.
    objects[0].dirty.store(true, Ordering::SeqCst);
    objects[0].cleanup.lock().unwrap().as_ref().unwrap().touch();
    assert!(common::eventually(
        || runs.load(Ordering::SeqCst) > runs_before
    ));
}

//! Several threads do random schedule / reschedule / touch / cancel / cancel_sync / drop /
//! flush / disable on shared works for a bounded time, against a two-worker scheduler.
//! Checks: no work ever runs on two threads at once, and none runs after its
//! `cancel_sync` (or drop) returned while nobody re-armed it.

use crate::common;

use common::Rng;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

const SLOTS: usize = 8;
const THREADS: usize = 4;
const RUN_FOR: Duration = Duration::from_millis(1500);

#[derive(Default)]
struct Checks {
    overlaps: AtomicU64,
    after_cancel: AtomicU64,
    runs: AtomicU64,
    leaked_closures: AtomicU64,
}

struct Slot {
    /// Operations that may arm the work hold it shared; cancel_sync and drop hold it
    /// exclusively, so during their check window nobody can legitimately re-arm the work.
    gate: RwLock<()>,
    work: Mutex<Option<Arc<Work>>>,
    inside: Arc<AtomicBool>,
    forbidden: Arc<AtomicBool>,
}

fn make_work(
    sched: &Scheduler,
    slot: &Slot,
    checks: &Arc<Checks>,
    seed: u64,
) -> (Work, Arc<AtomicBool>) {
    let (inside, forbidden, checks) = (slot.inside.clone(), slot.forbidden.clone(), checks.clone());
    let (guard, dropped) = common::drop_flag();
    let mut rng = Rng(seed | 1);
    let work = sched.work(move |_| {
        let _keep = &guard;
        if inside.swap(true, Ordering::SeqCst) {
            checks.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        if forbidden.load(Ordering::SeqCst) {
            checks.after_cancel.fetch_add(1, Ordering::SeqCst);
        }
        checks.runs.fetch_add(1, Ordering::Relaxed);
        for _ in 0..(rng.next() % 2000) {
            std::hint::spin_loop();
        }
        inside.store(false, Ordering::SeqCst);
        match rng.next() % 5 {
            0 => Next::Again,
            1 => Next::After(Duration::from_micros(rng.next() % 2000)),
            2 => Next::Yield,
            3 => Next::Park,
            _ => Next::Stop,
        }
    });
    (work, dropped)
}

#[test]
fn random_operations_keep_non_reentrancy_and_cancel_sync() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let checks = Arc::new(Checks::default());
    let slots: Arc<Vec<Slot>> = Arc::new(
        (0..SLOTS)
            .map(|_| Slot {
                gate: RwLock::new(()),
                work: Mutex::new(None),
                inside: Arc::default(),
                forbidden: Arc::default(),
            })
            .collect(),
    );
    for (i, slot) in slots.iter().enumerate() {
        let (work, _) = make_work(&sched, slot, &checks, i as u64 + 1);
        *slot.work.lock().unwrap() = Some(Arc::new(work));
    }
    let deadline = Instant::now() + RUN_FOR;
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (sched, slots, checks) = (sched.clone(), slots.clone(), checks.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9 + t as u64 * 7919);
                let mut ops = 0u64;
                while Instant::now() < deadline {
                    let slot = &slots[(rng.next() % SLOTS as u64) as usize];
                    let op = rng.next() % 10;
                    if op >= 8 {
                        let _exclusive = slot.gate.write().unwrap();
                        if op == 8 {
                            let work = slot.work.lock().unwrap().clone().unwrap();
                            work.cancel_sync();
                        } else {
                            let work = slot.work.lock().unwrap().take().unwrap();
                            let work = Arc::into_inner(work).expect("no op holds it");
                            let (replacement, dropped) =
                                make_work(&sched, slot, &checks, rng.next());
                            drop(replacement); // exercise drop of a never-armed work too
                            let (replacement, _) = make_work(&sched, slot, &checks, rng.next());
                            drop(work);
                            if !dropped.load(Ordering::SeqCst) {
                                checks.leaked_closures.fetch_add(1, Ordering::SeqCst);
                            }
                            *slot.work.lock().unwrap() = Some(Arc::new(replacement));
                        }
                        // The check window: nothing may run now.
                        slot.forbidden.store(true, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_micros(500));
                        slot.forbidden.store(false, Ordering::SeqCst);
                    } else {
                        let _shared = slot.gate.read().unwrap();
                        let work = slot.work.lock().unwrap().clone().unwrap();
                        let delay = Duration::from_micros(rng.next() % 3000);
                        match op {
                            0 => drop(work.schedule(delay)),
                            1 => drop(work.reschedule(delay)),
                            2 | 3 => work.touch(),
                            4 => drop(work.cancel()),
                            5 => drop(work.flush()),
                            6 => {
                                work.disable();
                                work.enable();
                            }
                            _ => drop(work.schedule(Duration::ZERO)),
                        }
                    }
                    ops += 1;
                }
                ops
            })
        })
        .collect();
    let ops: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    for slot in slots.iter() {
        let work = slot.work.lock().unwrap().take().unwrap();
        drop(Arc::into_inner(work).unwrap());
    }
    drop(sched);
    let runs = checks.runs.load(Ordering::SeqCst);
    println!("{ops} operations, {runs} runs");
    assert!(
        ops > 1000 && runs > 100,
        "the stress did not exercise anything"
    );
    assert_eq!(
        checks.overlaps.load(Ordering::SeqCst),
        0,
        "a work ran on two threads at once"
    );
    assert_eq!(
        checks.after_cancel.load(Ordering::SeqCst),
        0,
        "a work ran after cancel_sync/drop"
    );
    assert_eq!(
        checks.leaked_closures.load(Ordering::SeqCst),
        0,
        "drop returned before freeing"
    );
}

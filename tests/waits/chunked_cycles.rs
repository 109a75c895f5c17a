//! `run_chunked` never returns while a helper still runs the closure that borrows the
//! caller's stack, also when a helper's chunk waits for the caller's own work: helpers run
//! on behalf of the caller's callbacks, so that wait behaves as inside the own callback,
//! and the caller's final wait for its helpers is unconditional.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

struct Canary {
    v: u64,
}
impl Drop for Canary {
    fn drop(&mut self) {
        // Poison the value so a reader after the drop can tell.
        unsafe { std::ptr::write_volatile(&mut self.v, 0xDEAD_DEAD_DEAD_DEAD) };
    }
}

static RETURNED: AtomicBool = AtomicBool::new(false);
static VIOLATION: AtomicBool = AtomicBool::new(false);

#[test]
fn a_helper_that_flushes_the_callers_work_never_outlives_run_chunked() {
    // watchdog
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(30));
        eprintln!("WATCHDOG: hang");
        std::process::exit(101);
    });
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let a_slot: Arc<OnceLock<Work>> = Arc::new(OnceLock::new());
    let helper_started = Arc::new(AtomicBool::new(false));
    let returned = Arc::new(AtomicBool::new(false));
    let violation = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let helper_done = Arc::new(AtomicBool::new(false));

    let (slot, hs, ret, _viol, seen2, hd) = (
        a_slot.clone(),
        helper_started.clone(),
        returned.clone(),
        violation.clone(),
        seen.clone(),
        helper_done.clone(),
    );
    let a = sched.work(move |cx| {
        let canary = Canary { v: 0x1234_5678 };
        let canary_ref = &canary;
        let r = cx.scheduler().run_chunked(0..2, 1, |range| {
            if range.start == 1 {
                // helper side (claims from the back), on the other worker
                hs.store(true, Ordering::SeqCst);
                slot.get().unwrap().flush(); // A is running: wait for it (edge H -> A)
                if RETURNED.load(Ordering::SeqCst) {
                    // Report through a static before touching anything borrowed.
                    eprintln!("helper still inside run_chunked's borrowed closure after run_chunked returned");
                    VIOLATION.store(true, Ordering::SeqCst);
                }
                let v = unsafe { std::ptr::read_volatile(&canary_ref.v) };
                seen2.store(v, Ordering::SeqCst);
                hd.store(true, Ordering::SeqCst);
            } else {
                let start = Instant::now();
                while !hs.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(200)); // helper registers its wait
            }
            Ok::<(), ()>(())
        });
        assert!(r.is_ok());
        ret.store(true, Ordering::SeqCst);
        RETURNED.store(true, Ordering::SeqCst);
        Next::Park
    });
    a_slot.set(a).ok().unwrap();
    a_slot.get().unwrap().schedule(Duration::ZERO);

    let start = Instant::now();
    while !helper_done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(helper_done.load(Ordering::SeqCst), "helper never finished");
    eprintln!(
        "run_chunked returned before helper's closure finished: {}, canary read by helper = {:#x}",
        violation.load(Ordering::SeqCst),
        seen.load(Ordering::SeqCst)
    );
    assert!(
        !VIOLATION.load(Ordering::SeqCst) && !violation.load(Ordering::SeqCst),
        "run_chunked returned while a helper was still executing the borrowed closure \
         (canary read after its frame was popped: {:#x})",
        seen.load(Ordering::SeqCst)
    );
}

//! What a `flush` waits for: the run in progress when it was called (and `Yield`
//! increments it takes over), never a run that `Again` armed meanwhile, even when another
//! thread takes that run before the flusher is back on a CPU. Otherwise a busy
//! self-re-arming work could hold a flush for ever.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler};

#[test]
fn flush_does_not_wait_for_a_run_that_again_armed_during_it() {
    for round in 0..20 {
        let sched = Scheduler::manual();
        let runs = Arc::new(AtomicU64::new(0));
        let flush_returned = Arc::new(AtomicBool::new(false));
        let held_up = Arc::new(AtomicBool::new(false));
        let work = {
            let (runs, flush_returned, held_up) =
                (runs.clone(), flush_returned.clone(), held_up.clone());
            let waiter = sched.clone();
            Arc::new(sched.every(Duration::from_millis(1), move |_| {
                match runs.fetch_add(1, Ordering::SeqCst) {
                    // The run the flush is called in: it ends once the flusher waits.
                    0 => assert!(common::eventually(|| waiter.metrics().lending.waited > 0)),
                    // The run `Again` armed: it ends once the flush returned. If the flush
                    // waited for it, this times out instead.
                    1 => {
                        let start = Instant::now();
                        while !flush_returned.load(Ordering::SeqCst) {
                            if start.elapsed() > common::EVENTUALLY {
                                held_up.store(true, Ordering::SeqCst);
                                break;
                            }
                            std::thread::yield_now();
                        }
                    }
                    _ => {}
                }
                Next::Again
            }))
        };
        let driver = {
            let sched = sched.clone();
            std::thread::spawn(move || sched.advance(Duration::from_millis(2)))
        };
        assert!(common::eventually(|| work.is_running()));
        assert!(work.flush());
        flush_returned.store(true, Ordering::SeqCst);
        driver.join().unwrap();
        assert!(
            !held_up.load(Ordering::SeqCst),
            "round {round}: the flush waited for the run that Again armed during it"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

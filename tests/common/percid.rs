//! `PerCid` fixtures shared by the reclaim and slot-cache tests: a thread that must
//! finish, exit included, a thread that runs steps on demand and stays alive in between,
//! and the folding pattern where one `PerCid`'s reclaimed slots fold into another's.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use nicework::{IdSpace, PerCid};

use super::EVENTUALLY;

/// Runs `f` on a fresh thread (joined, so its thread-local destructors ran) and returns its
/// result; a thread that does not finish within the liveness bound is a deadlock.
pub fn finishes<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let result = catch_unwind(AssertUnwindSafe(f));
        // Sent from the thread body; the join below waits for the thread's locals.
        let _ = tx.send(());
        result
    });
    match rx.recv_timeout(EVENTUALLY) {
        Ok(()) => {}
        Err(_) => panic!("{what}: the thread never finished its body (deadlock)"),
    }
    // The body is done; now the thread-exit path (thread-local destructors) runs.
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(handle.join());
    });
    match done_rx.recv_timeout(EVENTUALLY) {
        Ok(Ok(Ok(value))) => value,
        Ok(Ok(Err(payload))) | Ok(Err(payload)) => resume_unwind(payload),
        Err(_) => panic!("{what}: the thread never finished exiting (deadlock at thread exit)"),
    }
}

/// Counters whose reclaimed slots fold into `totals` through `totals.with`, and `totals`,
/// whose own reclaimed slots fold into the atomic `total`: returns (total, totals,
/// counters). Live plus folded is `total` plus both `PerCid`s' slots.
pub fn fold_pair(ids: &IdSpace) -> (Arc<AtomicU64>, Arc<PerCid<u64>>, Arc<PerCid<u64>>) {
    let total = Arc::new(AtomicU64::new(0));
    let totals: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(ids, || 0, {
        let total = total.clone();
        move |n: &mut u64| {
            total.fetch_add(*n, Ordering::SeqCst);
        }
    }));
    let counters: Arc<PerCid<u64>> = Arc::new(PerCid::with_reclaim(ids, || 0, {
        let totals = totals.clone();
        move |n: &mut u64| totals.with(|t| *t += *n)
    }));
    (total, totals, counters)
}

/// A step an [`Owner`] runs on its thread.
pub type Step = Box<dyn FnOnce() + Send>;

/// A thread that runs the steps it is given, one at a time, and stays alive in between
/// (so its id is reclaimed by the scan, not released by an exit).
pub struct Owner {
    steps: mpsc::Sender<(Step, mpsc::Sender<()>)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Owner {
    /// A thread that waits for steps.
    pub fn start() -> Owner {
        let (steps, inbox) = mpsc::channel::<(Step, mpsc::Sender<()>)>();
        let thread = std::thread::spawn(move || {
            for (step, done) in inbox {
                step();
                done.send(()).unwrap();
            }
        });
        Owner {
            steps,
            thread: Some(thread),
        }
    }

    /// Runs `step` on the owner's thread and returns once it has.
    pub fn run(&self, step: impl FnOnce() + Send + 'static) {
        let (done, finished) = mpsc::channel();
        self.steps.send((Box::new(step), done)).unwrap();
        finished.recv().expect("the step panicked");
    }

    /// Ends the thread and joins it (its id is released before this returns).
    pub fn exit(mut self) {
        let thread = self.thread.take().unwrap();
        drop(self);
        thread.join().unwrap();
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let (steps, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.steps, steps));
        if let Some(thread) = self.thread.take() {
            // A step that panicked already failed its test; unwinding past this must not
            // panic again.
            let _ = thread.join();
        }
    }
}

//! `PerCid` fixtures shared by the reclaim tests: a thread that must finish, exit included,
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

#![cfg(loom)]
//! What the `PerCid` models share: a count whose every access loom checks, a `PerCid` of
//! them whose trimmed slots fold into a total, a sum by `for_each`, and the model runner.

use std::sync::Arc;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use nicework::{IdSpace, PerCid};

/// A count the owner writes through `&mut` and the reader reads through `&`.
pub struct Count(UnsafeCell<u64>);

// SAFETY: shared access only reads (`get`); writes need `&mut` (`add`), which `PerCid`
// hands out exclusively. This is the property the models check.
unsafe impl Sync for Count {}

impl Count {
    /// A count of 0.
    pub fn new() -> Count {
        Count(UnsafeCell::new(0))
    }

    /// Adds one through `&mut`.
    pub fn add(&mut self) {
        // SAFETY: `&mut self` (loom checks the claim).
        self.0.with_mut(|count| unsafe { *count += 1 });
    }

    /// Reads it through `&`.
    pub fn get(&self) -> u64 {
        // SAFETY: a shared read (loom checks it against writers).
        self.0.with(|count| unsafe { *count })
    }
}

impl Default for Count {
    fn default() -> Self {
        Count::new()
    }
}

/// A `PerCid` of counts whose trimmed slots fold into `folded`.
pub fn counters(ids: &IdSpace, folded: &Arc<AtomicU64>) -> Arc<PerCid<Count>> {
    let folded = folded.clone();
    Arc::new(PerCid::with_reclaim(
        ids,
        Count::new,
        move |count: &mut Count| {
            folded.fetch_add(count.get(), Ordering::SeqCst);
        },
    ))
}

/// The sum of the counts in their slots (and queued for the callback).
pub fn sum(counters: &PerCid<Count>) -> u64 {
    let mut sum = 0;
    counters.for_each(|count| sum += count.get());
    sum
}

/// Runs a model with a branch bound above loom's default of 1,000, which two scans, the
/// gate's condvar and four threads exceed.
pub fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.max_branches = 20_000;
    model.check(f);
}

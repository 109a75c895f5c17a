#![cfg(loom)]
//! How a user models their own type with nicework under loom: a cache whose purge work
//! parks while idle and is touched by inserts. The model checks the user's invariant
//! ("an entry is never left behind with the purge parked") over every interleaving of
//! an insert with a purge run, on `Scheduler::manual()` driven by `advance`.
//!
//! Build the user's crate with `RUSTFLAGS="--cfg loom"` and nicework's `loom` feature
//! enabled (as this crate's `Cargo.toml` does), so nicework's locks and atomics are
//! loom's too.

use std::sync::Arc;
use std::time::Duration;

use loom::sync::Mutex;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;
use nicework::{Next, Scheduler, Work};

const PERIOD: Duration = Duration::from_millis(10);

/// The user's type.
struct Cache {
    entries: Mutex<Vec<u64>>,
    dirty: AtomicBool,
    purge: Mutex<Option<Work>>,
}

impl Cache {
    fn new(sched: &Scheduler) -> Arc<Cache> {
        let cache = Arc::new(Cache {
            entries: Mutex::new(Vec::new()),
            dirty: AtomicBool::new(false),
            purge: Mutex::new(None),
        });
        let purge = sched.every_for(&cache, PERIOD, |cache, _| {
            // SeqCst pairs with the inserter's SeqCst store (README: "touch() on an armed
            // work is one SeqCst load").
            if cache.dirty.swap(false, Ordering::SeqCst) {
                cache.entries.lock().unwrap().clear();
                Next::Again
            } else {
                Next::Park
            }
        });
        *cache.purge.lock().unwrap() = Some(purge);
        cache
    }

    fn insert(&self, value: u64) {
        self.entries.lock().unwrap().push(value);
        // An RMW, not `store(true, SeqCst)`: loom models SeqCst stores as Release only, so
        // with a plain store loom finds the (C++-impossible) interleaving in which the
        // purge parks without seeing it. On real hardware either is correct; in code you
        // model with loom, use an RMW (or follow the store with `fence(SeqCst)`).
        self.dirty.swap(true, Ordering::SeqCst);
        self.purge.lock().unwrap().as_ref().unwrap().touch();
    }

    fn purge_pending(&self) -> bool {
        self.purge.lock().unwrap().as_ref().unwrap().is_pending()
    }
}

#[test]
fn an_insert_racing_with_a_parking_purge_is_never_left_behind() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let cache = Cache::new(&sched);
        let inserter = {
            let cache = cache.clone();
            thread::spawn(move || cache.insert(7))
        };
        // The purge's first run, racing with the insert: it may purge it, or park.
        sched.advance(PERIOD);
        inserter.join().unwrap();
        let left = !cache.entries.lock().unwrap().is_empty();
        assert!(
            !left || cache.purge_pending(),
            "an entry is left with the purge parked"
        );
        // Whatever the interleaving, enough virtual time purges it.
        sched.advance(PERIOD * 3);
        assert!(cache.entries.lock().unwrap().is_empty());
        // Dropping the cache's work (with the cache) stops it.
        drop(cache.purge.lock().unwrap().take());
        assert_eq!(sched.metrics().armed, 0);
    });
}

//! A 4 KiB value that counts how many exist and were ever made (per test), for
//! tests of the reclaim queue's memory; and a busy wait that stands for a slow callback.
//!
//! Each test counts its own values ([`Counting`]), so such tests run side by side.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One test's counts of its [`Counted`] values: each test makes its own, so tests that
/// count run side by side.
#[derive(Default)]
pub struct Counting {
    alive: AtomicUsize,
    created: AtomicUsize,
}

impl Counting {
    pub fn new() -> Arc<Counting> {
        Arc::default()
    }

    /// Values of this test alive now.
    pub fn alive(&self) -> usize {
        self.alive.load(Ordering::SeqCst)
    }

    /// Values of this test ever made.
    pub fn created(&self) -> usize {
        self.created.load(Ordering::SeqCst)
    }

    /// An init function for a `PerCid<Counted>` whose values this counts.
    pub fn init(self: &Arc<Self>) -> impl Fn() -> Counted + Send + Sync + 'static {
        let counting = self.clone();
        move || Counted::new(&counting)
    }
}

pub struct Counted {
    pub n: AtomicU64,
    _ballast: Vec<u8>,
    counting: Arc<Counting>,
}

impl Counted {
    pub fn new(counting: &Arc<Counting>) -> Self {
        counting.alive.fetch_add(1, Ordering::SeqCst);
        counting.created.fetch_add(1, Ordering::SeqCst);
        Counted {
            n: AtomicU64::new(0),
            _ballast: vec![0u8; 4096],
            counting: counting.clone(),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.counting.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Keeps the CPU busy for `duration` (a callback that costs something, not a wait).
pub fn spin(duration: Duration) {
    let start = Instant::now();
    while start.elapsed() < duration {
        std::hint::spin_loop();
    }
}

/// A count from the environment, for running a test longer by hand.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

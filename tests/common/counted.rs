//! A 4 KiB value that counts how many exist and were ever made (per test binary), for
//! tests of the reclaim queue's memory; and a busy wait that stands for a slow callback.
//!
//! The counts are process-wide, so the tests that read them run one at a time: each
//! holds [`exclusive`] for its whole body.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One test's use of the process-wide counts: while it lives no other such test runs,
/// and [`created`](Self::created) counts only the values made since it began.
pub struct Counting {
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
    created_before: usize,
}

impl Counting {
    /// Values made since this test began.
    pub fn created(&self) -> usize {
        CREATED.load(Ordering::SeqCst) - self.created_before
    }
}

/// Begins a test that reads [`ALIVE`] and [`CREATED`]: waits for any other such test to
/// end (a poisoned lock, from a failed test, still serialises), and checks that no value
/// of an earlier test is alive.
pub fn exclusive() -> Counting {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    assert_eq!(
        ALIVE.load(Ordering::SeqCst),
        0,
        "an earlier test left values alive"
    );
    Counting {
        _one_at_a_time: guard,
        created_before: CREATED.load(Ordering::SeqCst),
    }
}

/// Values alive now.
pub static ALIVE: AtomicUsize = AtomicUsize::new(0);
/// Values ever made.
pub static CREATED: AtomicUsize = AtomicUsize::new(0);

pub struct Counted {
    pub n: AtomicU64,
    _ballast: Vec<u8>,
}

impl Counted {
    pub fn new() -> Self {
        ALIVE.fetch_add(1, Ordering::SeqCst);
        CREATED.fetch_add(1, Ordering::SeqCst);
        Counted {
            n: AtomicU64::new(0),
            _ballast: vec![0u8; 4096],
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        ALIVE.fetch_sub(1, Ordering::SeqCst);
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

//! Helpers shared by the integration tests. No helper asserts a timing: waits are liveness
//! bounds (generous timeouts) and measurements are counts.
#![allow(dead_code)]

pub mod child;
pub mod counted;
pub mod events;
pub mod percid;
pub mod wakers;

// Kernel thread ids, nice values, scheduling policies, capabilities and re-runs as
// another user: Linux's, and only tests of Linux behaviour use them.
#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
#[allow(unused_imports)]
pub use linux::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Generous bound for "eventually": far above any expected latency, so only a hang fails.
pub const EVENTUALLY: Duration = Duration::from_secs(20);

/// Bound for one wait for a state inside a round of a race test.
pub const BOUND: Duration = Duration::from_secs(10);

/// A deadline far enough that nothing armed for it runs during a test (or a round of one).
pub const FAR: Duration = Duration::from_secs(60);

/// `base` rounds, times `NICEWORK_PROMISES_SCALE` (a whole number, default 1): race tests
/// that take their round counts from here can be run longer, to measure failure rates.
pub fn rounds(base: usize) -> usize {
    let scale = std::env::var("NICEWORK_PROMISES_SCALE")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    base * scale
}

/// Polls `cond` until it holds or `EVENTUALLY` passes; returns whether it held.
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < EVENTUALLY {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cond()
}

/// A small deterministic generator (xorshift), so randomized tests need no dependency and
/// repeat with their seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Sets its flag when dropped: captured by a closure, it tells when the closure was freed.
pub struct DropFlag(pub Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

pub fn drop_flag() -> (DropFlag, Arc<AtomicBool>) {
    let flag = Arc::new(AtomicBool::new(false));
    (DropFlag(flag.clone()), flag)
}

/// Asserts that `work` is inert, as after its scheduler was dropped: every arming call
/// returns false and leaves it unarmed, and nothing waits.
pub fn assert_inert(work: &nicework::Work) {
    assert!(!work.is_pending() && !work.is_running());
    assert!(!work.schedule(Duration::ZERO));
    assert!(!work.reschedule(Duration::ZERO));
    work.touch();
    assert!(!work.is_pending());
    assert!(!work.flush());
    assert!(!work.cancel());
    assert!(!work.cancel_sync());
    assert!(!work.disable());
    work.enable();
}

/// Keeps the panics a test plants (their message starts with `prefix`) out of the output;
/// other panics still print. Installs the hook once per test binary.
pub fn quiet_panics_starting_with(prefix: &'static str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if !text.starts_with(prefix) {
                previous(info);
            }
        }));
    });
}

/// The name libtest knows a test by, for `--exact` in a child process: `module_path!()`
/// of the test's module without the binary's own name, then the test's name.
pub fn exact_name(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

/// Spins (politely: a yield every 64 polls) until `cond` holds or `bound` passes; returns
/// whether it held. For waits whose other side is a busy thread, where [`eventually`]'s
/// 1 ms sleeps would make a round of a race test slow.
pub fn spin_until(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let mut spins = 0u32;
    while !cond() {
        if start.elapsed() > bound {
            return cond();
        }
        spins += 1;
        if spins % 64 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    true
}

/// [`spin_until`] with the generous bound, [`EVENTUALLY`].
pub fn spin_until_eventually(cond: impl FnMut() -> bool) -> bool {
    spin_until(EVENTUALLY, cond)
}

/// The verdict of a race test: no round broke `promise` (the count is printed either
/// way, for measuring rates).
pub fn assert_no_round_broke(promise: &str, broke: usize, rounds: usize, detail: &str) {
    eprintln!("{promise}: broken in {broke} of {rounds} rounds {detail}");
    assert_eq!(
        broke, 0,
        "{promise}: broken in {broke} of {rounds} rounds {detail}"
    );
}

/// Waits until `sched`'s worker wakeup count stays still for 150 ms (the last expiries
/// passed), at most [`EVENTUALLY`].
pub fn settle_wakeups(sched: &nicework::Scheduler) {
    let mut last = sched.metrics().worker_wakeups;
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(150));
        let now = sched.metrics().worker_wakeups;
        if now == last || start.elapsed() > EVENTUALLY {
            return;
        }
        last = now;
    }
}

/// A builder whose workers run at the caller's priority, for the tests whose subject is a
/// race or a count and not the priority: such a test needs its workers on a CPU as often
/// as its own threads, and at nice 19, beside other tests' spinning threads in a busy
/// binary (ASan's, in CI), a worker may wait seconds for one, past [`EVENTUALLY`].
pub fn normal_priority_builder() -> nicework::Builder {
    nicework::Scheduler::builder().priority(nicework::Priority::Normal)
}

/// The scheduler of race rounds whose races are between the arming threads and the run,
/// whatever the worker's priority.
pub fn racing_sched() -> nicework::Scheduler {
    normal_priority_builder().build().unwrap()
}

/// Flushes of `sched`'s works that waited for a run in progress (they are counted under
/// the core lock just before the wait, after the wait-for edge was registered).
pub fn flush_waits(sched: &nicework::Scheduler) -> u64 {
    let lending = sched.metrics().lending;
    lending.waited + lending.raised
}

/// `n` threads that keep a CPU busy each until `stop` is set (a CPU-bound load for the
/// tests of starved workers and of priorities).
pub fn spinners(n: usize, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect()
}

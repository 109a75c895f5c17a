//! Helpers shared by the integration tests. No helper asserts a timing: waits are liveness
//! bounds (generous timeouts) and measurements are counts.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous bound for "eventually": far above any expected latency, so only a hang fails.
pub const EVENTUALLY: Duration = Duration::from_secs(20);

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

/// The calling thread's nice value.
pub fn current_nice() -> i32 {
    // SAFETY: plain system calls with integer arguments.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::syscall(libc::SYS_gettid) as u32) }
}

/// The calling thread's scheduling policy.
pub fn current_policy() -> i32 {
    // SAFETY: plain system call; 0 is the calling thread.
    unsafe { libc::sched_getscheduler(0) }
}

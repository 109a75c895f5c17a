//! How a scheduler counts its workers' wakeups (`Metrics::worker_wakeups`).
//!
//! On Linux the kernel counts them: the sum of the workers' `voluntary_ctxt_switches` in
//! `/proc/self/task/TID/status`, so every time a worker blocked and woke counts,
//! including a wait for a lock. Elsewhere (and on Linux built with
//! `--cfg nicework_portable`) there is no such file, so the workers count themselves:
//! each return from the timer's wait (see `clock::sleeper`) and from the follower's
//! condition-variable wait adds one. That count leaves out waits for the core lock; both
//! stay flat while every work is parked.

use crate::priority::Tid;
use crate::sync::lock_std;

/// T: a scheduler's wakeup count.
#[derive(Debug, Default)]
pub(crate) struct WorkerWakeups {
    /// The workers' kernel ids, filled by `build()`.
    tids: std::sync::Mutex<Vec<Tid>>,
    /// The workers' own count where the OS keeps none.
    #[cfg(not(all(target_os = "linux", not(nicework_portable))))]
    counted: crate::clock::sleeper::WakeupCounter,
}

impl WorkerWakeups {
    /// The count for a scheduler whose workers sleep on `sleeper`.
    pub(crate) fn new(sleeper: Option<&crate::clock::sleeper::Sleeper>) -> Self {
        #[cfg(all(target_os = "linux", not(nicework_portable)))]
        let _ = sleeper;
        WorkerWakeups {
            tids: std::sync::Mutex::new(Vec::new()),
            #[cfg(not(all(target_os = "linux", not(nicework_portable))))]
            counted: sleeper.map(|sleeper| sleeper.wakeups()).unwrap_or_default(),
        }
    }

    /// A worker started.
    pub(crate) fn add_worker(&self, tid: Tid) {
        lock_std(&self.tids).push(tid);
    }

    /// The workers' ids.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn worker_tids(&self) -> Vec<Tid> {
        lock_std(&self.tids).clone()
    }

    /// A worker woke from its wait on the idle condition variable.
    #[inline]
    pub(crate) fn follower_woke(&self) {
        #[cfg(not(all(target_os = "linux", not(nicework_portable))))]
        self.counted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The wakeups so far.
    pub(crate) fn read(&self) -> u64 {
        #[cfg(all(target_os = "linux", not(nicework_portable)))]
        {
            lock_std(&self.tids)
                .iter()
                .map(|&tid| voluntary_switches(tid))
                .sum()
        }
        #[cfg(not(all(target_os = "linux", not(nicework_portable))))]
        {
            self.counted.load(std::sync::atomic::Ordering::Relaxed)
        }
    }
}

/// A thread's `voluntary_ctxt_switches`, or 0 once it has exited.
#[cfg(all(target_os = "linux", not(nicework_portable)))]
fn voluntary_switches(tid: Tid) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|count| count.trim().parse().ok())
        })
        .unwrap_or(0)
}

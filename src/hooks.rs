//! Hooks for nicework's own tests, benchmarks and loom models. Not part of the API:
//! hidden from the docs, and free to change in any release.

/// The kernel thread ids of a scheduler's worker threads (empty for a manual
/// scheduler), for reading their `/proc/self/task/TID/` files in tests.
#[cfg(target_os = "linux")]
pub fn worker_tids(sched: &crate::Scheduler) -> Vec<i32> {
    sched.shared().wakeups.worker_tids()
}

/// Whether `IdSpace::enter()`'s fast path is fence-free: `membarrier` is registered and
/// the compaction scan pays for the ordering. `false` means each first-level `enter()`
/// executes a `SeqCst` fence instead (old kernels, seccomp filters, loom builds).
pub fn uses_membarrier() -> bool {
    crate::cid::uses_membarrier()
}

/// Loom models only (`--cfg loom` with the `loom` feature): runs the calling thread's
/// nicework thread-exit hook now, as if the thread were exiting while the guards it holds
/// live in thread-locals destroyed after the hook. Loom cannot order thread-local
/// destructors, so `loom-tests/tests/cid_exit_hook.rs` uses this to model that case.
#[cfg(all(loom, feature = "loom"))]
pub fn run_thread_exit_hook_for_loom() {
    crate::cid::run_thread_exit_hook_now();
}

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

/// Loom models only: makes `sched`, a manual scheduler, stamp the touches of timeouts made
/// after this call with its touch tick (idles of 1 s or more), as a real scheduler does,
/// with the tick's times read from the virtual clock. `advance` then refreshes the tick
/// and judges the stamps, so a model can race touches against refreshes and decisions.
#[cfg(all(loom, feature = "loom"))]
pub fn stamp_with_ticks_for_loom(sched: &crate::Scheduler) {
    sched
        .shared()
        .manual_ticks
        .store(true, std::sync::atomic::Ordering::Relaxed);
}

/// When `sched`'s touch-tick refresher runs next, `None` while it is parked, for tests of
/// its schedule (a count, where a real-clock lateness would be a timing).
pub fn next_tick_refresh(sched: &crate::Scheduler) -> Option<std::time::Instant> {
    let shared = sched.shared();
    shared
        .touch_tick
        .next_refresh_ns()
        .map(|ns| shared.instant_at(ns))
}

/// The storages and slots the trims of `ids` visited since it was made: a count of a
/// scan's work, for tests that it follows the change and not the number of `PerCid`s.
pub fn trim_visits(ids: &crate::IdSpace) -> (u64, u64) {
    ids.inner().trim_visits()
}

/// Makes `ids` count `cpus` CPUs at its scans instead of the ones the process may run on
/// (`None`: those again), so tests reach per-CPU mode with a known number of threads.
pub fn count_cpus_as(ids: &crate::IdSpace, cpus: Option<usize>) {
    ids.inner().count_cpus_as(cpus);
}

/// Switches `ids` to per-CPU mode (`true`) or per-thread mode now, as a scan that decided
/// so would (its next scans decide again, from the threads and CPUs they count: pair this
/// with [`count_cpus_as`] to keep the mode). For tests and loom models that place a switch
/// at a chosen point.
pub fn switch_id_mode(ids: &crate::IdSpace, per_cpu: bool) {
    ids.inner().switch_mode_now(per_cpu);
}

/// Whether `ids` is in per-CPU mode, and how many times it switched modes.
pub fn id_mode(ids: &crate::IdSpace) -> (bool, u64) {
    ids.inner().mode()
}

/// Loom models only: the calling thread runs on `cpu`, as far as per-CPU mode can tell.
#[cfg(all(loom, feature = "loom"))]
pub fn pretend_cpu_for_loom(cpu: usize) {
    crate::cid::pretend_cpu(cpu);
}

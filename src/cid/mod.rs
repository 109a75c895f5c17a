//! Compacting concurrency ids: [`IdSpace`], the [`Cid`] guard and [`PerCid`].
//!
//! The files:
//!
//! - `handle.rs`: [`IdSpace`] and its builder, thin wrappers over the space's state.
//! - `record.rs`: a thread's record of one space (the `pin`, `cid`, `own` and `seen`
//!   words and their values), a leaf that the protocol files share.
//! - `pin.rs`: the pin protocol and the orphan protocol: `enter()`'s paths, the [`Cid`]
//!   guard, and the scan's revoke step. The diagrams' step letters stand at the lines
//!   that do them.
//! - `registry.rs`: the thread-local side: the registry of a thread's records, the
//!   fast path's one-entry cache, the orphan list, and the thread-exit hook.
//! - `space.rs`: the space's shared state, ownership under the space's
//!   lock (acquire, publish), the compaction scan around the revoke step, and trims.
//! - `ids.rs`: the set of owned ids (lowest free first).
//! - `mode.rs`: per-thread and per-CPU ids, the policy that picks one at each scan (the
//!   kernel 6.19 `mm_cid` policy, with its hysteresis) and the switch between them;
//!   `cpu_ids.rs`, the per-CPU mode's table of ids lent to one outermost guard at a time;
//!   `cpus.rs`, the CPUs the process may run on and the CPU a thread runs on.
//! - `barrier.rs`: the light and heavy barriers (`membarrier`, or fences).
//! - `percid.rs`: [`PerCid`], per-id slots; `owner.rs`, `with`'s straight line and cold
//!   paths (and `take`/`put`'s); `lending.rs`, `take`, `put`, `try_borrow` and
//!   [`SlotGuard`]; `slots.rs`, the shrinking bucket arrays and the owners' slot cache;
//!   `reader.rs`, the protocol of `PerCid::for_each` beside the owners.
//! - `reclaimer.rs`: the reclaim queue, between a trim and `on_reclaim`.
//! - `reach.rs`: which `PerCid`s a trim must visit (the space's index of its storages by
//!   the highest id they may hold a value for); `retention.rs`, the high water's recent
//!   drops, from which a trim with a retention takes its threshold.
//!
//! The user-space counterpart of Linux rseq `mm_cid`: a runtime indexes per-id data
//! (counters, caches, arenas) by a small dense id, and the id space shrinks when its
//! threads go away, so per-id memory follows live concurrency and not every thread that
//! ever existed.
//!
//! # Guarantees
//!
//! 1. **Unique**: no two live guards of different threads hold the same id.
//! 2. **Dense**: a thread that needs an id gets the lowest free one.
//! 3. **Compacting**: a thread whose id is not below [`IdSpace::held`] moves to the lowest
//!    free id at its next `enter()` (the 6.19 kernel moves at schedule-in); a thread that
//!    did not enter since the previous scan loses its id to the space's compaction work;
//!    a thread that exits releases its id at once (before `join()` returns), or, if a
//!    guard of it outlives nicework's exit hook (see below), when that guard drops.
//! 4. After the threads using a space shrink from N to M, every id handed out is below M
//!    by the survivors' next `enter()`, and within two scan periods at most.
//! 5. The compaction work is an ordinary [`Work`](crate::Work); it parks while no id is
//!    held, so an idle space costs nothing. (A `PerCid` retention adds one run of a
//!    second work, when the kept slots may go.)
//! 6. [`PerCid`] slots above the high water are passed to `on_reclaim` exactly once, then
//!    dropped, and the slot arrays wholly above it are freed (`slots.rs`). If the space's
//!    scheduler is gone, the trim runs when a thread exits instead of at each scan. With a
//!    [retention](PerCid::retention), a slot is trimmed only once it has stayed above the
//!    high water for it (`retention.rs`). A scan visits only the `PerCid`s whose slots
//!    may lie above the high water (`reach.rs`): the others cost it nothing.
//! 7. `enter()` on an id the thread already holds does no atomic read-modify-write: a
//!    thread-local lookup (two loads, compared with the space's address), a relaxed load
//!    and store of its pin word (the store also counts the enter for the scan), a compiler
//!    fence, and a relaxed load of its id word, compared with a constant (it does not read
//!    the space's `held` count: see "Moving down" below); the guard's drop is a relaxed
//!    load and a release store of the pin word.
//! 8. A guard keeps its id until it is dropped, also in a thread-local destroyed after
//!    nicework's exit hook (a [`Cid<'static>`](Cid) of a leaked or static [`IdSpace`] can
//!    be stored in any thread-local); nested `enter()` always returns the outer guard's id,
//!    whatever the scan does meanwhile.
//! 9. [`PerCid::for_each`] (for `T: Sync`) runs on any thread while owners keep calling
//!    `with`: it never sees a slot while its owner holds the `&mut T`, the owner's `with`
//!    stays free of atomic read-modify-write, and a trimmed slot is never visited after
//!    its value went to `on_reclaim`. While it waits for one owner no other owner waits
//!    for it, and no trim ever waits for it (the trim is left to the reader). The protocol
//!    (the pin protocol again, with the reader in the reclaimer's place) is written down
//!    in `reader.rs`.
//! 10. After a shrink from N to M threads, one scan after the survivors moved down, a
//!     `PerCid`'s heap is what a fresh one used by M threads holds (`tests/costs/percid_shrink.rs`).
//! 11. [`PerCid::take`], [`PerCid::put`] and [`PerCid::try_borrow`] are `with`'s protocol
//!     with another shape (`lending.rs`): a value taken out is the caller's; `put` fills
//!     the slot as a first value does; a [`SlotGuard`] holds the pin and the borrow until
//!     it drops. Where `with` would panic (the slot borrowed by this thread, or visited by
//!     its own reader) they return `None`, or the value, instead.
//! 12. **Bounded by concurrency**, as `mm_cid` is: while the threads active in a scan
//!     period outnumber the CPUs the process may run on by a quarter, the space is in
//!     per-CPU mode (`mode.rs`): each outermost guard borrows an id for its own length,
//!     its CPU's first, with one compare-and-swap, and gives it back at its drop. The ids
//!     held are then the CPUs plus the guards alive beyond them (a guard preempted inside
//!     keeps its id, and the others take a spare), within two scan periods. Back below
//!     three quarters of the CPUs, per-thread mode again. Every promise above holds in both
//!     modes and across a switch either way, except that in per-CPU mode a thread keeps
//!     no id between its guards (7 and 3 describe per-thread mode): two guards of one
//!     thread made one after the other may get different ids.
//!
//! # The protocols
//!
//! The pin protocol (how `enter()` and the compaction scan agree on who owns an id, with
//! the heavy barrier between them) and the orphan protocol (guards that outlive their
//! thread's exit hook) are written down at the top of `pin.rs`, next to the pin
//! protocol's two halves and the orphan protocol's guard half; the orphan protocol's
//! exit-hook half is `registry.rs`.

mod barrier;
mod cpu_ids;
mod cpus;
mod handle;
mod ids;
mod lending;
mod mode;
mod owner;
mod percid;
mod pin;
mod reach;
mod reader;
mod reclaimer;
mod record;
mod registry;
mod retention;
mod slots;
mod space;

pub use lending::SlotGuard;
pub use percid::PerCid;

/// Whether the `enter()` fast path is fence-free (see [`crate::hooks::uses_membarrier`]).
pub(crate) fn uses_membarrier() -> bool {
    barrier::is_asymmetric()
}

/// Runs the calling thread's thread-exit hook now (see
/// [`crate::hooks::run_thread_exit_hook_for_loom`]).
#[cfg(all(loom, feature = "loom"))]
pub(crate) fn run_thread_exit_hook_now() {
    registry::run_exit_hook_now();
}
/// The calling thread runs on `cpu` (see [`crate::hooks::pretend_cpu_for_loom`]).
#[cfg(all(loom, feature = "loom"))]
pub(crate) fn pretend_cpu(cpu: usize) {
    cpus::pretend_current(cpu);
}
pub use handle::{IdSpace, IdSpaceBuilder, MIN_SCAN_PERIOD};
pub use pin::Cid;

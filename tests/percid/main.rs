//! `PerCid`: the reader beside owners and trims, trims left to readers, the reclaim queue,
//! callbacks that misbehave, and thread exits.
//!
//! One test binary, a module per behaviour.
//! - `deferred_trims`: Trims left to a reader, the reclaim queue, and the reader's U /
//!   re-flag step.
//! - `exit_hook`: User code that nicework runs inside its own thread-exit hook and inside
//!   the compaction scan (trims once the scheduler is gone;
//! - `gate_cycles`: No hidden waits on a `PerCid`'s reader gate.
//! - `hostile_callbacks`: Attacks on `PerCid::for_each`, `with_reclaim`, trims that free
//!   slot arrays, the reader/trim gate, trims at thread exit once the scheduler is gone,
//!   `MIN_SCAN_PERIOD` and `IdSpace::enter()`'s fast path, against every id guarantee.
//! - `queue_reentrancy`: The reclaim queue visited one value at a time, with nested
//!   readers inside `on_reclaim`, self-replacing callbacks, panics, and two readers.
//! - `queue_starvation`: A reader in a loop beside a drainer.
//! - `queue_visits`: The reclaim queue that readers visit.
//! - `reader`: `PerCid::for_each` beside owners and trims.
//! - `retention`: `PerCid::retention`: no trim within it, one after it, exactly once; a
//!   thread back within it finds its value; the work parks after it.
//! - `scan_visits`: A trim visits only the `PerCid`s with slots above the high water:
//!   10,000 idle ones cost the scan what one does.
//! - `slot_guard`: `try_borrow` and `SlotGuard`: readers wait for a guard, a guard keeps
//!   its id across scans, nesting returns `None`, every unwind lets the slot go.
//! - `take_put`: `take` and `put`: no `init`, a full slot refused, no panic on nesting,
//!   values outliving their thread, every count in exactly one place beside readers and
//!   trims.
//! - `reclaim_mix`: Exactly-once and no double count with readers that panic while
//!   visiting queued values, two readers, the scheduler dropped mid-way and the PerCid
//!   dropped while values are queued.
//! - `hostile_cache`: The slot cache and `with`'s straight line under hostile use: revoked
//!   ids, reborn storages, nesting, late destructors, fork, spaces dropped under cached
//!   slots, churn beside a reader.
//! - `slot_cache`: The slot `with` finds through the thread's cache is its id's, in this
//!   `PerCid`: after a reclaim and trim, a move down, a `PerCid` made where a dropped one
//!   was, and two `PerCid`s used in turn.
//! - `sum_beside_a_trim`: `for_each`'s promise.
//! - `sum_during_a_drain`: Values a drainer took out of the reclaim queue but has not
//!   passed on yet.

#[path = "../common/mod.rs"]
mod common;

mod deferred_trims;
mod exit_hook;
mod gate_cycles;
mod hostile_cache;
mod hostile_callbacks;
mod queue_reentrancy;
mod queue_starvation;
mod queue_visits;
mod reader;
mod reclaim_mix;
mod retention;
mod scan_visits;
mod slot_cache;
mod slot_guard;
mod sum_beside_a_trim;
mod sum_during_a_drain;
mod take_put;

//! Compacting concurrency ids: [`IdSpace`], the [`Cid`] guard and [`PerCid`].
//!
//! The files:
//!
//! - `space.rs`: [`IdSpace`], its builder and shared state, `enter()`'s paths (the
//!   owner's half of the pin protocol below) and the compaction scan (the reclaimer's
//!   half), ownership under the space's lock, and trims.
//! - `guard.rs`: the [`Cid`] guard, whose drop ends the owner's half (U) and the orphan
//!   protocol's last step.
//! - `thread.rs`: a thread's records (the `pin`, `cid`, `own` and `seen` words and their
//!   layout), the thread-local lookup, and the thread-exit hook.
//! - `ids.rs`: the set of owned ids (lowest free first).
//! - `barrier.rs`: the light and heavy barriers (`membarrier`, or fences).
//! - `percid.rs`: [`PerCid`], per-id slots; `slots.rs`, their shrinking bucket arrays;
//!   `reader.rs`, the protocol of `PerCid::for_each` beside the owners.
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
//!    guard of it outlives nicework's exit hook (guarantee 8), when that guard drops.
//! 4. After the threads using a space shrink from N to M, every id handed out is below M
//!    by the survivors' next `enter()`, and within two scan periods at most.
//! 5. The compaction work is an ordinary [`Work`](crate::Work); it parks while no id is
//!    held, so an idle space costs nothing.
//! 6. [`PerCid`] slots above the high water are passed to `on_reclaim` exactly once, then
//!    dropped, and the slot arrays wholly above it are freed (`slots.rs`). If the space's
//!    scheduler is gone, the trim runs when a thread exits instead of at each scan.
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
//!     `PerCid`'s heap is what a fresh one used by M threads holds (`tests/percid_memory.rs`).
//!
//! # The pin protocol
//!
//! Each (thread, space) pair has a record: `cid` (the owned id or none, possibly marked
//! `MOVE`: see "Moving down"), `own` (the id the
//! thread last took; only the thread touches it), `pin`, and `seen` (the scan's). `pin` is
//! one word written only by the thread, with plain stores (a load, then a store): its low
//! half (`PINS`) holds the guard nesting depth and the `ORPHANED` flag (see below), so the
//! record is pinned while it is not zero; its high half counts the thread's first-level
//! enters. The scan only reads it: a thread whose count did not move since the scan's
//! previous look (kept in `seen`) has not entered since (a hint). Ids are owned in a
//! bitmap under the space's lock.
//!
//! ```text
//!  thread (enter, fast path)            reclaimer (scan, under the space lock)
//!  ─────────────────────────            ──────────────────────────────────────
//!  p := pin                             p := pin; moved := count(p) != seen
//!  if pinned(p): nested (N)             seen := count(p)
//!  pin := p + ENTER + PIN_ONE  (P)      if !moved and !pinned(p):  (idle)
//!  light barrier                          cid := NONE                        (R)
//!  c := cid                  (L)          heavy barrier  (membarrier)
//!  if c < MOVE: use c                     if pinned(pin) { cid := c } else { free(c) }  (C)
//!  else: slow path (takes the lock; a new id goes to `cid` and `own`)
//!  ...
//!  nested enter: pin += PIN_ONE, use own  (N)
//!  ...
//!  pin := pin - PIN_ONE  (release)  (U)
//! ```
//!
//! The heavy barrier (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`) makes every thread
//! execute a full fence, so the two store→load pairs, P→L and R→C, cannot both be
//! reordered: either the reclaimer's check C sees the pin (and gives the id back), or the
//! thread's load L sees `NONE` (and takes the lock, which the reclaimer holds, so it sees
//! the final state). A thread that loaded `c` is therefore always seen pinned, and an id
//! is freed only when its thread cannot be using it. The release store U makes the
//! holder's writes under the id (its [`PerCid`] slots) visible to a reclaimer that sees
//! the pin cleared. The light barrier is a compiler fence where membarrier is registered,
//! and a `SeqCst` fence where it is not; loom builds use `SeqCst` fences on both sides,
//! and `loom-tests/tests/cid.rs` checks the protocol in every interleaving.
//!
//! The fast path tells the barrier mode apart without reading it: the thread-local cache
//! keys a record by its space's address, with the low bit set where membarrier is not
//! registered, so there the cache misses and the out-of-line path uses the fence (the mode
//! is decided once, when the first space is built, and never changes).
//!
//! Between R and C, `cid` reads `NONE` even for a thread that is pinned on `c` and will
//! get it back, so a nested `enter()` (N) does not read `cid`: it returns `own`. Only the
//! thread's own slow path gives `cid` a new id, and it writes `own` with it; the scan only
//! revokes `cid` and then gives the same id back or frees it. So `cid` is always `NONE`
//! or `own`: the `c` a first-level `enter()` used is `own`, and `own` does not change
//! while the thread is pinned. N adds nothing to the fast path.
//!
//! Every other change of ownership (first acquire, moving down, thread exit, orphan
//! release, transient ids during thread teardown) happens under the space's lock.
//!
//! ## Moving down
//!
//! Guarantee 3 moves a thread whose id is not below `held` at its next `enter()`. The
//! fast path does not read `held`: whoever makes it shrink (a thread's exit or orphan
//! release, a scan that frees ids, a transient id's release; all under the lock, in
//! `publish`) sets the `MOVE` bit (the top bit, which no id reaches) in the `cid` of every
//! record whose id is now not below it. Growth needs no mark, and neither does moving
//! down (it frees one id and takes one). So at any time an unmarked `cid` is below `held`
//! (`acquire` keeps an id only if it is below the count, and a new id is the lowest free
//! one, below the new count), and the fast path's test `c < MOVE` sends `NONE` and
//! marked ids alike to the slow path, where `acquire`, under the lock, strips the mark
//! and keeps the id if it is below the count by then, else frees it and takes the lowest
//! free one. Marking costs O(threads) under the lock, only when `held` shrinks, which is
//! rare (the same events already take the lock and touch the compaction work).
//!
//! The mark keeps the protocol's argument:
//!
//! - It is a third value of `cid`: `cid` is always `NONE`, `own` or `own | MOVE`, so a
//!   nested `enter()` still returns `own`, and the mark never changes which id a thread
//!   owns. Setting it frees nothing: the id stays owned in the bitmap until its thread's
//!   `acquire` (under the lock) or the scan's revoke protocol frees it, as before.
//! - A thread that already loaded its unmarked `c` (or holds a guard on it) when the mark
//!   lands keeps using `c`, which is still its own; its next first-level `enter()` sees
//!   the mark and moves under the lock, where no scan is halfway through a revoke. Only
//!   that first-level `enter()` frees the old id, and no guard of the thread holds it
//!   then (the record was unpinned), so no thread loses an id it is pinned on.
//! - A marked value is never used without the lock, so it needs no Dekker ordering: the
//!   fast path's load L matters only when it returns an unmarked id, and then the barrier
//!   argument above is unchanged.
//! - The scan revokes a marked `cid` like any other (R: `NONE`), frees the id without the
//!   mark, or gives back the value it read, mark included (C). All of R, the barrier, C
//!   and the marking run under one hold of the lock, and every other writer of `cid`
//!   takes that lock, so a thread that saw `NONE` sees the final value in `acquire`.
//!
//! # The orphan protocol
//!
//! A thread's records are owned by a thread-local registry whose destructor is nicework's
//! thread-exit hook. Std runs thread-local destructors in the reverse order of their
//! registration (at each local's first use), so a guard stored in a local first used
//! before the thread's first `enter()` is dropped after the hook ran. The hook therefore does not release a record
//! that is still pinned:
//!
//! ```text
//!  exit hook (registry destructor)            guard drop (any time, also later)
//!  ───────────────────────────────            ─────────────────────────────────
//!  for each record:                           d := pin - PIN_ONE
//!    if !pinned: release id, free record      pin := d                  (release)
//!    else: pin := pin | ORPHANED              if d's low half == ORPHANED:  (cold, last)
//!          move record to ORPHANS               take record out of ORPHANS
//!                                               release id (under the lock), free record
//! ```
//!
//! `pin` is written only by its thread, so the orphan bit costs the guard drop one
//! compare, and `enter()` nothing. `ORPHANS` is a thread-local without a destructor, so it
//! can be used for the whole teardown: a nested `enter()` made after the hook ran (the
//! registry is gone) finds the orphaned record there and, the record being pinned, takes
//! the nested path and returns `own`. An orphan's `pin` is never unpinned (its low half
//! keeps `ORPHANED`), so the scan never revokes its id; the
//! thread's id is released by the last guard's drop, still before `join()` returns. An
//! `enter()` for a space without an orphaned record takes a transient id for that guard
//! alone. A guard that is leaked (`mem::forget`) keeps its id, and after the thread exits
//! its record, forever.

mod barrier;
mod guard;
mod ids;
mod percid;
mod reader;
mod slots;
mod space;
mod thread;

pub use percid::PerCid;

/// Whether the `enter()` fast path is fence-free (see [`crate::hooks::uses_membarrier`]).
pub(crate) fn uses_membarrier() -> bool {
    barrier::is_asymmetric()
}

/// Runs the calling thread's thread-exit hook now (see
/// [`crate::hooks::run_thread_exit_hook_for_loom`]).
#[cfg(all(loom, feature = "loom"))]
pub(crate) fn run_thread_exit_hook_now() {
    thread::run_exit_hook_now();
}
pub use guard::Cid;
pub use space::{IdSpace, IdSpaceBuilder, MIN_SCAN_PERIOD};

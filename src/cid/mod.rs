//! Compacting concurrency ids: [`IdSpace`], the [`Cid`] guard and [`PerCid`].
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
//!    a thread that exits releases its id at once (before `join()` returns).
//! 4. After the threads using a space shrink from N to M, every id handed out is below M
//!    by the survivors' next `enter()`, and within two scan periods at most.
//! 5. The compaction work is an ordinary [`Work`](crate::Work); it parks while no id is
//!    held, so an idle space costs nothing.
//! 6. [`PerCid`] slots above the high water are passed to `on_reclaim`, then dropped.
//! 7. `enter()` on an id the thread already holds does no atomic read-modify-write: a
//!    thread-local lookup, a relaxed store of its pin word, a compiler fence, and relaxed
//!    loads of its id and of the space's `held` count.
//!
//! # The pin protocol
//!
//! Each (thread, space) pair has a record: `cid` (the owned id or none), `pin` (the
//! thread's guard nesting depth, written only by the thread) and `used` (a hint). Ids are
//! owned in a bitmap under the space's lock.
//!
//! ```text
//!  thread (enter, fast path)            reclaimer (scan, under the space lock)
//!  ─────────────────────────            ──────────────────────────────────────
//!  pin := 1                  (P)        cid := NONE                          (R)
//!  light barrier                        heavy barrier  (membarrier)
//!  c := cid                  (L)        if pin == 0 { free(c) } else { cid := c }  (C)
//!  if c < held: use c                   
//!  else: slow path (takes the lock)
//!  ...
//!  pin := 0  (release)       (U)
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
//! Every other change of ownership (first acquire, moving down, thread exit, transient
//! ids during thread teardown) happens under the space's lock.

mod barrier;
mod ids;
mod percid;
mod space;
mod thread;

pub use percid::PerCid;
pub use space::{Cid, IdSpace, IdSpaceBuilder};

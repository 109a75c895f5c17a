//! What nicework costs, counted: the runs and wakeups of idle objects, and the live heap
//! bytes of works, timer entries and `PerCid`s as they churn, shrink and come and go.
//!
//! One test binary, because the byte counts need a global allocator of their own
//! ([`counting::Counting`]): a test that counts bytes holds [`counting::measuring`] while
//! it counts, so the counts never overlap. The idle test holds it only while it makes and
//! frees its objects, and sleeps its 30 s beside the others.
//! - `idle_objects`: 10,000 idle objects cost no runs and no wakeups for 30 s.
//! - `listing_memory`: the registry of live works gives its slots back as works go.
//! - `percid_dropped_storage`: creating and dropping `PerCid`s or spaces does not grow
//!   the heap.
//! - `percid_shapes`: `PerCid`'s memory follows the live concurrency in other shapes.
//! - `percid_shrink`: `PerCid`'s memory follows the live concurrency after 64 → 4 threads.
//! - `soak`: live heap bytes stay flat over 200 rounds of 10,000 works and a 16-thread
//!   `IdSpace`.
//! - `standby_wakeups`: with two to four workers, a lone work costs one wakeup per run,
//!   parked works none after churn, and overlapping groups one per group.
//! - `stale_entry_memory`: timer entries and live heap bytes stay bounded under millions
//!   of armed, cancelled and dropped works.
//! - `wakeups_coalesced`: a thousand periodic works at a hundred phases share wakeups by
//!   their leeway, with one worker or two.
//! - `wakeups_per_run`: a lone periodic work costs one worker wakeup per run, with one or
//!   two workers (it allocates while it counts, but counts no bytes, so it runs without
//!   the measuring lock... see the module).

#[path = "../common/mod.rs"]
mod common;
#[path = "../../examples/common/counting.rs"]
mod counting;
#[path = "../common/shrink_heap.rs"]
mod shrink_heap;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

// libtest starts tests in name order: `idle_objects` comes first, so its 30 s begin at once.
mod idle_objects;
mod listing_memory;
mod percid_dropped_storage;
mod percid_shapes;
mod percid_shrink;
mod soak;
mod stale_entry_memory;
mod standby_wakeups;
mod wakeups_coalesced;
mod wakeups_per_run;

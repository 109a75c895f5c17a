//! The scheduler: its handle, builder, worker loop and hosted driver, `global()`, its
//! diagnostics, and the state it shares with its works and workers.
//!
//! - [`handle`]: [`Scheduler`], the owning handle (and the non-owning one callbacks see):
//!   every public method of `Scheduler` is there, a thin wrapper where the logic lives
//!   in another file.
//! - [`builder`]: [`Builder`] and the limits it enforces.
//! - [`shared`]: `Shared`, the state one scheduler shares with its works and workers:
//!   the core lock and what it guards, the commit of an arm under it, the timer, and
//!   shutdown.
//! - [`lock`]: the core lock's guard, which wakes the owed wakers after it releases the
//!   lock.
//! - [`worker`]: the worker thread loop (leader/follower over one timer).
//! - [`standby`]: the idle worker that watches for a busy one on a timer of its own.
//! - [`driver`]: [`Driver`], how a host's own loop runs a hosted scheduler's works.
//! - [`backoff`]: how a worker backs off between `Yield` increments while every CPU is
//!   busy.
//! - [`global`](mod@global): [`global()`], the lazily started default scheduler.
//! - [`metrics`]: [`Metrics`], the diagnostics snapshot.
//! - [`wakeups`]: how the workers' wakeups are counted, from `/proc` or by the workers.
//! - [`chunked`]: `run_chunked`, parallel cleanup on the caller and the workers.
//! - [`contention`]: whether the machine is contended, for the back-off and for
//!   callbacks.
//! - [`work`]: a work's whole life (its handle, state word, arming, cancelling, runs,
//!   timeouts, stats).
//! - [`wait`]: everything that waits for a run (frames, wait cycles, flush, lending).
//!
//! # Guard tags
//!
//! Shared structs tag each field with what guards it (`L:` the core lock, `T:` a leaf
//! mutex of its own, `A:` an atomic, ...): the crate's one legend is in `sync`.

pub(crate) mod backoff;
pub(crate) mod builder;
pub(crate) mod chunked;
pub(crate) mod contention;
mod driver;
mod global;
pub(crate) mod handle;
pub(crate) mod lock;
mod making_works;
mod metrics;
pub(crate) mod shared;
mod standby;
pub(crate) mod wait;
mod wakeups;
mod waking;
pub(crate) mod work;
pub(crate) mod worker;

pub use builder::{Builder, MAX_SLACK, MAX_WORKERS, MIN_SLACK};
pub use driver::Driver;
pub use global::global;
pub use handle::Scheduler;
pub use metrics::Metrics;
pub use wait::LendingStats;
pub(crate) use work::{Callback, WorkInner, WorkRef};
pub use work::{Ctx, Next, ObjectRef, Work, WorkInfo, WorkKind, WorkStats};

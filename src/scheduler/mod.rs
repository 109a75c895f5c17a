//! The scheduler and the work subsystem: one folder, because they are one strongly
//! connected part. A work's whole life is here: its handle ([`work`]), its state word
//! ([`state`]), the operations behind the handle ([`ops`]), and its runs ([`run`]), on
//! the core the scheduler handle ([`handle`]) owns ([`core`]).
//!
//! # The state machine
//!
//! ```text
//!            schedule / reschedule / touch / every
//!   idle ─────────────────────────────────────────▶ armed (PENDING: due at its deadline)
//!    ▲  ◀──────────── cancel / cancel_sync / disable ──┘ │ due
//!    │                                                   ▼
//!    │   Park / Stop / refused re-arm        running (RUNNING: one thread)
//!    └──────────────────────────────────────────────┤  │ Again / After / Yield
//!                                                    │  └──────────────▶ armed
//!                           panic ──▶ poisoned (never runs again)
//! ```
//!
//! A work may be armed *and* running (touched or scheduled during its own run): the new
//! instance waits until the run ends, so the callback never runs on two threads at once.
//! See [`state`] for the word that encodes this and the ground rules below for how
//! transitions are ordered.
//!
//! # Ground rules
//!
//! - One lock (`core`) covers the timer structure, the programmed timerfd deadline and
//!   the worker bookkeeping. A work's state word is *not* under it: every write is a CAS
//!   (see [`state`]), because `cancel`, most `reschedule`/`schedule` calls and a timeout
//!   work's `touch` change it without the lock. Under the lock, arming goes through
//!   `Shared::commit`, which places a new timer entry when the word needs one. User
//!   callbacks never run under the lock, and nothing that can call back into user code
//!   (a closure's destructor) runs under it either.
//! - A run is *taken* by a CAS under the lock (`PENDING` cleared, `RUNNING` set; a
//!   concurrent lock-free re-arm or cancel makes it fail and the entry is judged again),
//!   executed unlocked, and *completed* under the lock (`RUNNING` cleared, the callback's
//!   `Next` applied unless re-arms are refused). Waiters for the end of a run
//!   (`cancel_sync`, `flush`) sleep on `run_done`, signalled by every completion that has
//!   waiters.
//! - Between take and call there is a `SeqCst` fence. `touch()`'s lock-free fast path is a
//!   `SeqCst` load of the state word, so a touch that still finds the work pending is
//!   covered by a run that sees every `SeqCst` write (or read-modify-write) the toucher
//!   made before it: the touch is never lost to a run that missed its data. A timeout
//!   work's touch and the worker's decision to run it are ordered the same way (see
//!   `Shared::touch_timeout`).
//! - References: the owning handle holds one `Arc`, the running thread one while it
//!   runs, and each timer entry one ([`entry`]), so the header outlives every entry. The
//!   closure's life is separate (see [`inner`]): the handle's drop disarms, waits until no
//!   run is in progress and drops the closure. Where that wait could never end (the run
//!   is the dropping thread's own, or its callback waits for the dropping callback: a
//!   wait cycle, see [`waits`]) it marks the work `ORPHANED` instead, and the runner drops
//!   the closure after the callback returned, outside the lock.
//! - After shutdown (the last `Scheduler` handle dropped) nothing is armed again: arming
//!   calls return `false`, runs already in progress finish, and their re-arm is refused.

pub(crate) mod backoff;
pub(crate) mod builder;
mod chunked;
pub(crate) mod core;
mod ctx;
mod entry;
pub(crate) mod frames;
mod global;
pub(crate) mod handle;
pub(crate) mod inner;
pub(crate) mod lending;
mod metrics;
pub(crate) mod names;
mod object;
mod ops;
pub(crate) mod run;
pub(crate) mod state;
mod stats;
mod timeout;
pub(crate) mod waits;
mod work;
pub(crate) mod worker;

pub use builder::{Builder, MAX_SLACK, MAX_WORKERS, MIN_SLACK};
pub use ctx::{Ctx, Next};
pub use global::global;
pub use handle::Scheduler;
pub(crate) use inner::{Callback, Header, WorkInner, WorkRef};
pub use lending::LendingStats;
pub use metrics::Metrics;
pub use object::ObjectRef;
pub(crate) use stats::StatsCounters;
pub use stats::WorkStats;
pub use work::Work;

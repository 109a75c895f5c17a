//! A work's whole life, one concept a file:
//!
//! - [`handle`]: [`Work`], the owning handle, and what each call promises: every public
//!   method of `Work` is there, a thin wrapper where the logic lives in another file.
//! - [`allocation`]: the heap half of a work: its [`Header`] (state word, period, stats)
//!   and its closure, who may call or drop the closure, and [`WorkRef`], the one-word
//!   counted reference every path shares a work through.
//! - [`state`]: the state word, its flags, and the ground rules of its transitions.
//! - [`arming`]: `schedule`, `reschedule`, `schedule_within`, a periodic work's
//!   `touch`, `detach`: lock-free where the live timer entry serves, else under the lock.
//! - [`cancel`]: `cancel`, `cancel_sync` and the handle's drop, `disable`/`enable`.
//! - [`timeout`]: idle timeouts: the lock-free touch, when a touched
//!   work is due, and which of them stamp with the touch tick (`clock::touch_tick`).
//! - [`run`]: a run's lifecycle: take, execute (unlocked, contained), complete; manual
//!   time's `advance`.
//! - [`entry`]: a timer entry, a counted reference tagged with the epoch it was placed
//!   for.
//! - [`stats`]: per-work statistics.
//! - [`ctx`]: [`Ctx`] and [`Next`], what a callback sees and returns.
//! - [`names`]: the table of custom names.
//! - [`listing`]: the list of a scheduler's live works, for `Scheduler::works`, and the
//!   end of a work's life (unlisted, then its closure dropped).
//! - [`listed_slots`]: the slots that list live works, one word each.
//! - [`object`]: per-object works: the closure behind `work_for`, `every_for` and
//!   `timeout_for`, and [`ObjectRef`].
//!
//! `arming`, `cancel`, `run`, `timeout`, `listing` and `stats` each add
//! their part to `impl Shared` (see `shared`), under a banner that says what it adds.
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
//! - References: the owning handle holds one `WorkRef`, the running thread one while it
//!   runs, and each timer entry one ([`entry`]), so the header outlives every entry. The
//!   closure's life is separate (see [`allocation`]): the handle's drop disarms, waits until no
//!   run is in progress and drops the closure. Where that wait could never end (the run
//!   is the dropping thread's own, or its callback waits for the dropping callback: a
//!   wait cycle, see [`cycles`](crate::scheduler::wait::cycles)) it marks the work `ORPHANED` instead, and the runner drops
//!   the closure after the callback returned, outside the lock.
//! - After shutdown (the last `Scheduler` handle dropped) nothing is armed again: arming
//!   calls return `false`, runs already in progress finish, and their re-arm is refused.

pub(crate) mod allocation;
pub(crate) mod arming;
pub(crate) mod cancel;
pub(crate) mod ctx;
pub(crate) mod entry;
pub(crate) mod handle;
pub(crate) mod leeway;
pub(crate) mod listed_slots;
pub(crate) mod listing;
pub(crate) mod names;
pub(crate) mod object;
pub(crate) mod run;
pub(crate) mod state;
pub(crate) mod stats;
pub(crate) mod timeout;

pub(crate) use allocation::{Callback, Header, WorkInner, WorkRef};
pub use ctx::{Ctx, Next};
pub use handle::Work;
pub use listing::{WorkInfo, WorkKind};
pub use object::ObjectRef;
pub(crate) use stats::StatsCounters;
pub use stats::WorkStats;

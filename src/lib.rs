//! Periodic maintenance work inside a process, after the Linux kernel.
//!
//! nicework gives runtimes, allocators, caches and servers two things:
//!
//! - **Delayed works** ([`Work`]) that re-arm themselves, run on a low-priority worker
//!   thread (nice 19 by default, the ktask/padata `MAX_NICE`), cost nothing while their
//!   object is idle (a parked work is in no timer structure and causes no wakeup), and are
//!   cancelled *synchronously* when dropped: when `drop` returns, the callback is not
//!   running and never will again.
//! - **Compacting concurrency IDs** ([`IdSpace`], [`PerCid`]), the user-space counterpart of
//!   rseq `mm_cid`: dense ids that follow live concurrency as threads come and go.
//!
//! # Example: a per-object cleanup
//!
//! ```
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use nicework::{Next, Scheduler, Work};
//!
//! struct Cache {
//!     entries: Mutex<Vec<u64>>,
//!     dirty: AtomicBool,
//!     purge: Mutex<Option<Work>>,
//! }
//!
//! let sched = Scheduler::manual(); // virtual time; use Scheduler::new()? for real threads
//! let cache = Arc::new(Cache {
//!     entries: Mutex::new(Vec::new()),
//!     dirty: AtomicBool::new(false),
//!     purge: Mutex::new(None),
//! });
//! // The closure reaches the cache through a Weak; the work stops once the cache is gone.
//! let purge = sched.every_for(&cache, Duration::from_millis(100), |cache, _cx| {
//!     if !cache.dirty.swap(false, Ordering::SeqCst) {
//!         return Next::Park; // idle: no timer, no wakeups, until the next touch()
//!     }
//!     cache.entries.lock().unwrap().clear();
//!     Next::Again
//! });
//! *cache.purge.lock().unwrap() = Some(purge);
//!
//! cache.entries.lock().unwrap().push(1);
//! cache.dirty.store(true, Ordering::SeqCst);
//! sched.advance(Duration::from_millis(100)); // purges, re-arms
//! sched.advance(Duration::from_millis(100)); // nothing new: parks
//! assert!(cache.entries.lock().unwrap().is_empty());
//! let purge = cache.purge.lock().unwrap().take().unwrap();
//! assert!(!purge.is_pending());
//! cache.dirty.store(true, Ordering::SeqCst);
//! purge.touch(); // activity: armed again for its period
//! assert!(purge.is_pending());
//! drop(purge); // cancel_sync: never runs again
//! ```
//!
//! # How it maps to the kernel
//!
//! | kernel | nicework |
//! |---|---|
//! | `queue_delayed_work` | [`Work::schedule`] |
//! | `mod_delayed_work` | [`Work::reschedule`] |
//! | `cancel_delayed_work` / `_sync` | [`Work::cancel`] / [`Work::cancel_sync`], `drop` |
//! | `flush_delayed_work` | [`Work::flush`], which runs a pending work on the caller |
//! | `disable_work` / `enable_work` | [`Work::disable`] / [`Work::enable`] |
//! | worker pool at `MAX_NICE` | [`Priority::Nice(19)`](Priority::Nice), the default |
//! | `round_jiffies` batching | the scheduler's slack: deadlines within it share a wakeup |
//!
//! # Testing your code
//!
//! [`Scheduler::manual`] has no threads and a virtual clock: [`Scheduler::advance`] runs
//! due works on the calling thread in deadline order. Built with `--cfg loom` and the
//! `loom` feature, nicework's locks and atomics are loom's, so a loom model of your type
//! explores nicework's interleavings too.
//!
//! # Implementation
//!
//! One worker thread (or `workers(n)`) blocks on a `CLOCK_MONOTONIC` timerfd. Armed works
//! sit in a hierarchical timing wheel over slab-allocated entries (O(1) arm and cancel),
//! ticking at the slack. Arming an earlier deadline re-programs the timerfd from the arming
//! thread. A work's state is one atomic word written under the scheduler's lock and read
//! lock-free, so `touch()` on an armed work is a single load.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations)]
// In loom builds only manual schedulers exist, so the thread and timerfd code is unused.
#![cfg_attr(all(loom, feature = "loom"), allow(dead_code))]

mod chunked;
pub mod cid;
mod driver;
mod error;
mod priority;
mod scheduler;
mod sync;
mod timer;
mod work;

pub use cid::{Cid, IdSpace, IdSpaceBuilder, PerCid};
pub use error::Error;
pub use priority::Priority;
pub use scheduler::{global, Builder, LendingStats, Scheduler, MAX_SLACK, MAX_WORKERS, MIN_SLACK};
pub use work::{Ctx, Next, Work, WorkStats};

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
//! use std::sync::{Arc, Mutex, Weak};
//! use std::time::Duration;
//! use nicework::{Next, Scheduler, Work};
//!
//! struct Cache {
//!     entries: Mutex<Vec<u64>>,
//!     dirty: AtomicBool,
//!     purge: Work,
//! }
//!
//! let sched = Scheduler::manual(); // virtual time; use Scheduler::new()? for real threads
//! // The cache owns its work; the closure reaches the cache through a Weak (built by
//! // new_cyclic) and the work stops once the cache is gone.
//! let cache = Arc::new_cyclic(|me: &Weak<Cache>| Cache {
//!     entries: Mutex::new(Vec::new()),
//!     dirty: AtomicBool::new(false),
//!     purge: sched.every_for(me, Duration::from_millis(100), |cache: &Cache, _cx| {
//!         if !cache.dirty.swap(false, Ordering::SeqCst) {
//!             return Next::Park; // idle: no timer, no wakeups, until the next touch()
//!         }
//!         cache.entries.lock().unwrap().clear();
//!         Next::Again
//!     }),
//! });
//!
//! cache.entries.lock().unwrap().push(1);
//! cache.dirty.store(true, Ordering::SeqCst);
//! sched.advance(Duration::from_millis(100)); // purges, re-arms
//! sched.advance(Duration::from_millis(100)); // nothing new: parks
//! assert!(cache.entries.lock().unwrap().is_empty());
//! assert!(!cache.purge.is_pending());
//! cache.dirty.store(true, Ordering::SeqCst);
//! cache.purge.touch(); // activity: armed again for its period
//! assert!(cache.purge.is_pending());
//! drop(cache); // drops its work: cancel_sync, never runs again
//! ```
//!
//! # Idle timeout vs periodic maintenance
//!
//! The example above is *periodic maintenance*: work to do because something happened
//! (entries to purge, state to flush). Activity **wakes** the work: `touch()` arms a
//! parked work for its period, and the callback decides whether to go on (`Again`) or
//! sleep (`Park`). Build it with [`Scheduler::every`] / [`every_for`](Scheduler::every_for).
//!
//! An *idle timeout* is work to do because nothing happened: close a connection, drop a
//! session, evict an entry once it has been left alone for `idle`. Activity
//! **postpones** the run: a timeout work is due at the later of its deadline and its
//! latest `touch()` + `idle`, and `touch()` on it is lock-free (a few loads and a
//! compare, and for an idle under 1 s without a leeway of 125 ms or more a clock read;
//! it never touches the timer structure). One precision rule holds for every idle:
//! never early, at most `idle / 16 + leeway` late, the leeway being the slack unless set
//! (see [`Scheduler::timeout`]). Build it with
//! [`Scheduler::timeout`] / [`timeout_for`](Scheduler::timeout_for). Using `every` for a
//! reaper makes it fire early, since a touch does not move an armed work; re-arming it
//! with `reschedule(idle)` on every use is correct but costs more per use.
//!
//! ```
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::sync::{Arc, Weak};
//! use std::time::Duration;
//! use nicework::{Next, Scheduler, Work};
//!
//! struct Conn {
//!     open: AtomicBool,
//!     reaper: Work,
//! }
//!
//! let sched = Scheduler::manual();
//! let idle = Duration::from_secs(30);
//! let conn = Arc::new_cyclic(|me: &Weak<Conn>| Conn {
//!     open: AtomicBool::new(true),
//!     reaper: sched.timeout_for(me, idle, |conn: &Conn, _cx| {
//!         conn.open.store(false, Ordering::SeqCst); // idle for 30 s: close it
//!         Next::Park // a later checkout's touch() arms it again
//!     }),
//! });
//! for _ in 0..10 {
//!     sched.advance(Duration::from_secs(20));
//!     conn.reaper.touch(); // checked in: postpone the reaper
//! }
//! assert!(conn.open.load(Ordering::SeqCst)); // 200 s, never idle for 30 s
//! sched.advance(idle);
//! assert!(!conn.open.load(Ordering::SeqCst));
//! assert_eq!(conn.reaper.stats().runs, 1); // the early fires re-armed without running
//! ```
//!
//! # Example: sharded counters that follow the live threads
//!
//! The most common per-thread data is a counter (statistics, reference counts,
//! histograms: the kernel's `percpu_counter`). Each thread adds to its own slot of a
//! [`PerCid`] through `&mut`, with no atomic read-modify-write; any thread sums the slots
//! with [`PerCid::for_each`] while the owners keep counting; and when threads go away the
//! compaction scan hands their slots to the reclaim callback, which folds them into a
//! total, and frees the slot arrays above the ids still in use.
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use nicework::{IdSpace, PerCid, Scheduler};
//!
//! let sched = Scheduler::manual(); // virtual time; Scheduler::new()? for real threads
//! let ids = IdSpace::new(&sched);
//! let folded = Arc::new(AtomicU64::new(0));
//! let sink = folded.clone();
//! let requests = PerCid::with_reclaim(&ids, || AtomicU64::new(0), move |n: &mut AtomicU64| {
//!     sink.fetch_add(*n.get_mut(), Relaxed); // a departed thread's count is kept
//! });
//! let sum = || {
//!     let mut total = folded.load(Relaxed);
//!     requests.for_each(|n| total += n.load(Relaxed));
//!     total
//! };
//! std::thread::scope(|s| {
//!     let threads: Vec<_> = (0..8)
//!         .map(|_| s.spawn(|| (0..100).for_each(|_| requests.with(|n| *n.get_mut() += 1))))
//!         .collect();
//!     // join() waits for the whole thread exit, which releases the thread's id (the end
//!     // of a scope alone does not).
//!     threads.into_iter().for_each(|t| t.join().unwrap());
//! });
//! assert_eq!(sum(), 800);
//! sched.advance(Duration::from_millis(100)); // one scan: the 8 slots are folded, freed
//! assert_eq!((requests.live(), sum()), (0, 800));
//! ```
//!
//! # Example: an exclusive per-id cache
//!
//! A runtime keeps one cache per concurrency id and uses it through `&mut` with
//! [`PerCid::with`]. As threads come and go, ids stay dense, and slots above the ids
//! still in use are trimmed by the space's compaction work.
//!
//! ```
//! use nicework::{IdSpace, PerCid, Scheduler};
//!
//! let sched = Scheduler::new()?;
//! let ids = IdSpace::new(&sched);
//! let caches: PerCid<Vec<u64>> = PerCid::new(&ids, Vec::new);
//! caches.on_reclaim(|cache| cache.clear()); // runs for each trimmed slot
//! std::thread::scope(|s| {
//!     let threads: Vec<_> = (0..4)
//!         .map(|t| {
//!             let caches = &caches;
//!             s.spawn(move || caches.with(|cache| cache.push(t))) // this thread's slot
//!         })
//!         .collect();
//!     threads.into_iter().for_each(|t| t.join().unwrap());
//! });
//! // The four threads are gone: their ids were released when they exited.
//! assert_eq!(ids.held(), 0);
//! let cid = ids.enter();
//! assert_eq!(cid.get(), 0); // a new thread gets the lowest free id
//! # Ok::<(), nicework::Error>(())
//! ```
//!
//! # Example: a pool of caches whose guards are `Send`
//!
//! A pool (regex keeps one of search caches per `Regex`) hands a value out in a guard that
//! may cross threads, so the guard cannot hold a pin. [`PerCid::take`] moves the calling
//! thread's value out of its slot and [`PerCid::put`] moves one back in: one pin each,
//! no lock. With a [`retention`](PerCid::retention), a value survives a short idle of its
//! thread; without one, memory follows the threads searching now.
//!
//! ```
//! use std::time::Duration;
//! use nicework::{IdSpace, PerCid, Scheduler};
//!
//! struct Guard<'p> {
//!     pool: &'p PerCid<Box<Vec<u8>>>,
//!     cache: Option<Box<Vec<u8>>>,
//! }
//! impl Drop for Guard<'_> {
//!     fn drop(&mut self) {
//!         if let Some(cache) = self.cache.take() {
//!             let _ = self.pool.put(cache); // a full slot: this one is dropped
//!         }
//!     }
//! }
//! let sched = Scheduler::manual();
//! let ids = IdSpace::new(&sched);
//! let pool = PerCid::new(&ids, || Box::new(Vec::new())).retention(Duration::from_secs(1));
//! let get = || Guard {
//!     cache: Some(pool.take().unwrap_or_else(|| Box::new(Vec::with_capacity(4096)))),
//!     pool: &pool,
//! };
//! let guard = get();
//! std::thread::scope(|s| {
//!     s.spawn(move || drop(guard)); // the guard is Send: its cache goes to that thread's slot
//! });
//! drop(get());
//! // This thread's cache is back in its slot; the other thread's, though that thread is
//! // gone, is kept for the retention.
//! assert_eq!(pool.live(), 2);
//! // Nobody uses the pool: the scans revoke this thread's id, and once both slots have
//! // been above the high water for the retention, both caches go.
//! sched.advance(Duration::from_secs(2));
//! assert_eq!(pool.live(), 0);
//! ```
//!
//! # Example: a parallel cleanup on idle CPU
//!
//! [`Scheduler::run_chunked`] splits a big job into chunks that the caller runs at its own
//! priority and up to `workers` helpers run at the scheduler's (nice 19); the closure
//! may borrow from the caller's stack.
//!
//! ```
//! use std::sync::Mutex;
//! use nicework::Scheduler;
//!
//! let sched = Scheduler::builder().workers(2).build()?;
//! let table: Vec<Mutex<Vec<String>>> =
//!     (0..64).map(|i| Mutex::new(vec![format!("entry {i}"); 100])).collect();
//! sched.run_chunked(0..table.len(), 4, |blocks| {
//!     for block in &table[blocks] {
//!         block.lock().unwrap().clear(); // frees this chunk's strings
//!     }
//!     Ok::<(), std::convert::Infallible>(())
//! }).unwrap();
//! assert!(table.iter().all(|b| b.lock().unwrap().is_empty()));
//! # Ok::<(), nicework::Error>(())
//! ```
//!
//! # Lending priority
//!
//! Works run at nice 19 so that they only use idle CPU; a thread that needs one done now
//! calls [`Work::flush`]. A pending work then runs on the caller, a running one is raised
//! to the caller's nice where the process may ([`Scheduler::raise_limit`]), and a work
//! that runs in [`Next::Yield`] increments is taken over by the caller. Between increments
//! a worker backs off while every CPU is busy ([`Builder::back_off`]); the README's "Why
//! low priority" has the measurements.
//!
//! # How it maps to the kernel
//!
//! | kernel | nicework |
//! |---|---|
//! | `queue_delayed_work` | [`Work::schedule`] |
//! | `mod_delayed_work` | [`Work::reschedule`] |
//! | `cancel_delayed_work` / `_sync` | [`Work::cancel`] / [`Work::cancel_sync`], `drop` |
//! | `flush_delayed_work`, `flush_work_at_nice` | [`Work::flush`]: runs a pending work on the caller, raises a running one |
//! | `disable_work` / `enable_work` | [`Work::disable`] / [`Work::enable`] |
//! | worker pool at `MAX_NICE` | [`Priority::Nice(19)`](Priority::Nice), the default |
//! | `round_jiffies` batching | the scheduler's slack: deadlines within it share a wakeup |
//! | `mm_cid`, `task_mm_cid_work` | [`IdSpace`], [`Cid`], its compaction work, [`PerCid`] |
//! | `padata_do_multithreaded`, ktask | [`Scheduler::run_chunked`] |
//!
//! # Testing your code
//!
//! Read time from the scheduler, not from `Instant::now()`: `cx.scheduler().now()` inside
//! a callback and `sched.now()` elsewhere. On a real scheduler that is the real clock; on
//! a manual one it is the virtual clock that [`Scheduler::advance`] moves, so the same code
//! (a purge that compares expiry times, say) works unchanged in a test.
//!
//! [`Scheduler::manual`] has no threads and a virtual clock: [`Scheduler::advance`] runs
//! due works on the calling thread in deadline order, so a test of your type is exact:
//!
//! ```
//! use std::time::Duration;
//! use nicework::{Next, Scheduler};
//!
//! let sched = Scheduler::manual();
//! let work = sched.every(Duration::from_secs(60), |_| Next::Again);
//! assert_eq!(sched.advance(Duration::from_secs(59)), 0);
//! assert_eq!(sched.advance(Duration::from_secs(1)), 1); // exactly at its deadline
//! assert_eq!(sched.advance(Duration::from_secs(600)), 10);
//! drop(work);
//! ```
//!
//! Built with `RUSTFLAGS="--cfg loom"` and nicework's `loom` feature, nicework's locks
//! and atomics are loom's, so a loom model of your type explores nicework's interleavings
//! too (only `Scheduler::manual()` exists there, since loom's condition variables ignore
//! timeouts). The repository's `loom-tests/tests/user_type.rs` models a user's cache this way. One caveat:
//! loom models a `SeqCst` store as a release store only, so data a callback reads to
//! decide to park should be written with a read-modify-write (`swap`, `fetch_or`) before
//! [`Work::touch`], or loom reports an interleaving real hardware cannot produce.
//!
//! # `fork()`
//!
//! In a forked child a scheduler from before the fork is inert: every call returns at
//! once (`false`, 0, nothing runs), it never takes a lock another thread may have held at
//! the fork, and dropping it joins nothing. [`global()`] starts a new scheduler in the
//! child; `Scheduler::new()` works as usual. An [`IdSpace`] made before the fork never
//! takes its lock in the child either: the forking thread keeps its id and other threads
//! get fresh ids above the high water at the fork (unique, but neither reused nor
//! compacted); make a new one in the child for dense ids.
//!
//! # Platforms
//!
//! nicework builds for Linux, macOS, FreeBSD and Windows, with the same API and the same
//! guarantees everywhere; what differs is the cost and the priority:
//!
//! - On Linux a worker sleeps on a timerfd, lock-free arming reads
//!   `CLOCK_MONOTONIC_COARSE`, the `IdSpace` fast path is fence-free (`membarrier`), and a
//!   waiter lends its priority to the worker it waits for.
//! - Elsewhere a worker sleeps on a condition variable with a deadline, every path reads
//!   the full clock, `enter()` pays one fence (`FlushProcessWriteBuffers` keeps it free on
//!   Windows), lending is off, and a hosted [`Driver`] has no descriptor: the host sleeps
//!   until [`Driver::next_deadline`] and is woken through [`Driver::set_waker`].
//! - [`Priority`] lists what each priority becomes on each OS; one the OS cannot express
//!   is an [`Error::Priority`] from `build()`.
//!
//! Linux built with `--cfg nicework_portable` uses the portable timer, clock and barrier,
//! which is how their logic is tested. The README's "Platforms" section says what is
//! tested and what is only type-checked.
//!
//! # Implementation
//!
//! One worker thread (or `workers(n)`) blocks on a `CLOCK_MONOTONIC` timerfd (on Linux;
//! see [Platforms](#platforms)). Armed works
//! sit in a hierarchical timing wheel ticking at the slack, whose entries are removed
//! lazily. A work's state is one atomic word that carries its deadline, so `cancel` is one
//! compare-and-swap, and `reschedule`/`schedule` are one too whenever the work's timer
//! entry is placed no later than the new deadline (a work re-armed for "now + delay" over
//! and over, or cancelled and re-armed); only an earlier deadline takes the scheduler's
//! lock to place a new entry. `touch()` on an armed work is a single load; on a timeout
//! work of 1 s idle or more, a few loads and a compare, with no clock read: it records
//! the scheduler's touch tick, which a worker refreshes only while touches come (the
//! kernel's timers count jiffies the same way); shorter idles read the clock. Long
//! delays on the lock-free arming paths read `CLOCK_MONOTONIC_COARSE` on Linux (rounded
//! so that nothing runs early; see [`Builder::slack`]). A stale entry (of a work
//! cancelled, re-armed earlier or dropped) leaves when its tick comes, at the cost of at
//! most one wakeup it may share, or in a sweep once stale entries may be half the wheel;
//! a dropped work's closure is freed at once, its 72-byte header with its last entry.
//!
//! # Guarantees
//!
//! Works, as the kernel workqueue's:
//!
//! - A work never runs on two threads at once, and never before its deadline; the slack
//!   only lets it run that much late, so that neighbouring deadlines share a wakeup, and
//!   a work's [`leeway`](Work::leeway) that much: the workers (and a host's
//!   `next_deadline()`) wake by the earliest end of any armed window, and each wakeup
//!   runs every work whose deadline has come.
//! - `schedule` on a pending work changes nothing; only `reschedule` moves a deadline. A
//!   zero delay runs at the next opportunity, and a re-arm below the slack is rounded up
//!   to it, so `Next::Again` can never spin a core.
//! - When `cancel_sync` or `drop` returns, the callback is not running and does not run
//!   again (after `cancel_sync`, until `schedule`/`reschedule`); `drop` has freed the
//!   closure. Re-arms are refused from the moment the call begins, and an `enable()`
//!   without a matching `disable()` never lifts that refusal.
//! - Waiting never deadlocks. From inside its own callback, `cancel_sync` and `drop`
//!   cancel without waiting and `flush` returns `false`. The same holds where a wait would
//!   close a cycle of callbacks waiting for each other (across schedulers too); a
//!   `tracing` warning names both works.
//! - A panic in a callback is caught: that work is poisoned, a `tracing` error event
//!   names it, and everything else carries on. So is a panic while dropping the panic's
//!   payload or the closure: nothing ever unwinds into a worker or into the caller.
//! - Idle costs nothing: a parked work is in no timer structure, and with every work
//!   parked the worker sleeps with no wakeups at all.
//! - A `touch()` racing with the callback returning `Next::Park` is never lost, and a
//!   touch during a run never overrides the callback: `Again`, `After`, `At` and `Yield`
//!   stand, `Stop` stays stopped.
//! - A timeout work never runs while it was touched within its idle, by the real clock
//!   (a touch that returned before the run began); a touch during its run, or one still
//!   in progress as it began, re-arms it unless the callback returned `Stop`.
//! - The scheduler's clock is `Instant`'s: `now()` is never earlier than an
//!   `Instant::now()` read before it, and `deadline()` after `reschedule(d)` never
//!   earlier than that `Instant::now() + d`.
//! - A `work()`'s period and deadline come from the same arm, also when arms race.
//! - A `stats()` snapshot never shows more parks than runs.
//! - Per-object works given a `Weak` inside `Arc::new_cyclic` live through a slow
//!   constructor: a run before the object exists re-arms and calls nothing.
//! - Re-arming is fixed-delay: no burst of catch-up runs after a stall; lateness is
//!   recorded in the stats.
//! - The worker runs at its priority from its first instruction; a priority it cannot
//!   take is a `build()` error.
//! - `flush` runs a pending work on the caller, waits for a running one (raising its
//!   worker to the caller's nice where the process may, never lowering what it could not
//!   raise back), takes over `Next::Yield` increments, and never waits for a run that
//!   `Again` armed meanwhile.
//! - `fork()` inside a callback: in the child nicework runs nothing more and never reads
//!   the parent's timer; schedulers from before a fork are inert in the child.
//!
//! Concurrency ids, as the kernel's `mm_cid`:
//!
//! - No two live guards hold the same id, and a thread that needs an id gets the lowest
//!   free one.
//! - Ids compact: a thread whose id is not below the number held moves down at its next
//!   `enter()`, an idle thread loses its id within a scan period or two, and an exiting
//!   thread releases its id at once. After the threads shrink from N to M, every id is
//!   below M within two scan periods.
//! - A guard keeps its id until it is dropped, also in a thread-local destroyed after
//!   nicework's exit hook, and a nested `enter()` always returns the outer guard's id.
//! - `enter()` on an id the thread holds performs no atomic read-modify-write, and an idle
//!   space costs nothing (its compaction work parks).
//! - `PerCid` slots above the high water go to `on_reclaim` exactly once, then are
//!   dropped, and the slot arrays above it are freed: after the threads shrink from N to
//!   M, a `PerCid` holds about what a fresh one used by M threads holds.
//! - `PerCid::for_each` runs on any thread beside the owners' `with` and never sees a
//!   slot while its owner holds the `&mut T`; the owners' side stays free of atomic
//!   read-modify-write (the reader pays a `membarrier`). Neither the compaction scan nor
//!   a thread's exit ever waits for a reader.
//! - `PerCid::take`, `put` and `try_borrow` follow `with`'s protocol (one pin each, no
//!   lock), and where `with` would panic on nesting they return `None` or give the value
//!   back. A `SlotGuard` excludes readers and trims for its whole life.
//! - Ids are bounded by concurrency, as `mm_cid`'s: once the threads active in a scan
//!   period outnumber the CPUs the process may run on (its affinity and cgroup quota) by
//!   a quarter, each outermost guard borrows an id for its length, its CPU's first (one
//!   compare-and-swap), so 200 threads on 2 CPUs hold about 2 ids, plus one per guard
//!   alive beyond them; back below three quarters of the CPUs, each thread keeps its id
//!   again. Every other promise holds in both modes and across either switch.
//! - With a retention, a slot is trimmed only once it has stayed above the high water
//!   that long, and then exactly once. A scan visits only the `PerCid`s that may have
//!   slots above the high water: idle ones cost it nothing.
//!
//! `tests/README.md` in the repository lists, for each guarantee, the tests and loom models
//! that pin it.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations)]
// In loom builds only manual schedulers exist, so the thread and timerfd code is unused.
#![cfg_attr(all(loom, feature = "loom"), allow(dead_code))]

mod cid;
mod clock;
mod contain;
mod error;
mod fork;
#[doc(hidden)]
pub mod hooks;
mod priority;
mod scheduler;
mod sync;
#[cfg(all(any(feature = "tokio", test), not(all(loom, feature = "loom"))))]
pub mod tokio;
mod wheel;

pub use cid::{Cid, IdSpace, IdSpaceBuilder, MIN_SCAN_PERIOD, PerCid, SlotGuard};
pub use error::Error;
pub use priority::Priority;
pub use scheduler::{
    Builder, Ctx, Driver, LendingStats, MAX_SLACK, MAX_WORKERS, MIN_SLACK, Metrics, Next,
    ObjectRef, Scheduler, Work, WorkInfo, WorkKind, WorkStats, global,
};

//! Works: the workqueue semantics on the manual clock and on real workers, arming
//! (lock-free and locked), detach, cancelling and its refusals, flushes, shutdown,
//! containment, bad input and faults, per-object works, stats, thread-local destructors
//! that run after nicework's own, and never running early by the real clock.
//!
//! One test binary, a module per behaviour.
//! - `arming`: The arming API a connection pool needs.
//! - `changing_delays`: Re-arms whose delay changes at every call stay lock-free while
//!   the live entry serves, run neither early nor late, and keep the period rule under
//!   storms from several threads.
//! - `changing_delays_hostile`: The same under hostile use: whole-word ABA around the
//!   period and the placement, epochs that wrap, a reference model across the placement's
//!   reach and the coarse clock's threshold, fork, shutdown and `cancel_sync` storms, and
//!   the run maxima.
//! - `arming_races`: `schedule_within`, `deadline`, `Next::At` and touches during runs
//!   (which never override the callback's decision) under random and racing use.
//! - `bad_input`: Bad input and calls in the wrong place.
//! - `cancel_refusal`: What `cancel_sync` refuses: every re-arm from the moment it is
//!   called, a lock-free `reschedule` racing it too, and an `enable` without a matching
//!   `disable` lifts nothing.
//! - `containment`: Containment is total.
//! - `detach`: `Work::detach` under races.
//! - `faults`: Faults.
//! - `flush_scope`: What a `flush` waits for, and that it is true exactly when it ran.
//! - `late_thread_locals`: Dropping a scheduler, `flush`, `cancel_sync`, dropping a
//!   running work, `global()`, wait cycles and `run_chunked` in a thread-local destructor
//!   that runs after nicework's own.
//! - `leeway`: Works with a leeway never run before their deadline, the scheduler never
//!   plans a wake past a pending window's end, and the builder step gives an armed work
//!   its window.
//! - `leeway_hostile`: Leeways under hostile use: random arms, leeways, cancels and runs
//!   against a hosted plan, a blocking run waiting for a later work with two workers,
//!   the manual scheduler's order, wakeup counts, tick-stamped timeouts beside busy
//!   neighbours.
//! - `listing`: `Scheduler::works` lists every live work and only those, against
//!   creation, drop, poison, detach and `once` from other threads, and against every way
//!   a work's life ends, from inside the listing and beside it.
//! - `lock_free_arming`: Real schedulers (2 workers) under many threads arming, cancelling
//!   and touching.
//! - `lone_runs`: Far deadlines through a hosted driver, arms made while a lone run holds
//!   its worker, and `once` and `try_flush` racing runs.
//! - `manual`: The work semantics (the workqueue guarantees in the crate docs) on the
//!   manual scheduler, where time is virtual and every interleaving is chosen by the test.
//! - `manual_ticks`: The manual clock at sub-slack resolution.
//! - `never_early`: A real scheduler's clock is `Instant`'s, and no run, re-armed or
//!   touched, begins before its deadline by the real clock.
//! - `once`: `Scheduler::once` runs at most once, frees its closure with that run, and
//!   refuses every later arm.
//! - `per_object`: Per-object works given the `Weak` of `Arc::new_cyclic` survive runs
//!   during construction, a panicking constructor and a dead `Weak`.
//! - `reference_model`: Manual scheduler against a reference model.
//! - `scheduler_drop_in_callback`: Dropping a scheduler's last handle from inside a
//!   callback does not join its workers, so a worker whose callback waits for the dropping
//!   callback cannot deadlock it.
//! - `shutdown`: Shutdown racing arms, touches, flushes, cancels, detaches and `Yield`
//!   takeovers leaves every work inert.
//! - `sleeping_worker`: The worker's sleep against arms, cancels, re-arms and shutdown
//!   racing it, on the timerfd and on the portable alarm.
//! - `standby`: The idle worker that stands by on a timer of its own against arms from
//!   other threads while one worker blocks, blocked callbacks, shutdown and flush.
//! - `stale_entries`: Timer entries are removed lazily (a cancelled, re-armed-earlier or
//!   dropped work's entry stays until its tick), so these tests pin the bound.
//! - `stats`: `stats()` never shows more parks than runs, and its counts never go back.
//! - `stress`: Several threads do random schedule / reschedule / touch / cancel /
//!   cancel_sync / drop / flush / disable on shared works for a bounded time, against a
//!   two-worker scheduler.
//! - `threaded`: The work semantics on real schedulers.

#[path = "../common/mod.rs"]
mod common;

mod arming;
mod arming_races;
mod bad_input;
mod cancel_refusal;
mod changing_delays;
mod changing_delays_hostile;
mod containment;
mod detach;
mod faults;
mod flush_scope;
mod late_thread_locals;
mod leeway;
mod leeway_hostile;
mod listing;
mod lock_free_arming;
mod lone_runs;
mod manual;
mod manual_ticks;
mod never_early;
mod once;
mod per_object;
mod reference_model;
mod scheduler_drop_in_callback;
mod shutdown;
mod sleeping_worker;
mod stale_entries;
mod standby;
mod stats;
mod stress;
mod threaded;

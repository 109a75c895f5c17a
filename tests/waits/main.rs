//! Waits between works: wait cycles (direct, mixed, across schedulers), `run_chunked`,
//! whose helpers wait on behalf of the caller, and waits that block no thread.
//!
//! One test binary, a module per behaviour.
//! - `chunked`: `Scheduler::run_chunked`.
//! - `chunked_cycles`: `run_chunked` never returns while a helper still runs the closure
//!   that borrows the caller's stack, also when a helper's chunk waits for the caller's
//!   own work.
//! - `chunked_helper_cycles`: A wait cycle that passes through one of several
//!   `run_chunked` helpers is found.
//! - `cycles`: Wait cycles are broken, with a warning logged under no lock; a wait that
//!   has ended is no wait.
//! - `mixed_cycles`: Wait cycles that mix `flush`, `cancel_sync` and drop, pass through a
//!   nested run or span three schedulers, are broken;
//! - `try_flush`: `Work::try_flush` helps a pending work and never waits for a running
//!   one.
//! - `without_blocking`: `cancel_async` and `drop_async`.

#[path = "../common/mod.rs"]
mod common;

// Tells the caller's chunks from the workers' by kernel thread id, and reads nice values.
#[cfg(target_os = "linux")]
mod chunked;
mod chunked_cycles;
mod chunked_helper_cycles;
mod cycles;
mod mixed_cycles;
mod try_flush;
mod without_blocking;

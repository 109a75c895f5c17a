//! Everything that waits for a run:
//!
//! - [`frames`]: which works run on the current thread (the frame stack), so that a wait
//!   from inside a callback for its own work does not wait.
//! - [`cycles`]: the process-wide wait-for graph, which breaks cycles of callbacks
//!   waiting for each other.
//! - [`flush`]: `flush` and `try_flush` (and their `Work` methods), and the wait for the
//!   end of a run that `cancel_sync`, drop and `flush` share.
//! - [`lending`]: priority lending: a waiter raises the worker running what it waits
//!   for, where the process may.
//! - [`futures`]: waiting without blocking a thread (`cancel_async`, `drop_async`).

pub(crate) mod cycles;
pub(crate) mod flush;
pub(crate) mod frames;
pub(crate) mod futures;
pub(crate) mod lending;

pub use lending::LendingStats;

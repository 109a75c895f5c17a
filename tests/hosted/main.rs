//! Hosted schedulers (`Builder::build_hosted`): a host's own loop runs the works through
//! the `Driver`, in real time, with no nicework thread; and the waits that block no
//! thread (`cancel_async`, `drop_async`) on them and on threaded schedulers under hostile
//! use.
//!
//! One test binary, a module per behaviour.
//! - `busy_host`: a host thread held inside a callback silences neither the descriptor
//!   nor the waker for the others; `Yield` once per call; `run_due_at_most`.
//! - `driver`: the `Driver`'s promises: `run_due`, `next_deadline`, the waker, the
//!   descriptor, shutdown, bad input.
//! - `races`: two hosts at once, wakers that call back in (and drop the driver or the
//!   scheduler), foreign arms against an fd-driven host, futures polled from many
//!   threads, dropped early, or raced with shutdown.

#[path = "../common/mod.rs"]
mod common;

mod busy_host;
mod driver;
mod races;

//! Waits between works: wait cycles (direct, mixed, across schedulers) and `run_chunked`, whose helpers wait on behalf of the caller.
//!
//! One test binary, a module per behaviour:
//! - `chunked`
//! - `chunked_cycles`
//! - `chunked_helper_cycles`
//! - `cycles`
//! - `mixed_cycles`

#[path = "../common/mod.rs"]
mod common;

mod chunked;
mod chunked_cycles;
mod chunked_helper_cycles;
mod cycles;
mod mixed_cycles;

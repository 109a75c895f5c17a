//! `fork()` inside callbacks and around the id space: in the child nicework runs nothing
//! more and never takes a parent's lock.
//!
//! One test binary, a module per behaviour.
//! - `inside_a_callback`: `fork()` with a scheduler in use.
//! - `nested`: `fork()` inside a callback C that runs nested, because callback A (on a
//!   worker) flushed it.
//! - `wait_graph`: A child forked inside a callback may still wait from inside that
//!   callback (on a fresh scheduler, say) while parent threads were using the process-wide
//!   wait-for graph at the fork.

#![cfg(unix)]

#[path = "../common/mod.rs"]
mod common;

mod inside_a_callback;
mod nested;
mod wait_graph;

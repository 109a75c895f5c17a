//! `fork()` inside callbacks and around the id space: in the child nicework runs nothing more and never takes a parent's lock.
//!
//! One test binary, a module per behaviour:
//! - `inside_a_callback`
//! - `nested`
//! - `wait_graph`

#[path = "../common/mod.rs"]
mod common;

mod inside_a_callback;
mod nested;
mod wait_graph;

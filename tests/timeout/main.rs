//! Idle timeouts: the rules on the manual clock, their edges, real threads, and bad input.
//!
//! One test binary, a module per behaviour:
//! - `bad_input`
//! - `edges`
//! - `manual`
//! - `threaded`

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod edges;
mod manual;
mod threaded;

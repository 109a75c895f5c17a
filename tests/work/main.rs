//! Works: the workqueue semantics on the manual clock and on real workers, arming (lock-free and locked), detach, cancelling and its refusals, containment, bad input and faults, the promises that legal code once broke, and the idle-cost count.
//!
//! One test binary, a module per behaviour:
//! - `arming`
//! - `arming_races`
//! - `bad_input`
//! - `cancel_refusal`
//! - `containment`
//! - `containment_levels`
//! - `detach`
//! - `faults`
//! - `flush_scope`
//! - `idle_objects`
//! - `lock_free_arming`
//! - `manual`
//! - `manual_ticks`
//! - `promise_edges`
//! - `promises`
//! - `reference_model`
//! - `scheduler_drop_in_callback`
//! - `stale_entries`
//! - `stress`
//! - `threaded`

#[path = "../common/mod.rs"]
mod common;

mod arming;
mod arming_races;
mod bad_input;
mod cancel_refusal;
mod containment;
mod containment_levels;
mod detach;
mod faults;
mod flush_scope;
mod idle_objects;
mod lock_free_arming;
mod manual;
mod manual_ticks;
mod promise_edges;
mod promises;
mod reference_model;
mod scheduler_drop_in_callback;
mod stale_entries;
mod stress;
mod threaded;

//! Concurrency ids: the `mm_cid` guarantees, guards that outlive the exit hook and nested enters, churn, late destructors, and spaces at reused addresses.
//!
//! One test binary, a module per behaviour:
//! - `churn`
//! - `guarantees`
//! - `late_destructors`
//! - `late_guards_and_nesting`
//! - `reused_addresses`

#[path = "../common/mod.rs"]
mod common;

mod churn;
mod guarantees;
mod late_destructors;
mod late_guards_and_nesting;
mod reused_addresses;

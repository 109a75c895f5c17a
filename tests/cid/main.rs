//! Concurrency ids: the `mm_cid` guarantees, guards that outlive the exit hook and nested
//! enters, churn, late destructors, and spaces at reused addresses.
//!
//! One test binary, a module per behaviour.
//! - `churn`: Uniqueness of ids and exclusivity of slots under churn.
//! - `guarantees`: The concurrency-id guarantees.
//! - `late_destructors`: `enter()` from thread-local destructors that run after nicework's
//!   thread-exit hook, when no guard pinned the thread's id at the hook.
//! - `per_cpu`: Per-CPU ids once threads outnumber the CPUs, and the switches between
//!   the modes.
//! - `late_guards_and_nesting`: A guard keeps its id until it is dropped, and a nested
//!   `enter()` returns the outer guard's id, under the two conditions that broke it.
//! - `reused_addresses`: Spaces dropped and re-created (often at the same address) while
//!   long-lived threads keep the previous space's record cached in `LAST`.

#[path = "../common/mod.rs"]
mod common;

mod churn;
mod guarantees;
mod late_destructors;
mod late_guards_and_nesting;
mod per_cpu;
mod reused_addresses;

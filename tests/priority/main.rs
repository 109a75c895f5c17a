//! Priorities: lending a flusher's priority to the worker it waits for, what a callback
//! learns of the machine's contention, and what an unprivileged process may not do (both re-run as another user where they can). Alone in a
//! binary: these tests change the process's `RLIMIT_NICE`.
//!
//! Linux only: nice values, `SCHED_IDLE`, `RLIMIT_NICE`, capabilities and lending are
//! Linux's (see `Priority` for what other OSes set).
//!
//! One test binary, a module per behaviour.
//! - `contended`: `Ctx::contended`, the machine's contention as a callback reads it.
//! - `lending`: Lending priority.
//! - `privilege`: Priorities and privilege.

#![cfg(target_os = "linux")]

#[path = "../common/mod.rs"]
mod common;

mod contended;
mod lending;
mod privilege;

//! Priorities: lending a flusher's priority to the worker it waits for, and what an
//! unprivileged process may not do (both re-run as another user where they can). Alone in a
//! binary: these tests change the process's `RLIMIT_NICE`.
//!
//! Linux only: nice values, `SCHED_IDLE`, `RLIMIT_NICE`, capabilities and lending are
//! Linux's (see `Priority` for what other OSes set).
//!
//! One test binary, a module per behaviour.
//! - `lending`: Lending priority.
//! - `privilege`: Priorities and privilege.

#![cfg(target_os = "linux")]

#[path = "../common/mod.rs"]
mod common;

mod lending;
mod privilege;

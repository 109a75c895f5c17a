//! Idle timeouts: the rules on the manual clock, their edges, real threads, and bad input.
//!
//! One test binary, a module per behaviour.
//! - `bad_input`: Bad input and odd timing.
//! - `edges`: Edge cases of timeout works on the manual clock.
//! - `manual`: Idle timeouts (`Scheduler::timeout`, `timeout_for`) on the manual clock.
//! - `threaded`: Idle timeouts on real threads and the real clock.
//! - `touch_tick`: The touch tick that long timeouts' touches read, under attack.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod edges;
mod manual;
mod threaded;
mod touch_tick;

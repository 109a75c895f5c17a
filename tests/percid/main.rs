//! `PerCid`: the reader beside owners and trims, trims left to readers, the reclaim queue, callbacks that misbehave, and thread exits.
//!
//! One test binary, a module per behaviour:
//! - `deferred_trims`
//! - `exit_hook`
//! - `gate_cycles`
//! - `hostile_callbacks`
//! - `queue_reentrancy`
//! - `queue_starvation`
//! - `queue_visits`
//! - `reader`
//! - `reclaim_mix`
//! - `sum_beside_a_trim`
//! - `sum_during_a_drain`

#[path = "../common/mod.rs"]
mod common;

mod deferred_trims;
mod exit_hook;
mod gate_cycles;
mod hostile_callbacks;
mod queue_reentrancy;
mod queue_starvation;
mod queue_visits;
mod reader;
mod reclaim_mix;
mod sum_beside_a_trim;
mod sum_during_a_drain;

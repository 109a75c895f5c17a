#![cfg(loom)]
//! Loom models of nicework live in `tests/`; this crate only hosts them, and what the
//! `PerCid` models share.

pub mod percid_fixtures;

#![cfg(loom)]
//! Loom models of nicework live in `tests/`; this crate only hosts them.

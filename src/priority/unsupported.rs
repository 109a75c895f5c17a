//! Any other OS: nicework knows no per-thread priority call there, so only
//! `Priority::Normal` can be expressed; every other priority is an `Unsupported` error
//! from `build()`, never a silent default.

use std::io;

use super::Priority;

pub(crate) use super::fixed::*;

/// Applies `priority` to the calling thread.
pub(crate) fn apply(priority: Priority) -> io::Result<()> {
    match priority {
        Priority::Normal => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no per-thread priority on this OS: use Priority::Normal",
        )),
    }
}

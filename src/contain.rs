//! Panic containment: user code that nicework runs (callbacks, closures' and slots'
//! destructors, `on_reclaim`) never unwinds into nicework or into the caller.
//!
//! A callback runs inside `catch_unwind` (see the run lifecycle); everything else goes
//! through [`contain`]. A caught panic's payload is dropped with [`drop_payload`], because
//! its destructor is user code too: a second panic there is caught and its payload leaked,
//! never dropped, so no chain of panicking payloads can escape or recurse without end.
//! Each caught panic is reported as one `tracing` ERROR event.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Drops a caught panic's payload. Its destructor is user code and may panic in turn; that
/// second payload is leaked, not dropped, so no panic ever escapes (a third level could
/// otherwise recurse without end).
pub(crate) fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(second) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        tracing::error!(
            panic = panic_message(second.as_ref()),
            "a panic payload panicked while being dropped; the second payload is leaked"
        );
        std::mem::forget(second);
    }
}

/// Runs user code (a destructor, a callback) so that a panic in it is reported as `what`
/// and contained, never propagated into nicework or the caller; its payload is dropped
/// contained too.
pub(crate) fn contain(what: &str, f: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
        tracing::error!(panic = panic_message(payload.as_ref()), "{what}");
        drop_payload(payload);
    }
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
}

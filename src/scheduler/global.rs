//! The lazily started default scheduler.

use crate::Scheduler;

/// The process-wide default scheduler, started on first use with the defaults (one worker
/// at `Nice(19)`), named `nicework`. It is never dropped.
///
/// In loom builds (`--cfg loom` with the `loom` feature) each call returns a new, leaked
/// [`Scheduler::manual`], because loom state cannot outlive one model.
///
/// # Panics
///
/// If the default scheduler cannot start even at [`Priority::Normal`](crate::Priority::Normal) (the process is out
/// of file descriptors or threads). Use [`Scheduler::builder`] to handle that as an error.
///
/// # Examples
///
/// ```
/// let a = nicework::global();
/// let b = nicework::global();
/// assert!(std::ptr::eq(a, b));
/// ```
pub fn global() -> &'static Scheduler {
    #[cfg(all(loom, feature = "loom"))]
    {
        Box::leak(Box::new(Scheduler::manual()))
    }
    #[cfg(not(all(loom, feature = "loom")))]
    {
        use crate::Priority;
        use std::sync::OnceLock;

        static GLOBAL: OnceLock<Scheduler> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            Scheduler::new()
                .or_else(|_| Scheduler::builder().priority(Priority::Normal).build())
                .unwrap_or_else(|error| panic!("nicework::global(): {error}"))
        })
    }
}

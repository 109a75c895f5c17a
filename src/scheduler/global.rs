//! The lazily started default scheduler.

use crate::Scheduler;

/// The process-wide default scheduler, started on first use with the defaults (one worker
/// at `Nice(19)`), named `nicework`. It is never dropped. In a `fork()`ed child the
/// first call starts a new one (the parent's is inert there).
///
/// It is for short, non-blocking maintenance: its one worker is shared by every user in
/// the process, so a callback that blocks (a connect, a disk read, a lock held elsewhere)
/// or runs long delays everybody else's works. Give blocking or latency-critical jobs a
/// scheduler of their own, with more [`workers`](crate::Builder::workers) and
/// [`Priority::Normal`](crate::Priority::Normal) where they must not wait behind
/// foreground threads (see "Blocking jobs get a scheduler of their own" on
/// [`Scheduler`]). Works detached on it ([`Work::detach`](crate::Work::detach)) live as long
/// as the process, like a detached thread.
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
        use std::sync::atomic::{AtomicPtr, Ordering};

        use crate::Priority;

        // A pointer rather than a OnceLock: a forked child needs a new one (the parent's
        // is inert there), and a OnceLock being initialized at fork time would block the
        // child forever.
        static GLOBAL: AtomicPtr<Scheduler> = AtomicPtr::new(std::ptr::null_mut());
        let current = GLOBAL.load(Ordering::Acquire);
        // SAFETY: a non-null pointer came from `Box::leak` below and is never freed.
        if let Some(scheduler) = unsafe { current.as_ref() } {
            if !scheduler.shared().is_forked_copy() {
                return scheduler;
            }
        }
        let fresh = Scheduler::new()
            .or_else(|_| Scheduler::builder().priority(Priority::Normal).build())
            .unwrap_or_else(|error| panic!("nicework::global(): {error}"));
        let fresh: *mut Scheduler = Box::leak(Box::new(fresh));
        match GLOBAL.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // The replaced one (if any) belongs to the parent: leaked, as in `fork`.
            Ok(_) => {
                // SAFETY: just leaked, never freed.
                unsafe { &*fresh }
            }
            Err(winner) => {
                // Another thread installed one first: stop ours, use theirs.
                // SAFETY: `fresh` came from Box::leak above and was never shared.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: a non-null pointer from `Box::leak`, never freed.
                unsafe { &*winner }
            }
        }
    }
}

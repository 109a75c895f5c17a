//! What a scheduler is in a `fork()`ed child.
//!
//! `fork()` copies only the calling thread. In the child a scheduler made before the fork
//! has no workers, its timerfd is shared with the parent, and its lock may have been
//! held by a thread that no longer exists, so taking it could block forever. So such a
//! scheduler is **inert** in the child: every call returns at once without touching its
//! lock (arming calls return `false`, `flush`/`cancel` return `false`, `advance` returns
//! 0, dropping the last handle neither shuts anything down nor joins), and no callback
//! ever runs there. Memory it holds is leaked in the child, never freed twice.
//! [`global()`](crate::global) starts a fresh scheduler in each child that calls it, and
//! `Scheduler::new()` works as usual; works made from those run normally.
//!
//! Detection costs one relaxed load: a `pthread_atfork` child handler (registered once
//! per process, when the first scheduler is made) bumps a process-wide generation, and
//! each scheduler compares it with the generation it was made in. The handler only does
//! an atomic add, which is async-signal-safe.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The current fork generation, registering the handler on first use.
pub(crate) fn generation() -> u64 {
    REGISTER.call_once(|| {
        // SAFETY: `in_child` is an `extern "C" fn()` that stays valid for the life of the
        // process and only performs an atomic add.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    GENERATION.load(Ordering::Relaxed)
}

/// Whether a scheduler made in `generation` is now in a forked child.
#[inline]
pub(crate) fn is_forked_since(generation: u64) -> bool {
    GENERATION.load(Ordering::Relaxed) != generation
}

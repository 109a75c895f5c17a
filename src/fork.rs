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
//! `fork()` called *inside a callback* is the same rule seen from the forking thread: in
//! the child it returns from the callback into nicework, which notices the fork before
//! it takes any lock and stops there. A worker thread ends (in a child whose only thread
//! it is, the process then exits with status 0, as after `pthread_exit`); `flush` and
//! `advance` on a caller's thread return to the caller. Nothing else runs in the child,
//! and the parent's timerfd is never read there, so the parent's works keep their rate.
//! A child that has work of its own to do should do it inside the callback and leave
//! with `_exit` or `exec`.
//!
//! Detection costs one relaxed load: a `pthread_atfork` child handler (registered once
//! per process, when the first scheduler is made) bumps a process-wide generation, and
//! each scheduler compares it with the generation it was made in. The handler only does
//! atomic operations, which are async-signal-safe. The same registration holds the work
//! name table's lock across the fork (see `scheduler::names`).
//!
//! The rules hold on every unix: `pthread_atfork` is POSIX. Windows has no `fork()`, so
//! there nothing registers and the generation never moves.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static GENERATION: AtomicU64 = AtomicU64::new(0);
static REGISTERED: AtomicBool = AtomicBool::new(false);
#[cfg_attr(not(unix), allow(dead_code))]
static REGISTER: Mutex<()> = Mutex::new(());

#[cfg_attr(not(unix), allow(dead_code))]
extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    crate::scheduler::work::names::after_fork();
}

/// The current fork generation, registering the handler on first use.
///
/// `pthread_atfork` can fail (`ENOMEM`). Then forks are not detected: the failure is
/// logged as an error and registration is tried again by the next scheduler or id space
/// that is made.
pub(crate) fn generation() -> u64 {
    if !REGISTERED.load(Ordering::Acquire) {
        register();
    }
    GENERATION.load(Ordering::Relaxed)
}

#[cfg(not(unix))]
#[cold]
fn register() {
    REGISTERED.store(true, Ordering::Release);
}

#[cfg(unix)]
#[cold]
fn register() {
    let _once = crate::sync::lock_std(&REGISTER);
    if REGISTERED.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: the handlers are `extern "C" fn()`s that stay valid for the life of the
    // process; the child's only does atomic stores and adds, which are
    // async-signal-safe, and the prepare handler takes a lock no forking thread holds.
    let rc = unsafe {
        libc::pthread_atfork(
            Some(crate::scheduler::work::names::before_fork),
            Some(crate::scheduler::work::names::after_fork),
            Some(in_child),
        )
    };
    if rc == 0 {
        REGISTERED.store(true, Ordering::Release);
    } else {
        tracing::error!(
            error = %std::io::Error::from_raw_os_error(rc),
            "pthread_atfork failed: schedulers made now are not inert in a fork()ed child"
        );
    }
}

/// Whether a scheduler made in `generation` is now in a forked child.
#[inline]
pub(crate) fn is_forked_since(generation: u64) -> bool {
    GENERATION.load(Ordering::Relaxed) != generation
}

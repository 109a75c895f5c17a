//! The one place that picks `std` or `loom` primitives.
//!
//! Everything in nicework that other threads can observe (the scheduler core lock, the
//! condition variables, the work state words, the thread-local run frames) is built from
//! the names re-exported here, so a loom model of a user's type explores nicework's
//! interleavings too. Loom is picked only when both `--cfg loom` and the `loom` feature are
//! set, so a downstream crate that sets `--cfg loom` for its own models does not get a loom
//! build of nicework by accident (the sharded-slab rule).
//!
//! # Guard tags
//!
//! Shared structs tag each field with what guards it, as `kernel/workqueue.c` does. One
//! legend for the crate, a letter for each lock:
//!
//! - `I:` set when the struct is made, read-only after.
//! - `A:` an atomic; its comment names its writers.
//! - `X:` only the owner touches it (the thread that holds the run, or the handle).
//! - `L:` the scheduler's core lock (`Shared::core`).
//! - `T:` a leaf mutex of its own, the one the field is or names (the workers' join
//!   handles, their ids, the list of live works, the touch tick's history, a
//!   `run_chunked`'s results): never taken with another lock held, nor another taken
//!   under it.
//! - `S:` an id space's lock (`SpaceInner::state`).
//! - `G:` a `PerCid` storage's gate (`Gate::state`): readers and trims of that storage.
//! - `R:` a `PerCid` storage's reclaimer (its `on_reclaim` callback and queue).
//!
//! `Arc` is always `std`'s (loom's cannot be coerced to a trait object on stable Rust), and
//! so are the atomics of a work's reference count (`WorkRef`), which play `Arc`'s part for
//! works. The shared state inside both is loom-tracked.

#[cfg(all(loom, feature = "loom"))]
mod imp {
    pub(crate) use loom::cell::{MutPtr, UnsafeCell};
    pub(crate) use loom::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
    };
    pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use loom::thread_local;
}

#[cfg(not(all(loom, feature = "loom")))]
mod imp {
    pub(crate) use std::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
    };
    pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use std::thread_local;

    /// `std::cell::UnsafeCell` with loom's closure-based API, so call sites are the same
    /// in both builds and loom can check them for concurrent access.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }

        /// A mutable access that lasts as long as the returned pointer (loom tracks it
        /// until the pointer is dropped).
        pub(crate) fn get_mut(&self) -> MutPtr<T> {
            MutPtr(self.0.get())
        }
    }

    /// loom's `MutPtr`: a mutable access to an `UnsafeCell` for as long as it lives.
    #[derive(Debug)]
    pub(crate) struct MutPtr<T>(*mut T);

    impl<T> MutPtr<T> {
        /// # Safety
        ///
        /// As for dereferencing the cell's raw pointer: no other reference to the value
        /// is alive while the returned one is.
        #[allow(clippy::mut_from_ref, reason = "loom's `MutPtr::deref`, mirrored")]
        pub(crate) unsafe fn deref(&self) -> &mut T {
            // SAFETY: the caller's contract.
            unsafe { &mut *self.0 }
        }
    }
}

pub(crate) use imp::*;

/// Locks `mutex`, ignoring poisoning: nicework never panics while holding its own locks
/// (user callbacks run unlocked and inside `catch_unwind`), so a poisoned lock can only come
/// from a bug that already reported itself, and the data is still consistent.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    ignore_poison(mutex.lock())
}

/// The one poison rule, for both kinds of mutex: a poisoned guard is used as it is.
fn ignore_poison<G>(result: std::sync::LockResult<G>) -> G {
    result.unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`lock`] for a std mutex that is never part of a loom model (thread bookkeeping,
/// `run_chunked`'s results).
pub(crate) fn lock_std<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    ignore_poison(mutex.lock())
}

/// Waits on `condvar`, ignoring poisoning for the reason given at [`lock`].
pub(crate) fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    ignore_poison(condvar.wait(guard))
}

/// A load that must observe the caller's earlier `SeqCst` writes in the single total
/// order (the `touch()` fast path; see the ground rules in `scheduler`).
///
/// In real builds this is one `SeqCst` load: a plain `mov` on x86. Loom regards `SeqCst`
/// accesses as `AcqRel` (its README lists this as a source of false alarms) but models
/// `fence(SeqCst)` exactly, so loom builds spell the same guarantee as a `SeqCst` fence
/// followed by the load, which is what the `SeqCst` load provides against `SeqCst` writes
/// in the C++20 model. The other side of the protocol is the same in both builds.
#[inline]
pub(crate) fn load_ordered_after_seqcst_writes(atomic: &AtomicU64) -> u64 {
    #[cfg(all(loom, feature = "loom"))]
    fence(Ordering::SeqCst);
    atomic.load(Ordering::SeqCst)
}

/// One round of waiting for another thread to finish a step of a few instructions that
/// nothing can block (a lock-free arm publishing its period): spins first, then yields,
/// then sleeps, so that a waiter never keeps a preempted writer of lower priority off its
/// CPU (`SCHED_IDLE` or nice 19 beside a spinning nice-0 thread would never run).
#[inline]
pub(crate) fn wait_round(round: &mut u32) {
    *round = round.saturating_add(1);
    #[cfg(all(loom, feature = "loom"))]
    loom::thread::yield_now();
    #[cfg(not(all(loom, feature = "loom")))]
    if *round < 64 {
        std::hint::spin_loop();
    } else if *round < 128 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

//! Asymmetric fences: a free one for the hot side, an expensive one for the rare side.
//!
//! The ID fast path (`enter()`) must publish "I am pinned" and then read "which id do I
//! own", and the reclaimer must publish "this id is revoked" and then read "is its thread
//! pinned". Both are store→load orders, which normally need a full fence on *both* sides
//! (Dekker). `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` lets the reclaimer pay for
//! both: it makes every running thread of the process execute a full barrier (and a thread
//! that is not running has passed one at its context switch), so the hot side needs only a
//! compiler fence. This is the kernel's `sys_membarrier` pattern, as in folly's
//! `asymmetricHeavyBarrier` and userspace RCU.
//!
//! Windows has the same barrier: `FlushProcessWriteBuffers` interrupts every processor
//! running a thread of the process (the heavy side of .NET's and folly's asymmetric
//! fences there), so the hot side is a compiler fence there too.
//!
//! Where neither exists (macOS, FreeBSD, Linux kernels before 4.14, seccomp filters, and
//! Linux built with `--cfg nicework_portable`), [`light`] falls back to a real `SeqCst`
//! fence, decided once per process. The `IdSpace` promises are the same; only the cost
//! moves: each first-level `enter()` pays one full fence (an `mfence` on x86, `dmb ish`
//! on ARM: `enter()` + drop measured 7.9 ns with it against 1.0 ns without, on the
//! development VM) and a scan pays nothing extra. In loom
//! builds both sides are `fence(SeqCst)`, which loom models exactly, so the models check
//! the same ordering argument.

#[cfg(not(all(loom, feature = "loom")))]
mod imp {
    use std::sync::atomic::{AtomicU8, Ordering, compiler_fence, fence};

    const UNKNOWN: u8 = 0;
    const EXPEDITED: u8 = 1;
    const FENCES: u8 = 2;

    static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);

    /// Registers the process for expedited barriers (once); call before any [`light`].
    pub(crate) fn init() {
        if MODE.load(Ordering::Acquire) != UNKNOWN {
            return;
        }
        let mode = if super::os::register() {
            EXPEDITED
        } else {
            FENCES
        };
        // Decided once: a racing `init` that decided first wins (either answer is safe
        // then: registration is per process), so the mode never changes once known and
        // callers may remember `is_asymmetric` (see `light_asymmetric`).
        let _ = MODE.compare_exchange(UNKNOWN, mode, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The hot side's barrier: a compiler fence where membarrier works, else a fence.
    #[inline(always)]
    pub(crate) fn light() {
        if MODE.load(Ordering::Relaxed) == EXPEDITED {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }

    /// [`light`] for a caller that saw [`asymmetric_light_ok`] after [`init`] (the mode
    /// never changes then): a compiler fence, without reading the mode again.
    #[inline(always)]
    pub(crate) fn light_asymmetric() {
        compiler_fence(Ordering::SeqCst);
    }

    /// Whether [`light_asymmetric`] may stand for [`light`]: [`is_asymmetric`]. Decided by
    /// [`init`] and fixed from then on, so a caller may ask once and remember.
    pub(crate) fn asymmetric_light_ok() -> bool {
        is_asymmetric()
    }

    /// The rare side's barrier: after it returns, every other thread's memory operations
    /// before its last [`light`] are visible to us and ours before this call are visible
    /// to its operations after that [`light`].
    pub(crate) fn heavy() {
        fence(Ordering::SeqCst);
        if MODE.load(Ordering::Acquire) == EXPEDITED {
            super::os::heavy();
        }
    }

    /// Whether the light side is free (membarrier registered).
    pub(crate) fn is_asymmetric() -> bool {
        MODE.load(Ordering::Acquire) == EXPEDITED
    }
}

#[cfg(all(loom, feature = "loom"))]
mod imp {
    use crate::sync::{Ordering, fence};

    pub(crate) fn init() {}

    pub(crate) fn light() {
        fence(Ordering::SeqCst);
    }

    pub(crate) fn light_asymmetric() {
        fence(Ordering::SeqCst);
    }

    /// The models take the same fast path as real builds, with a `SeqCst` fence in it.
    pub(crate) fn asymmetric_light_ok() -> bool {
        true
    }

    pub(crate) fn heavy() {
        fence(Ordering::SeqCst);
    }

    pub(crate) fn is_asymmetric() -> bool {
        false
    }
}

pub(crate) use imp::*;

/// Linux's `membarrier(2)`.
#[cfg(all(
    target_os = "linux",
    not(nicework_portable),
    not(all(loom, feature = "loom"))
))]
mod os {
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    /// Whether the process could register for expedited membarriers.
    pub(super) fn register() -> bool {
        // SAFETY: membarrier takes integer arguments only and touches no memory of ours.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0,
                0,
            )
        };
        rc == 0
    }

    /// A full barrier on every running thread of the process.
    pub(super) fn heavy() {
        // SAFETY: as in `register`.
        let rc =
            unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
        // Registration succeeded, so this cannot fail; if it ever did, switching every
        // light side to real fences would race with threads mid-fast-path, so this is a
        // hard error.
        assert_eq!(
            rc, 0,
            "membarrier(PRIVATE_EXPEDITED) failed after registration"
        );
    }
}

/// Windows' `FlushProcessWriteBuffers`, which needs no registration and cannot fail.
#[cfg(all(windows, not(all(loom, feature = "loom"))))]
mod os {
    pub(super) fn register() -> bool {
        true
    }

    pub(super) fn heavy() {
        // SAFETY: no arguments, no preconditions.
        unsafe { windows_sys::Win32::System::Threading::FlushProcessWriteBuffers() };
    }
}

/// No process-wide barrier: both sides are fences.
#[cfg(not(any(
    all(target_os = "linux", not(nicework_portable)),
    windows,
    all(loom, feature = "loom")
)))]
mod os {
    pub(super) fn register() -> bool {
        false
    }

    pub(super) fn heavy() {
        unreachable!("heavy barriers are only asked for once registered");
    }
}

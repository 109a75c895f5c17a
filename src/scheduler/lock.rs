//! The core lock's guard, [`WakingGuard`]: what every holder of `Shared::core` holds
//! (`shared::CoreGuard`).
//!
//! Wakers are user code (an executor's, or a host's own), so none is woken under the
//! lock: an arm made under the lock that owes a wake (to a hosted scheduler's host, to a
//! future whose run ended) pushes the waker to the guarded state's owed wakes
//! ([`OwedWakes`]), and the guard wakes them once it has released the lock, or, in
//! [`WakingGuard::wait`], just before the wait releases it. A waker may then call back
//! into nicework on any thread.

use std::mem::ManuallyDrop;
use std::task::Waker;

use crate::sync::{Condvar, MutexGuard};

/// State that collects wakes to make once its lock is released.
pub(crate) trait OwedWakes {
    /// Takes the wakes owed so far, leaving none.
    fn take_owed_wakes(&mut self) -> Vec<Waker>;

    /// Whether any wake is owed (checked at every release, so it is cheap).
    fn owes_wakes(&self) -> bool;
}

/// A mutex guard that makes the owed wakes after it releases the lock.
pub(crate) struct WakingGuard<'a, T: OwedWakes> {
    guard: ManuallyDrop<MutexGuard<'a, T>>,
}

impl<'a, T: OwedWakes> WakingGuard<'a, T> {
    pub(crate) fn new(guard: MutexGuard<'a, T>) -> Self {
        WakingGuard {
            guard: ManuallyDrop::new(guard),
        }
    }

    /// Waits on `condvar` with the lock (as `Condvar::wait`); the owed wakes are made
    /// first, as at any release of the lock.
    pub(crate) fn wait(mut self, condvar: &Condvar) -> Self {
        let owed = self.guard.take_owed_wakes();
        // SAFETY: `self.guard` is taken out once and `self` is forgotten, so its drop
        // never touches it again.
        let guard = unsafe { ManuallyDrop::take(&mut self.guard) };
        std::mem::forget(self);
        // Woken with the lock held: the wait below releases it at once, and a waker that
        // calls into nicework blocks on the lock only until then.
        owed.into_iter().for_each(Waker::wake);
        WakingGuard::new(crate::sync::wait(condvar, guard))
    }
}

impl<T: OwedWakes> std::ops::Deref for WakingGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: OwedWakes> std::ops::DerefMut for WakingGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T: OwedWakes> Drop for WakingGuard<'_, T> {
    fn drop(&mut self) {
        if !self.guard.owes_wakes() {
            // SAFETY: this is the guard's drop; it is not used again.
            unsafe { ManuallyDrop::drop(&mut self.guard) };
            return;
        }
        let owed = self.guard.take_owed_wakes();
        // SAFETY: as above.
        unsafe { ManuallyDrop::drop(&mut self.guard) };
        owed.into_iter().for_each(Waker::wake);
    }
}

//! Which works are running on the current thread.
//!
//! A thread-local stack of the cells whose callbacks this thread is executing (nested
//! when a callback flushes another work, which then runs on the same thread). It answers
//! one question: "would waiting for this work's run wait for ourselves?", which turns
//! `cancel_sync`, `flush` and drop from inside the own callback into their documented
//! non-waiting forms instead of a deadlock.

use std::cell::RefCell;

use crate::scheduler::shared::Cell;
use crate::sync::thread_local;

thread_local! {
    // loom's thread_local! has no `const { }` form, and this must build with both.
    #[allow(clippy::missing_const_for_thread_local)]
    static RUNNING_HERE: RefCell<Vec<usize>> = RefCell::new(Vec::new());
}

fn address(cell: &Cell) -> usize {
    std::sync::Arc::as_ptr(cell) as *const () as usize
}

/// Marks `cell` as running on this thread until the guard drops.
pub(crate) fn enter(cell: &Cell) -> FrameGuard {
    RUNNING_HERE.with(|stack| stack.borrow_mut().push(address(cell)));
    FrameGuard {
        _not_send: std::marker::PhantomData,
    }
}

/// Whether `cell`'s callback is executing on this thread (at any nesting depth).
pub(crate) fn is_running_here(cell: &Cell) -> bool {
    let address = address(cell);
    RUNNING_HERE.with(|stack| stack.borrow().contains(&address))
}

/// Pops the frame pushed by [`enter`].
pub(crate) struct FrameGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for FrameGuard {
    fn drop(&mut self) {
        RUNNING_HERE.with(|stack| {
            stack.borrow_mut().pop();
        });
    }
}

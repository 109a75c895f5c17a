//! Which works are running on the current thread.
//!
//! A thread-local stack of the cells whose callbacks this thread is executing (nested
//! when a callback flushes another work, which then runs on the same thread). It answers
//! "would waiting for this work's run wait for ourselves?", which turns `cancel_sync`,
//! `flush` and drop from inside the own callback into their documented non-waiting forms
//! instead of a deadlock, and it is what a thread holds in the wait-for graph
//! ([`waits`](super::waits)).
//!
//! A frame is a raw pointer to the work: [`Shared::execute`] holds a counted reference
//! for as long as the frame is on the stack, so the pointer is valid while it is there.
//!
//! [`Shared::execute`]: crate::scheduler::core::Shared::execute

use super::{Callback, WorkInner};
use std::cell::RefCell;

use super::WorkRef;
use crate::sync::thread_local;

thread_local! {
    // loom's thread_local! has no `const { }` form, and this must build with both.
    #[allow(clippy::missing_const_for_thread_local)]
    static RUNNING_HERE: RefCell<Vec<*const WorkInner<dyn Callback>>> = RefCell::new(Vec::new());
}

/// The address that identifies a work: its work's data pointer.
pub(crate) fn address(work: &WorkRef) -> usize {
    std::sync::Arc::as_ptr(work) as *const () as usize
}

/// Marks `work` as running on this thread until the guard drops. The caller keeps `work`
/// alive for at least as long as the guard.
pub(crate) fn enter(work: &WorkRef) -> FrameGuard {
    RUNNING_HERE.with(|stack| stack.borrow_mut().push(std::sync::Arc::as_ptr(work)));
    FrameGuard {
        _not_send: std::marker::PhantomData,
    }
}

/// Whether `work`'s callback is executing on this thread (at any nesting depth).
pub(crate) fn is_running_here(work: &WorkRef) -> bool {
    let address = address(work);
    RUNNING_HERE.with(|stack| {
        stack
            .borrow()
            .iter()
            .any(|frame| frame.cast::<()>() as usize == address)
    })
}

/// The addresses of every work running on this thread, outermost first.
pub(crate) fn running_here() -> Vec<usize> {
    RUNNING_HERE.with(|stack| {
        stack
            .borrow()
            .iter()
            .map(|frame| frame.cast::<()>() as usize)
            .collect()
    })
}

/// The name of the innermost work running on this thread.
pub(crate) fn innermost_name() -> Option<String> {
    RUNNING_HERE.with(|stack| {
        stack.borrow().last().map(|frame| {
            // SAFETY: a frame is on the stack only while `execute` holds a counted
            // reference to its work (see the module docs).
            unsafe { &**frame }.name().to_owned()
        })
    })
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

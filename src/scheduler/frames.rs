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
//! A `run_chunked` helper also carries its caller's frames (`enter_on_behalf`); the caller
//! waits for the helper's run to end before its own `execute` lets go of them.
//!
//! [`Shared::execute`]: crate::scheduler::core::Shared::execute

use super::{Callback, WorkInner};
use std::cell::RefCell;

use super::WorkRef;
use crate::sync::thread_local;

thread_local! {
    // loom's thread_local! has no `const { }` form, and this must build with both.
    #[allow(clippy::missing_const_for_thread_local)]
    static RUNNING_HERE: RefCell<Vec<Frame>> = RefCell::new(Vec::new());
}

/// A work whose callback runs on this thread (see the module docs for its validity).
pub(crate) type Frame = *const WorkInner<dyn Callback>;

/// This thread's frames, outermost first: what a `run_chunked` helper runs on behalf of.
pub(crate) fn snapshot() -> Vec<Frame> {
    RUNNING_HERE.with(|stack| stack.borrow().clone())
}

/// Pushes `frames` (another thread's [`snapshot`]) until the guard drops: a
/// `run_chunked` helper runs its chunk as part of the caller's callbacks, so a wait from
/// inside the chunk for one of them behaves as inside the own callback, and a cycle
/// through the helper is a cycle through the caller. The caller keeps the frames' works
/// running, and so valid, until every helper finished (it waits for them unconditionally).
pub(crate) fn enter_on_behalf(frames: &[Frame]) -> OnBehalfGuard {
    RUNNING_HERE.with(|stack| stack.borrow_mut().extend_from_slice(frames));
    OnBehalfGuard {
        count: frames.len(),
        _not_send: std::marker::PhantomData,
    }
}

/// Pops the frames pushed by [`enter_on_behalf`].
pub(crate) struct OnBehalfGuard {
    count: usize,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for OnBehalfGuard {
    fn drop(&mut self) {
        RUNNING_HERE.with(|stack| {
            let mut stack = stack.borrow_mut();
            let keep = stack.len() - self.count;
            stack.truncate(keep);
        });
    }
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

/// Whether this thread is executing a callback (of any scheduler).
pub(crate) fn in_callback() -> bool {
    RUNNING_HERE.with(|stack| !stack.borrow().is_empty())
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
            // reference to its work, on this thread or, for a frame pushed by
            // `enter_on_behalf`, on the `run_chunked` caller's thread, which does not
            // return before this helper's run ended (see the module docs).
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

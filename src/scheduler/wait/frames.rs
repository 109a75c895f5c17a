//! Which works are running on the current thread.
//!
//! A thread-local stack of the works whose callbacks this thread is executing (nested
//! when a callback flushes another work, which then runs on the same thread). It answers
//! "would waiting for this work's run wait for ourselves?", which turns `cancel_sync`,
//! `flush` and drop from inside the own callback into their documented non-waiting forms
//! instead of a deadlock, and it is what a thread holds in the wait-for graph
//! ([`cycles`](super::cycles)).
//!
//! # An intrusive stack, reachable in every thread-local destructor
//!
//! The stack is a linked list of [`Frame`]s that live on the stacks of the calls that
//! push them ([`Shared::execute`] and a `run_chunked` helper), and the thread-local holds
//! only a pointer to the innermost one. A `Cell` of a raw pointer needs no destructor, so
//! the thread-local is never destroyed: nicework's calls read it correctly from any
//! other thread-local's destructor, however late it runs (a `Scheduler` or a `Work`
//! dropped there, a `flush` called there). It also costs no allocation per run.
//!
//! # Validity
//!
//! - A frame is linked by [`Frame::enter`], whose guard borrows it, and unlinked by that
//!   guard's drop, so a linked frame never moves and never outlives its link. Guards
//!   drop in the reverse order of their `enter` (they are locals of nested calls, and
//!   unwinding drops them in that order too).
//! - A frame's work pointers are valid while it is linked: [`Shared::execute`] holds a
//!   counted reference to its work for as long as its frame is, and a `run_chunked`
//!   helper's frame points at the caller's [`snapshot`], which the caller keeps (with
//!   its own frames' works running) until every helper's run ended.
//!
//! [`Shared::execute`]: crate::scheduler::shared::Shared::execute

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr;

use crate::scheduler::{Callback, WorkInner, WorkRef};

#[cfg(not(all(loom, feature = "loom")))]
std::thread_local! {
    /// The innermost linked frame, or null.
    static INNERMOST: Cell<*const Frame> = const { Cell::new(ptr::null()) };
}

#[cfg(all(loom, feature = "loom"))]
loom::thread_local! {
    // loom's thread_local! has no `const { }` form; loom models run no thread-local
    // destructors after nicework's.
    #[allow(clippy::missing_const_for_thread_local)]
    static INNERMOST: Cell<*const Frame> = Cell::new(ptr::null());
}

/// A work whose callback runs on this thread (see the module docs for its validity).
pub(crate) type RunningWork = *const WorkInner<dyn Callback>;

/// One link of the stack: a work that runs here, or the works a `run_chunked` helper
/// runs on behalf of (its caller's frames, outermost first).
pub(crate) struct Frame {
    works: Works,
    /// The next frame out; set while linked.
    outer: Cell<*const Frame>,
}

enum Works {
    One(RunningWork),
    OnBehalf(*const [RunningWork]),
}

impl Frame {
    /// A frame for `work`, whose callback is about to run on this thread.
    pub(crate) fn running(work: &WorkRef) -> Frame {
        Frame {
            works: Works::One(work.inner()),
            outer: Cell::new(ptr::null()),
        }
    }

    /// A frame that carries `frames` (another thread's [`snapshot`]): a `run_chunked`
    /// helper runs its chunk as part of the caller's callbacks, so a wait from inside the
    /// chunk for one of them behaves as inside the own callback, and a cycle through the
    /// helper is a cycle through the caller.
    ///
    /// # Safety
    ///
    /// `frames` and the works it names must stay valid until the guard of
    /// [`enter`](Self::enter) on this frame drops (the caller keeps them running until
    /// every helper finished: it waits for them unconditionally).
    pub(crate) unsafe fn on_behalf(frames: &[RunningWork]) -> Frame {
        Frame {
            works: Works::OnBehalf(frames as *const [RunningWork]),
            outer: Cell::new(ptr::null()),
        }
    }

    /// Links this frame as the innermost until the guard drops.
    pub(crate) fn enter(&self) -> Entered<'_> {
        let linked = INNERMOST
            .try_with(|innermost| {
                self.outer.set(innermost.get());
                innermost.set(self);
            })
            .is_ok();
        Entered {
            frame: linked.then_some(self),
            _not_send: PhantomData,
        }
    }

    fn works(&self) -> &[RunningWork] {
        match &self.works {
            Works::One(work) => std::slice::from_ref(work),
            // SAFETY: valid while linked (the contract of `on_behalf`).
            Works::OnBehalf(works) => unsafe { &**works },
        }
    }
}

/// Unlinks the frame linked by [`Frame::enter`].
pub(crate) struct Entered<'a> {
    frame: Option<&'a Frame>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let Some(frame) = self.frame else {
            return;
        };
        let _ = INNERMOST.try_with(|innermost| {
            debug_assert!(
                ptr::eq(innermost.get(), frame),
                "frames unlinked out of order"
            );
            innermost.set(frame.outer.get());
        });
    }
}

/// Calls `visit` for each linked frame, innermost first, until it returns `true`; returns
/// whether one did. Nothing is linked when the thread-local is unreachable.
fn any_frame(mut visit: impl FnMut(&Frame) -> bool) -> bool {
    INNERMOST
        .try_with(|innermost| {
            let mut current = innermost.get();
            // SAFETY: a linked frame is valid until it is unlinked (see the module docs),
            // and only this thread links or unlinks its frames.
            while let Some(frame) = unsafe { current.as_ref() } {
                if visit(frame) {
                    return true;
                }
                current = frame.outer.get();
            }
            false
        })
        .unwrap_or(false)
}

/// This thread's running works, outermost first: what a `run_chunked` helper runs on
/// behalf of.
pub(crate) fn snapshot() -> Vec<RunningWork> {
    let mut works = Vec::new();
    any_frame(|frame| {
        // Innermost first, each frame's works reversed: the whole reversed at the end.
        works.extend(frame.works().iter().rev().copied());
        false
    });
    works.reverse();
    works
}

/// The address that identifies a work: its work's data pointer.
pub(crate) fn address(work: &WorkRef) -> usize {
    work.address()
}

fn address_of(work: RunningWork) -> usize {
    work.cast::<()>() as usize
}

/// Whether `work`'s callback is executing on this thread (at any nesting depth).
pub(crate) fn is_running_here(work: &WorkRef) -> bool {
    let address = address(work);
    any_frame(|frame| {
        frame
            .works()
            .iter()
            .any(|&running| address_of(running) == address)
    })
}

/// Whether this thread is executing a callback (of any scheduler).
pub(crate) fn in_callback() -> bool {
    any_frame(|frame| !frame.works().is_empty())
}

/// The addresses of every work running on this thread, outermost first.
pub(crate) fn running_here() -> Vec<usize> {
    snapshot().into_iter().map(address_of).collect()
}

/// The name of the innermost work running on this thread.
pub(crate) fn innermost_name() -> Option<String> {
    let mut name = None;
    any_frame(|frame| match frame.works().last() {
        Some(&work) => {
            // SAFETY: a frame's works are valid while it is linked (see the module docs).
            name = Some(unsafe { &*work }.name().to_owned());
            true
        }
        None => false,
    });
    name
}

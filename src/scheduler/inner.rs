//! The heap half of a work: its header (state, period, name, statistics) and its closure.
//!
//! One `Arc<WorkInner<Closure<F>>>` is allocated per work and shared, unsized to a
//! [`WorkRef`] (`Arc<WorkInner<dyn Callback>>`), by the owning [`Work`](crate::Work)
//! handle, the timer entry while armed, and the thread running it. The header is a plain
//! field in front of the unsized closure, so every path reaches it without a virtual call
//! and without `unsafe`; only calling the closure goes through the vtable. The closure
//! sits behind an `UnsafeCell`: only the thread that set `RUNNING` in the state word
//! (under the core lock) may call it, which is what makes the `unsafe impl Sync` on
//! [`Closure`] sound.
//!
//! # Size
//!
//! Arc counts (16 B) + state (8) + period (8) + name pointer (8) + six statistics words
//! (48) = 88 B before the closure's captures, the size of the kernel's
//! `struct delayed_work`. The default name costs nothing: it is the closure's type name,
//! read from the vtable. A custom name is one extra allocation.

use std::ptr;
use std::sync::Arc;

use super::{Ctx, Next, StatsCounters};
use crate::sync::{AtomicPtr, AtomicU64, Ordering, UnsafeCell};

/// A custom name. Renaming pushes a node and keeps the old ones until the work is freed,
/// so a `&str` handed out by [`Header::name`] stays valid for as long as the work lives
/// even if another thread renames it meanwhile.
struct NameNode {
    name: Box<str>,
    older: *mut NameNode,
}

/// The part of a work that every thread may read.
#[derive(Debug)]
/// Tags: `A:` atomic, with its writers named.
pub(crate) struct Header {
    /// A: the state word (see `state`); written only under the core lock, read anywhere.
    pub(crate) state: AtomicU64,
    /// A: the period for `Again` and `touch`; written by `schedule`/`reschedule` under the
    /// core lock, read anywhere.
    pub(crate) period_ns: AtomicU64,
    /// A: the custom name chain; pushed by `Work::named` with a compare-exchange.
    name: AtomicPtr<NameNode>,
    /// A: run statistics; written by the running thread only (see `stats`).
    pub(crate) stats: StatsCounters,
}

impl Header {
    pub(crate) fn new(state: u64, period_ns: u64) -> Self {
        Header {
            state: AtomicU64::new(state),
            period_ns: AtomicU64::new(period_ns),
            name: AtomicPtr::new(ptr::null_mut()),
            stats: StatsCounters::new(),
        }
    }

    /// The custom name, if one was set.
    pub(crate) fn custom_name(&self) -> Option<&str> {
        let node = self.name.load(Ordering::Acquire);
        // SAFETY: nodes are published with Release after being fully built and are freed
        // only in `Drop`, which cannot run while `&self` is alive.
        unsafe { node.as_ref() }.map(|node| &*node.name)
    }

    pub(crate) fn set_name(&self, name: Box<str>) {
        let mut older = self.name.load(Ordering::Acquire);
        let node = Box::into_raw(Box::new(NameNode { name, older }));
        // The node is complete before it is published: a reader may hold `&NameNode` the
        // moment the exchange succeeds, so nothing may write it afterwards.
        while let Err(current) =
            self.name
                .compare_exchange_weak(older, node, Ordering::AcqRel, Ordering::Acquire)
        {
            older = current;
            // SAFETY: the exchange failed, so `node` is still unpublished and ours alone.
            unsafe { (*node).older = older };
        }
    }
}

impl Drop for Header {
    fn drop(&mut self) {
        let mut node = self.name.swap(ptr::null_mut(), Ordering::Acquire);
        while !node.is_null() {
            // SAFETY: every node was made by `Box::into_raw` in `set_name` and is reachable
            // only through this chain, which we own now.
            let boxed = unsafe { Box::from_raw(node) };
            node = boxed.older;
        }
    }
}

/// A work's closure as the scheduler sees it: the only implementation is [`Closure`].
pub(crate) trait Callback: Send + Sync + 'static {
    /// The closure's type name, the default work name.
    fn type_name(&self) -> &'static str;

    /// Calls the closure.
    ///
    /// # Safety
    ///
    /// The caller must be the thread that set `RUNNING` in this work's state word, and
    /// `RUNNING` must still be set.
    unsafe fn call(&self, cx: &mut Ctx<'_>) -> Next;
}

/// A counted reference to a work, as the scheduler's paths share it.
pub(crate) type WorkRef = Arc<WorkInner<dyn Callback>>;

/// A work's allocation: the header every thread may read, then the closure. Generic over
/// the closure so that it can be unsized to `WorkInner<dyn Callback>`.
pub(crate) struct WorkInner<C: ?Sized> {
    pub(crate) header: Header,
    callback: C,
}

impl<F> WorkInner<Closure<F>>
where
    F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
{
    pub(crate) fn new(header: Header, func: F) -> Self {
        WorkInner {
            header,
            callback: Closure {
                func: UnsafeCell::new(func),
            },
        }
    }
}

impl WorkInner<dyn Callback> {
    /// The header: a plain field, reached without a virtual call.
    #[inline]
    pub(crate) fn header(&self) -> &Header {
        &self.header
    }

    /// The work's name: its custom name or its closure's type name.
    pub(crate) fn name(&self) -> &str {
        self.header
            .custom_name()
            .unwrap_or_else(|| self.callback.type_name())
    }

    /// Calls the closure.
    ///
    /// # Safety
    ///
    /// As [`Callback::call`]: the caller set `RUNNING`, and it is still set.
    pub(crate) unsafe fn call(&self, cx: &mut Ctx<'_>) -> Next {
        // SAFETY: forwarded from the caller.
        unsafe { self.callback.call(cx) }
    }
}

impl std::fmt::Debug for WorkInner<dyn Callback> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkInner")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

/// A work's closure behind the cell that only the running thread may enter.
pub(crate) struct Closure<F> {
    func: UnsafeCell<F>,
}

// SAFETY: the closure is only reached through `call`, whose contract (the RUNNING bit,
// set and cleared under the core lock) gives one thread exclusive access at a time;
// `type_name` does not touch it.
unsafe impl<F: Send> Sync for Closure<F> {}

impl<F> Callback for Closure<F>
where
    F: FnMut(&mut Ctx<'_>) -> Next + Send + 'static,
{
    fn type_name(&self) -> &'static str {
        std::any::type_name::<F>()
    }

    unsafe fn call(&self, cx: &mut Ctx<'_>) -> Next {
        // SAFETY: the caller holds RUNNING, so no other reference to the closure exists.
        self.func.with_mut(|func| unsafe { (*func)(cx) })
    }
}

//! The heap half of a work: its header (state, period, name, statistics) and its closure.
//!
//! One `Arc<WorkCell<F>>` is allocated per work and shared, as `Arc<dyn RunCell>`, by the
//! owning [`Work`](crate::Work) handle, the timer entry while armed, and the thread running
//! it. The closure sits inline behind an `UnsafeCell`: only the thread that set `RUNNING`
//! in the state word (under the core lock) may call it, which is what makes the
//! `unsafe impl Sync` below sound.
//!
//! # Size
//!
//! Arc counts (16 B) + state (8) + period (8) + name pointer (8) + six statistics words
//! (48) = 88 B before the closure's captures, the size of the kernel's
//! `struct delayed_work`. The default name costs nothing: it is the closure's type name,
//! read from the vtable. A custom name is one extra allocation.

use std::ptr;

use super::{Ctx, Next, StatsCell};
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
pub(crate) struct Header {
    pub(crate) state: AtomicU64,
    pub(crate) period_ns: AtomicU64,
    name: AtomicPtr<NameNode>,
    pub(crate) stats: StatsCell,
}

impl Header {
    pub(crate) fn new(state: u64, period_ns: u64) -> Self {
        Header {
            state: AtomicU64::new(state),
            period_ns: AtomicU64::new(period_ns),
            name: AtomicPtr::new(ptr::null_mut()),
            stats: StatsCell::new(),
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

/// A work as the scheduler sees it. The only implementation is [`WorkCell`], so every
/// `dyn RunCell` starts with its [`Header`] (see `header` below).
pub(crate) trait RunCell: Send + Sync + 'static {
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

impl std::fmt::Debug for dyn RunCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCell")
            .field("name", &self.name())
            .finish()
    }
}

impl dyn RunCell {
    /// The header, without a virtual call: `touch()` and every arm go through here.
    #[inline]
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: the only implementor of the crate-private `RunCell` is `WorkCell<F>`,
        // which is `repr(C)` with `header` as its first field, so the data pointer of any
        // `dyn RunCell` points at a valid `Header` living as long as `self`.
        unsafe { &*(self as *const dyn RunCell as *const Header) }
    }

    /// The work's name: its custom name or its closure's type name.
    pub(crate) fn name(&self) -> &str {
        self.header()
            .custom_name()
            .unwrap_or_else(|| self.type_name())
    }
}

/// `repr(C)`, header first: see [`RunCell::header`](trait.RunCell.html).
#[repr(C)]
pub(crate) struct WorkCell<F> {
    header: Header,
    func: UnsafeCell<F>,
}

impl<F> WorkCell<F> {
    pub(crate) fn new(header: Header, func: F) -> Self {
        WorkCell {
            header,
            func: UnsafeCell::new(func),
        }
    }
}

// SAFETY: the closure is only reached through `call`, whose contract (the RUNNING bit,
// set and cleared under the core lock) gives one thread exclusive access at a time; the
// header is Sync on its own.
unsafe impl<F: Send> Sync for WorkCell<F> {}

impl<F> RunCell for WorkCell<F>
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

//! Per-thread records: which id a thread owns in each space, and the thread-local registry
//! that finds a thread's record and releases its ids when the thread exits.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Weak};

use super::space::SpaceInner;
use crate::sync::{thread_local, AtomicUsize, Ordering};

/// `ThreadRec::cid` when the thread owns no id.
pub(crate) const NO_ID: usize = usize::MAX;

/// One thread's membership of one space. Written by its thread (`pin`, `used`, and `cid`
/// only under the space lock) and by the space's reclaimer (`cid`, `used`, under the lock).
#[derive(Debug)]
pub(crate) struct ThreadRec {
    /// The id this thread owns, or `NO_ID`.
    pub(crate) cid: AtomicUsize,
    /// Live guards on this thread (nesting depth); only the thread writes it.
    pub(crate) pin: AtomicUsize,
    /// Entered since the last scan (1) or not (0); a heuristic for the reclaimer only.
    pub(crate) used: AtomicUsize,
    pub(crate) space: Weak<SpaceInner>,
}

impl ThreadRec {
    pub(crate) fn new(space: Weak<SpaceInner>) -> Self {
        ThreadRec {
            cid: AtomicUsize::new(NO_ID),
            pin: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
            space,
        }
    }
}

/// The thread's records, by space serial number.
struct Registry {
    records: RefCell<Vec<(u64, Arc<ThreadRec>)>>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        // The cache must not point into records that are going away.
        // `try_with`: loom destroys its mock thread-locals in any order.
        let _ = LAST.try_with(|last| last.set((0, std::ptr::null())));
        // Thread exit: release every id at once, before `join()` returns elsewhere.
        for (_, record) in self.records.get_mut().drain(..) {
            if let Some(space) = record.space.upgrade() {
                space.release_thread(&record);
            }
        }
    }
}

thread_local! {
    // loom's thread_local! has no `const { }` form, and this must build with both.
    #[allow(clippy::missing_const_for_thread_local)]
    static REGISTRY: Registry = Registry {
        records: RefCell::new(Vec::new()),
    };
}

// The fast path's one-entry cache: the last record looked up (its space serial and a
// pointer kept alive by `REGISTRY`). It has no destructor, so std can make it a plain
// `#[thread_local]` access with no lazy-initialisation check; `Registry::drop` clears it.
#[cfg(not(all(loom, feature = "loom")))]
thread_local! {
    static LAST: Cell<(u64, *const ThreadRec)> = const { Cell::new((0, std::ptr::null())) };
}

#[cfg(all(loom, feature = "loom"))]
thread_local! {
    #[allow(clippy::missing_const_for_thread_local)]
    static LAST: Cell<(u64, *const ThreadRec)> = Cell::new((0, std::ptr::null()));
}

/// The calling thread's record for `space`, registering it on first use. `None` while the
/// thread's locals are being destroyed.
#[inline]
pub(crate) fn record(space: &Arc<SpaceInner>) -> Option<*const ThreadRec> {
    let (last_serial, last) = LAST.with(Cell::get);
    if last_serial == space.serial {
        return Some(last);
    }
    REGISTRY
        .try_with(|registry| lookup_or_register(registry, space))
        .ok()
}

#[cold]
fn lookup_or_register(registry: &Registry, space: &Arc<SpaceInner>) -> *const ThreadRec {
    let mut records = registry.records.borrow_mut();
    let found = records
        .iter()
        .find(|(serial, _)| *serial == space.serial)
        .map(|(_, record)| Arc::as_ptr(record));
    let record = match found {
        Some(record) => record,
        None => {
            // Forget records of spaces that are gone, so long-lived threads do not collect
            // them.
            records.retain(|(_, record)| record.space.strong_count() > 0);
            let record = Arc::new(ThreadRec::new(Arc::downgrade(space)));
            space.add_thread(record.clone());
            let pointer = Arc::as_ptr(&record);
            records.push((space.serial, record));
            pointer
        }
    };
    LAST.with(|last| last.set((space.serial, record)));
    record
}

/// Marks `record` as used since the last scan, without a read-modify-write.
#[inline]
pub(crate) fn mark_used(record: &ThreadRec) {
    if record.used.load(Ordering::Relaxed) == 0 {
        record.used.store(1, Ordering::Relaxed);
    }
}

//! The list of a scheduler's live works, for [`Scheduler::works`](crate::Scheduler::works).
//!
//! # Membership
//!
//! A work is listed from its creation until its life ends: the moment its closure is
//! dropped by whoever ends that life (the handle's drop, the runner of an orphaned or
//! detached work, the shutdown), which unlists it *before* dropping the closure and
//! while it still holds a reference. A `once` work whose run consumed its closure stays
//! listed while its handle lives. A work made in a `fork()`ed child's inert copy of a
//! scheduler is not listed (nothing may take the copy's locks).
//!
//! # Why a listed work can be referenced
//!
//! The registry holds no reference: a listed work is kept alive by the thread that will
//! unlist it, which takes the registry lock to do so. So under that lock every listed
//! work has a live reference elsewhere, and [`Shared::live_works`] may add one of its
//! own, as cloning an `Arc` would. Every work's allocation is freed after its closure,
//! so after its unlisting (`WorkInner`'s drop checks it in debug builds).
//!
//! # Layout and cost
//!
//! One word per slot: a pointer to a listed work's header (8-aligned, so its low bit is
//! 0), or a vacant slot's link to the next vacant one (odd). Each work keeps its slot number
//! in its header (`registry_key`), so listing and unlisting are O(1): one lock, a slot
//! write. With the vector's growth a work costs 8–16 B here (about 10.5 B at 100k works).
//! The vector shrinks (moving works to the front, their keys rewritten under the lock)
//! once three quarters of it are vacant, so it follows the live works down as well.
//!
//! The lock is `T:` (see the legend in `sync`): it is held for a
//! slot write, or for one pass that adds a reference per listed work, and never with
//! the core lock.

use std::ptr::NonNull;
use std::time::Instant;

use super::{Header, WorkRef, WorkStats};
use crate::scheduler::shared::Shared;

use crate::sync::lock_std;

/// A work's `registry_key` while it is not listed: the largest 31-bit key (the word's top
/// bit says whether the work is named).
pub(crate) const NOT_LISTED: u32 = (1 << 31) - 1;

/// Marks a vacant slot's link (a header address is even).
const VACANT: usize = 1;

/// The end of the vacant slots' chain (a link keeps its slot number shifted left by one).
const NO_VACANT: usize = usize::MAX >> 1;
/// Below this many slots the vector is never shrunk.
const MIN_SHRINK_SLOTS: usize = 64;

/// The slots (see the module docs).
#[derive(Debug)]
pub(crate) struct Registry {
    /// A listed work's header, or a vacant slot's link: a pointer with no provenance
    /// whose address is `next << 1 | VACANT`.
    slots: Vec<*const Header>,
    /// The first vacant slot, or `NO_VACANT`.
    vacant: usize,
    /// Listed works.
    listed: usize,
}

// SAFETY: the pointers are to works, which are `Send + Sync`; they are only followed
// under the registry's lock, while the works are alive (see the module docs).
unsafe impl Send for Registry {}

impl Registry {
    pub(crate) const fn new() -> Registry {
        Registry {
            slots: Vec::new(),
            vacant: NO_VACANT,
            listed: 0,
        }
    }

    /// Lists `header`'s work; returns its slot, or `None` when the slots would pass
    /// `NOT_LISTED` (two billion live works: it is then simply not listed).
    fn insert(&mut self, header: NonNull<Header>) -> Option<u32> {
        let header = header.as_ptr().cast_const();
        debug_assert_eq!(header.addr() & VACANT, 0, "headers are 8-aligned");
        let key = if self.vacant != NO_VACANT {
            let key = self.vacant;
            self.vacant = self.slots[key].addr() >> 1;
            self.slots[key] = header;
            key
        } else {
            let key = self.slots.len();
            if key >= NOT_LISTED as usize {
                return None;
            }
            self.slots.push(header);
            key
        };
        self.listed += 1;
        Some(key as u32)
    }

    /// Unlists the work in slot `key`.
    fn remove(&mut self, key: u32) {
        let key = key as usize;
        debug_assert_eq!(self.slots[key].addr() & VACANT, 0, "slot {key} was listed");
        self.slots[key] = std::ptr::without_provenance((self.vacant << 1) | VACANT);
        self.vacant = key;
        self.listed -= 1;
        if self.slots.len() >= MIN_SHRINK_SLOTS && self.listed * 4 <= self.slots.len() {
            self.shrink();
        }
    }

    /// Moves the listed works to the front and frees the rest.
    fn shrink(&mut self) {
        let mut kept = 0;
        for key in 0..self.slots.len() {
            let header = self.slots[key];
            if header.addr() & VACANT != 0 {
                continue;
            }
            self.slots[kept] = header;
            // SAFETY: a listed work is alive while the lock is held (see the module
            // docs); its key is only written under the lock.
            unsafe { &*header }.set_registry_key(kept as u32);
            kept += 1;
        }
        self.slots.truncate(kept);
        self.slots.shrink_to(kept * 2);
        self.vacant = NO_VACANT;
    }

    /// Every listed work's header.
    fn each(&self, mut f: impl FnMut(NonNull<Header>)) {
        for &header in &self.slots {
            if header.addr() & VACANT == 0 {
                f(NonNull::new(header.cast_mut()).expect("a listed header is not null"));
            }
        }
    }
}

// === `impl Shared`, this file's part: listing and unlisting works, and the list
// `Scheduler::works` shows. ===
impl Shared {
    /// Lists a work that was just made (see the module docs).
    pub(crate) fn register(&self, work: &WorkRef) {
        if self.is_forked_copy() {
            return;
        }
        let header = work.header_ptr();
        if let Some(key) = lock_std(&self.registry).insert(header) {
            work.header().set_registry_key(key);
        }
    }

    /// Unlists a work whose life ends; the caller holds a reference. Nothing if it is not
    /// listed (any more).
    pub(crate) fn unregister(&self, work: &WorkRef) {
        if work.header().registry_key() == NOT_LISTED || self.is_forked_copy() {
            return;
        }
        let mut registry = lock_std(&self.registry);
        // Read again under the lock: a shrink may have moved the work meanwhile.
        let key = work.header().registry_key();
        if key != NOT_LISTED {
            registry.remove(key);
            work.header().set_registry_key(NOT_LISTED);
        }
    }

    /// A reference to every listed work.
    pub(crate) fn live_works(&self) -> Vec<WorkRef> {
        if self.is_forked_copy() {
            return Vec::new();
        }
        let registry = lock_std(&self.registry);
        let mut works = Vec::with_capacity(registry.listed);
        // SAFETY: a listed work is alive while the lock is held (see the module docs).
        registry.each(|header| works.push(unsafe { WorkRef::clone_from_raw(header) }));
        works
    }

    /// Calls `f` with a [`WorkInfo`] of every listed work, with no lock held (see
    /// [`Scheduler::works`](crate::Scheduler::works)).
    pub(crate) fn visit_works(&self, mut f: impl FnMut(&WorkInfo<'_>)) {
        for work in self.live_works() {
            let state = work.header().state.load();
            let info = WorkInfo {
                name: work.name(),
                stats: self.stats_of(&work),
                deadline: self.deadline_of(&work),
                running: state.is_running(),
                poisoned: state.is_poisoned(),
            };
            f(&info);
        }
    }
}

/// One live work, as [`Scheduler::works`](crate::Scheduler::works) shows it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Scheduler};
///
/// let sched = Scheduler::manual();
/// let _purge = sched.every(Duration::from_secs(1), |_| Next::Again).named("purge");
/// let mut names = Vec::new();
/// sched.works(|w| names.push((w.name.to_string(), w.deadline.is_some())));
/// assert_eq!(names, [("purge".to_string(), true)]);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkInfo<'a> {
    /// Its [`named`](crate::Work::named) name, or its closure's type name.
    pub name: &'a str,
    /// Its statistics, as [`Work::stats`](crate::Work::stats).
    pub stats: WorkStats,
    /// When it is due, if armed, as [`Work::deadline`](crate::Work::deadline).
    pub deadline: Option<Instant>,
    /// Whether its callback is executing.
    pub running: bool,
    /// Whether its callback panicked (it never runs again).
    pub poisoned: bool,
}

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
//! The slots themselves (one word per work, O(1) listing and unlisting, shrinking with
//! the live works) are `listed_slots.rs`.
//!
//! The lock is `T:` (see the legend in `sync`): it is held for a
//! slot write, or for one pass that adds a reference per listed work, and never with
//! the core lock.

use std::time::{Duration, Instant};

use super::listed_slots::NOT_LISTED;
use super::state::Kind;
use super::{WorkRef, WorkStats};
use crate::contain::contain;
use crate::scheduler::shared::Shared;
use crate::sync::lock_std;

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
            // SAFETY: a listed work is alive while the lock is held (see the module docs);
            // its key is only written under the lock.
            registry.remove(key, |header, key| {
                unsafe { header.as_ref() }.set_registry_key(key)
            });
            work.header().set_registry_key(NOT_LISTED);
        }
    }

    /// Ends a work's life: unlists it, then drops its closure, whose destructor is user
    /// code (a panic there is caught and logged).
    pub(crate) fn end_life(&self, work: &WorkRef) {
        self.unregister(work);
        self.forget_tick_idle(work);
        contain("a work's closure panicked while being dropped", || {
            // SAFETY: the caller ends the work's life: the handle is gone or going, no run
            // is in progress and none can start (`ORPHANED` refuses every arm).
            unsafe { work.drop_closure() }
        });
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
                id: work.id(),
                kind: WorkKind::of(state.kind(), work.is_once()),
                period: self.period_of(&work),
                leeway: self.leeway_of(work.header()),
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
    /// Its id, as [`Work::id`](crate::Work::id): works with the same default name (the
    /// closure's type) still differ here.
    pub id: u64,
    /// Which constructor made it.
    pub kind: WorkKind,
    /// Its period, as [`Work::period`](crate::Work::period) (a timeout's idle time).
    pub period: Duration,
    /// How late it may run to share a wakeup, as [`Ctx::leeway`](crate::Ctx::leeway)
    /// reads it (the scheduler's slack when it has no longer one of its own).
    pub leeway: Duration,
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

/// Which constructor made a work, as [`WorkInfo::kind`] shows it. The per-object
/// constructors (`work_for`, `every_for`, `timeout_for`) make the kind of their plain
/// counterpart.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Scheduler, WorkKind};
///
/// let sched = Scheduler::manual();
/// let _reaper = sched.timeout(Duration::from_secs(30), |_| Next::Park);
/// let mut kinds = Vec::new();
/// sched.works(|w| kinds.push(w.kind));
/// assert_eq!(kinds, [WorkKind::Timeout]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WorkKind {
    /// [`Scheduler::work`](crate::Scheduler::work): its period follows its arms.
    Work,
    /// [`Scheduler::once`](crate::Scheduler::once): runs at most once.
    Once,
    /// [`Scheduler::every`](crate::Scheduler::every): a fixed period.
    Every,
    /// [`Scheduler::timeout`](crate::Scheduler::timeout): an idle timeout.
    Timeout,
}

impl WorkKind {
    fn of(kind: Kind, once: bool) -> WorkKind {
        match kind {
            Kind::Timeout => WorkKind::Timeout,
            Kind::FixedPeriod => WorkKind::Every,
            Kind::FollowsArms if once => WorkKind::Once,
            Kind::FollowsArms => WorkKind::Work,
        }
    }

    /// A lower-case name, for labels: `work`, `once`, `every` or `timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkKind::Work => "work",
            WorkKind::Once => "once",
            WorkKind::Every => "every",
            WorkKind::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for WorkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

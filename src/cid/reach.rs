//! Which [`PerCid`](crate::PerCid)s a trim must visit: the space's index of its storages
//! by **reach**, one past the highest id whose slot may hold a value (0: none may).
//!
//! A trim takes values only from slots at or above the high water, so a storage whose
//! reach is at or below it has nothing to trim, and a scan visits only the storages
//! indexed above the high water: 30,000 `PerCid`s whose slots all lie below it cost the
//! scan nothing, however busy their owners are.
//!
//! # Invariants (all under the space lock)
//!
//! - **The reach is an upper bound.** Every slot holding a value has an id below its
//!   storage's reach, whenever the space lock is free. A slot gets a value only from the
//!   owner of its id (`init`, `put`), which raises the reach under the space lock first
//!   if the id is not below it (`SpaceInner::raise_reach`), while it pins the id; a trim
//!   lowers it only to its threshold, after taking every value at or above that, and
//!   the threshold is at least the high water, above every owned id.
//! - **The index is the reach.** A live storage with reach `r > 0` is in `by_reach[r - 1]`
//!   under its serial number, and nowhere else; reach 0 is in no list. A `PerCid`'s drop
//!   takes its storage out.
//! - **Owners pay once per id.** An owner reads the reach without the lock (a relaxed load
//!   of a word no one writes while it pins an id below it) and takes the lock only when
//!   its id is at or above it: the first value of each id, or the first after a trim.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Weak};

use super::space::Trim;

/// The index's keys are serial numbers, unique and handed out by a counter: a
/// multiplication spreads them over a table's buckets as well as SipHash would, at a
/// fraction of its cost (a scan that trims 30,000 storages moves each between two lists).
#[derive(Default)]
struct SerialHasher(u64);

impl Hasher for SerialHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, serial: u64) {
        self.0 = serial.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A list of storages by serial number.
type Storages = HashMap<u64, Weak<dyn Trim>, BuildHasherDefault<SerialHasher>>;

/// See the module docs. Under the space lock.
#[derive(Default)]
pub(super) struct ReachIndex {
    /// `by_reach[r - 1]`: the storages whose reach is `r`, by serial number.
    by_reach: Vec<Storages>,
}

impl std::fmt::Debug for ReachIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReachIndex")
            .field(
                "storages",
                &self.by_reach.iter().map(Storages::len).sum::<usize>(),
            )
            .finish()
    }
}

impl ReachIndex {
    /// Moves `storage` to reach `new`: in the index and in its own `reach` word, which
    /// only this (under the space lock) and `remove`'s caller write.
    pub(super) fn move_to(&mut self, storage: &Reachable, new: usize) {
        let old = storage.reach.load(crate::sync::Ordering::Relaxed);
        self.set(storage.serial, &storage.storage, old, new);
        storage.reach.store(new, crate::sync::Ordering::Relaxed);
    }

    /// Moves storage `serial` from reach `old` to reach `new`.
    fn set(&mut self, serial: u64, storage: &Weak<dyn Trim>, old: usize, new: usize) {
        if old == new {
            return;
        }
        self.remove(serial, old);
        if new > 0 {
            if self.by_reach.len() < new {
                self.by_reach.resize_with(new, Storages::default);
            }
            self.by_reach[new - 1].insert(serial, storage.clone());
        }
    }

    /// Takes storage `serial`, of reach `reach`, out of the index.
    pub(super) fn remove(&mut self, serial: u64, reach: usize) {
        let Some(list) = reach
            .checked_sub(1)
            .and_then(|at| self.by_reach.get_mut(at))
        else {
            return;
        };
        list.remove(&serial);
        if list.capacity() >= 4 * list.len().max(4) {
            list.shrink_to(list.len());
        }
        while self.by_reach.last().is_some_and(Storages::is_empty) {
            self.by_reach.pop();
        }
        if self.by_reach.capacity() >= 4 * self.by_reach.len().max(4) {
            self.by_reach.shrink_to(self.by_reach.len());
        }
    }

    /// The live storages whose reach is above `high_water`: the only ones a trim at that
    /// high water can take values from. Forgets the dropped ones it meets.
    pub(super) fn above(&mut self, high_water: usize) -> Vec<Arc<dyn Trim>> {
        let mut live = Vec::new();
        for list in self.by_reach.iter_mut().skip(high_water) {
            list.retain(|_, storage| match storage.upgrade() {
                Some(storage) => {
                    live.push(storage);
                    true
                }
                None => false,
            });
        }
        live
    }
}

/// `Reachable::reach` once the storage's `PerCid` is dropped: out of the index for good,
/// also if a trim that was running meanwhile lowers its reach.
pub(super) const FORGOTTEN: usize = usize::MAX;

/// A storage's entry in its space's index: its serial number, a handle the index keeps,
/// its reach and its retention.
pub(crate) struct Reachable {
    /// A number no other storage has: its key in the index and in the owners' slot
    /// caches (`slots.rs`).
    pub(super) serial: u64,
    /// What the index keeps (`Weak`: the index never keeps a `PerCid`'s storage alive).
    pub(super) storage: Weak<dyn Trim>,
    /// A: one past the highest id whose slot may hold a value, or `FORGOTTEN`. Written
    /// under the space lock; read without it by owners, as a hint (see the module docs).
    pub(super) reach: crate::sync::AtomicUsize,
    /// A: the storage's retention in nanoseconds (0: none). Written under the space lock
    /// by `PerCid::retention`; read by its trims under it.
    pub(super) retention: crate::sync::AtomicU64,
    /// A: set while the storage is in the space's list of queues to drain
    /// (`SpaceInner::request_drain`); cleared by the scan that takes it off.
    pub(super) drain_requested: crate::sync::AtomicBool,
}

impl Reachable {
    pub(super) fn new(serial: u64, storage: Weak<dyn Trim>) -> Self {
        Reachable {
            serial,
            storage,
            reach: crate::sync::AtomicUsize::new(0),
            retention: crate::sync::AtomicU64::new(0),
            drain_requested: crate::sync::AtomicBool::new(false),
        }
    }
}

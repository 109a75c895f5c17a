//! The deadline structure: a hierarchical wheel of slots holding entries, plus the ready
//! queue of entries that are due. `mod.rs` holds the structure and its operations,
//! `geometry.rs` the wheel's geometry (levels, slots, which slot a deadline goes to).
//!
//! # Ground rules
//!
//! - The structure stores opaque values with the deadline they were placed for. It never
//!   removes a value on request: removal is *lazy*. When a slot's tick comes, every value
//!   in it is handed to the owner's `decide` callback, which drops it (stale), or returns
//!   it with the deadline it must wait for now (it is then placed again: one level lower,
//!   or on the ready queue if due). So placing a value is O(1), and the owner can move a
//!   deadline *later* without touching the structure at all; the owner keeps, per value,
//!   the rule for which of its entries are live (see the scheduler's state word).
//! - Deadlines are in units; the wheel's tick is a whole number of units (the scheduler's
//!   slack), and a deadline is rounded up to whole ticks, so all deadlines within one tick
//!   fire in one wakeup and none fires early.
//! - The ready queue is ordered by deadline (ties keep arrival order), so works run in
//!   deadline order, and a `Yield` (deadline "now") goes behind everything already due.
//! - Slots hold values in fixed-size chunks, so the memory per value is the value's size
//!   plus a fraction of a chunk header, whatever the number of values per slot.
//!
//! The structure is single-threaded; the scheduler keeps it under its core lock.

mod geometry;

use std::collections::VecDeque;

use geometry::{Geometry, LEVELS, SLOTS};

/// Values per chunk of a slot.
const CHUNK: usize = 64;
/// Ready-queue capacity kept once the queue is empty again.
const READY_KEPT: usize = 256;
/// Empty chunks kept for reuse.
const SPARE_CHUNKS: usize = 16;

/// What a slot holds: chunks of at most `CHUNK` values, each allocated at that capacity,
/// and the earliest tick any of them was placed for.
#[derive(Debug)]
struct Bag<T> {
    chunks: Vec<Vec<T>>,
    /// The earliest tick of a value placed here since the slot was last processed
    /// (`u64::MAX` when it holds none). A lower bound after a sweep removed some.
    first_tick: u64,
}

/// Appends `value` to a slot's chunks, starting a chunk (a spare one if there is one)
/// when the last is full.
fn push_chunked<T>(chunks: &mut Vec<Vec<T>>, spare: &mut Vec<Vec<T>>, value: T) {
    match chunks.last_mut() {
        Some(chunk) if chunk.len() < CHUNK => chunk.push(value),
        _ => {
            let mut chunk = spare.pop().unwrap_or_else(|| Vec::with_capacity(CHUNK));
            chunk.push(value);
            chunks.push(chunk);
        }
    }
}

/// Timer entries, placed by deadline.
#[derive(Debug)]
pub(crate) struct Wheel<T> {
    geometry: Geometry,
    slots: Box<[Bag<T>]>,
    ready: VecDeque<(u64, T)>,
    tick_units: u64,
    len: usize,
    spare: Vec<Vec<T>>,
}

impl<T> Wheel<T> {
    /// An empty structure whose tick (and so coalescing window) is `tick_units`.
    pub(crate) fn new(tick_units: u64) -> Self {
        Wheel {
            geometry: Geometry::new(),
            slots: (0..LEVELS * SLOTS)
                .map(|_| Bag {
                    chunks: Vec::new(),
                    first_tick: u64::MAX,
                })
                .collect(),
            ready: VecDeque::new(),
            tick_units: tick_units.max(1),
            len: 0,
            spare: Vec::new(),
        }
    }

    /// Number of values held (live or not: stale ones leave when their slot comes).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Places `value` for `deadline`. A deadline at or before `now` is due at once.
    pub(crate) fn insert(&mut self, value: T, deadline: u64, now: u64) {
        self.len += 1;
        self.place(value, deadline, now);
    }

    fn place(&mut self, value: T, deadline: u64, now: u64) {
        let tick = deadline.div_ceil(self.tick_units);
        if deadline <= now || tick <= self.geometry.elapsed {
            let at = self.ready.partition_point(|(due, _)| *due <= deadline);
            self.ready.insert(at, (deadline, value));
        } else {
            self.place_in_wheel(value, tick);
        }
    }

    /// Places a value that was taken from the ready queue and turned out not to be due
    /// at `deadline` yet: in the wheel, at the next tick at the earliest, so it is not
    /// judged again before time has moved.
    pub(crate) fn defer(&mut self, value: T, deadline: u64) {
        self.len += 1;
        let tick = deadline
            .div_ceil(self.tick_units)
            .max(self.geometry.elapsed + 1);
        self.place_in_wheel(value, tick);
    }

    fn place_in_wheel(&mut self, value: T, tick: u64) {
        let (level, slot) = self.geometry.position(tick);
        self.geometry.set_occupied(level, slot, true);
        let bag = &mut self.slots[level * SLOTS + slot];
        bag.first_tick = bag.first_tick.min(tick);
        push_chunked(&mut bag.chunks, &mut self.spare, value);
    }

    /// Processes every slot due at `now`: each value in it goes through `decide`, which
    /// drops it (`None`) or returns it with the deadline it waits for now.
    pub(crate) fn expire(&mut self, now: u64, mut decide: impl FnMut(T) -> Option<(T, u64)>) {
        let now_tick = now / self.tick_units;
        while let Some(exp) = self.geometry.next_expiration() {
            if exp.tick > now_tick {
                break;
            }
            self.geometry.elapsed = exp.tick;
            self.geometry.set_occupied(exp.level, exp.slot, false);
            let bag = &mut self.slots[exp.level * SLOTS + exp.slot];
            bag.first_tick = u64::MAX;
            let chunks = std::mem::take(&mut bag.chunks);
            for mut chunk in chunks {
                for value in chunk.drain(..) {
                    match decide(value) {
                        Some((value, deadline)) => self.place(value, deadline, now),
                        None => self.len -= 1,
                    }
                }
                if self.spare.len() < SPARE_CHUNKS {
                    self.spare.push(chunk);
                }
            }
        }
        if now_tick > self.geometry.elapsed {
            self.geometry.elapsed = now_tick;
        }
    }

    /// Takes the first due value and the deadline it was placed for. The caller owns it
    /// now; it goes back with [`insert`](Self::insert) if it must wait again.
    pub(crate) fn pop_ready(&mut self) -> Option<(u64, T)> {
        let popped = self.ready.pop_front();
        if popped.is_some() {
            self.len -= 1;
        }
        if self.ready.is_empty() && self.ready.capacity() > READY_KEPT {
            // A burst is over: memory follows the load, not its peak.
            self.ready.shrink_to(READY_KEPT);
        }
        popped
    }

    /// Whether any value is due.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// When the structure must be looked at next (in units): `now` if a value is ready,
    /// else the earliest tick placed in the first occupied slot. `None` when it holds
    /// nothing.
    ///
    /// Not the slot's start (nor later than its end): a coarse slot (level 1 and up) is
    /// processed whenever
    /// [`expire`](Self::expire) first runs at or after its start, and nothing in it is
    /// due before its earliest tick, so waking then processes the slot (cascading the
    /// rest of it one level down) and finds that value due in the same wakeup. A lone
    /// periodic deadline costs one wakeup, whatever level it waits in.
    pub(crate) fn next_wake(&self, now: u64) -> Option<u64> {
        if self.has_ready() {
            return Some(now);
        }
        self.geometry.next_expiration().map(|exp| {
            let first = self.slots[exp.level * SLOTS + exp.slot].first_tick;
            // Capped at the slot's end: a top-level slot also holds deadlines past the
            // horizon, re-placed when it comes round, and every later slot starts at or
            // after that end, so waking later could sleep past them.
            let end = exp
                .tick
                .saturating_add(1u64 << (exp.level as u32 * geometry::SLOT_BITS));
            exp.tick.max(first.min(end)).saturating_mul(self.tick_units)
        })
    }

    /// Calls `f` with every value.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&T)) {
        self.ready.iter().for_each(|(_, value)| f(value));
        for bag in self.slots.iter() {
            bag.chunks.iter().flatten().for_each(&mut f);
        }
    }

    /// Keeps only the values `keep` accepts (a sweep of the whole structure). Values are
    /// offered in the order they would be processed: the ready queue, then the slots by
    /// the tick they come due (values within one slot in any order).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.ready.retain(|(_, value)| keep(value));
        let mut len = self.ready.len();
        let mut order: Vec<(u64, usize)> = (0..LEVELS * SLOTS)
            .filter(|&index| !self.slots[index].chunks.is_empty())
            .map(|index| (self.geometry.slot_tick(index / SLOTS, index % SLOTS), index))
            .collect();
        order.sort_unstable();
        for (_, index) in order {
            let bag = &mut self.slots[index];
            let mut kept: Vec<Vec<T>> = Vec::new();
            for mut chunk in std::mem::take(&mut bag.chunks) {
                for value in chunk.drain(..) {
                    if !keep(&value) {
                        continue;
                    }
                    push_chunked(&mut kept, &mut self.spare, value);
                    len += 1;
                }
                if self.spare.len() < SPARE_CHUNKS {
                    self.spare.push(chunk);
                }
            }
            self.geometry
                .set_occupied(index / SLOTS, index % SLOTS, !kept.is_empty());
            if kept.is_empty() {
                bag.first_tick = u64::MAX;
            }
            // Else `first_tick` stays: a lower bound, which at worst wakes once early.
            bag.chunks = kept;
        }
        self.len = len;
    }

    /// Removes every value.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let mut all: Vec<T> = self.ready.drain(..).map(|(_, value)| value).collect();
        for bag in self.slots.iter_mut() {
            for chunk in bag.chunks.drain(..) {
                all.extend(chunk);
            }
            bag.first_tick = u64::MAX;
        }
        self.geometry = Geometry::new();
        self.len = 0;
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unit tests place plain values and keep their deadlines in the value itself.
    fn keep(value: (&'static str, u64)) -> Option<((&'static str, u64), u64)> {
        Some((value, value.1))
    }

    fn drain_ready(timers: &mut Wheel<(&'static str, u64)>) -> Vec<&'static str> {
        let mut out = Vec::new();
        while let Some((_, (name, _))) = timers.pop_ready() {
            out.push(name);
        }
        out
    }

    #[test]
    fn entries_expire_in_deadline_order_and_never_early() {
        let mut timers = Wheel::new(10);
        for value in [("c", 35), ("a", 10), ("b", 30), ("far", 700_000)] {
            timers.insert(value, value.1, 0);
        }
        timers.expire(30, keep);
        assert_eq!(drain_ready(&mut timers), ["a", "b"]);
        timers.expire(40, keep);
        assert_eq!(drain_ready(&mut timers), ["c"]);
        timers.expire(699_999, keep);
        assert!(drain_ready(&mut timers).is_empty());
        timers.expire(700_000, keep);
        assert_eq!(drain_ready(&mut timers), ["far"]);
        assert_eq!(timers.len(), 0);
    }

    #[test]
    fn dropped_values_never_come_back_and_moved_ones_wait() {
        let mut timers = Wheel::new(10);
        timers.insert(("a", 50), 50, 0);
        timers.insert(("b", 50), 50, 0);
        timers.insert(("later", 50), 50, 0);
        timers.expire(50, |value| match value.0 {
            "a" => None,
            "later" => Some((value, 90)),
            _ => keep(value),
        });
        assert_eq!(drain_ready(&mut timers), ["b"]);
        assert_eq!(timers.len(), 1);
        timers.expire(89, keep);
        assert!(!timers.has_ready());
        timers.expire(90, keep);
        assert_eq!(drain_ready(&mut timers), ["later"]);
    }

    #[test]
    fn next_wake_is_the_first_occupied_slot() {
        let mut timers = Wheel::new(10);
        assert_eq!(timers.next_wake(0), None);
        timers.insert(("a", 21), 21, 0);
        assert_eq!(timers.next_wake(0), Some(30));
        timers.insert(("now", 0), 0, 0);
        assert_eq!(timers.next_wake(7), Some(7));
    }

    #[test]
    fn retain_keeps_exactly_the_accepted_values_in_place() {
        let mut timers = Wheel::new(10);
        for i in 0..300u64 {
            timers.insert(("x", 100 + i), 100 + i, 0);
        }
        timers.insert(("now", 0), 0, 0);
        timers.retain(|value| value.1 % 2 == 0);
        assert_eq!(timers.len(), 151);
        timers.expire(1_000, keep);
        let mut fired = 0;
        while let Some((_, (_, deadline))) = timers.pop_ready() {
            assert_eq!(deadline % 2, 0);
            fired += 1;
        }
        assert_eq!(fired, 151);
        assert_eq!(timers.next_wake(1_000), None);
    }

    #[test]
    fn retain_offers_values_in_processing_order() {
        let mut timers = Wheel::new(1);
        for deadline in [5_000u64, 70, 3, 64 * 64 * 3, 200] {
            timers.insert(("x", deadline), deadline, 0);
        }
        timers.insert(("now", 0), 0, 0);
        let mut seen = Vec::new();
        timers.retain(|value| {
            seen.push(value.1);
            true
        });
        assert_eq!(seen, [0, 3, 70, 200, 5_000, 64 * 64 * 3]);
    }

    #[test]
    fn saturated_deadlines_stay_in_the_wheel() {
        let mut timers = Wheel::new(10);
        timers.insert(("never", u64::MAX), u64::MAX, 0);
        for step in 1..200u64 {
            timers.expire(step * 1_000_000_000, keep);
            assert!(!timers.has_ready());
        }
        assert_eq!(timers.len(), 1);
    }

    #[test]
    fn many_values_in_one_slot_use_whole_chunks() {
        let mut timers = Wheel::new(10);
        for i in 0..1000 {
            timers.insert(("x", 500 + i % 3), 500, 0);
        }
        let chunks: usize = timers.slots.iter().map(|bag| bag.chunks.len()).sum();
        assert_eq!(chunks, 1000usize.div_ceil(CHUNK));
        timers.expire(510, keep);
        assert_eq!(drain_ready(&mut timers).len(), 1000);
    }

    #[test]
    fn random_inserts_and_drops_match_a_reference() {
        // A small deterministic generator keeps this test free of dependencies.
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        const TICK: u64 = 10;
        let mut timers: Wheel<(u32, u64)> = Wheel::new(TICK);
        // Live values by id; a value whose id is gone is stale and must be dropped.
        let mut live: std::collections::HashMap<u32, u64> = Default::default();
        let mut now = 0u64;
        let mut id = 0u32;
        for _ in 0..20_000 {
            match next() % 4 {
                0 | 1 => {
                    let deadline = now + next() % 50_000;
                    id += 1;
                    timers.insert((id, deadline), deadline, now);
                    live.insert(id, deadline);
                }
                2 if !live.is_empty() => {
                    let victim = *live.keys().nth((next() as usize) % live.len()).unwrap();
                    live.remove(&victim);
                }
                _ => {
                    now += next() % 500;
                    timers.expire(now, |(id, deadline)| {
                        live.contains_key(&id).then_some(((id, deadline), deadline))
                    });
                    while let Some((_, (id, deadline))) = timers.pop_ready() {
                        if live.remove(&id).is_some() {
                            assert!(deadline <= now, "fired early");
                        }
                    }
                    let late = live.values().filter(|d| d.div_ceil(TICK) * TICK <= now);
                    assert_eq!(late.count(), 0, "a value due by now did not fire");
                }
            }
        }
    }

    /// `next_wake` and `expire` with deadlines across every level and past the horizon.
    #[path = "far_deadlines.rs"]
    mod far_deadlines;
}

//! The deadline structure: a hierarchical wheel of slots holding entries, plus the ready
//! queue of entries that are due. `mod.rs` holds the structure and its operations,
//! `geometry.rs` the wheel's geometry (levels, slots, which slot a deadline goes to).
//!
//! # Ground rules
//!
//! - The structure stores opaque values with the window they were placed for: a deadline,
//!   before which the value is never due, and an end, by which the owner wants it looked
//!   at (its leeway; the end is the deadline when it has none). It never removes a value
//!   on request: removal is *lazy*. When a slot's tick comes, every value in it is handed
//!   to the owner's `decide` callback, which drops it (stale), or returns it with the
//!   window it must wait for now (it is then placed again: one level lower, or on the
//!   ready queue if due). So placing a value is O(1), and the owner can move a deadline
//!   *later* without touching the structure at all; the owner keeps, per value, the rule
//!   for which of its entries are live (see the scheduler's state word).
//! - Deadlines and ends are in units; the wheel's tick is a whole number of units (the
//!   scheduler's slack), and both are rounded up to whole ticks, so all deadlines within
//!   one tick fire in one wakeup and none fires early.
//! - Values are placed by deadline, so one pass over the slots that have come makes
//!   everything due ready; the ends only decide when to look. [`next_wake`](Wheel::next_wake)
//!   is the earliest end: waking then makes ready every value whose deadline has come,
//!   so values whose windows overlap share the wakeup (the greedy rule: wake at the
//!   earliest end, run every window that has opened). Each slot keeps the earliest end
//!   placed in it, and the search stops at the first slot that starts after the best end
//!   found, so it looks at the few slots before that end, not at every value.
//! - The ready queue is ordered by end (ties keep arrival order): due works run earliest
//!   end first, so the one whose window closes first is not kept waiting by those that
//!   can still wait. A value without a leeway ends at its deadline, so such values run in
//!   deadline order, and a `Yield` (deadline "now", no leeway) goes behind everything due
//!   by now. A manual scheduler's wheel orders it by deadline instead
//!   ([`ReadyOrder`]): its clock moves only when told, so there are no wakeups to share,
//!   and its works run at their deadlines.
//! - Slots hold values in fixed-size chunks, so the memory per value is the value's size
//!   plus a fraction of a chunk header, whatever the number of values per slot.
//! - The latest placement can get a new end ([`rewindow_last`](Wheel::rewindow_last))
//!   while nothing else changed the structure since: its slot's earliest end is then
//!   exactly what it would have been had the value been placed with that end. That lets a work that was armed as it was created
//!   get its leeway right after, without a wakeup for the window it was first placed with.
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
/// A slot's earliest tick and end while it holds nothing.
const NONE_PLACED: u64 = u64::MAX;

/// What a slot holds: chunks of at most `CHUNK` values, each allocated at that capacity,
/// and the earliest tick and end tick any of them was placed for.
#[derive(Debug)]
struct Bag<T> {
    chunks: Vec<Vec<T>>,
    /// The earliest tick of a value placed here since the slot was last processed
    /// (`u64::MAX` when it holds none). A lower bound after a sweep removed some.
    first_tick: u64,
    /// The earliest end tick of a value placed here, on the same terms.
    first_end: u64,
}

/// The latest placement into a slot, while its end can still be changed exactly.
#[derive(Debug, Clone, Copy)]
struct LastPlacement {
    /// The slot's index in `slots`.
    index: usize,
    /// The deadline (units) and tick the value was placed for.
    deadline: u64,
    tick: u64,
    /// The slot's earliest end before the placement.
    first_end: u64,
}

/// What orders the ready queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadyOrder {
    /// Earliest end first (real schedulers).
    ByEnd,
    /// Earliest deadline first (manual schedulers).
    ByDeadline,
}

/// Timer entries, placed by deadline.
#[derive(Debug)]
pub(crate) struct Wheel<T> {
    geometry: Geometry,
    slots: Box<[Bag<T>]>,
    /// Due values with their order key (see `order`) and deadline (units).
    ready: VecDeque<(u64, u64, T)>,
    order: ReadyOrder,
    tick_units: u64,
    len: usize,
    spare: Vec<Vec<T>>,
    last: Option<LastPlacement>,
}

impl<T> Wheel<T> {
    /// An empty structure whose tick (and so coalescing window) is `tick_units`.
    pub(crate) fn new(tick_units: u64, order: ReadyOrder) -> Self {
        Wheel {
            geometry: Geometry::new(),
            slots: (0..LEVELS * SLOTS)
                .map(|_| Bag {
                    chunks: Vec::new(),
                    first_tick: NONE_PLACED,
                    first_end: NONE_PLACED,
                })
                .collect(),
            ready: VecDeque::new(),
            order,
            tick_units: tick_units.max(1),
            len: 0,
            spare: Vec::new(),
            last: None,
        }
    }

    /// Number of values held (live or not: stale ones leave when their slot comes).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Places `value` for the window from `deadline` to `end` (an end before the deadline
    /// counts as the deadline). A deadline at or before `now` is due at once.
    pub(crate) fn insert(&mut self, value: T, deadline: u64, end: u64, now: u64) {
        self.len += 1;
        self.place(value, deadline, end, now);
    }

    fn place(&mut self, value: T, deadline: u64, end: u64, now: u64) {
        let tick = deadline.div_ceil(self.tick_units);
        if deadline <= now || tick <= self.geometry.elapsed {
            self.last = None;
            let key = match self.order {
                ReadyOrder::ByEnd => end.max(deadline),
                ReadyOrder::ByDeadline => deadline,
            };
            let at = self.ready.partition_point(|(queued, _, _)| *queued <= key);
            self.ready.insert(at, (key, deadline, value));
        } else {
            let end_tick = end.div_ceil(self.tick_units).max(tick);
            self.place_in_wheel(value, deadline, tick, end_tick);
        }
    }

    /// Places a value that was taken from the ready queue and turned out not to be due
    /// at `deadline` yet: in the wheel, at the next tick at the earliest, so it is not
    /// judged again before time has moved.
    pub(crate) fn defer(&mut self, value: T, deadline: u64, end: u64) {
        self.len += 1;
        let tick = deadline
            .div_ceil(self.tick_units)
            .max(self.geometry.elapsed + 1);
        let end_tick = end.div_ceil(self.tick_units).max(tick);
        self.place_in_wheel(value, deadline, tick, end_tick);
    }

    fn place_in_wheel(&mut self, value: T, deadline: u64, tick: u64, end_tick: u64) {
        let (level, slot) = self.geometry.position(tick);
        self.geometry.set_occupied(level, slot, true);
        let index = level * SLOTS + slot;
        let bag = &mut self.slots[index];
        self.last = Some(LastPlacement {
            index,
            deadline,
            tick,
            first_end: bag.first_end,
        });
        bag.first_tick = bag.first_tick.min(tick);
        bag.first_end = bag.first_end.min(end_tick);
        push_chunked(&mut bag.chunks, &mut self.spare, value);
    }

    /// Gives the value placed last a new end, `end_of` its deadline, if nothing changed
    /// the structure since and `is_it` recognises it: its slot's earliest end is what it
    /// was before that placement, with the new end. A value that went to the ready queue
    /// is not found. Returns whether it was.
    pub(crate) fn rewindow_last(
        &mut self,
        is_it: impl FnOnce(&T) -> bool,
        end_of: impl FnOnce(u64) -> u64,
    ) -> bool {
        let Some(last) = self.last else {
            return false;
        };
        let bag = &mut self.slots[last.index];
        if !bag
            .chunks
            .last()
            .and_then(|chunk| chunk.last())
            .is_some_and(is_it)
        {
            return false;
        }
        let end_tick = end_of(last.deadline)
            .div_ceil(self.tick_units)
            .max(last.tick);
        bag.first_end = last.first_end.min(end_tick);
        true
    }

    /// Processes every slot due at `now`: each value in it goes through `decide`, which
    /// drops it (`None`) or returns it with the deadline and end it waits for now.
    pub(crate) fn expire(&mut self, now: u64, mut decide: impl FnMut(T) -> Option<(T, u64, u64)>) {
        let now_tick = now / self.tick_units;
        while let Some(exp) = self.geometry.next_expiration() {
            if exp.tick > now_tick {
                break;
            }
            self.last = None;
            self.geometry.elapsed = exp.tick;
            self.geometry.set_occupied(exp.level, exp.slot, false);
            let bag = &mut self.slots[exp.level * SLOTS + exp.slot];
            bag.first_tick = NONE_PLACED;
            bag.first_end = NONE_PLACED;
            let chunks = std::mem::take(&mut bag.chunks);
            for mut chunk in chunks {
                for value in chunk.drain(..) {
                    match decide(value) {
                        Some((value, deadline, end)) => self.place(value, deadline, end, now),
                        None => self.len -= 1,
                    }
                }
                if self.spare.len() < SPARE_CHUNKS {
                    self.spare.push(chunk);
                }
            }
        }
        if now_tick > self.geometry.elapsed {
            self.last = None;
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
        popped.map(|(_, deadline, value)| (deadline, value))
    }

    /// Whether any value is due.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// When the structure must be looked at next (in units): `now` if a value is ready,
    /// else the earliest end placed in the wheel (see "Ground rules"). `None` when it
    /// holds nothing.
    ///
    /// A coarse slot (level 1 and up) is processed whenever [`expire`](Self::expire)
    /// first runs at or after its start, and nothing in it is due before its earliest
    /// tick, so waking at any time from then on processes the slot (cascading the rest
    /// of it one level down) and finds what is due in the same wakeup. A lone periodic
    /// deadline costs one wakeup, whatever level it waits in.
    pub(crate) fn next_wake(&self, now: u64) -> Option<u64> {
        if self.has_ready() {
            return Some(now);
        }
        self.first_end_in_slots()
    }

    /// The earliest end (units) of any value held, ready ones included (a lower bound for
    /// those when the queue is ordered by deadline). `None` when it holds nothing.
    pub(crate) fn first_end(&self) -> Option<u64> {
        let ready = self.ready.front().map(|(key, _, _)| *key);
        match (ready, self.first_end_in_slots()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest end tick over the occupied slots, in units: each level's slots in the
    /// order they come, stopping at the first that starts after the best end so far
    /// (nothing in it ends before it starts).
    fn first_end_in_slots(&self) -> Option<u64> {
        let mut best: Option<u64> = None;
        for level in 0..LEVELS {
            for (slot, start) in self.geometry.occupied_in_order(level) {
                if best.is_some_and(|best| start >= best) {
                    break;
                }
                let bag = &self.slots[level * SLOTS + slot];
                let mut end = bag.first_end;
                if level == LEVELS - 1 {
                    // A top-level slot also holds deadlines past the horizon, placed again
                    // when it comes round: look at it by its end at the latest, as every
                    // later slot of the level starts at or after that.
                    end =
                        end.min(start.saturating_add(1u64 << (level as u32 * geometry::SLOT_BITS)));
                }
                let wake = start.max(end);
                best = Some(best.map_or(wake, |best| best.min(wake)));
            }
        }
        best.map(|tick| tick.saturating_mul(self.tick_units))
    }

    /// Calls `f` with every value.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&T)) {
        self.ready.iter().for_each(|(_, _, value)| f(value));
        for bag in self.slots.iter() {
            bag.chunks.iter().flatten().for_each(&mut f);
        }
    }

    /// Keeps only the values `keep` accepts (a sweep of the whole structure). Values are
    /// offered in the order they would be processed: the ready queue, then the slots by
    /// the tick they come due (values within one slot in any order).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.last = None;
        self.ready.retain(|(_, _, value)| keep(value));
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
                bag.first_tick = NONE_PLACED;
                bag.first_end = NONE_PLACED;
            }
            // Else `first_tick` and `first_end` stay: lower bounds, which at worst wake
            // once early.
            bag.chunks = kept;
        }
        self.len = len;
    }

    /// Removes every value.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        self.last = None;
        let mut all: Vec<T> = self.ready.drain(..).map(|(_, _, value)| value).collect();
        for bag in self.slots.iter_mut() {
            for chunk in bag.chunks.drain(..) {
                all.extend(chunk);
            }
            bag.first_tick = NONE_PLACED;
            bag.first_end = NONE_PLACED;
        }
        self.geometry = Geometry::new();
        self.len = 0;
        all
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Unit tests place plain values and keep their deadlines in the value itself.
    fn keep(value: (&'static str, u64)) -> Option<((&'static str, u64), u64, u64)> {
        Some((value, value.1, value.1))
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
        let mut timers = Wheel::new(10, ReadyOrder::ByEnd);
        for value in [("c", 35), ("a", 10), ("b", 30), ("far", 700_000)] {
            timers.insert(value, value.1, value.1, 0);
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
        let mut timers = Wheel::new(10, ReadyOrder::ByEnd);
        timers.insert(("a", 50), 50, 50, 0);
        timers.insert(("b", 50), 50, 50, 0);
        timers.insert(("later", 50), 50, 50, 0);
        timers.expire(50, |value| match value.0 {
            "a" => None,
            "later" => Some((value, 90, 90)),
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
        let mut timers = Wheel::new(10, ReadyOrder::ByEnd);
        assert_eq!(timers.next_wake(0), None);
        timers.insert(("a", 21), 21, 21, 0);
        assert_eq!(timers.next_wake(0), Some(30));
        timers.insert(("now", 0), 0, 0, 0);
        assert_eq!(timers.next_wake(7), Some(7));
    }

    #[test]
    fn next_wake_is_the_earliest_end_and_it_takes_every_open_window_along() {
        let mut timers = Wheel::new(10, ReadyOrder::ByEnd);
        // Windows 100..400, 200..300 and 350..360: the earliest end is 300, where the
        // first two have opened and the third has not.
        timers.insert(("a", 100), 100, 400, 0);
        timers.insert(("b", 200), 200, 300, 0);
        timers.insert(("c", 350), 350, 360, 0);
        assert_eq!(timers.next_wake(0), Some(300));
        let end_of = |name| match name {
            "a" => 400,
            "b" => 300,
            _ => 360,
        };
        timers.expire(300, |value| Some((value, value.1, end_of(value.0))));
        assert_eq!(drain_ready(&mut timers), ["b", "a"], "earliest end first");
        assert_eq!(timers.next_wake(300), Some(360));
    }

    #[test]
    fn the_search_for_the_earliest_end_looks_past_slots_that_end_late() {
        let mut timers = Wheel::new(1, ReadyOrder::ByEnd);
        // A level-1 slot (64..128) whose value ends far out, and a later level-1 slot
        // (128..192) whose value ends first.
        timers.insert(("lax", 70), 70, 10_000, 0);
        timers.insert(("tight", 130), 130, 131, 0);
        assert_eq!(timers.next_wake(0), Some(131));
        assert_eq!(timers.first_end(), Some(131));
        timers.insert(("due", 0), 0, 125, 0);
        assert_eq!(timers.first_end(), Some(125), "the ready value ends first");
        assert_eq!(timers.next_wake(0), Some(0), "and is due now");
    }

    #[test]
    fn the_last_placement_gets_a_new_end_only_while_nothing_else_changed() {
        let mut timers = Wheel::new(10, ReadyOrder::ByEnd);
        timers.insert(("a", 100), 100, 100, 0);
        assert!(timers.rewindow_last(|v| v.0 == "a", |deadline| deadline + 500));
        assert_eq!(timers.next_wake(0), Some(600));
        assert!(timers.rewindow_last(|v| v.0 == "a", |deadline| deadline + 50));
        assert_eq!(timers.next_wake(0), Some(150), "narrower again: exact");
        timers.insert(("b", 120), 120, 900, 0);
        assert!(!timers.rewindow_last(|v| v.0 == "a", |deadline| deadline + 500));
        assert!(timers.rewindow_last(|v| v.0 == "b", |deadline| deadline + 10));
        assert_eq!(timers.next_wake(0), Some(130));
        timers.expire(20, keep);
        assert!(
            !timers.rewindow_last(|v| v.0 == "b", |deadline| deadline),
            "time moved: the slot may have been processed"
        );
    }

    #[test]
    fn retain_keeps_exactly_the_accepted_values_in_place() {
        let mut timers = Wheel::new(10, ReadyOrder::ByEnd);
        for i in 0..300u64 {
            timers.insert(("x", 100 + i), 100 + i, 100 + i, 0);
        }
        timers.insert(("now", 0), 0, 0, 0);
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
        let mut timers = Wheel::new(1, ReadyOrder::ByEnd);
        for deadline in [5_000u64, 70, 3, 64 * 64 * 3, 200] {
            timers.insert(("x", deadline), deadline, deadline, 0);
        }
        timers.insert(("now", 0), 0, 0, 0);
        let mut seen = Vec::new();
        timers.retain(|value| {
            seen.push(value.1);
            true
        });
        assert_eq!(seen, [0, 3, 70, 200, 5_000, 64 * 64 * 3]);
    }

    #[test]
    fn saturated_deadlines_stay_in_the_wheel() {
        let mut timers = Wheel::new(10, ReadyOrder::ByEnd);
        timers.insert(("never", u64::MAX), u64::MAX, u64::MAX, 0);
        for step in 1..200u64 {
            timers.expire(step * 1_000_000_000, keep);
            assert!(!timers.has_ready());
        }
        assert_eq!(timers.len(), 1);
    }

    #[test]
    fn many_values_in_one_slot_use_whole_chunks() {
        let mut timers = Wheel::new(10, ReadyOrder::ByEnd);
        for i in 0..1000 {
            timers.insert(("x", 500 + i % 3), 500, 500, 0);
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
        let mut timers: Wheel<(u32, u64)> = Wheel::new(TICK, ReadyOrder::ByEnd);
        // Live values by id; a value whose id is gone is stale and must be dropped.
        let mut live: std::collections::HashMap<u32, u64> = Default::default();
        let mut now = 0u64;
        let mut id = 0u32;
        for _ in 0..20_000 {
            match next() % 4 {
                0 | 1 => {
                    let deadline = now + next() % 50_000;
                    id += 1;
                    timers.insert((id, deadline), deadline, deadline, now);
                    live.insert(id, deadline);
                }
                2 if !live.is_empty() => {
                    let victim = *live.keys().nth((next() as usize) % live.len()).unwrap();
                    live.remove(&victim);
                }
                _ => {
                    now += next() % 500;
                    timers.expire(now, |(id, deadline)| {
                        live.contains_key(&id)
                            .then_some(((id, deadline), deadline, deadline))
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

//! The deadline structure: a hierarchical wheel over slab-allocated entries, plus the
//! ready list of entries that are due.
//!
//! # Ground rules
//!
//! - Every armed work has exactly one entry, and an entry is in exactly one place: a wheel
//!   slot, the ready list, or *detached* (taken off the ready list while the same work was
//!   still running elsewhere; it goes back on the ready list when that run ends). A parked
//!   or cancelled work has no entry at all, so idle works cost the wheel nothing.
//! - Arm and cancel are O(1): a slab insert or remove and an intrusive list link or unlink.
//! - The ready list is ordered by exact deadline (ties keep arrival order), so works run in
//!   deadline order within a tick, and a `Yield` (deadline "now") goes behind everything
//!   already due.
//! - Deadlines are rounded up to whole ticks, and the tick is the scheduler's slack: all
//!   deadlines within one tick fire in one wakeup, and none fires early.
//!
//! The structure is single-threaded; the scheduler keeps it under its core lock.

mod wheel;

use slab::Slab;

use wheel::{Wheel, NIL};

/// Where an entry is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Wheel { level: u8, slot: u8 },
    Ready,
    Detached,
}

#[derive(Debug)]
struct Entry<T> {
    value: T,
    deadline_ns: u64,
    tick: u64,
    prev: u32,
    next: u32,
    place: Place,
}

/// Armed entries, keyed by a `u32` slab index that the owner stores in its state word.
#[derive(Debug)]
pub(crate) struct Timers<T> {
    entries: Slab<Entry<T>>,
    wheel: Wheel,
    ready_head: u32,
    ready_tail: u32,
    tick_ns: u64,
    due: Vec<u32>,
}

impl<T> Timers<T> {
    /// An empty structure whose tick (and so coalescing window) is `tick_ns`.
    pub(crate) fn new(tick_ns: u64) -> Self {
        Timers {
            entries: Slab::new(),
            wheel: Wheel::new(),
            ready_head: NIL,
            ready_tail: NIL,
            tick_ns: tick_ns.max(1),
            due: Vec::new(),
        }
    }

    /// Number of armed entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Arms `value` for `deadline_ns`. A deadline at or before `now_ns` is due at once.
    pub(crate) fn arm(&mut self, value: T, deadline_ns: u64, now_ns: u64) -> u32 {
        let tick = deadline_ns.div_ceil(self.tick_ns);
        let key = self.entries.insert(Entry {
            value,
            deadline_ns,
            tick,
            prev: NIL,
            next: NIL,
            place: Place::Detached,
        });
        let key = u32::try_from(key).expect("more than 2^32 armed works");
        if deadline_ns <= now_ns || tick <= self.wheel.elapsed {
            self.link_ready(key);
        } else {
            self.link_wheel(key);
        }
        key
    }

    /// Disarms the entry `key` and returns its value.
    pub(crate) fn remove(&mut self, key: u32) -> T {
        self.unlink(key);
        self.entries.remove(key as usize).value
    }

    /// The exact deadline of `key`.
    pub(crate) fn deadline_ns(&self, key: u32) -> u64 {
        self.entries[key as usize].deadline_ns
    }

    /// The value stored for `key`.
    pub(crate) fn value(&self, key: u32) -> &T {
        &self.entries[key as usize].value
    }

    /// Moves everything due at `now_ns` from the wheel onto the ready list.
    pub(crate) fn expire(&mut self, now_ns: u64) {
        let now_tick = now_ns / self.tick_ns;
        while let Some(exp) = self.wheel.next_expiration() {
            if exp.tick > now_tick {
                break;
            }
            self.wheel.elapsed = exp.tick;
            let mut key = self.wheel.head(exp.level, exp.slot);
            self.wheel.set_head(exp.level, exp.slot, NIL);
            while key != NIL {
                let entry = &mut self.entries[key as usize];
                let next = entry.next;
                entry.place = Place::Detached;
                if entry.tick <= exp.tick {
                    self.due.push(key);
                } else {
                    self.link_wheel(key);
                }
                key = next;
            }
        }
        if now_tick > self.wheel.elapsed {
            self.wheel.elapsed = now_tick;
        }
        let mut due = std::mem::take(&mut self.due);
        due.sort_unstable_by_key(|&key| (self.entries[key as usize].deadline_ns, key));
        for key in due.drain(..) {
            self.link_ready(key);
        }
        self.due = due;
    }

    /// Unlinks and returns the first ready entry; it stays armed (detached) until the
    /// caller either [`remove`](Self::remove)s it or puts it back with
    /// [`make_ready`](Self::make_ready).
    pub(crate) fn pop_ready(&mut self) -> Option<u32> {
        let key = self.ready_head;
        if key == NIL {
            return None;
        }
        self.unlink(key);
        Some(key)
    }

    /// Whether any entry is due.
    pub(crate) fn has_ready(&self) -> bool {
        self.ready_head != NIL
    }

    /// Puts a detached entry back on the ready list, in deadline order.
    pub(crate) fn make_ready(&mut self, key: u32) {
        if self.entries[key as usize].place == Place::Detached {
            self.link_ready(key);
        }
    }

    /// When the earliest entry must be looked at: now if one is ready, else the start of
    /// the first occupied wheel slot (in ns). `None` when nothing is armed.
    pub(crate) fn next_wake_ns(&self, now_ns: u64) -> Option<u64> {
        if self.has_ready() {
            return Some(now_ns);
        }
        self.wheel
            .next_expiration()
            .map(|exp| exp.tick.saturating_mul(self.tick_ns))
    }

    /// Removes every entry, returning their values.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        self.wheel = Wheel::new();
        self.ready_head = NIL;
        self.ready_tail = NIL;
        self.entries.drain().map(|entry| entry.value).collect()
    }

    fn link_wheel(&mut self, key: u32) {
        let tick = self.entries[key as usize].tick;
        let (level, slot) = self.wheel.position(tick);
        let head = self.wheel.head(level, slot);
        if head != NIL {
            self.entries[head as usize].prev = key;
        }
        let entry = &mut self.entries[key as usize];
        entry.prev = NIL;
        entry.next = head;
        entry.place = Place::Wheel {
            level: level as u8,
            slot: slot as u8,
        };
        self.wheel.set_head(level, slot, key);
    }

    fn link_ready(&mut self, key: u32) {
        let deadline = self.entries[key as usize].deadline_ns;
        // Walk back from the tail: new entries are almost always the latest.
        let mut after = self.ready_tail;
        while after != NIL && self.entries[after as usize].deadline_ns > deadline {
            after = self.entries[after as usize].prev;
        }
        let before = if after == NIL {
            self.ready_head
        } else {
            self.entries[after as usize].next
        };
        {
            let entry = &mut self.entries[key as usize];
            entry.prev = after;
            entry.next = before;
            entry.place = Place::Ready;
        }
        if after == NIL {
            self.ready_head = key;
        } else {
            self.entries[after as usize].next = key;
        }
        if before == NIL {
            self.ready_tail = key;
        } else {
            self.entries[before as usize].prev = key;
        }
    }

    fn unlink(&mut self, key: u32) {
        let (prev, next, place) = {
            let entry = &self.entries[key as usize];
            (entry.prev, entry.next, entry.place)
        };
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
        match place {
            Place::Detached => return,
            Place::Ready => {
                if prev == NIL {
                    self.ready_head = next;
                } else {
                    self.entries[prev as usize].next = next;
                }
                if next == NIL {
                    self.ready_tail = prev;
                }
            }
            Place::Wheel { level, slot } => {
                if prev == NIL {
                    self.wheel.set_head(level as usize, slot as usize, next);
                } else {
                    self.entries[prev as usize].next = next;
                }
            }
        }
        let entry = &mut self.entries[key as usize];
        entry.prev = NIL;
        entry.next = NIL;
        entry.place = Place::Detached;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn drain_ready(timers: &mut Timers<&'static str>) -> Vec<&'static str> {
        let mut out = Vec::new();
        while let Some(key) = timers.pop_ready() {
            out.push(timers.remove(key));
        }
        out
    }

    #[test]
    fn entries_expire_in_deadline_order_and_never_early() {
        let mut timers = Timers::new(MS);
        timers.arm("c", 3 * MS + 5, 0);
        timers.arm("a", MS, 0);
        timers.arm("b", 3 * MS, 0);
        timers.arm("far", 70_000 * MS, 0);
        timers.expire(3 * MS);
        assert_eq!(drain_ready(&mut timers), ["a", "b"]);
        timers.expire(4 * MS);
        assert_eq!(drain_ready(&mut timers), ["c"]);
        timers.expire(69_999 * MS);
        assert!(drain_ready(&mut timers).is_empty());
        timers.expire(70_000 * MS);
        assert_eq!(drain_ready(&mut timers), ["far"]);
        assert_eq!(timers.len(), 0);
    }

    #[test]
    fn removed_entries_never_fire() {
        let mut timers = Timers::new(MS);
        let a = timers.arm("a", 5 * MS, 0);
        timers.arm("b", 5 * MS, 0);
        assert_eq!(timers.remove(a), "a");
        timers.expire(10 * MS);
        assert_eq!(drain_ready(&mut timers), ["b"]);
    }

    #[test]
    fn next_wake_is_the_first_occupied_slot() {
        let mut timers = Timers::new(MS);
        assert_eq!(timers.next_wake_ns(0), None);
        timers.arm("a", 2 * MS + 1, 0);
        assert_eq!(timers.next_wake_ns(0), Some(3 * MS));
        timers.arm("now", 0, 0);
        assert_eq!(timers.next_wake_ns(7), Some(7));
    }

    #[test]
    fn saturated_deadlines_stay_in_the_wheel() {
        let mut timers = Timers::new(MS);
        timers.arm("never", u64::MAX, 0);
        for step in 1..200u64 {
            timers.expire(step * 1_000_000 * MS);
            assert!(!timers.has_ready());
        }
        assert_eq!(timers.len(), 1);
    }

    #[test]
    fn random_arms_and_cancels_match_a_reference() {
        // A small deterministic generator keeps this test free of dependencies.
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut timers = Timers::new(MS);
        let mut live: Vec<(u32, u64)> = Vec::new();
        let mut now = 0u64;
        for _ in 0..20_000 {
            match next() % 4 {
                0 | 1 => {
                    let deadline = now + next() % (5_000 * MS);
                    let key = timers.arm((), deadline, now);
                    live.push((key, deadline));
                }
                2 if !live.is_empty() => {
                    let (key, _) = live.swap_remove((next() as usize) % live.len());
                    timers.remove(key);
                }
                _ => {
                    now += next() % (50 * MS);
                    timers.expire(now);
                    let mut fired = Vec::new();
                    while let Some(key) = timers.pop_ready() {
                        let deadline = timers.deadline_ns(key);
                        assert!(deadline <= now, "fired early");
                        timers.remove(key);
                        fired.push(key);
                    }
                    let before = live.len();
                    live.retain(|(key, _)| !fired.contains(key));
                    assert_eq!(before - live.len(), fired.len());
                    let late = live.iter().filter(|(_, d)| d.div_ceil(MS) * MS <= now);
                    assert_eq!(late.count(), 0, "an entry due by now did not fire");
                }
            }
        }
    }
}

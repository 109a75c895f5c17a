//! The tick a long timeout work's `touch()` reads instead of a clock.
//!
//! The kernel's timers read no clock: they count jiffies. A real scheduler keeps such a
//! count for its timeout works: a tick number, and the real time at which each tick was
//! published. A touch reads the tick with one relaxed load and stores it in the work's
//! stamp word only when it moved since that work's last touch, so a touch costs a few
//! loads and no clock read.
//!
//! # Why it is never early
//!
//! The refresher publishes tick `k + 1` with a `SeqCst` store, then a `SeqCst` fence, and
//! only then reads the clock: that reading is `time(k + 1)`. A touch that read `k`
//! executed its load before `k + 1` became visible to it, so before `time(k + 1)` was
//! read. A work stamped `k` is therefore due no earlier than `time(k + 1) + idle`, which
//! is never within `idle` of the touch, however late the refresher runs (a starved
//! worker only makes the run later). A stamp equal to the current tick has no
//! `time(k + 1)` yet: whoever needs it (a worker judging the work, `deadline()`) publishes
//! the next tick first.
//!
//! # The history
//!
//! Which tick's time a decision needs depends on the stamp's age, and a stamp may be
//! judged long after it was stored (a long idle, a starved worker). So the history keeps,
//! like a timing wheel, the times of the last [`RING`] ticks, of the last `RING`
//! multiples of 4, of 16, and so on over [`LEVELS`] levels. A stamp `k` is bounded by the
//! time of the first kept tick at or after `k + 1`: exact while `k + 1` is among the last
//! `RING` ticks, else the next multiple of the coarsest stride that still covers it. That
//! bound never moves earlier (never early), and for a stamp `a` ticks old it is at most
//! `a / 16` ticks late, so a timeout judged at touch + idle is at most 1/16 of its idle
//! late on that account. The levels cover 4^19 × 64 ticks: ticks are only published by
//! the refresher and by a worker (or host, or flush) taking a decision on a work stamped
//! with the current tick, never by a read such as `deadline()`, so that is millennia.
//!
//! # Cost
//!
//! - A touch: one relaxed load of the tick besides what every timeout touch does (the
//!   stamp word, the state word); a store only once per tick per work, which also marks
//!   the tick as used.
//! - The refresher runs at most `interval` apart (the shortest interval the scheduler's
//!   live tick-stamped works ask for: 1/16 of a timeout's idle, or half its leeway when
//!   that is more; see `scheduler::work::timeout`), and from half an interval on at any
//!   wakeup that comes anyway, so it shares the other works' wakeups where it can, while
//!   touches store new stamps, and parks once a refresh finds none since the one
//!   before: with no timeout touched, it costs no wakeup at all. The first touch after
//!   that wakes it (that touch takes the core lock, once). When the shortest interval's
//!   last work ends its life, the interval grows back to the next one's.
//!
//! Only real schedulers (threaded and hosted) stamp with ticks, and only for intervals
//! of at least [`TICK_MIN_INTERVAL_NS`]; timeouts that need shorter ones and manual
//! schedulers (whose virtual clock is one load anyway, and whose tests expect exact
//! times) stamp with the full clock.
//! Loom models may make a manual scheduler stamp with ticks on its virtual clock
//! (`hooks::stamp_with_ticks_for_loom`): the tick's atomics and lock are the `sync`
//! module's, so the models explore touches against refreshes and decisions.
//!
//! Lock order: the core lock, then this module's own (`T`), which guards the history.
//! Every change of the refresher's schedule (`wake`, `refresh`) runs under the core lock,
//! so the `parked` flag its readers check first never disagrees with it there.

use std::collections::BTreeMap;

use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering, fence, lock};

/// The shortest refresh interval a timeout may stamp with ticks for: its refresher then
/// runs at most 16 times a second while it is touched (1/16 of a 1 s idle). A timeout
/// whose precision asks for shorter intervals reads the full clock, and its reaps are
/// coalesced to 1/16 of its idle (see `scheduler::work::timeout`).
pub(crate) const TICK_MIN_INTERVAL_NS: u64 = 62_500_000;

/// Ticks per history level (see the module docs).
const RING: u64 = 64;
/// History levels; level `l` keeps the multiples of `STRIDE^l`.
const LEVELS: u32 = 20;
/// Each level's stride over the one below.
const STRIDE: u64 = 4;

/// A scheduler's touch tick (see the module docs).
#[derive(Debug)]
pub(crate) struct TouchTick {
    /// A: the current tick, from 1; published by [`publish_next`](Self::publish_next).
    current: AtomicU64,
    /// A: a touch stored a new tick stamp since the last refresh.
    touched: AtomicBool,
    /// A: no refresh is scheduled; a touch that stores a new stamp schedules one.
    parked: AtomicBool,
    /// T: the history and the refresher's schedule.
    state: Mutex<TickState>,
}

#[derive(Debug)]
struct TickState {
    /// The history: `LEVELS` rings of `RING` times (see the module docs); slot
    /// `(t / STRIDE^l) % RING` of level `l` holds the time of tick `t`, a multiple of
    /// `STRIDE^l`. Empty until a tick-stamped work registers.
    times: Vec<u64>,
    /// The refresh intervals the live tick-stamped works ask for, with how many of each:
    /// the refresher follows the shortest ([`interval_ns`](Self::interval_ns)), and slows
    /// down again when its last work's life ends.
    live_intervals: BTreeMap<u64, usize>,
    /// When the refresher runs next, `None` while parked.
    next_refresh_ns: Option<u64>,
    /// Tick 1's time, for the history once it is allocated.
    first_ns: u64,
}

impl TickState {
    /// Time between refreshes: the shortest live interval; `None` while no tick-stamped
    /// work lives.
    fn interval_ns(&self) -> Option<u64> {
        let &shortest = self.live_intervals.keys().next()?;
        Some(shortest.max(1))
    }

    fn stride(level: u32) -> u64 {
        STRIDE.pow(level)
    }

    fn slot(tick: u64, level: u32) -> usize {
        (level as usize) * RING as usize + ((tick / Self::stride(level)) % RING) as usize
    }

    /// Records tick `tick`'s time in every level it belongs to.
    fn record(&mut self, tick: u64, ns: u64) {
        if self.times.is_empty() {
            return;
        }
        for level in 0..LEVELS {
            if tick % Self::stride(level) != 0 {
                break; // not a multiple of any coarser stride either
            }
            self.times[Self::slot(tick, level)] = ns;
        }
    }

    /// The time of the first kept tick at or after `tick` (`tick <= current`), if any.
    fn first_kept_at_or_after(&self, tick: u64, current: u64) -> Option<u64> {
        if self.times.is_empty() {
            return None;
        }
        (0..LEVELS).find_map(|level| {
            let stride = Self::stride(level);
            let kept = tick.div_ceil(stride).checked_mul(stride)?;
            // Published, and still in this level's ring of its last `RING` multiples.
            (kept <= current && (current - kept) / stride < RING)
                .then(|| self.times[Self::slot(kept, level)])
        })
    }
}

impl TouchTick {
    /// A tick at 1, published at `now_ns`.
    pub(crate) fn new(now_ns: u64) -> Self {
        TouchTick {
            current: AtomicU64::new(1),
            touched: AtomicBool::new(false),
            parked: AtomicBool::new(true),
            state: Mutex::new(TickState {
                times: Vec::new(),
                live_intervals: BTreeMap::new(),
                next_refresh_ns: None,
                first_ns: now_ns,
            }),
        }
    }

    /// A timeout work stamps with ticks and needs a refresh at least every `interval_ns`.
    /// Returns the refresher's new time if a refresh scheduled for a longer interval
    /// moved earlier, for the caller to wake a worker (or the host) for.
    pub(crate) fn register_interval(&self, interval_ns: u64, now_ns: u64) -> Option<u64> {
        let mut state = lock(&self.state);
        *state.live_intervals.entry(interval_ns).or_insert(0) += 1;
        let interval = state
            .interval_ns()
            .expect("an interval was just registered");
        let sooner = now_ns.saturating_add(interval);
        let moved = match state.next_refresh_ns {
            Some(at) if at > sooner => {
                state.next_refresh_ns = Some(sooner);
                Some(sooner)
            }
            _ => None,
        };
        if state.times.is_empty() {
            // Every tick so far gets the earliest time it can have had: tick 1's is the
            // start, and any later one's is at least that. Bounds are upper bounds, so
            // the history starts as "now" for every published tick.
            let first = state.first_ns;
            state.times = vec![first; (LEVELS * RING as u32) as usize];
        }
        moved
    }

    /// A tick-stamped work's life ended (or it stamps for another interval now): the
    /// refresher no longer runs for `interval_ns`. A longer interval takes effect from
    /// the next refresh (one more refresh at the shorter one is never late).
    pub(crate) fn unregister_interval(&self, interval_ns: u64) {
        let mut state = lock(&self.state);
        let Some(count) = state.live_intervals.get_mut(&interval_ns) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            state.live_intervals.remove(&interval_ns);
        }
    }

    /// The current tick, for a touch.
    #[inline]
    pub(crate) fn current(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }

    /// A touch stored a new stamp. Returns whether the refresher is parked and must be
    /// scheduled ([`wake`](Self::wake), under the core lock).
    #[inline]
    pub(crate) fn note_touch(&self) -> bool {
        if !self.touched.load(Ordering::Relaxed) {
            // SeqCst, against the refresher's park (see `refresh`): one of the two sees
            // the other.
            self.touched.store(true, Ordering::SeqCst);
        }
        self.parked.load(Ordering::SeqCst)
    }

    /// Schedules the refresher if it is parked; returns when it runs, for the caller to
    /// wake a worker (or the host) for.
    pub(crate) fn wake(&self, now_ns: u64) -> Option<u64> {
        let mut state = lock(&self.state);
        if state.next_refresh_ns.is_some() {
            return None;
        }
        let at = now_ns.saturating_add(state.interval_ns()?);
        state.next_refresh_ns = Some(at);
        self.parked.store(false, Ordering::SeqCst);
        Some(at)
    }

    /// When the refresher runs next (for the next wakeup), `None` while parked. Called
    /// under the core lock, as every change of the schedule is, so the flag read first
    /// agrees with it.
    #[inline]
    pub(crate) fn next_refresh_ns(&self) -> Option<u64> {
        if self.parked.load(Ordering::Relaxed) {
            return None;
        }
        lock(&self.state).next_refresh_ns
    }

    /// Runs the refresher if it is due at `now_ns`: publishes the next tick, and parks
    /// unless a touch stored a new stamp since the last refresh. `now` reads the real
    /// clock.
    pub(crate) fn refresh(&self, now_ns: u64, now: impl Fn() -> u64) {
        if self.parked.load(Ordering::Relaxed) {
            return; // the schedule only changes under the core lock, which the caller holds
        }
        let mut state = lock(&self.state);
        let Some(at) = state.next_refresh_ns else {
            return;
        };
        // Its window opens half an interval before it is due, so a wakeup that comes
        // anyway from then on takes it along (see `leeway`), and refreshes stay at most
        // one interval apart, as the precision of the timeouts needs.
        let opens = at.saturating_sub(state.interval_ns().unwrap_or(0) / 2);
        if opens > now_ns {
            return;
        }
        self.publish_next(&mut state, &now);
        let Some(interval) = state.interval_ns() else {
            // No tick-stamped work lives any more: nothing to refresh for.
            state.next_refresh_ns = None;
            self.parked.store(true, Ordering::SeqCst);
            self.touched.store(false, Ordering::SeqCst);
            return;
        };
        if self.touched.swap(false, Ordering::SeqCst) {
            state.next_refresh_ns = Some(now_ns.saturating_add(interval));
            return;
        }
        state.next_refresh_ns = None;
        self.parked.store(true, Ordering::SeqCst);
        // A touch that stored its stamp before the park but read `parked` before it was
        // set did not schedule a refresh: it is seen here.
        if self.touched.load(Ordering::SeqCst) {
            state.next_refresh_ns = Some(now_ns.saturating_add(interval));
            self.parked.store(false, Ordering::SeqCst);
        }
    }

    /// A time no earlier than any touch stamped `stamp` (a tick), for a decision (a
    /// worker, a host or a flush judging the work): the time the tick after it was
    /// published, publishing it first if `stamp` is the current tick, so the bound of a
    /// stamp never moves once a decision has used it.
    pub(crate) fn upper_time_ns(&self, stamp: u64, now: impl Fn() -> u64) -> u64 {
        let mut state = lock(&self.state);
        // Unknown (the current tick, or older than every level): the next tick's time,
        // published now, is later than it.
        self.kept_bound(&state, stamp)
            .unwrap_or_else(|| self.publish_next(&mut state, &now))
    }

    /// [`upper_time_ns`](Self::upper_time_ns) for a read (`deadline()`, an arm comparing
    /// deadlines): never publishes, so reads cannot drive the tick; a stamp equal to the
    /// current tick is bounded by `now_ns` (the touch came before it), which the bound a
    /// later decision uses is never earlier than.
    pub(crate) fn read_upper_time_ns(&self, stamp: u64, now_ns: u64) -> u64 {
        let state = lock(&self.state);
        self.kept_bound(&state, stamp).unwrap_or(now_ns)
    }

    /// The time of the first kept tick after `stamp`, if `stamp` is not the current tick
    /// and the history still holds one.
    fn kept_bound(&self, state: &TickState, stamp: u64) -> Option<u64> {
        let current = self.current.load(Ordering::SeqCst);
        if stamp >= current {
            return None;
        }
        state.first_kept_at_or_after(stamp + 1, current)
    }

    /// A work stamped `stamp` is being taken to run: publishes the next tick if `stamp`
    /// is the current one, so a touch during the run reads a newer tick and stores it,
    /// and the run's completion sees that touch.
    pub(crate) fn move_past(&self, stamp: u64, now: impl Fn() -> u64) {
        if stamp != 0 && stamp >= self.current.load(Ordering::SeqCst) {
            let mut state = lock(&self.state);
            if stamp >= self.current.load(Ordering::SeqCst) {
                self.publish_next(&mut state, &now);
            }
        }
    }

    /// Publishes the next tick and records its time, read after the publication (see the
    /// module docs); returns that time.
    fn publish_next(&self, state: &mut TickState, now: &impl Fn() -> u64) -> u64 {
        let next = self.current.load(Ordering::Relaxed) + 1;
        self.current.store(next, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let at = now();
        state.record(next, at);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_stamp_is_bounded_by_the_next_ticks_time_and_the_current_one_publishes_it() {
        let clock = Cell::new(100);
        let now = || clock.get();
        let tick = TouchTick::new(100);
        tick.register_interval(1_000, 0);
        assert_eq!(tick.current(), 1);
        clock.set(150);
        // Stamped with the current tick: its bound is published now.
        assert_eq!(tick.upper_time_ns(1, now), 150);
        assert_eq!(tick.current(), 2);
        clock.set(400);
        assert_eq!(tick.upper_time_ns(1, now), 150, "tick 2's time");
        assert_eq!(tick.upper_time_ns(2, now), 400, "current: published now");
        assert_eq!(tick.current(), 3);
    }

    #[test]
    fn old_stamps_are_bounded_by_a_coarser_kept_tick_never_earlier_and_stably() {
        let clock = Cell::new(0);
        let now = || clock.get();
        let tick = TouchTick::new(0);
        tick.register_interval(1_000, 0);
        // Tick t (t >= 2) is published at time 10 t.
        for t in 2..=5_000u64 {
            clock.set(t * 10);
            tick.upper_time_ns(tick.current(), now); // publishes tick t
        }
        assert_eq!(tick.current(), 5_000);
        // Recent stamps: exact (the time of the next tick).
        assert_eq!(tick.upper_time_ns(4_990, now), 49_910);
        // Every stamp: never before the next tick's time, and at most 1/16 of its age
        // plus one level's stride later; a second reading gives the same bound.
        for stamp in [1u64, 7, 100, 1_000, 3_333, 4_900] {
            let exact = (stamp + 1) * 10;
            let bound = tick.upper_time_ns(stamp, now);
            assert!(bound >= exact, "stamp {stamp}: {bound} before {exact}");
            let age = (5_000 - stamp) * 10;
            assert!(
                bound - exact <= age / 4,
                "stamp {stamp}: {bound} far after {exact}"
            );
            assert_eq!(tick.upper_time_ns(stamp, now), bound, "stable");
        }
        assert_eq!(tick.current(), 5_000, "no bound needed a new tick");
    }

    #[test]
    fn a_wakeup_in_the_refresh_window_takes_it_along_and_the_next_is_an_interval_later() {
        let clock = Cell::new(0);
        let now = || clock.get();
        let tick = TouchTick::new(0);
        tick.register_interval(100, 0);
        tick.note_touch();
        assert_eq!(tick.wake(0), Some(100));
        tick.note_touch();
        clock.set(60);
        tick.refresh(60, now);
        assert_eq!(tick.current(), 2, "a wakeup at 60 is inside the window");
        assert_eq!(tick.next_refresh_ns(), Some(160));
    }

    #[test]
    fn the_refresher_runs_while_touched_and_parks_after_a_quiet_interval() {
        let clock = Cell::new(0);
        let now = || clock.get();
        let tick = TouchTick::new(0);
        tick.register_interval(100, 0);
        assert_eq!(tick.next_refresh_ns(), None, "parked until a touch");
        assert!(tick.note_touch(), "parked: the touch must wake it");
        assert_eq!(tick.wake(0), Some(100));
        assert_eq!(tick.wake(0), None, "already scheduled");
        tick.refresh(49, now);
        assert_eq!(
            tick.current(),
            1,
            "its window opens half an interval early, at 50"
        );
        clock.set(100);
        tick.refresh(100, now);
        assert_eq!(tick.current(), 2);
        assert_eq!(
            tick.next_refresh_ns(),
            Some(200),
            "touched since: runs again"
        );
        clock.set(200);
        tick.refresh(200, now);
        assert_eq!(tick.current(), 3);
        assert_eq!(tick.next_refresh_ns(), None, "quiet: parked");
        assert!(tick.note_touch());
    }

    #[test]
    fn bounds_match_a_brute_force_history_at_every_level_boundary() {
        let clock = Cell::new(0u64);
        let now = || clock.get();
        let tick = TouchTick::new(0);
        tick.register_interval(1_000, 0);
        // times[t] = time of tick t (tick 1 at 0); irregular gaps.
        let mut times = vec![0u64, 0];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut last_bound = std::collections::HashMap::new();
        let checkpoints: Vec<u64> = {
            let mut v = vec![2, 3, 63, 64, 65, 66, 127, 128, 129, 255, 256, 257, 320, 321];
            for l in 1..6u32 {
                let b = RING * STRIDE.pow(l);
                v.extend([b - 1, b, b + 1, b + 2, b + STRIDE.pow(l), 2 * b + 3]);
            }
            v.sort();
            v.dedup();
            v
        };
        let max = *checkpoints.last().unwrap();
        for t in 2..=max {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = times[t as usize - 1] + 1 + x % 1000;
            clock.set(at);
            tick.upper_time_ns(tick.current(), now); // publishes tick t
            times.push(at);
            assert_eq!(tick.current(), t);
            if !checkpoints.contains(&t) {
                continue;
            }
            clock.set(at + 5);
            let mut stamps: Vec<u64> = (1..t).filter(|s| t - s < 200 || s % 97 == 0).collect();
            for l in 0..7u32 {
                let st = STRIDE.pow(l);
                for m in [st, 2 * st, RING * st] {
                    for d in [0u64, 1, 2] {
                        if m + d < t && m + d >= 1 {
                            stamps.push(m + d);
                        }
                        if m > d + 1 && m - d < t {
                            stamps.push(m - d);
                        }
                    }
                }
            }
            for stamp in stamps {
                let bound = tick.upper_time_ns(stamp, now);
                assert_eq!(tick.current(), t, "an old stamp published a tick");
                let kept = times
                    .iter()
                    .position(|&ns| ns == bound)
                    .expect("a bound is a published tick's time") as u64;
                assert!(kept > stamp, "stamp {stamp} at {t}: bound of tick {kept}");
                let age = t - stamp;
                assert!(
                    kept - (stamp + 1) <= age / 16 + 1,
                    "stamp {stamp} at {t}: tick {kept}, {} ticks late",
                    kept - stamp - 1
                );
                if let Some(&prev) = last_bound.get(&stamp) {
                    assert!(bound >= prev, "stamp {stamp}: bound moved earlier");
                }
                last_bound.insert(stamp, bound);
            }
        }
    }
}

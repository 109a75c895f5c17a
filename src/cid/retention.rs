//! The high water's recent past, for [`PerCid`](crate::PerCid)s with a retention: a slot
//! is trimmed only once it has stayed at or above the high water for its storage's
//! retention, so a value survives a short idle of its thread.
//!
//! Slot `i` has stayed above the high water for all of the last `r` iff the highest
//! high water of that window is at most `i`. So a trim with retention `r` takes the
//! slots at or above the window's highest high water (its **threshold**), where a trim
//! without one takes those at or above the current high water.
//!
//! The space records each drop of the high water, under its lock (`publish`), as
//! `(when, from)`: the high water was `from` until `when`. A drop that is followed by a
//! drop from a higher or equal value is forgotten: every window that holds the earlier
//! one holds the later one too (windows end now). What is left has strictly decreasing
//! values and increasing times, at most one entry per id, and the threshold for `r` is
//! the value of the oldest entry less than `r` old, or the current high water. Entries
//! older than the longest retention of the space's `PerCid`s are dropped; with no
//! retention set, nothing is recorded.
//!
//! Times are the scheduler's clock in nanoseconds (the manual clock under
//! `Scheduler::manual`), so tests and loom models step through a retention.

use std::collections::VecDeque;

/// See the module docs. Under the space lock.
#[derive(Debug, Default)]
pub(super) struct HighWaterHistory {
    /// `(when, from)`, oldest first: strictly decreasing `from`, increasing `when`.
    drops: VecDeque<(u64, usize)>,
    /// The longest retention of the space's `PerCid`s, in nanoseconds; 0 records nothing.
    longest: u64,
}

impl HighWaterHistory {
    /// A `PerCid` of the space keeps its slots for `retention` nanoseconds.
    pub(super) fn note_retention(&mut self, retention: u64) {
        self.longest = self.longest.max(retention);
    }

    /// Whether drops are recorded: some `PerCid` of the space has a retention.
    pub(super) fn is_recording(&self) -> bool {
        self.longest > 0
    }

    /// The high water dropped from `from` at `now`.
    pub(super) fn record_drop(&mut self, now: u64, from: usize) {
        if self.longest == 0 {
            return;
        }
        while self
            .drops
            .back()
            .is_some_and(|&(_, earlier)| earlier <= from)
        {
            self.drops.pop_back();
        }
        self.drops.push_back((now, from));
        self.forget_older_than(now, self.longest);
    }

    /// The lowest id a trim with `retention` may take at `now`, with `current` the high
    /// water: the highest high water of the last `retention`.
    pub(super) fn threshold(&mut self, now: u64, retention: u64, current: usize) -> usize {
        self.forget_older_than(now, self.longest);
        match self.first_within(now, retention) {
            Some(&(_, from)) => from.max(current),
            None => current,
        }
    }

    /// When the threshold for `retention` first falls to `id` or below, if it is above
    /// it at `now`: the moment the latest drop from above `id` turns `retention` old.
    /// (A trim wakes then for its highest kept slot, not at each step of the high
    /// water's history above it.)
    pub(super) fn when_below(&self, now: u64, retention: u64, id: usize) -> Option<u64> {
        if retention == 0 {
            return None;
        }
        // The drops from above `id` come first (the values decrease), and the latest of
        // them sets the moment.
        let &(when, _) = self
            .drops
            .iter()
            .take_while(|&&(_, from)| from > id)
            .last()?;
        (now.saturating_sub(when) < retention).then(|| when.saturating_add(retention))
    }

    /// The oldest entry less than `retention` old at `now`.
    fn first_within(&self, now: u64, retention: u64) -> Option<&(u64, usize)> {
        if retention == 0 {
            return None;
        }
        self.drops
            .iter()
            .find(|&&(when, _)| now.saturating_sub(when) < retention)
    }

    fn forget_older_than(&mut self, now: u64, age: u64) {
        while self
            .drops
            .front()
            .is_some_and(|&(when, _)| now.saturating_sub(when) >= age)
        {
            self.drops.pop_front();
        }
        if self.drops.capacity() >= 4 * self.drops.len().max(4) {
            self.drops.shrink_to(self.drops.len().max(4));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HighWaterHistory;

    #[test]
    fn no_retention_records_nothing_and_thresholds_are_the_high_water() {
        let mut history = HighWaterHistory::default();
        history.record_drop(10, 8);
        assert_eq!(history.threshold(11, 0, 2), 2);
        assert_eq!(history.threshold(11, 100, 2), 2);
        assert_eq!(history.when_below(11, 100, 2), None);
    }

    #[test]
    fn a_drop_counts_for_exactly_its_retention() {
        let mut history = HighWaterHistory::default();
        history.note_retention(100);
        history.record_drop(10, 8);
        assert_eq!(history.threshold(10, 100, 4), 8);
        assert_eq!(history.threshold(109, 100, 4), 8);
        assert_eq!(history.when_below(109, 100, 4), Some(110));
        assert_eq!(history.threshold(110, 100, 4), 4);
        assert_eq!(history.when_below(110, 100, 4), None);
        // A shorter retention of another storage of the space.
        history.record_drop(200, 4);
        assert_eq!(history.threshold(210, 20, 1), 4);
        assert_eq!(history.threshold(220, 20, 1), 1);
    }

    #[test]
    fn steps_down_are_kept_and_a_later_higher_drop_hides_earlier_lower_ones() {
        let mut history = HighWaterHistory::default();
        history.note_retention(1_000);
        history.record_drop(10, 8); // 8 -> 6
        history.record_drop(20, 6); // 6 -> 3
        assert_eq!(history.threshold(30, 1_000, 3), 8);
        assert_eq!(history.threshold(1_015, 1_000, 3), 6);
        assert_eq!(history.when_below(1_015, 1_000, 3), Some(1_020));
        // Back up to 9, then down to 2: every window holding the old drops holds this one.
        history.record_drop(40, 9);
        assert_eq!(history.drops.len(), 1);
        assert_eq!(history.threshold(1_039, 1_000, 2), 9);
        assert_eq!(history.threshold(1_040, 1_000, 2), 2);
    }

    #[test]
    fn a_kept_slot_is_woken_for_when_the_last_drop_from_above_it_is_old() {
        let mut history = HighWaterHistory::default();
        history.note_retention(1_000);
        history.record_drop(10, 8); // 8 -> 6
        history.record_drop(20, 6); // 6 -> 3
        // A slot at id 6 may go once the drop from 8 is old, one at id 4 only after the
        // drop from 6: a trim wakes for the slot it keeps, not for each step above it.
        assert_eq!(history.when_below(30, 1_000, 6), Some(1_010));
        assert_eq!(history.when_below(30, 1_000, 4), Some(1_020));
        assert_eq!(history.when_below(30, 1_000, 8), None);
        assert_eq!(history.when_below(1_020, 1_000, 4), None);
    }

    #[test]
    fn huge_retentions_and_times_saturate() {
        let mut history = HighWaterHistory::default();
        history.note_retention(u64::MAX);
        history.record_drop(u64::MAX - 1, 5);
        assert_eq!(history.threshold(u64::MAX, u64::MAX, 0), 5);
        assert_eq!(history.when_below(u64::MAX, u64::MAX, 0), Some(u64::MAX));
    }
}

//! A work's leeway: how late it may run so that it shares a wakeup with other works, as
//! Linux's timer slack and hrtimer ranges, libdispatch's leeway and Windows'
//! `SetCoalescableTimer` let a timer's owner say.
//!
//! # The window
//!
//! A work armed for deadline `d` with leeway `l` runs in the window from `d` to `d + l`:
//! never before `d`, and the workers wake for it by `d + l`. The scheduler's slack `s` is
//! every work's floor: a leeway below it (and no leeway at all) counts as `s`. The wheel
//! rounds every deadline up to its tick, which is the slack, and that rounding already
//! spends up to one slack of the window; so a timer entry's end is `d + (l - s)`, rounded
//! up to the tick, and the work starts by `d + l` plus the time a wakeup takes. A work
//! without a leeway of its own has its end at its deadline: the wakeups it always had.
//!
//! A `Yield` increment's window is its deadline alone, whatever the leeway: it runs as
//! soon as others had their turn.
//!
//! # The rule
//!
//! The workers and a hosted `next_deadline()` wake at the earliest end of any armed
//! window, and every wakeup (for whatever reason) runs every work whose deadline has come
//! (see `wheel`). So works whose windows overlap share one wakeup, and a lone work still
//! costs one wakeup per run, at the end of its window. This greedy rule is what hrtimer
//! ranges and libdispatch do; a grid as `round_jiffies` keeps is the other way, and it
//! coalesces less: a grid no coarser than the leeway has at least one point per leeway,
//! and works with different leeways round to different grids. Measured by
//! `cargo bench --bench work -- coalesced` (see `benches/README.md`).
//!
//! # Timeouts
//!
//! A timeout's due time is its last touch + idle, and its precision rule is "at most
//! `idle / 16 + leeway` late" (see `timeout`). A timeout whose touches read the touch
//! tick is due up to one tick interval late already, where the interval is
//! `max(idle / 16, leeway / 2)`; when half the leeway sets it, the window after the due
//! time keeps the other half (plus the idle's sixteenth), not the whole leeway. So a
//! leeway also buys a timeout cheap touches: at 125 ms or more its touches read no clock,
//! when it gets the leeway before its first touch (`sched.timeout(idle, f).leeway(l)`);
//! a timeout already touched keeps reading the clock, which is exact (see
//! `Shared::retick_timeout` for every case).
//!
//! # Storage
//!
//! 16 bits beside the parks count (see `stats`), which keeps the header at 72 bytes: an
//! 11-bit mantissa and a 5-bit exponent of deadline units (100 µs), rounded down, so a
//! leeway is kept within 1/1024 of itself and never longer than asked, up to about 13.9
//! years (longer ones are that). Written under the core lock only.
//!
//! # Setting it on an armed work
//!
//! `every`, `once` and `timeout` arm as they are created, so `leeway()` usually finds the
//! work's entry placed with the window it had before. The wheel can change the end of the
//! placement it made last while nothing else changed it since
//! (`Wheel::rewindow_last`), and that is the usual case: the entry keeps its tick and gets
//! its new end, and the timer is set for the wheel's new earliest end. Otherwise, on a
//! pending work, a wider leeway leaves the entry as it is (it wakes for its old, narrower
//! window once, and the next arm uses the new one), and a narrower one links a new entry,
//! so the work is never late for its new window. A work that is not pending but still
//! has a live entry (cancelled before its entry's tick) loses it: a lock-free arm would
//! otherwise reuse it with the old window, and the next arm links one with the new.

use std::time::Duration;

use super::timeout::IDLE_PARTS;
use super::{Header, WorkRef};
use crate::clock::nanos;
use crate::scheduler::shared::Shared;
use crate::scheduler::work::state::{DEADLINE_UNIT_NS, State, units_to_ns};

/// The 16-bit form of a leeway (see "Storage"); 0 is "none of its own".
pub(crate) struct LeewayCode;

impl LeewayCode {
    const MANTISSA_BITS: u32 = 11;
    const MANTISSA_MASK: u16 = (1 << Self::MANTISSA_BITS) - 1;
    const MAX_EXPONENT: u32 = 31;

    /// The code of `units`, rounded down.
    pub(crate) fn encode(units: u64) -> u16 {
        let bits = u64::BITS - units.leading_zeros();
        let exponent = bits.saturating_sub(Self::MANTISSA_BITS);
        if exponent > Self::MAX_EXPONENT {
            return u16::MAX;
        }
        let mantissa = (units >> exponent) as u16;
        ((exponent as u16) << Self::MANTISSA_BITS) | mantissa
    }

    /// The units a code stands for.
    pub(crate) fn decode(code: u16) -> u64 {
        u64::from(code & Self::MANTISSA_MASK) << (code >> Self::MANTISSA_BITS)
    }
}

// === `impl Shared`, this file's part: a work's leeway and the end of its window. ===
impl Shared {
    fn slack_units(&self) -> u64 {
        (self.slack_ns() / DEADLINE_UNIT_NS).max(1)
    }

    /// How far (units) a work's window ends past its deadline: its leeway beyond the slack.
    #[inline]
    fn leeway_past_slack(&self, header: &Header) -> u64 {
        match header.stats.leeway_code() {
            0 => 0,
            code => LeewayCode::decode(code).saturating_sub(self.slack_units()),
        }
    }

    /// The end (units) of the window of the instance `state` arms, due at `due`; `idle_ns`
    /// reads a timeout work's idle.
    #[inline]
    pub(crate) fn window_end(
        &self,
        header: &Header,
        state: State,
        due: u64,
        idle_ns: impl FnOnce() -> u64,
    ) -> u64 {
        if state.is_yield_increment() {
            return due;
        }
        let past_slack = self.leeway_past_slack(header);
        if past_slack == 0 || !state.is_timeout() || !Self::stamp_is_a_tick(header) {
            return due.saturating_add(past_slack);
        }
        // A tick-stamped timeout is due up to its tick interval late already: where half
        // its leeway sets that interval, the window keeps the other half (see "Timeouts").
        let leeway_ns = nanos(self.leeway_of(header));
        let idle_part = idle_ns() / IDLE_PARTS;
        if leeway_ns / 2 <= idle_part {
            return due.saturating_add(past_slack);
        }
        let window_ns = (idle_part + leeway_ns / 2).saturating_sub(self.slack_ns());
        due.saturating_add(window_ns / DEADLINE_UNIT_NS)
    }

    /// The work's leeway: its own, or the scheduler's slack where that is more.
    pub(crate) fn leeway_of(&self, header: &Header) -> Duration {
        let own = units_to_ns(LeewayCode::decode(header.stats.leeway_code()));
        Duration::from_nanos(own.max(self.slack_ns()))
    }

    /// Gives `work` its leeway; an armed work's entry gets the new window (see "Setting
    /// it on an armed work"), and a timeout work the touch stamps its precision allows
    /// (see "Timeouts").
    pub(crate) fn set_leeway(&self, work: &WorkRef, leeway: Duration) {
        let Some(mut core) = self.lock_unless_forked() else {
            return;
        };
        let header = work.header();
        let before = self.leeway_past_slack(header);
        let leeway_before_ns = nanos(self.leeway_of(header));
        header
            .stats
            .set_leeway_code(LeewayCode::encode(nanos(leeway) / DEADLINE_UNIT_NS));
        let past_slack = self.leeway_past_slack(header);
        let state = header.state.load();
        if state.is_timeout() && !core.shutdown && past_slack != before {
            let now = self.now_ns();
            self.retick_timeout(&mut core, work, leeway_before_ns, now);
        }
        if past_slack == before || core.shutdown || !state.has_live_entry() {
            return;
        }
        let (address, epoch) = (work.address(), state.epoch());
        let now = self.now_ns();
        let rewindowed = core.wheel.rewindow_last(
            |entry| entry.address() == address && entry.epoch() == epoch,
            |deadline| self.window_end(header, state, deadline, || work.period_ns()),
        );
        if rewindowed {
            self.follow_next_wake(&mut core, now);
        } else if !state.is_pending() {
            // Disarmed (cancelled before its entry's tick): its live entry would serve
            // the next arm lock-free, with the old window. Dropped, the next arm links one.
            let dropped = header.state.update(|old| {
                (old.is_live_entry(epoch) && !old.is_pending()).then(|| old.without_entry())
            });
            if dropped.is_some() {
                self.note_stale(&mut core, 1);
            }
        } else if past_slack < before {
            self.relink(&mut core, work, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LeewayCode;

    #[test]
    fn codes_are_exact_below_2048_units_and_never_above_the_leeway() {
        for units in 0..2048 {
            assert_eq!(LeewayCode::decode(LeewayCode::encode(units)), units);
        }
        let mut units = 2048u64;
        while units < 1 << 42 {
            let back = LeewayCode::decode(LeewayCode::encode(units));
            assert!(back <= units, "{units} came back as {back}");
            assert!(units - back <= units / 1024, "{units} came back as {back}");
            units = units * 3 / 2 + 7;
        }
    }

    #[test]
    fn huge_leeways_saturate_at_the_largest_code() {
        let largest = LeewayCode::decode(u16::MAX);
        assert_eq!(LeewayCode::decode(LeewayCode::encode(u64::MAX)), largest);
        // About 13.9 years of 100 µs units.
        assert!(largest > 13 * 365 * 24 * 3600 * 10_000);
    }
}

//! Hierarchical timing wheel: where an armed entry waits until it is due.
//!
//! # Layout
//!
//! Six levels of 64 slots. A slot at level `L` covers `64^L` ticks, so level 0 holds the
//! next 64 ticks one per slot and level 5 reaches `64^6` ticks (2.2 years at the default
//! 1 ms tick). The slots' contents live in [`Wheel`](super::Wheel); this keeps the
//! cursor and an `occupied` bitmap per level, so placing an entry is O(1) and finding the
//! next slot to process is one `trailing_zeros` per level.
//!
//! # Ground rules
//!
//! - `elapsed` is the last tick processed. An entry is only ever inserted with a tick
//!   `> elapsed` (the caller puts anything earlier straight onto the ready list).
//! - An entry's level is the highest 6-bit digit in which its tick differs from
//!   `elapsed` (tokio's `level_for`); the slot is that digit of its tick. So a level-`L`
//!   slot is processed exactly when `elapsed` reaches the start of its range, and its
//!   entries are re-inserted one level lower (cascaded) or, at level 0, are due.
//! - Ticks beyond the horizon are placed in level 5 by their digit there and cascaded
//!   again when that slot comes round: their exact tick is kept, so an entry is never due
//!   before its deadline, however far away it is.

/// Number of levels.
pub(crate) const LEVELS: usize = 6;
/// Slots per level.
pub(crate) const SLOTS: usize = 64;
pub(crate) const SLOT_BITS: u32 = 6;
/// First tick distance that no longer fits the wheel.
const HORIZON: u64 = 1 << (SLOT_BITS as usize * LEVELS);

/// The cursor and the occupancy bitmaps.
#[derive(Debug)]
pub(crate) struct Geometry {
    /// Last tick processed.
    pub(crate) elapsed: u64,
    occupied: [u64; LEVELS],
}

/// A slot that `next_expiration` found, with the tick at which it must be processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expiration {
    pub(crate) level: usize,
    pub(crate) slot: usize,
    pub(crate) tick: u64,
}

impl Geometry {
    pub(crate) fn new() -> Self {
        Geometry {
            elapsed: 0,
            occupied: [0; LEVELS],
        }
    }

    /// Level and slot for an entry due at `tick` (`tick > self.elapsed`).
    pub(crate) fn position(&self, tick: u64) -> (usize, usize) {
        debug_assert!(tick > self.elapsed);
        let mut masked = (self.elapsed ^ tick) | (SLOTS as u64 - 1);
        if masked >= HORIZON {
            masked = HORIZON - 1;
        }
        let significant = 63 - masked.leading_zeros();
        let level = (significant / SLOT_BITS) as usize;
        let slot = ((tick >> (level as u32 * SLOT_BITS)) as usize) & (SLOTS - 1);
        (level, slot)
    }

    /// Keeps a slot's occupancy bit in step with its contents.
    pub(crate) fn set_occupied(&mut self, level: usize, slot: usize, occupied: bool) {
        if occupied {
            self.occupied[level] |= 1 << slot;
        } else {
            self.occupied[level] &= !(1 << slot);
        }
    }

    /// The earliest slot that must be processed, if any entry is in the wheel.
    pub(crate) fn next_expiration(&self) -> Option<Expiration> {
        (0..LEVELS).find_map(|level| self.next_in_level(level))
    }

    /// A level's occupied slots in the order they come, each with the tick at which it
    /// is processed next (increasing along the way; see `next_in_level`).
    pub(crate) fn occupied_in_order(&self, level: usize) -> impl Iterator<Item = (usize, u64)> {
        let shift = level as u32 * SLOT_BITS;
        let first = (((self.elapsed >> shift) as usize) + 1) & (SLOTS - 1);
        let mut rest = self.occupied[level].rotate_right(first as u32);
        std::iter::from_fn(move || {
            if rest == 0 {
                return None;
            }
            let offset = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let slot = (offset + first) & (SLOTS - 1);
            Some((slot, self.slot_tick(level, slot)))
        })
    }

    fn next_in_level(&self, level: usize) -> Option<Expiration> {
        let occupied = self.occupied[level];
        if occupied == 0 {
            return None;
        }
        let shift = level as u32 * SLOT_BITS;
        let now_slot = ((self.elapsed >> shift) as usize) & (SLOTS - 1);
        // From the slot after the cursor's: the cursor's own slot can only hold deadlines
        // past the horizon that share its top digit (an ordinary entry's digit at its level
        // is above the cursor's), which come round a whole level range later, so it is
        // the last in rotation.
        let first = (now_slot + 1) & (SLOTS - 1);
        let slot =
            (occupied.rotate_right(first as u32).trailing_zeros() as usize + first) & (SLOTS - 1);
        Some(Expiration {
            level,
            slot,
            tick: self.slot_tick(level, slot),
        })
    }

    /// The tick at which a slot is processed next: the start of its coming range.
    pub(crate) fn slot_tick(&self, level: usize, slot: usize) -> u64 {
        let shift = level as u32 * SLOT_BITS;
        let slot_range = 1u64 << shift;
        let level_range = slot_range << SLOT_BITS;
        let level_start = self.elapsed & !(level_range.wrapping_sub(1));
        let tick = level_start + slot as u64 * slot_range;
        if tick <= self.elapsed {
            // Only entries clamped past the horizon sit "behind" the cursor; they are
            // cascaded when the level comes round again.
            tick.saturating_add(level_range)
        } else {
            tick
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_ticks_go_to_level_zero_in_their_own_slot() {
        let wheel = Geometry::new();
        assert_eq!(wheel.position(1), (0, 1));
        assert_eq!(wheel.position(63), (0, 63));
        assert_eq!(wheel.position(64), (1, 1));
        assert_eq!(wheel.position(64 * 64), (2, 1));
    }

    #[test]
    fn far_ticks_are_clamped_to_the_top_level() {
        let wheel = Geometry::new();
        assert_eq!(wheel.position(u64::MAX).0, LEVELS - 1);
    }

    #[test]
    fn next_expiration_is_the_start_of_the_slot_range() {
        let mut wheel = Geometry::new();
        wheel.elapsed = 10;
        let (level, slot) = wheel.position(200);
        wheel.set_occupied(level, slot, true);
        let exp = wheel.next_expiration().unwrap();
        assert_eq!((exp.level, exp.slot, exp.tick), (1, 3, 192));
    }
}

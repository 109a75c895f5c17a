//! `next_wake` with `Bag::first_tick`, across every level and past the wheel's horizon,
//! against a driver that only looks at the structure when `next_wake` says so (a sleeping
//! poller, or a host sleeping until `Driver::next_deadline`).

use crate::wheel::{ReadyOrder, Wheel};

const LEVEL5_SLOT: u64 = 1 << 30; // ticks a level-5 slot covers
const HORIZON: u64 = 1 << 36; // ticks the wheel reaches

/// A value placed beyond the horizon sits in a level-5 slot that comes *before* the slot of
/// an ordinary level-5 value; the slot's `first_tick` is the far value's tick, so
/// `next_wake` names the far tick and a sleeper misses the near value by years.
/// (Scheduler terms, 1 ms slack: a `Duration::MAX` work lands in level-5 slot 51, so any
/// work due 646..795 days out is woken for ~27 years later.)
#[test]
fn next_wake_is_not_later_than_a_value_in_a_later_top_level_slot() {
    let mut timers: Wheel<u32> = Wheel::new(1, ReadyOrder::ByEnd);
    let far = HORIZON + 5 * LEVEL5_SLOT; // clamped: level 5, slot 5
    let near = 10 * LEVEL5_SLOT; // level 5, slot 10
    timers.insert(1, far, far, 0);
    timers.insert(2, near, near, 0);
    let wake = timers.next_wake(0).unwrap();
    assert!(
        wake <= near,
        "next_wake {wake} is after the earliest deadline {near} (far one at {far})"
    );
}

/// The scheduler's own numbers: units of 100 us, tick 10 units (1 ms slack),
/// `DEADLINE_NEVER` = 2^43 - 1 units (a `Duration::MAX` arm), and a work due in 700 days.
#[test]
fn a_never_due_value_does_not_hide_one_due_in_700_days() {
    let mut timers: Wheel<u32> = Wheel::new(10, ReadyOrder::ByEnd);
    let never = (1u64 << 43) - 1;
    let day_units = 24 * 3600 * 10_000u64;
    let near = 700 * day_units;
    timers.insert(1, never, never, 0);
    timers.insert(2, near, near, 0);
    let wake = timers.next_wake(0).unwrap();
    assert!(
        wake <= near.div_ceil(10) * 10,
        "next_wake is {} days out, the work is due in 700",
        wake / day_units
    );
}

/// A value beyond the horizon whose level-5
/// digit equals the cursor's lands in the cursor's own level-5 slot, which
/// `next_expiration` returns first with tick `start + level range`; every other level-5
/// slot behind it is then never processed by `expire` until that far tick.
#[test]
fn expire_processes_a_top_level_slot_behind_a_wrapped_one() {
    let mut timers: Wheel<u32> = Wheel::new(1, ReadyOrder::ByEnd);
    timers.insert(1, HORIZON + 1000, HORIZON + 1000, 0); // clamped into level 5, slot 0 (the cursor's)
    timers.insert(2, 3 * LEVEL5_SLOT, 3 * LEVEL5_SLOT, 0); // level 5, slot 3
    timers.expire(3 * LEVEL5_SLOT, |v| {
        let deadline = if v == 1 {
            HORIZON + 1000
        } else {
            3 * LEVEL5_SLOT
        };
        Some((v, deadline, deadline))
    });
    let mut fired = Vec::new();
    while let Some((_, v)) = timers.pop_ready() {
        fired.push(v);
    }
    assert_eq!(
        fired,
        [2],
        "the value due at 3 * 2^30 ticks did not fire by then"
    );
}

fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// Random arms (log-uniform delays from 0 to beyond the horizon, each with a random
/// leeway, none for a third of them), cancels, lazy moves later, re-arms earlier (new
/// entry, the old one stale), sweeps; the driver jumps straight to `next_wake` (a
/// sleeper) or a bit before it. Checks: never early, nothing due is left behind, and
/// `next_wake` is never after the earliest live window's end.
fn sleeping_driver_round(seed: u64, tick: u64, max_bits: u32, far: bool, steps: usize) {
    let mut next = xorshift(seed);
    let mut timers: Wheel<(u32, u32)> = Wheel::new(tick, ReadyOrder::ByEnd);
    // id -> (epoch, deadline, leeway)
    let mut live: std::collections::HashMap<u32, (u32, u64, u64)> = Default::default();
    let mut now = 0u64;
    let mut id = 0u32;
    let mut epochs = 0u32;
    let leeway = |next: &mut dyn FnMut() -> u64| match next() % 3 {
        0 => 0,
        _ => next() % (tick << (next() % 12)),
    };
    for step in 0..steps {
        let delay = |next: &mut dyn FnMut() -> u64| {
            let bits = next() % u64::from(max_bits);
            let d = next() & ((1u64 << bits) - 1);
            if far && next() % 50 == 0 {
                d.saturating_mul(1 << 20)
            } else {
                d
            }
        };
        match next() % 10 {
            0..=2 => {
                let deadline = now.saturating_add(delay(&mut next)).min(u64::MAX / 4);
                let leeway = leeway(&mut next);
                id += 1;
                epochs += 1;
                timers.insert((id, epochs), deadline, deadline + leeway, now);
                live.insert(id, (epochs, deadline, leeway));
            }
            3 if !live.is_empty() => {
                let victim = *live.keys().nth((next() as usize) % live.len()).unwrap();
                live.remove(&victim);
            }
            4 if !live.is_empty() => {
                // Moved later without touching the structure.
                let k = *live.keys().nth((next() as usize) % live.len()).unwrap();
                let e = live.get_mut(&k).unwrap();
                e.1 = e.1.saturating_add(delay(&mut next)).min(u64::MAX / 4);
            }
            5 if !live.is_empty() => {
                // Re-armed earlier: a new entry, the old one stale.
                let k = *live.keys().nth((next() as usize) % live.len()).unwrap();
                let (_, old, leeway) = live[&k];
                let deadline = now + (old.saturating_sub(now)) / (1 + next() % 8);
                epochs += 1;
                timers.insert((k, epochs), deadline, deadline + leeway, now);
                live.insert(k, (epochs, deadline, leeway));
            }
            6 => {
                timers.retain(|&(k, e)| live.get(&k).is_some_and(|l| l.0 == e));
            }
            _ => {
                let earliest = live.values().map(|l| l.1 + l.2).min();
                if let Some(earliest) = earliest {
                    let bound = earliest.div_ceil(tick) * tick;
                    let wake = timers.next_wake(now);
                    assert!(
                        wake.is_some_and(|w| w <= bound.max(now)),
                        "seed {seed} step {step}: next_wake {wake:?} > earliest live end \
                         {earliest} (rounded {bound}), now {now}"
                    );
                }
                let Some(wake) = timers.next_wake(now) else {
                    continue;
                };
                let target = if next() % 3 == 0 {
                    now.max(wake.saturating_sub(next() % (4 * tick)))
                } else {
                    wake
                };
                if target >= u64::MAX / 4 {
                    continue;
                }
                now = now.max(target);
                timers.expire(now, |(k, e)| {
                    let l = live.get(&k)?;
                    (l.0 == e).then_some(((k, e), l.1, l.1 + l.2))
                });
                while let Some((placed, (k, e))) = timers.pop_ready() {
                    let Some(&(le, deadline, leeway)) = live.get(&k) else {
                        continue;
                    };
                    if le != e {
                        continue;
                    }
                    if deadline > now {
                        // Moved later after it was queued: back in.
                        timers.insert((k, e), deadline, deadline + leeway, now);
                        continue;
                    }
                    assert!(placed <= now, "fired early");
                    live.remove(&k);
                }
                let late: Vec<_> = live
                    .iter()
                    .filter(|(_, l)| l.1.div_ceil(tick) * tick <= now)
                    .collect();
                assert!(
                    late.is_empty(),
                    "seed {seed} step {step}: due by {now} but not fired: {late:?}"
                );
            }
        }
    }
}

#[test]
fn sleeping_driver_short_delays_match_a_reference() {
    for seed in 1..40u64 {
        sleeping_driver_round(
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            10,
            20,
            false,
            3000,
        );
    }
}

#[test]
fn sleeping_driver_all_levels_below_the_horizon_match_a_reference() {
    for seed in 1..40u64 {
        sleeping_driver_round(seed.wrapping_mul(0x2545_F491_4F6C_DD1D), 7, 36, false, 3000);
    }
}

#[test]
fn sleeping_driver_past_the_horizon_matches_a_reference() {
    for seed in 1..40u64 {
        sleeping_driver_round(seed.wrapping_mul(0xD6E8_FEB8_6659_FD93), 1, 44, true, 3000);
    }
}

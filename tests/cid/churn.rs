//! Uniqueness of ids and exclusivity of slots under churn.
//!
//! Several leaked spaces on one threaded scheduler scanning every `MIN_SCAN_PERIOD`,
//! threads that come and go (so `held` shrinks and survivors get the MOVE mark), nested
//! enters, guards kept in thread-locals destroyed after nicework's exit hook, guards
//! leaked with `mem::forget`, `PerCid::with` inside late destructors, a reader in a loop,
//! and (in the second test) the scheduler dropped half-way so trims move to thread exits.
//!
//! Every first-level guard claims its id in a per-space table (compare-exchange from 0 to
//! the thread's tag), so two live guards of different threads on one id are caught at
//! once; `with` claims its slot the same way and the reader checks no slot it visits is
//! claimed.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nicework::{Cid, IdSpace, MIN_SCAN_PERIOD, PerCid, Scheduler};

const SPACES: usize = 3;
const TABLE: usize = 4096;

struct World {
    spaces: Vec<&'static IdSpace>,
    tables: Vec<Vec<AtomicUsize>>,
    /// One PerCid per space: the slot's claim, and a count of `with` calls.
    slots: Vec<&'static PerCid<(AtomicUsize, AtomicU64)>>,
    folded: Vec<Arc<AtomicU64>>,
    calls: Vec<AtomicU64>,
    errors: Mutex<Vec<String>>,
}

impl World {
    fn new(sched: &Scheduler) -> &'static World {
        let spaces: Vec<&'static IdSpace> = (0..SPACES)
            .map(|_| {
                &*Box::leak(Box::new(
                    IdSpace::builder().scan_period(MIN_SCAN_PERIOD).build(sched),
                ))
            })
            .collect();
        let folded: Vec<Arc<AtomicU64>> =
            (0..SPACES).map(|_| Arc::new(AtomicU64::new(0))).collect();
        let slots = spaces
            .iter()
            .zip(&folded)
            .map(|(space, folded)| {
                let folded = folded.clone();
                &*Box::leak(Box::new(PerCid::with_reclaim(
                    space,
                    || (AtomicUsize::new(0), AtomicU64::new(0)),
                    move |slot: &mut (AtomicUsize, AtomicU64)| {
                        assert_eq!(*slot.0.get_mut(), 0, "attack: a reclaimed slot is claimed");
                        folded.fetch_add(*slot.1.get_mut(), Ordering::Relaxed);
                    },
                )))
            })
            .collect();
        Box::leak(Box::new(World {
            spaces,
            tables: (0..SPACES)
                .map(|_| (0..TABLE).map(|_| AtomicUsize::new(0)).collect())
                .collect(),
            slots,
            folded,
            calls: (0..SPACES).map(|_| AtomicU64::new(0)).collect(),
            errors: Mutex::new(Vec::new()),
        }))
    }

    fn error(&self, text: String) {
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 20 {
            errors.push(text);
        }
    }

    /// Claims `id` of space `s` for `tag`; `own` says whether this thread may already hold
    /// it (a leaked or late guard of its own).
    fn claim(&self, s: usize, id: usize, tag: usize) -> bool {
        if id >= TABLE {
            self.error(format!("space {s}: id {id} out of range"));
            return false;
        }
        match self.tables[s][id].compare_exchange(0, tag, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(other) if other == tag => false,
            Err(other) => {
                self.error(format!(
                    "space {s}: id {id} handed to thread {tag} while thread {other} holds it"
                ));
                false
            }
        }
    }

    fn unclaim(&self, s: usize, id: usize, tag: usize) {
        if self.tables[s][id]
            .compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            self.error(format!("space {s}: id {id} lost thread {tag}'s claim"));
        }
    }

    fn with(&self, s: usize, tag: usize) {
        self.slots[s].with(|slot| {
            if let Err(other) = slot
                .0
                .compare_exchange(0, tag, Ordering::AcqRel, Ordering::Acquire)
            {
                self.error(format!(
                    "space {s}: slot claimed by {other} inside {tag}'s with"
                ));
                return;
            }
            *slot.1.get_mut() += 1;
            self.calls[s].fetch_add(1, Ordering::Relaxed);
            std::hint::spin_loop();
            slot.0.store(0, Ordering::Release);
        });
    }
}

/// A guard that outlives the exit hook: its destructor unclaims, then drops the guard.
struct Late {
    world: &'static World,
    held: Vec<(usize, usize, usize, Cid<'static>)>,
    with_at_drop: Vec<usize>,
}

impl Drop for Late {
    fn drop(&mut self) {
        for s in self.with_at_drop.drain(..) {
            // A late `with`: an orphan's id (nested) or a late orphan of its own.
            self.world.with(s, tag());
        }
        for (s, id, t, cid) in self.held.drain(..).rev() {
            // Still ours: nested enter returns it.
            let again = self.world.spaces[s].enter();
            if again.get() != id {
                self.world.error(format!(
                    "space {s}: nested enter in a late destructor returned {} not {id}",
                    again.get()
                ));
            }
            drop(again);
            if t != 0 {
                self.world.unclaim(s, id, t);
            }
            drop(cid);
        }
    }
}

thread_local! {
    static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
    static TAG: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

fn tag() -> usize {
    TAG.with(|t| *t)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn worker(world: &'static World, seed: u64, ops: usize) {
    let mut rng = Rng(seed | 1);
    let me = tag();
    // First use before any enter: destroyed after nicework's exit hook.
    LATE.with(|late| {
        *late.borrow_mut() = Some(Late {
            world,
            held: Vec::new(),
            with_at_drop: Vec::new(),
        })
    });
    // Ids this thread holds through leaked or late guards: (space, id).
    let mut pinned: Vec<Option<usize>> = vec![None; SPACES];
    for _ in 0..ops {
        let s = (rng.next() % SPACES as u64) as usize;
        let space = world.spaces[s];
        match rng.next() % 16 {
            0..=8 => {
                let g = space.enter();
                let id = g.get();
                if id >= space.high_water() {
                    world.error(format!(
                        "space {s}: id {id} >= high water {}",
                        space.high_water()
                    ));
                }
                let claimed = match pinned[s] {
                    Some(p) if p != id => {
                        world.error(format!("space {s}: pinned on {p}, enter returned {id}"));
                        false
                    }
                    Some(_) => false,
                    None => world.claim(s, id, me),
                };
                let depth = rng.next() % 3;
                for _ in 0..depth {
                    let n = space.enter();
                    if n.get() != id {
                        world.error(format!("space {s}: nested {} != outer {id}", n.get()));
                    }
                    if rng.next() % 4 == 0 {
                        std::thread::yield_now();
                    }
                }
                if rng.next() % 8 == 0 {
                    std::thread::sleep(Duration::from_micros(rng.next() % 2000));
                }
                if claimed {
                    world.unclaim(s, id, me);
                }
                drop(g);
            }
            9..=12 => world.with(s, me),
            13 => {
                // Keep a guard until after the exit hook.
                if pinned[s].is_none() && rng.next() % 4 == 0 {
                    let g = space.enter();
                    let id = g.get();
                    let claimed = world.claim(s, id, me);
                    pinned[s] = Some(id);
                    LATE.with(|late| {
                        late.borrow_mut().as_mut().unwrap().held.push((
                            s,
                            id,
                            if claimed { me } else { 0 },
                            g,
                        ))
                    });
                } else {
                    LATE.with(|late| late.borrow_mut().as_mut().unwrap().with_at_drop.push(s));
                }
            }
            14 => {
                // Leak a guard: the id is this thread's for good (claim never released).
                if pinned[s].is_none() && rng.next() % 16 == 0 {
                    let g = space.enter();
                    let id = g.get();
                    world.claim(s, id, me);
                    pinned[s] = Some(id);
                    std::mem::forget(g);
                }
            }
            _ => {
                std::thread::sleep(Duration::from_micros(rng.next() % 3000));
            }
        }
    }
}

fn run(drop_scheduler_after: Option<Duration>, total: Duration) {
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let world = World::new(&sched);
    let stop = Arc::new(AtomicBool::new(false));
    let sched_slot = Arc::new(Mutex::new(Some(sched)));
    let start = Instant::now();

    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut passes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for s in 0..SPACES {
                    world.slots[s].for_each(|slot| {
                        let claim = slot.0.load(Ordering::Acquire);
                        if claim != 0 {
                            world.error(format!(
                                "space {s}: for_each saw a slot claimed by {claim}"
                            ));
                        }
                    });
                }
                passes += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            passes
        })
    };

    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut threads = 0;
    let mut dropped = false;
    while start.elapsed() < total {
        if let Some(after) = drop_scheduler_after {
            if !dropped && start.elapsed() >= after {
                drop(sched_slot.lock().unwrap().take());
                dropped = true;
            }
        }
        // A wave of short-lived threads, plus some that stay for the next wave.
        let wave: Vec<_> = (0..6)
            .map(|i| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let s = seed;
                std::thread::spawn(move || worker(world, s, 50 + i * 40))
            })
            .collect();
        for t in wave {
            t.join().unwrap();
            threads += 1;
        }
        if !world.errors.lock().unwrap().is_empty() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let passes = reader.join().unwrap();
    let errors = world.errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "after {threads} threads:\n{}",
        errors.join("\n")
    );
    // Every thread has exited: nothing is held except leaked guards' ids.
    for s in 0..SPACES {
        let leaked = world.tables[s]
            .iter()
            .filter(|c| c.load(Ordering::Relaxed) != 0)
            .count();
        assert_eq!(
            world.spaces[s].held(),
            leaked,
            "space {s}: held() counts ids no live guard or leak explains"
        );
        // live + folded == every increment
        let mut live = 0;
        world.slots[s].for_each(|slot| live += slot.1.load(Ordering::Relaxed));
        assert_eq!(
            live + world.folded[s].load(Ordering::Relaxed),
            world.calls[s].load(Ordering::Relaxed),
            "space {s}: live + folded != increments"
        );
    }
    println!("{threads} threads, {passes} reader passes");
}

#[test]
fn ids_and_slots_stay_exclusive_under_churn_moves_and_late_guards() {
    run(None, Duration::from_secs(4));
}

#[test]
fn ids_and_slots_stay_exclusive_when_the_scheduler_is_dropped_midway() {
    run(Some(Duration::from_millis(1500)), Duration::from_secs(4));
}

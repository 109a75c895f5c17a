//! A sharded cache with one purge work per shard: the work runs while its shard has
//! entries that can expire, parks (no timer, no wakeups) while the shard is idle, is
//! re-armed by the next insert's `touch()`, and is cancelled synchronously when its shard
//! is dropped.
//!
//! `cargo run --release --example cache_cleanup`

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

const TTL: Duration = Duration::from_millis(50);
const PURGE_PERIOD: Duration = Duration::from_millis(20);

/// One shard: entries with their expiry, and the work that purges them.
struct Shard {
    entries: Mutex<HashMap<u64, (String, Instant)>>,
    purge: Work,
    /// The scheduler's clock: `Instant::now()` would break when this code runs on a
    /// `Scheduler::manual()` in a test, where time is virtual.
    clock: Scheduler,
}

impl Shard {
    fn new(sched: &Scheduler, name: String) -> Arc<Shard> {
        // The shard owns its work, built in one step: the work reaches the shard through
        // the Weak that `new_cyclic` hands out, and stops by itself once the shard is gone.
        Arc::new_cyclic(|me: &Weak<Shard>| Shard {
            entries: Mutex::new(HashMap::new()),
            purge: sched
                .every_for(me, PURGE_PERIOD, |shard: &Shard, cx| {
                    let now = cx.scheduler().now();
                    let mut entries = shard.entries.lock().unwrap();
                    entries.retain(|_, (_, expires)| *expires > now);
                    if entries.is_empty() {
                        Next::Park // idle: costs nothing until the next insert touches it
                    } else {
                        Next::Again
                    }
                })
                .named(name),
            clock: sched.clone(),
        })
    }

    fn insert(&self, key: u64, value: String) {
        self.entries
            .lock()
            .unwrap()
            .insert(key, (value, self.clock.now() + TTL));
        // Arms the purge for its period if it was parked; ~2 ns if it is already armed.
        self.purge.touch();
    }

    fn stats(&self) -> (usize, nicework::WorkStats, bool) {
        (
            self.entries.lock().unwrap().len(),
            self.purge.stats(),
            self.purge.is_pending(),
        )
    }
}

/// A cache of shards; a key goes to shard `key % shards`.
struct Cache {
    shards: Vec<Option<Arc<Shard>>>,
}

impl Cache {
    fn insert(&self, key: u64, value: String) {
        if let Some(shard) = &self.shards[key as usize % self.shards.len()] {
            shard.insert(key, value);
        }
    }

    fn print(&self, sched: &Scheduler, title: &str) {
        println!(
            "\n{title} (armed works: {}, worker wakeups so far: {})",
            sched.metrics().armed,
            sched.metrics().worker_wakeups
        );
        println!(
            "{:<10} {:>8} {:>7} {:>7} {:>8} {:>10}",
            "shard", "entries", "runs", "parks", "armed", "busy avg"
        );
        for (i, shard) in self.shards.iter().enumerate() {
            match shard {
                Some(shard) => {
                    let (entries, stats, armed) = shard.stats();
                    println!(
                        "{:<10} {:>8} {:>7} {:>7} {:>8} {:>10.2?}",
                        format!("shard-{i}"),
                        entries,
                        stats.runs,
                        stats.parks,
                        armed,
                        stats.busy_avg()
                    );
                }
                None => println!("{:<10} {:>8}", format!("shard-{i}"), "dropped"),
            }
        }
    }
}

fn main() -> Result<(), nicework::Error> {
    let sched = Scheduler::new()?;
    let mut cache = Cache {
        shards: (0..8)
            .map(|i| Some(Shard::new(&sched, format!("purge shard-{i}"))))
            .collect(),
    };
    // Every purge work was armed by every_for(); the first run finds its shard empty
    // and parks.
    std::thread::sleep(PURGE_PERIOD * 3);

    // Traffic on the even shards only, for half a second.
    let start = Instant::now();
    let mut key = 0u64;
    while start.elapsed() < Duration::from_millis(500) {
        for _ in 0..50 {
            key += 1;
            if (key % 8) % 2 == 0 {
                cache.insert(key, format!("value-{key}"));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cache.print(&sched, "after 0.5 s of traffic on the even shards");

    // No traffic: entries expire, the purges remove them and park.
    std::thread::sleep(TTL + PURGE_PERIOD * 3);
    let wakeups = sched.metrics().worker_wakeups;
    std::thread::sleep(Duration::from_millis(500));
    cache.print(&sched, "idle again");
    println!(
        "worker wakeups during the last 0.5 s of idleness: {}",
        sched.metrics().worker_wakeups - wakeups
    );

    // Drop half the shards: each purge work is cancelled synchronously with its shard
    // (drop of a Work waits for a running purge and frees its closure).
    for shard in cache.shards.iter_mut().take(4) {
        let dropped = shard.take().unwrap();
        drop(dropped);
    }
    for key in 0..64 {
        cache.insert(key, format!("late-{key}"));
    }
    std::thread::sleep(TTL + PURGE_PERIOD * 3);
    cache.print(
        &sched,
        "shards 0-3 dropped, a burst of inserts on the rest, expired",
    );
    Ok(())
}

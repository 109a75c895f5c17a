//! The main demo: concurrency ids compacting as a "runtime" shrinks and grows.
//!
//! A runtime's threads keep a per-id cache (`PerCid<Vec<u64>>`). It starts 32 threads,
//! shrinks to 4, then to 1, then grows to 8, then to 200. Every 100 ms a line shows the
//! threads alive, the ids held, the high water and the live cache slots: ids stay dense
//! and the per-id memory follows the live concurrency. While the threads outnumber the
//! machine's CPUs, the ids follow the CPUs instead, as the kernel's `mm_cid` does: 200
//! threads on 2 CPUs hold about 2 ids (each guard borrows its CPU's id for its length).
//! At the end, the compaction work's stats table (as in the kernel patch's
//! `task_mm_cid_work` table) and the per-object maintenance works of a small cache.
//!
//! `cargo run --release --example compaction`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nicework::{IdSpace, Next, PerCid, Scheduler, Work, WorkStats};

struct RuntimeThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

fn spawn(cache: &Arc<PerCid<Vec<u64>>>) -> RuntimeThread {
    let stop = Arc::new(AtomicBool::new(false));
    let (cache, flag) = (cache.clone(), stop.clone());
    let handle = std::thread::spawn(move || {
        let mut n = 0u64;
        while !flag.load(Ordering::Relaxed) {
            cache.with(|slot| {
                slot.push(n);
                if slot.len() > 1024 {
                    slot.clear();
                }
            });
            n += 1;
            std::thread::sleep(Duration::from_micros(500));
        }
    });
    RuntimeThread { stop, handle }
}

/// A cache shard whose purge work parks while nobody writes to it.
struct Shard {
    writes: AtomicU64,
    purge: Work,
}

fn main() -> Result<(), nicework::Error> {
    let sched = Scheduler::builder().name("maint").build()?;
    let ids = IdSpace::new(&sched);
    let cache: Arc<PerCid<Vec<u64>>> = Arc::new(PerCid::new(&ids, Vec::new));
    let reclaimed = Arc::new(AtomicU64::new(0));
    let counter = reclaimed.clone();
    cache.on_reclaim(move |slot| {
        counter.fetch_add(slot.len() as u64, Ordering::Relaxed);
        slot.clear();
    });

    // A few per-object works beside the id space: they park while their shard is idle.
    let shards: Vec<Arc<Shard>> = (0..100)
        .map(|_| {
            // The shard owns its work; the work reaches it through new_cyclic's Weak.
            Arc::new_cyclic(|me: &Weak<Shard>| Shard {
                writes: AtomicU64::new(0),
                purge: sched
                    .every_for(me, Duration::from_millis(50), |shard: &Shard, _| {
                        if shard.writes.swap(0, Ordering::SeqCst) == 0 {
                            Next::Park
                        } else {
                            Next::Again
                        }
                    })
                    .named("shard purge"),
            })
        })
        .collect();

    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("on {cpus} CPUs");
    println!(
        "{:>6} {:>8} {:>8} {:>10} {:>10}   phase",
        "t(ms)", "threads", "held", "high water", "slots live"
    );
    let start = Instant::now();
    let mut threads: Vec<RuntimeThread> = Vec::new();
    for (phase, target) in [
        ("grow to 32", 32),
        ("shrink to 4", 4),
        ("shrink to 1", 1),
        ("grow to 8", 8),
        ("grow to 200", 200),
    ] {
        while threads.len() < target {
            threads.push(spawn(&cache));
        }
        while threads.len() > target {
            let thread = threads.pop().expect("more than target");
            thread.stop.store(true, Ordering::Relaxed);
            thread.handle.join().expect("runtime thread");
        }
        for tick in 0..10 {
            for shard in &shards[..(threads.len() * 3).min(shards.len())] {
                shard.writes.fetch_add(1, Ordering::SeqCst);
                shard.purge.touch();
            }
            std::thread::sleep(Duration::from_millis(100));
            println!(
                "{:>6} {:>8} {:>8} {:>10} {:>10}   {}",
                start.elapsed().as_millis(),
                ids.threads(),
                ids.held(),
                ids.high_water(),
                cache.live(),
                if tick == 0 { phase } else { "" }
            );
        }
    }
    for thread in threads.drain(..) {
        thread.stop.store(true, Ordering::Relaxed);
        thread.handle.join().expect("runtime thread");
    }
    std::thread::sleep(Duration::from_millis(250));
    println!(
        "{:>6} {:>8} {:>8} {:>10} {:>10}   all stopped; {} cached values reclaimed",
        start.elapsed().as_millis(),
        ids.threads(),
        ids.held(),
        ids.high_water(),
        cache.live(),
        reclaimed.load(Ordering::Relaxed)
    );

    println!("\nmaintenance works");
    println!(
        "{:<24} {:>6} {:>6} {:>11} {:>11} {:>11}",
        "work", "runs", "parks", "busy avg", "busy max", "busy sum"
    );
    print_row("cid compaction", &ids.compaction_stats());
    let mut total = WorkStats::default();
    for shard in &shards {
        let stats = shard.purge.stats();
        total.runs += stats.runs;
        total.parks += stats.parks;
        total.busy_total += stats.busy_total;
        total.busy_max = total.busy_max.max(stats.busy_max);
    }
    print_row("100 shard purges (sum)", &total);
    Ok(())
}

fn print_row(name: &str, stats: &WorkStats) {
    println!(
        "{:<24} {:>6} {:>6} {:>11.2?} {:>11.2?} {:>11.2?}",
        name,
        stats.runs,
        stats.parks,
        stats.busy_avg(),
        stats.busy_max,
        stats.busy_total
    );
}

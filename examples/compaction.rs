//! The main demo. For now (the ID space is the next issue) it shows the scheduler half:
//! 1,000 per-object maintenance works that run while their object is busy and park while
//! it is idle, so an idle population costs nothing, followed by the works' stats table.
//!
//! `cargo run --release --example compaction`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

/// A cache shard whose purge work parks while nobody writes to it.
struct Shard {
    writes: AtomicU64,
    purged: AtomicU64,
    purge: Mutex<Option<Work>>,
}

fn main() -> Result<(), nicework::Error> {
    let sched = Scheduler::builder().name("maint").build()?;
    let shards: Vec<Arc<Shard>> = (0..1000)
        .map(|_| {
            let shard = Arc::new(Shard {
                writes: AtomicU64::new(0),
                purged: AtomicU64::new(0),
                purge: Mutex::new(None),
            });
            let work = sched.every_for(&shard, Duration::from_millis(20), |shard, _| {
                let writes = shard.writes.swap(0, Ordering::SeqCst);
                if writes == 0 {
                    return Next::Park;
                }
                shard.purged.fetch_add(writes, Ordering::Relaxed);
                Next::Again
            });
            *shard.purge.lock().unwrap() = Some(work);
            shard
        })
        .collect();

    let tid = sched.worker_tids()[0];
    println!(
        "{:>6} {:>12} {:>12} {:>10} {:>12}",
        "t(ms)", "busy shards", "armed works", "wakeups", "purged"
    );
    let start = Instant::now();
    let mut last_switches = switches(tid);
    for step in 0..20u64 {
        // The first half: every shard busy. The second: only 10 shards, then none.
        let busy = match step {
            0..=7 => shards.len(),
            8..=13 => 10,
            _ => 0,
        };
        for shard in &shards[..busy] {
            shard.writes.fetch_add(1, Ordering::SeqCst);
            if let Some(work) = shard.purge.lock().unwrap().as_ref() {
                work.touch();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        let now = switches(tid);
        let purged: u64 = shards
            .iter()
            .map(|s| s.purged.load(Ordering::Relaxed))
            .sum();
        println!(
            "{:>6} {:>12} {:>12} {:>10} {:>12}",
            start.elapsed().as_millis(),
            busy,
            sched.armed(),
            now - last_switches,
            purged
        );
        last_switches = now;
    }

    println!("\nmaintenance works (1,000 shards):");
    println!(
        "{:>8} {:>8} {:>12} {:>12} {:>12}",
        "runs", "parks", "busy avg", "busy max", "busy sum"
    );
    let (mut runs, mut parks) = (0, 0);
    let (mut sum, mut max) = (Duration::ZERO, Duration::ZERO);
    for shard in &shards {
        let stats = shard.purge.lock().unwrap().as_ref().unwrap().stats();
        runs += stats.runs;
        parks += stats.parks;
        sum += stats.busy_total;
        max = max.max(stats.busy_max);
    }
    let avg = if runs > 0 {
        sum / runs as u32
    } else {
        Duration::ZERO
    };
    println!("{runs:>8} {parks:>8} {avg:>12.2?} {max:>12.2?} {sum:>12.2?}");
    Ok(())
}

/// Worker wakeups so far: its voluntary context switches.
fn switches(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

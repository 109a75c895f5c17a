//! Sharded statistics counters that follow the live concurrency.
//!
//! A request pool grows from 2 to 64 threads, then shrinks to 4. Each request bumps its
//! thread's counter in a `PerCid<AtomicU64>` (plain adds through `&mut`: no atomic
//! read-modify-write). A reporter thread sums the counters with `for_each` every 20 ms
//! while the pool works. When threads go away, the compaction scan hands their slots to
//! `on_reclaim`, which folds them into a total, and frees the slot arrays above the ids
//! still in use.
//!
//! The same job is done with `thread_local::ThreadLocal<AtomicU64>` + `iter().sum()`. The
//! heap each one holds after the shrink is printed side by side (a counting allocator,
//! minus a run of the same pool with no counters at all). The example exits non-zero if
//! an increment was lost.
//!
//! `cargo run --release --example sharded_counters`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

use nicework::{IdSpace, PerCid, Scheduler};
use thread_local::ThreadLocal;

// The heap is counted by the test suite's counting allocator (live bytes).
#[path = "common/counting.rs"]
mod counting;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// What the pool counts into.
trait Counters: Send + Sync + 'static {
    /// One request on the calling thread.
    fn bump(&self);
    /// Everything counted so far, as the reporter sees it.
    fn total(&self) -> u64;
}

/// nicework: a counter per concurrency id, reclaimed slots folded into `folded`.
struct Sharded {
    _ids: IdSpace,
    counters: PerCid<AtomicU64>,
    folded: Arc<AtomicU64>,
}

impl Sharded {
    fn new(sched: &Scheduler) -> Self {
        let ids = IdSpace::builder()
            .scan_period(Duration::from_millis(20))
            .build(sched);
        let folded = Arc::new(AtomicU64::new(0));
        let sink = folded.clone();
        // The reclaim callback is set at creation: no slot can be trimmed before it.
        let counters = PerCid::with_reclaim(
            &ids,
            || AtomicU64::new(0),
            move |slot: &mut AtomicU64| {
                sink.fetch_add(*slot.get_mut(), Relaxed);
            },
        );
        Sharded {
            _ids: ids,
            counters,
            folded,
        }
    }
}

impl Counters for Sharded {
    fn bump(&self) {
        self.counters.with(|n| *n.get_mut() += 1);
    }

    fn total(&self) -> u64 {
        // Folded first: a slot trimmed in between is then missed once (the sum lags)
        // rather than counted twice.
        let mut total = self.folded.load(Relaxed);
        self.counters.for_each(|n| total += n.load(Relaxed));
        total
    }
}

/// `thread_local`: a counter per thread that ever ran, kept until the end.
struct PerThread(ThreadLocal<AtomicU64>);

impl Counters for PerThread {
    fn bump(&self) {
        let n = self.0.get_or(|| AtomicU64::new(0));
        n.store(n.load(Relaxed) + 1, Relaxed);
    }

    fn total(&self) -> u64 {
        self.0.iter().map(|n| n.load(Relaxed)).sum()
    }
}

/// The pool's own cost, for the baseline run.
struct Nothing;

impl Counters for Nothing {
    fn bump(&self) {}
    fn total(&self) -> u64 {
        0
    }
}

struct Worker {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<u64>,
}

fn spawn<C: Counters>(counters: &Arc<C>) -> Worker {
    let stop = Arc::new(AtomicBool::new(false));
    let (counters, flag) = (counters.clone(), stop.clone());
    let handle = std::thread::spawn(move || {
        let mut requests = 0u64;
        while !flag.load(Relaxed) {
            for _ in 0..64 {
                counters.bump();
            }
            requests += 64;
            std::thread::sleep(Duration::from_micros(200));
        }
        requests
    });
    Worker { stop, handle }
}

fn retire(workers: Vec<Worker>) -> u64 {
    for worker in &workers {
        worker.stop.store(true, Relaxed);
    }
    // A join waits for the thread's exit, which releases its concurrency id.
    workers.into_iter().map(|w| w.handle.join().unwrap()).sum()
}

struct Run {
    /// Heap held once the pool is down to 4 threads (pool and counters together).
    heap_after_shrink: isize,
    /// Requests the workers made.
    requests: u64,
    /// What the counters say at the end.
    counted: u64,
    /// Sums the reporter took while the pool was running.
    reports: u64,
}

/// 2 threads, then 64, then the first 60 leave and 4 go on for 200 ms (ten scans).
fn run<C: Counters>(name: &'static str, counters: C, verbose: bool) -> Run {
    let base = counting::live_bytes();
    let counters = Arc::new(counters);
    let reporting = Arc::new(AtomicBool::new(true));
    let reporter = {
        let (counters, reporting) = (counters.clone(), reporting.clone());
        std::thread::spawn(move || {
            let mut reports = 0u64;
            while reporting.load(Relaxed) {
                let total = counters.total();
                reports += 1;
                if verbose && reports % 10 == 0 {
                    println!("  {name}: {total:>9} requests counted so far");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            reports
        })
    };
    let mut leaving: Vec<Worker> = (0..2).map(|_| spawn(&counters)).collect();
    std::thread::sleep(Duration::from_millis(100));
    leaving.extend((0..58).map(|_| spawn(&counters)));
    let staying: Vec<Worker> = (0..4).map(|_| spawn(&counters)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut requests = retire(leaving);
    std::thread::sleep(Duration::from_millis(200));
    let heap_after_shrink = counting::live_bytes() - base;
    requests += retire(staying);
    reporting.store(false, Relaxed);
    let reports = reporter.join().unwrap();
    let counted = counters.total();
    Run {
        heap_after_shrink,
        requests,
        counted,
        reports,
    }
}

fn main() {
    let sched = Scheduler::new().expect("a scheduler");
    // The pool alone, for the baseline (a warm-up run first: one-time allocations).
    run("nothing", Nothing, false);
    let pool = run("nothing", Nothing, false).heap_after_shrink;
    println!("pool: 2 -> 64 -> 4 threads; a reporter sums the counters every 20 ms");
    let sharded = run("PerCid", Sharded::new(&sched), true);
    let per_thread = run("ThreadLocal", PerThread(ThreadLocal::new()), true);
    println!();
    println!(
        "{:<34} {:>12} {:>12} {:>10} {:>16}",
        "counters", "requests", "counted", "reports", "heap after 64->4"
    );
    for (name, run) in [
        ("PerCid<AtomicU64> + for_each", &sharded),
        ("ThreadLocal<AtomicU64> + iter", &per_thread),
    ] {
        println!(
            "{name:<34} {:>12} {:>12} {:>10} {:>14} B",
            run.requests,
            run.counted,
            run.reports,
            run.heap_after_shrink - pool
        );
    }
    let ratio = (per_thread.heap_after_shrink - pool) as f64
        / (sharded.heap_after_shrink - pool).max(1) as f64;
    println!("ThreadLocal holds {ratio:.1}x the heap PerCid holds after the shrink");
    let lost = [&sharded, &per_thread]
        .iter()
        .any(|run| run.counted != run.requests);
    if lost {
        eprintln!("increments were lost");
        std::process::exit(1);
    }
    println!("no increment lost");
}

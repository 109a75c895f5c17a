//! Scale: 1,000,000 objects with a periodic cleanup each, 1 % of them active per period.
//!
//! `cargo bench --bench scale` (add `quick` for 3 shorter windows).
//!
//! - nicework: one work per object; an object that saw activity is `touch()`ed (armed for
//!   its 1 s period), its cleanup runs once and parks. 10,000 random objects are touched
//!   every second.
//! - scheduled-thread-pool (one thread, the same as nicework's one worker): one
//!   `execute_at_fixed_rate(1 s)` job per object, which checks the object's dirty flag;
//!   the usual way to give each object a periodic job when jobs cannot park.
//!
//! Reported per 1 s period, as medians over windows: the scheduler thread's CPU time (its
//! `schedstat` run time), its wakeups (voluntary context switches) and the callbacks run.
//! Both run in the same process, one after the other.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{median, quick};
use nicework::{Next, Scheduler, Work};
use scheduled_thread_pool::ScheduledThreadPool;

const OBJECTS: usize = 1_000_000;
const ACTIVE_PER_PERIOD: usize = OBJECTS / 100;
const PERIOD: Duration = Duration::from_secs(1);

/// A thread's (CPU ns, voluntary context switches) from /proc.
fn thread_usage(tid: i32) -> (u64, u64) {
    let cpu = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|f| f.parse().ok()))
        .unwrap_or(0);
    let switches = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                l.strip_prefix("voluntary_ctxt_switches:")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0);
    (cpu, switches)
}

/// The tid of this process's thread named `name`.
fn tid_named(name: &str) -> i32 {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok())
        .find_map(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            (comm.trim() == name).then(|| e.file_name().to_str()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no thread named {name}"))
}

/// xorshift, to pick the active objects.
struct Random(u64);

impl Random {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

struct Figures {
    cpu_ms: Vec<f64>,
    wakeups: Vec<f64>,
    runs: Vec<f64>,
}

/// Drives `periods` periods, marking 1 % of the objects active each, and samples `tid`.
fn drive(tid: i32, runs: &AtomicU64, periods: usize, mut activate: impl FnMut(usize)) -> Figures {
    let mut random = Random(0x9E37_79B9_7F4A_7C15);
    let mut figures = Figures {
        cpu_ms: Vec::new(),
        wakeups: Vec::new(),
        runs: Vec::new(),
    };
    for _ in 0..periods {
        let start = Instant::now();
        let (cpu0, switches0) = thread_usage(tid);
        let runs0 = runs.load(Ordering::Relaxed);
        for _ in 0..ACTIVE_PER_PERIOD {
            activate(random.below(OBJECTS));
        }
        std::thread::sleep(PERIOD.saturating_sub(start.elapsed()));
        let (cpu1, switches1) = thread_usage(tid);
        let seconds = start.elapsed().as_secs_f64();
        figures.cpu_ms.push((cpu1 - cpu0) as f64 / 1e6 / seconds);
        figures
            .wakeups
            .push((switches1 - switches0) as f64 / seconds);
        figures
            .runs
            .push((runs.load(Ordering::Relaxed) - runs0) as f64 / seconds);
    }
    figures
}

fn nicework(periods: usize) -> Figures {
    let sched = Scheduler::builder().name("nw-scale").build().unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let works: Vec<Work> = (0..OBJECTS)
        .map(|_| {
            let runs = runs.clone();
            let work = sched.work(move |_| {
                runs.fetch_add(1, Ordering::Relaxed);
                Next::Park
            });
            // Sets the period; the first run parks it.
            work.schedule(PERIOD);
            work.cancel();
            work
        })
        .collect();
    let tid = nicework::hooks::worker_tids(&sched)[0];
    // One warm-up period, then the measured ones.
    drive(tid, &runs, 1, |i| works[i].touch());
    drive(tid, &runs, periods, |i| works[i].touch())
}

fn scheduled_thread_pool(periods: usize) -> Figures {
    let pool = ScheduledThreadPool::builder()
        .num_threads(1)
        .thread_name_pattern("stp-scale-{}")
        .build();
    let runs = Arc::new(AtomicU64::new(0));
    let dirty: Arc<Vec<AtomicBool>> =
        Arc::new((0..OBJECTS).map(|_| AtomicBool::new(false)).collect());
    let jobs: Vec<_> = (0..OBJECTS)
        .map(|i| {
            let (runs, dirty) = (runs.clone(), dirty.clone());
            // Spread the first runs over the period, as objects are created over time.
            let initial = PERIOD.mul_f64(i as f64 / OBJECTS as f64);
            pool.execute_at_fixed_rate(initial, PERIOD, move || {
                if dirty[i].swap(false, Ordering::Relaxed) {
                    runs.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let tid = tid_named("stp-scale-0");
    drive(tid, &runs, 1, |i| dirty[i].store(true, Ordering::Relaxed));
    let figures = drive(tid, &runs, periods, |i| {
        dirty[i].store(true, Ordering::Relaxed)
    });
    for job in &jobs {
        job.cancel();
    }
    figures
}

fn main() {
    let periods = if quick() { 3 } else { 7 };
    println!(
        "{OBJECTS} objects, {ACTIVE_PER_PERIOD} active per {PERIOD:?} period; medians of {periods} periods"
    );
    let nw = nicework(periods);
    let stp = scheduled_thread_pool(periods);
    println!(
        "{:<40} {:>16} {:>12} {:>14}",
        "", "thread CPU ms/s", "wakeups/s", "callbacks/s"
    );
    for (label, f) in [
        ("nicework (touch + park)", &nw),
        ("scheduled-thread-pool (a job per object)", &stp),
    ] {
        println!(
            "{label:<40} {:>16.1} {:>12.0} {:>14.0}",
            median(f.cpu_ms.clone()),
            median(f.wakeups.clone()),
            median(f.runs.clone())
        );
    }
    let ratio = median(stp.cpu_ms.clone()) / median(nw.cpu_ms.clone());
    println!("CPU: scheduled-thread-pool uses {ratio:.0}× nicework's");
}

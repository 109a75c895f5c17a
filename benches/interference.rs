//! The ktask interference tables, reproduced on this machine (README, "Why low priority").
//!
//! `cargo bench --bench interference` (add `quick` for 3 short rounds). Every round runs
//! every configuration once, in a rotated order, so slow drift of a shared machine hits
//! all of them alike; figures are medians over rounds of per-round ratios.
//!
//! Table 1, foreground loss: two nice-0 threads run a CPU-bound loop for a fixed wall time
//! and count iterations and read their own CPU time, first alone, then while one
//! saturating maintenance load runs: a plain `std::thread` (what thread-pool crates do:
//! their threads inherit nice 0), and a nicework work that returns `Next::Yield` after
//! each ~0.5 ms increment, at `Normal`, `Nice(19)` and `Idle`, with the default back-off
//! and without it, and with a back-off written in user code that watches the worker's own
//! `run_delay` (`/proc/thread-self/schedstat`) instead of the runnable count. "fg loss"
//! is the iteration count against the same round alone; "fg CPU loss" the CPU time the
//! loops got against alone, which the host's speed variations (steal, frequency) do not
//! blur. The last columns give the maintenance load's own progress (increments per second) under that
//! contention and on an otherwise idle machine.
//!
//! Table 2, flush latency: a pending incremental work of about 200 ms CPU (200 increments)
//! is flushed while two nice-0 threads saturate both CPUs, against the same flush on an
//! idle machine. "Plain wait" waits for the worker (Nice(19)) to finish it: it is capped
//! and extrapolated from the increments done. A third row flushes a work that runs as
//! one 200 ms call on the worker: with `CAP_SYS_NICE` the flusher raises the worker to
//! its own nice for that run.

mod common;

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Saturation, calibrate, median, quick, rounds, thread_cpu_time, unit};
use nicework::{Next, Priority, Scheduler};

/// Runs `threads` nice-0 CPU-bound loops for `wall`; returns (iterations, CPU share).
fn foreground(threads: usize, wall: Duration) -> (u64, f64) {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let cpu0 = thread_cpu_time();
                let start = Instant::now();
                let mut iterations = 0u64;
                while start.elapsed() < wall {
                    for _ in 0..16 {
                        black_box(unit(iterations ^ t as u64));
                        iterations += 1;
                    }
                }
                let share = (thread_cpu_time() - cpu0).as_secs_f64() / wall.as_secs_f64();
                (iterations, share)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold((0, 0.0), |(i, s), (di, ds)| {
            (i + di, s + ds / threads as f64)
        })
}

/// A saturating maintenance load, running until dropped.
enum Load {
    None,
    Thread {
        stop: Arc<AtomicBool>,
        handle: Option<std::thread::JoinHandle<()>>,
    },
    Work {
        _sched: Scheduler,
        work: nicework::Work,
    },
}

impl Drop for Load {
    fn drop(&mut self) {
        match self {
            Load::None => {}
            Load::Thread { stop, handle } => {
                stop.store(true, Ordering::Relaxed);
                handle.take().unwrap().join().unwrap();
            }
            Load::Work { work, .. } => {
                work.cancel_sync();
            }
        }
    }
}

#[derive(Clone, Copy)]
enum LoadKind {
    Alone,
    StdThread,
    Nicework {
        priority: Priority,
        back_off: bool,
        run_delay_backoff: bool,
    },
}

impl LoadKind {
    fn label(self) -> String {
        match self {
            LoadKind::Alone => "alone".into(),
            LoadKind::StdThread => "plain std::thread (nice 0)".into(),
            LoadKind::Nicework {
                priority,
                back_off,
                run_delay_backoff,
            } => {
                let how = match (back_off, run_delay_backoff) {
                    (true, _) => "back-off (default)",
                    (false, true) => "run_delay back-off",
                    (false, false) => "no back-off",
                };
                let priority = match priority {
                    Priority::Normal => "Normal".to_string(),
                    Priority::Idle => "Idle".to_string(),
                    Priority::Nice(n) => format!("Nice({n})"),
                };
                format!("nicework {priority}, {how}")
            }
        }
    }

    fn start(self, increment: u64, done: Arc<AtomicU64>) -> Load {
        match self {
            LoadKind::Alone => Load::None,
            LoadKind::StdThread => {
                let stop = Arc::new(AtomicBool::new(false));
                let flag = stop.clone();
                let handle = std::thread::spawn(move || {
                    while !flag.load(Ordering::Relaxed) {
                        for i in 0..increment {
                            black_box(unit(i));
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                });
                Load::Thread {
                    stop,
                    handle: Some(handle),
                }
            }
            LoadKind::Nicework {
                priority,
                back_off,
                run_delay_backoff,
            } => {
                let sched = Scheduler::builder()
                    .priority(priority)
                    .back_off(back_off)
                    .build()
                    .unwrap();
                let mut probe = RunDelayProbe::default();
                let work = sched.work(move |_| {
                    let waited_before = probe.run_delay();
                    for i in 0..increment {
                        black_box(unit(i));
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    if run_delay_backoff {
                        probe.next(waited_before)
                    } else {
                        Next::Yield
                    }
                });
                work.schedule(Duration::ZERO);
                Load::Work {
                    _sched: sched,
                    work,
                }
            }
        }
    }
}

/// The alternative back-off, in user code: defer when the worker itself waited for a CPU
/// during the increment (its `run_delay` grew by more than 1 ms).
#[derive(Default)]
struct RunDelayProbe {
    schedstat: Option<File>,
    delay: Duration,
}

impl RunDelayProbe {
    fn run_delay(&mut self) -> u64 {
        let file = self
            .schedstat
            .get_or_insert_with(|| File::open("/proc/thread-self/schedstat").unwrap());
        let mut text = [0u8; 96];
        let len = file.read_at(&mut text, 0).unwrap_or(0);
        std::str::from_utf8(&text[..len])
            .ok()
            .and_then(|t| t.split_ascii_whitespace().nth(1))
            .and_then(|f| f.parse().ok())
            .unwrap_or(0)
    }

    fn next(&mut self, waited_before: u64) -> Next {
        if self.run_delay().saturating_sub(waited_before) > 1_000_000 {
            self.delay =
                (self.delay * 2).clamp(Duration::from_millis(1), Duration::from_millis(128));
            Next::After(self.delay)
        } else {
            self.delay = Duration::ZERO;
            Next::Yield
        }
    }
}

fn table1(increment: u64, wall: Duration) {
    let nw = |priority, back_off, run_delay_backoff| LoadKind::Nicework {
        priority,
        back_off,
        run_delay_backoff,
    };
    let kinds = [
        LoadKind::Alone,
        LoadKind::StdThread,
        nw(Priority::Normal, true, false),
        nw(Priority::Nice(19), false, false),
        nw(Priority::Nice(19), false, true),
        nw(Priority::Nice(19), true, false),
        nw(Priority::Idle, false, false),
        nw(Priority::Idle, true, false),
    ];
    let n = kinds.len();
    // Per kind: per-round (iteration loss, CPU-time loss, maintenance increments/s).
    let mut results: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); n];
    let mut solo: Vec<Vec<f64>> = vec![Vec::new(); n];
    for round in 0..rounds() {
        let mut iterations = vec![0u64; n];
        let mut cells = vec![(0.0, 0.0); n];
        for k in 0..n {
            let i = (k + round) % n;
            let done = Arc::new(AtomicU64::new(0));
            let load = kinds[i].start(increment, done.clone());
            std::thread::sleep(Duration::from_millis(20));
            let before = done.load(Ordering::Relaxed);
            let (iters, share) = foreground(2, wall);
            let increments = (done.load(Ordering::Relaxed) - before) as f64 / wall.as_secs_f64();
            drop(load);
            iterations[i] = iters;
            cells[i] = (share, increments);
        }
        let (alone, alone_share) = (iterations[0] as f64, cells[0].0);
        for i in 0..n {
            results[i].push((
                1.0 - iterations[i] as f64 / alone,
                1.0 - cells[i].0 / alone_share,
                cells[i].1,
            ));
        }
        // The maintenance load's own rate on an otherwise idle machine.
        for i in 1..n {
            let done = Arc::new(AtomicU64::new(0));
            let load = kinds[i].start(increment, done.clone());
            std::thread::sleep(wall / 4);
            solo[i].push(done.load(Ordering::Relaxed) as f64 / (wall / 4).as_secs_f64());
            drop(load);
        }
    }
    println!(
        "\nTable 1: foreground loss (2 nice-0 CPU-bound threads, 1 saturating maintenance load)"
    );
    println!(
        "{:<42} {:>10} {:>12} {:>16} {:>16}",
        "maintenance load", "fg loss", "fg CPU loss", "maint incr/s", "maint idle incr/s"
    );
    for i in 0..n {
        let loss = median(results[i].iter().map(|r| r.0).collect());
        let cpu_loss = median(results[i].iter().map(|r| r.1).collect());
        let rate = median(results[i].iter().map(|r| r.2).collect());
        let idle_rate = if i == 0 {
            "-".to_string()
        } else {
            format!("{:.0}", median(solo[i].clone()))
        };
        let rate = if i == 0 {
            "-".to_string()
        } else {
            format!("{rate:.0}")
        };
        println!(
            "{:<42} {:>9.2}% {:>11.2}% {:>16} {:>16}",
            kinds[i].label(),
            loss * 100.0,
            cpu_loss * 100.0,
            rate,
            idle_rate
        );
    }
}

thread_local! {
    /// The flusher's CPU share (its CPU time over the flush's wall time), per flush.
    static FLUSHER_SHARE: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An incremental work of `increments` × `increment` units; returns the time from its
/// `schedule(ZERO)` until it is done, by `flush()` or by waiting (capped at `cap`,
/// extrapolated from the increments done when the cap is hit).
fn incremental_job(
    sched: &Scheduler,
    increments: u64,
    increment: u64,
    flush: bool,
    cap: Duration,
) -> Duration {
    let done = Arc::new(AtomicU64::new(0));
    let counter = done.clone();
    let work = sched.work(move |_| {
        for i in 0..increment {
            black_box(unit(i));
        }
        if counter.fetch_add(1, Ordering::SeqCst) + 1 < increments {
            Next::Yield
        } else {
            Next::Park
        }
    });
    let start = Instant::now();
    let cpu0 = thread_cpu_time();
    work.schedule(Duration::ZERO);
    let elapsed = finish(&work, flush, &done, increments, start, cap);
    if flush {
        let share = (thread_cpu_time() - cpu0).as_secs_f64() / elapsed.as_secs_f64();
        FLUSHER_SHARE.with(|s| s.borrow_mut().push(share));
    }
    elapsed
}

/// Flushes `work`, or waits until `done` reaches `total` (at most until `cap`); returns
/// the time since `start`, extrapolated from the progress when the cap was hit.
fn finish(
    work: &nicework::Work,
    flush: bool,
    done: &AtomicU64,
    total: u64,
    start: Instant,
    cap: Duration,
) -> Duration {
    if flush {
        work.flush();
    } else {
        while done.load(Ordering::SeqCst) < total && start.elapsed() < cap {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let elapsed = start.elapsed();
    let finished = done.load(Ordering::SeqCst);
    // Still running past the cap: cancel_sync waits for it, so it finishes unseen.
    work.cancel_sync();
    if finished >= total {
        elapsed
    } else {
        elapsed.mul_f64(total as f64 / finished.max(1) as f64)
    }
}

/// One long call on the worker, flushed (raised where allowed) or waited for.
fn single_run_job(sched: &Scheduler, units: u64, flush: bool, cap: Duration) -> Duration {
    let done = Arc::new(AtomicU64::new(0));
    let counter = done.clone();
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    let work = sched.work(move |_| {
        flag.store(true, Ordering::SeqCst);
        for i in 0..units {
            black_box(unit(i));
            counter.fetch_add(1, Ordering::SeqCst);
        }
        Next::Park
    });
    let start = Instant::now();
    work.schedule(Duration::ZERO);
    while !started.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_micros(100));
    }
    finish(&work, flush, &done, units, start, cap)
}

fn table2(increment_1ms: u64) {
    let increments = 200;
    let cap = if quick() {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    };
    let sched = Scheduler::new().unwrap();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut idle = Vec::new();
    let mut lent = Vec::new();
    let mut waited = Vec::new();
    let mut raised = Vec::new();
    let mut single_waited = Vec::new();
    let mut share = Vec::new();
    let incremental = |flush| {
        ms(incremental_job(
            &sched,
            increments,
            increment_1ms,
            flush,
            cap,
        ))
    };
    let single = |flush| {
        ms(single_run_job(
            &sched,
            increments * increment_1ms,
            flush,
            cap,
        ))
    };
    for _ in 0..if quick() { 3 } else { 5 } {
        idle.push(incremental(true));
        let saturation = Saturation::start(cpus);
        std::thread::sleep(Duration::from_millis(20));
        lent.push(incremental(true));
        share.push(FLUSHER_SHARE.with(|s| s.borrow().last().copied().unwrap_or(0.0)));
        waited.push(incremental(false));
        raised.push(single(true));
        single_waited.push(single(false));
        drop(saturation);
    }
    let idle = median(idle);
    println!(
        "\nTable 2: flush of a ~200 ms CPU work while {cpus} nice-0 threads saturate {cpus} CPUs (raise_limit: {:?})",
        sched.raise_limit()
    );
    println!("{:<58} {:>10} {:>8}", "", "ms", "× idle");
    let row = |label: &str, v: f64| println!("{label:<58} {v:>10.0} {:>7.2}×", v / idle);
    row("idle machine: schedule + flush()", idle);
    row(
        "saturated: flush() (takes over the Yield increments)",
        median(lent),
    );
    println!(
        "  (the flusher's own CPU share during those flushes: median {:.0} %, per round {:?})",
        median(share.clone()) * 100.0,
        share
            .iter()
            .map(|s| (s * 100.0).round() as u32)
            .collect::<Vec<_>>()
    );
    row(
        "saturated: plain wait for the Nice(19) worker (extrap.)",
        median(waited),
    );
    row(
        "saturated: flush() of one long run (raises the worker)",
        median(raised),
    );
    row(
        "saturated: plain wait for one long run (extrap.)",
        median(single_waited),
    );
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && a != "quick")
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f));
    let wall = if quick() {
        Duration::from_millis(300)
    } else {
        Duration::from_millis(800)
    };
    let increment = calibrate(Duration::from_micros(500));
    if wanted("table1") {
        table1(increment, wall);
    }
    if wanted("table2") {
        table2(increment * 2);
    }
}

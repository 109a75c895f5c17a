//! moka's pattern, honestly: a cache whose writers insert into its map and append to a
//! bounded write log, which a housekeeper drains, holding the map's lock for its whole
//! batch (moka applies the log to its access-order lists and frequency sketch under its
//! maintenance lock). When the log is full a writer cannot go on until it is drained.
//!
//! The drain here takes milliseconds per batch, long enough for a nice-19 worker to be
//! preempted in the middle of one while the rest of the process (one busy thread per
//! CPU, besides the writers and the reader) keeps every CPU busy: then every insert
//! waits for a thread that only gets leftover CPU. Five housekeepers,
//! the same cache, one run each:
//!
//! - **nice-0 thread**: a plain housekeeper thread at the writers' priority (what a
//!   thread-pool crate gives you), woken when the log is full.
//! - **nicework, try_flush**: the drain is a nice-19 work; a writer with a full log calls
//!   `try_flush()`, which runs the drain on the writer when it is due and never waits, so
//!   the writer sleeps and retries while the worker holds the drain.
//! - **nicework, flush**: the same, but a writer with a full log (it must wait anyway)
//!   calls `flush()`, which runs the drain on the writer or waits for the worker's run
//!   and lends it the writer's priority where the process may (`CAP_SYS_NICE` or
//!   `RLIMIT_NICE`).
//! - **nicework, contended**: writers `flush()`, and the drain applies its batch in
//!   chunks, asking `cx.contended()` between them: while every CPU is busy it releases
//!   the lock and returns `Next::Yield`, so the rest runs after the writers had their turn.
//! - **nicework, quiet**: the drain is a timeout every insert touches (300 ms, with a
//!   150 ms leeway, so a touch reads no clock): it runs once the writes stop, and a
//!   writer with a full log `flush()`es it.
//!
//! For each it prints the medians of five interleaved runs (one run is too noisy to
//! compare): the writers' wall time, the worst single insert (how long a writer stood
//! still) and how much of the drain ran on the writers. Run as root it also runs itself
//! unprivileged (`setpriv`, user 65534), where nothing is lent.
//!
//! ```text
//! cargo run --release --example write_log_cache        # add a number for more runs
//! ```
//!
//! It exits non-zero only on a broken count (an insert lost, a drain that never ran),
//! never on a timing: one run on a shared machine is noisy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

const WRITERS: u64 = 2;
const INSERTS_PER_WRITER: u64 = 50_000;
/// The write log's capacity.
const LOG_CAPACITY: usize = 4_096;
/// Entries a drain applies between two questions to `cx.contended()`.
const CHUNK: usize = 256;
/// How often the periodic housekeepers drain on their own (moka: 300 ms).
const PERIOD: Duration = Duration::from_millis(300);
/// The environment variable that marks the unprivileged re-run.
const CHILD: &str = "NICEWORK_WRITE_LOG_CACHE_CHILD";

/// The cache: a map behind a lock, and the log of writes not applied yet.
struct Cache {
    map: Mutex<HashMap<u64, u64>>,
    log: Mutex<Vec<u64>>,
    /// Signalled after every drain, for writers waiting for room in the log.
    drained: Condvar,
    /// Entries applied, and the drain's nanoseconds on writer threads and elsewhere.
    applied: AtomicU64,
    foreground_ns: AtomicU64,
    background_ns: AtomicU64,
    /// The longest an insert took, in nanoseconds.
    worst_insert_ns: AtomicU64,
}

thread_local! {
    /// Set while a writer runs the drain itself, so the drain can count where it ran.
    static ON_A_WRITER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Bookkeeping per logged write, as moka updates its lists and sketch: enough that a
/// batch of a few thousand takes milliseconds.
fn bookkeeping(key: u64, map: &mut HashMap<u64, u64>) {
    let mut hash = key;
    for _ in 0..1_000 {
        hash = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    }
    *map.entry(key % 50_000).or_default() ^= hash;
}

impl Cache {
    fn new() -> Arc<Cache> {
        Arc::new(Cache {
            map: Mutex::new(HashMap::new()),
            log: Mutex::new(Vec::with_capacity(LOG_CAPACITY)),
            drained: Condvar::new(),
            applied: AtomicU64::new(0),
            foreground_ns: AtomicU64::new(0),
            background_ns: AtomicU64::new(0),
            worst_insert_ns: AtomicU64::new(0),
        })
    }

    /// Applies logged writes holding the map's lock: all of them, or, with `contended`,
    /// chunk by chunk until it says the machine is busy. Returns whether any are left.
    fn drain(&self, contended: Option<&dyn Fn() -> bool>) -> bool {
        let start = Instant::now();
        let writes = std::mem::take(&mut *self.log.lock().unwrap());
        let mut left = Vec::new();
        {
            let mut map = self.map.lock().unwrap();
            for (index, chunk) in writes.chunks(CHUNK).enumerate() {
                for &key in chunk {
                    bookkeeping(key, &mut map);
                }
                self.applied
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                if contended.is_some_and(|contended| contended()) {
                    let done = ((index + 1) * CHUNK).min(writes.len());
                    left = writes[done..].to_vec();
                    break;
                }
            }
        }
        let more = !left.is_empty();
        if more {
            // Back at the head of the log, before what was written meanwhile.
            let mut log = self.log.lock().unwrap();
            left.append(&mut log);
            *log = left;
        }
        self.drained.notify_all();
        let spent = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let counter = if ON_A_WRITER.with(|on| on.get()) {
            &self.foreground_ns
        } else {
            &self.background_ns
        };
        counter.fetch_add(spent, Ordering::Relaxed);
        more
    }

    /// Inserts into the map and logs the write; at half the log's capacity calls `half`
    /// (a hint to the housekeeper, as moka schedules its maintenance then), and with the
    /// log full calls `full` (which may drain here), then waits until there is room.
    fn insert(&self, key: u64, half: &dyn Fn(), full: &dyn Fn()) {
        let start = Instant::now();
        self.map.lock().unwrap().insert(key % 50_000, key);
        loop {
            let mut log = self.log.lock().unwrap();
            if log.len() < LOG_CAPACITY {
                log.push(key);
                let hint = log.len() == LOG_CAPACITY / 2;
                drop(log);
                if hint {
                    half();
                }
                break;
            }
            drop(log);
            ON_A_WRITER.with(|on| on.set(true));
            full();
            ON_A_WRITER.with(|on| on.set(false));
            let log = self.log.lock().unwrap();
            if log.len() >= LOG_CAPACITY {
                let _ = self
                    .drained
                    .wait_timeout(log, Duration::from_millis(1))
                    .unwrap();
            }
        }
        let took = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.worst_insert_ns.fetch_max(took, Ordering::Relaxed);
    }
}

/// What one housekeeper's run measured.
struct Outcome {
    name: &'static str,
    writers: Duration,
    cache: Arc<Cache>,
    /// Whether the housekeeper (or a writer helping it) drained during the load: the
    /// leftovers are drained on the main thread afterwards, which proves nothing.
    drained_during_load: bool,
}

impl Outcome {
    /// Drains what is left on the calling thread, after noting whether any drain ran.
    fn after_the_load(name: &'static str, writers: Duration, cache: Arc<Cache>) -> Outcome {
        let drained_during_load = cache.foreground_ns.load(Ordering::Relaxed)
            + cache.background_ns.load(Ordering::Relaxed)
            > 0;
        cache.drain(None);
        Outcome {
            name,
            writers,
            cache,
            drained_during_load,
        }
    }
}

/// Interleaved runs per housekeeper (the first argument overrides it).
const ROUNDS: usize = 5;

/// What a writer does to the housekeeper: at half the log, with the log full, and at
/// every insert.
struct Helping<'a> {
    half: &'a (dyn Fn() + Sync),
    full: &'a (dyn Fn() + Sync),
    touch: &'a (dyn Fn() + Sync),
}

/// Runs the writers and one reader against `cache`, the writers helping as `helping`
/// says.
fn run_load(cache: &Arc<Cache>, helping: &Helping<'_>) -> Duration {
    let writers_done = AtomicBool::new(false);
    let start = Instant::now();
    std::thread::scope(|s| {
        // The rest of the process: one busy thread per CPU, so that the CPUs are never
        // idle while the cache is loaded and a nice-19 worker only gets leftovers.
        for _ in 0..std::thread::available_parallelism().map_or(1, usize::from) {
            s.spawn(|| {
                while !writers_done.load(Ordering::Relaxed) {
                    std::hint::black_box((0..1_000u64).sum::<u64>());
                }
            });
        }
        s.spawn(|| {
            let mut key = 0u64;
            while !writers_done.load(Ordering::Relaxed) {
                std::hint::black_box(cache.map.lock().unwrap().get(&(key % 50_000)).copied());
                key = key.wrapping_add(7919);
            }
        });
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                s.spawn(move || {
                    for i in 0..INSERTS_PER_WRITER {
                        cache.insert(w * INSERTS_PER_WRITER + i, helping.half, helping.full);
                        (helping.touch)();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        writers_done.store(true, Ordering::Relaxed);
    });
    start.elapsed()
}

/// The cache on a plain nice-0 housekeeper thread, woken when the log is full.
fn thread_housekeeper() -> Outcome {
    let cache = Cache::new();
    let wake = Arc::new((Mutex::new(false), Condvar::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let housekeeper = {
        let (cache, wake, stop) = (cache.clone(), wake.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (lock, cvar) = &*wake;
                let woken = lock.lock().unwrap();
                let (mut woken, _) = cvar.wait_timeout(woken, PERIOD).unwrap();
                *woken = false;
                drop(woken);
                cache.drain(None);
            }
        })
    };
    let wake_up = || {
        let (lock, cvar) = &*wake;
        *lock.lock().unwrap() = true;
        cvar.notify_one();
    };
    let helping = Helping {
        half: &wake_up,
        full: &wake_up,
        touch: &|| {},
    };
    let writers = run_load(&cache, &helping);
    stop.store(true, Ordering::Relaxed);
    wake_up();
    housekeeper.join().unwrap();
    Outcome::after_the_load("nice-0 housekeeper thread", writers, cache)
}

/// How a nicework housekeeper is set up and helped.
#[derive(Clone, Copy, PartialEq)]
enum Housekeeping {
    TryFlush,
    Flush,
    Contended,
    Quiet,
}

/// The cache on a nice-19 nicework housekeeper.
fn nicework_housekeeper(sched: &Scheduler, housekeeping: Housekeeping) -> Outcome {
    let cache = Cache::new();
    let housekeeper: Work = {
        let cache = cache.clone();
        let drain = move |cx: &mut nicework::Ctx<'_>| {
            let contended = || cx.contended();
            let more = if housekeeping == Housekeeping::Contended {
                cache.drain(Some(&contended))
            } else {
                cache.drain(None)
            };
            if more {
                Next::Yield
            } else if housekeeping == Housekeeping::Quiet || cache.log.lock().unwrap().is_empty() {
                Next::Park
            } else {
                Next::Again
            }
        };
        match housekeeping {
            Housekeeping::Quiet => sched
                .timeout(PERIOD, drain)
                .leeway(Duration::from_millis(150)),
            _ => sched.every(PERIOD, drain),
        }
    };
    let full = || {
        housekeeper.schedule(Duration::ZERO);
        if housekeeping == Housekeeping::TryFlush {
            housekeeper.try_flush();
        } else {
            housekeeper.flush();
        }
    };
    // A quiet-time drain waits for the writes to stop: no hint at half the log.
    let half = || {
        if housekeeping != Housekeeping::Quiet {
            housekeeper.schedule(Duration::ZERO);
        }
    };
    let touch = || housekeeper.touch();
    let helping = Helping {
        half: &half,
        full: &full,
        touch: &touch,
    };
    let writers = run_load(&cache, &helping);
    housekeeper.flush();
    drop(housekeeper);
    let name = match housekeeping {
        Housekeeping::TryFlush => "nicework, writers try_flush",
        Housekeeping::Flush => "nicework, writers flush",
        Housekeeping::Contended => "nicework, flush + contended()",
        Housekeeping::Quiet => "nicework, quiet-time timeout",
    };
    Outcome::after_the_load(name, writers, cache)
}

/// Runs every housekeeper `rounds` times, interleaved, and prints the medians; returns
/// whether every count held.
fn run_all(rounds: usize) -> Result<bool, nicework::Error> {
    let sched = Scheduler::new()?; // Nice(19)
    let names: Vec<&str> = [
        "nice-0 housekeeper thread",
        "nicework, writers try_flush",
        "nicework, writers flush",
        "nicework, flush + contended()",
        "nicework, quiet-time timeout",
    ]
    .to_vec();
    // Per housekeeper: (writers' time, worst insert, share of the drain on writers).
    let mut measured: Vec<Vec<(Duration, Duration, f64)>> = vec![Vec::new(); names.len()];
    let mut counts_hold = true;
    for _ in 0..rounds {
        let outcomes = [
            thread_housekeeper(),
            nicework_housekeeper(&sched, Housekeeping::TryFlush),
            nicework_housekeeper(&sched, Housekeeping::Flush),
            nicework_housekeeper(&sched, Housekeeping::Contended),
            nicework_housekeeper(&sched, Housekeeping::Quiet),
        ];
        for (index, outcome) in outcomes.iter().enumerate() {
            let cache = &outcome.cache;
            let (foreground, background) = (
                cache.foreground_ns.load(Ordering::Relaxed) as f64,
                cache.background_ns.load(Ordering::Relaxed) as f64,
            );
            measured[index].push((
                outcome.writers,
                Duration::from_nanos(cache.worst_insert_ns.load(Ordering::Relaxed)),
                foreground / (foreground + background).max(1.0),
            ));
            let applied = cache.applied.load(Ordering::Relaxed);
            if applied != WRITERS * INSERTS_PER_WRITER {
                eprintln!(
                    "{}: {applied} writes applied of {}",
                    outcome.name,
                    WRITERS * INSERTS_PER_WRITER
                );
                counts_hold = false;
            }
            if !outcome.drained_during_load {
                eprintln!("{}: the drain never ran during the load", outcome.name);
                counts_hold = false;
            }
        }
    }
    println!(
        "{WRITERS} writers x {INSERTS_PER_WRITER} inserts, 1 reader, a log of {LOG_CAPACITY}, \
         {} CPUs, lending {}; medians of {rounds} interleaved runs:",
        std::thread::available_parallelism().map_or(1, usize::from),
        match sched.raise_limit() {
            Some(limit) => format!("up to nice {limit}"),
            None => "none (no privilege)".to_string(),
        }
    );
    println!(
        "  {:<32} {:>10} {:>13} {:>16}",
        "housekeeper", "writers", "worst insert", "drain on writers"
    );
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let writers_median = |runs: &[(Duration, Duration, f64)]| {
        median(runs.iter().map(|r| r.0.as_secs_f64()).collect())
    };
    let baseline = writers_median(&measured[0]);
    for (name, runs) in names.iter().zip(&measured) {
        let writers = writers_median(runs);
        let worst = median(runs.iter().map(|r| r.1.as_secs_f64()).collect());
        let on_writers = median(runs.iter().map(|r| r.2).collect());
        println!(
            "  {:<32} {:>10.2?} {:>13.2?} {:>15.0} %   ({:.2}x the thread)",
            name,
            Duration::from_secs_f64(writers),
            Duration::from_secs_f64(worst),
            100.0 * on_writers,
            writers / baseline,
        );
    }
    Ok(counts_hold)
}

/// As root, the same run as user 65534 (nothing lent there), if `setpriv` is at hand.
#[cfg(target_os = "linux")]
fn run_unprivileged() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || std::env::var_os(CHILD).is_some() {
        return true;
    }
    let Ok(exe) = std::env::current_exe() else {
        return true;
    };
    println!("\nunprivileged (setpriv, user 65534):");
    match std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(exe)
        .args(std::env::args().skip(1))
        .env(CHILD, "1")
        .status()
    {
        // 1 is this example's broken count, 101 a panic; anything else is setpriv
        // failing to run it as that user, which breaks nothing of the cache's.
        Ok(status) if matches!(status.code(), Some(1 | 101)) => false,
        Ok(status) => {
            if !status.success() {
                println!("  not run: setpriv exited with {status}");
            }
            true
        }
        Err(error) => {
            println!("  not run: {error}");
            true
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn run_unprivileged() -> bool {
    let _ = CHILD;
    true
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(ROUNDS)
        .max(1);
    let counts_hold = run_all(rounds)? && run_unprivileged();
    if !counts_hold {
        std::process::exit(1);
    }
    Ok(())
}

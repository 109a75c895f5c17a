//! A cache pool, the shape regex keeps per `Regex`: a search borrows a scratch cache
//! (regex-automata's lazy DFA and engine caches, about 110 KB here) from a pool through a
//! guard that is `Send`, and gives it back when the guard drops. Two pools of the same
//! caches:
//!
//! - **stacks**: regex-automata's own design (`util::pool`): the first thread to get a
//!   cache owns one (an atomic owner id, the fast path), every other thread pops boxed
//!   caches from one of 8 mutex-protected stacks picked by its thread id and pushes them
//!   back. Nothing is freed until the pool drops.
//! - **PerCid**: the calling thread's slot of a `PerCid` as a one-value cache: `take()`
//!   on get (or a fresh cache if the slot is empty), `put()` when the guard drops (the
//!   cache is dropped if the slot is full). Slots above the id space's high water are
//!   trimmed, so memory follows the threads searching now; a retention of 1 s keeps a
//!   cache across a short idle.
//!
//! It prints, for each pool:
//! - the heap after a burst of 64 searching threads (on a machine with fewer CPUs), while
//!   4 search, and after they exit; the caches built during the burst (each one a cold
//!   search: the stacks build one whenever a thread finds its stack's lock taken ten
//!   times in a row, and drop one whenever a put finds it so) and the searches done;
//! - the cost of a search with its get and put, on 1 thread and on 4 (a short search,
//!   about as long as a regex `find` on a short haystack), and of a bare get and put (the
//!   variant where the pool is all there is);
//! - the first search of threads back from 300 ms idle, with and without the retention.
//!
//! ```text
//! cargo run --release --example cache_pool        # add a number for more rounds
//! ```
//!
//! Timings are medians of interleaved rounds; it exits non-zero only on a broken count (two
//! searches on one cache, a heap that did not shrink), never on a timing.

#[path = "common/counting.rs"]
mod counting;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

use std::cell::UnsafeCell;
use std::hint::black_box;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use nicework::{IdSpace, PerCid, Scheduler};

/// A search cache's size: what regex-automata's meta cache holds for a regex of moderate
/// size once its lazy DFA has warmed up (7.25 MB for 64 threads in the measured port).
const CACHE_BYTES: usize = 112 * 1024;
/// Words of a cache's transition table.
const TABLE: usize = CACHE_BYTES / 4;
/// A haystack: a short line, as in a log filter.
const HAYSTACK: &[u8] = b"2026-12-05T10:27:12Z GET /api/v1/items?id=4417 200 1.8ms";

/// A search's scratch state.
struct Cache {
    table: Vec<u32>,
    /// Set while a search uses the cache: a second search finding it set would be two
    /// guards on one cache, the one thing a pool must never do.
    searching: bool,
}

impl Cache {
    /// Builds a cache: allocates it and fills its table, as a first search warms a lazy
    /// DFA (the expensive part of a cold search).
    fn new() -> Cache {
        BUILT.fetch_add(1, Ordering::Relaxed);
        let mut table = vec![0u32; TABLE];
        let mut state = 0x9e37_79b9u32;
        for word in table.iter_mut() {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            *word = state;
        }
        Cache {
            table,
            searching: false,
        }
    }
}

/// A search: walks the haystack through the cache's table (reads, and a write, as a lazy
/// DFA fills its cache), about as long as a short regex `find`.
fn search(cache: &mut Cache, haystack: &[u8]) -> u32 {
    if cache.searching {
        SHARED_CACHES.fetch_add(1, Ordering::Relaxed);
    }
    cache.searching = true;
    // The flag must be in memory while the walk runs, as it would be for a search that
    // calls out.
    let cache = black_box(cache);
    let mask = TABLE - 1;
    let mut state = 0u32;
    for &byte in haystack {
        let at = ((state as usize) << 8 ^ byte as usize) & mask;
        state = cache.table[at].rotate_left(5) ^ u32::from(byte);
    }
    let at = state as usize & mask;
    cache.table[at] = cache.table[at].wrapping_add(1);
    cache.searching = false;
    state
}

/// Caches built: each one is a cold search.
static BUILT: AtomicUsize = AtomicUsize::new(0);

/// Searches that found their cache in use by another search.
static SHARED_CACHES: AtomicUsize = AtomicUsize::new(0);

// === the pools ===

/// A pool of caches that hands them out through `Send` guards.
trait Pool: Sync {
    type Guard<'a>: DerefMut<Target = Cache> + Send
    where
        Self: 'a;
    fn get(&self) -> Self::Guard<'_>;
}

/// regex-automata's `util::pool::Pool`, condensed: an owner slot and 8 stacks.
struct Stacks {
    #[allow(
        clippy::vec_box,
        reason = "regex-automata's design: a guard moves a pointer"
    )]
    stacks: Vec<Mutex<Vec<Box<Cache>>>>,
    owner: AtomicUsize,
    owner_value: UnsafeCell<Option<Cache>>,
}

// SAFETY: `owner_value` is reached only by the thread that set `owner` to `IN_USE`
// (a compare-exchange from `UNOWNED`, or the owner's own store), as in regex-automata.
unsafe impl Sync for Stacks {}

const UNOWNED: usize = 0;
const IN_USE: usize = 1;

fn thread_id() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(2);
    thread_local!(static ID: usize = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|id| *id)
}

impl Stacks {
    fn new() -> Stacks {
        Stacks {
            stacks: (0..8).map(|_| Mutex::new(Vec::new())).collect(),
            owner: AtomicUsize::new(UNOWNED),
            owner_value: UnsafeCell::new(None),
        }
    }
}

enum StackValue {
    /// The owner's cache (in `owner_value`), held by thread `.0`.
    Owned(usize),
    Boxed(Box<Cache>),
}

struct StackGuard<'a> {
    pool: &'a Stacks,
    value: Option<StackValue>,
}

// SAFETY: as regex-automata's `PoolGuard`: the owned value is reached only by the guard
// that set `owner` to `IN_USE`, wherever it goes.
unsafe impl Send for StackGuard<'_> {}

impl Deref for StackGuard<'_> {
    type Target = Cache;
    fn deref(&self) -> &Cache {
        match self.value.as_ref() {
            Some(StackValue::Boxed(cache)) => cache,
            // SAFETY: this guard set `owner` to `IN_USE` (see `Stacks`).
            _ => unsafe { (*self.pool.owner_value.get()).as_ref().unwrap() },
        }
    }
}

impl DerefMut for StackGuard<'_> {
    fn deref_mut(&mut self) -> &mut Cache {
        match self.value.as_mut() {
            Some(StackValue::Boxed(cache)) => cache,
            // SAFETY: as in `deref`.
            _ => unsafe { (*self.pool.owner_value.get()).as_mut().unwrap() },
        }
    }
}

impl Drop for StackGuard<'_> {
    fn drop(&mut self) {
        match self.value.take() {
            Some(StackValue::Owned(owner)) => self.pool.owner.store(owner, Ordering::Release),
            Some(StackValue::Boxed(cache)) => {
                let stack = &self.pool.stacks[thread_id() % self.pool.stacks.len()];
                for _ in 0..10 {
                    if let Ok(mut stack) = stack.try_lock() {
                        stack.push(cache);
                        return;
                    }
                }
            }
            None => {}
        }
    }
}

impl Pool for Stacks {
    type Guard<'a> = StackGuard<'a>;

    fn get(&self) -> StackGuard<'_> {
        let caller = thread_id();
        let owner = self.owner.load(Ordering::Acquire);
        if caller == owner {
            self.owner.store(IN_USE, Ordering::Release);
            return StackGuard {
                pool: self,
                value: Some(StackValue::Owned(caller)),
            };
        }
        if owner == UNOWNED
            && self
                .owner
                .compare_exchange(UNOWNED, IN_USE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // SAFETY: this thread just set `owner` to `IN_USE`.
            unsafe { *self.owner_value.get() = Some(Cache::new()) };
            return StackGuard {
                pool: self,
                value: Some(StackValue::Owned(caller)),
            };
        }
        let stack = &self.stacks[caller % self.stacks.len()];
        for _ in 0..10 {
            if let Ok(mut stack) = stack.try_lock() {
                let cache = stack.pop();
                drop(stack);
                let cache = cache.unwrap_or_else(|| Box::new(Cache::new()));
                return StackGuard {
                    pool: self,
                    value: Some(StackValue::Boxed(cache)),
                };
            }
        }
        StackGuard {
            pool: self,
            value: Some(StackValue::Boxed(Box::new(Cache::new()))),
        }
    }
}

/// The pool on `PerCid::take` and `put`. Boxed caches, as in regex-automata's stacks:
/// `take` and `put` then move one word.
struct Slots {
    slots: PerCid<Box<Cache>>,
}

struct SlotsGuard<'a> {
    pool: &'a Slots,
    cache: Option<Box<Cache>>,
}

impl Deref for SlotsGuard<'_> {
    type Target = Cache;
    fn deref(&self) -> &Cache {
        self.cache.as_ref().expect("held until drop")
    }
}

impl DerefMut for SlotsGuard<'_> {
    fn deref_mut(&mut self) -> &mut Cache {
        self.cache.as_mut().expect("held until drop")
    }
}

impl Drop for SlotsGuard<'_> {
    fn drop(&mut self) {
        if let Some(cache) = self.cache.take() {
            // A full slot (another guard of this thread came back first): drop this one.
            let _ = self.pool.slots.put(cache);
        }
    }
}

impl Pool for Slots {
    type Guard<'a> = SlotsGuard<'a>;

    #[inline]
    fn get(&self) -> SlotsGuard<'_> {
        let cache = self.slots.take().unwrap_or_else(|| Box::new(Cache::new()));
        SlotsGuard {
            pool: self,
            cache: Some(cache),
        }
    }
}

fn percid_pool(ids: &IdSpace, retention: Duration) -> Slots {
    Slots {
        // `init` is never called: `take` and `put` use the slot as a one-value cache.
        slots: PerCid::new(ids, || Box::new(Cache::new())).retention(retention),
    }
}

// === the runs ===

/// Searches on `threads` threads for `run`, started together; returns the searches.
fn search_for(pool: &impl Pool, threads: usize, run: Duration, broken: &AtomicBool) -> u64 {
    let start = Barrier::new(threads);
    let total = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                start.wait();
                let began = Instant::now();
                let mut done = 0;
                while began.elapsed() < run {
                    for _ in 0..64 {
                        let mut cache = pool.get();
                        black_box(search(&mut cache, HAYSTACK));
                        done += 1;
                    }
                }
                if done == 0 {
                    broken.store(true, Ordering::Relaxed);
                }
                total.fetch_add(done, Ordering::Relaxed);
            });
        }
    });
    total.load(Ordering::Relaxed) as u64
}

/// Nanoseconds per `get` + search + drop on each of `threads` threads (CPU time of the
/// process divided by the searches, so more threads than CPUs are not counted asleep).
fn cost(pool: &impl Pool, threads: usize, searching: bool) -> f64 {
    const ROUNDS: u64 = 200_000;
    let start = Barrier::new(threads + 1);
    let cpu_before = process_cpu();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                // Warm: this thread's cache exists before the count starts.
                drop(pool.get());
                start.wait();
                for _ in 0..ROUNDS {
                    let mut cache = pool.get();
                    if searching {
                        black_box(search(&mut cache, black_box(HAYSTACK)));
                    } else {
                        black_box(&mut *cache);
                    }
                }
            });
        }
        start.wait();
    });
    let cpu = process_cpu() - cpu_before;
    cpu.as_nanos() as f64 / (ROUNDS * threads as u64) as f64
}

/// The process's CPU time (on other systems, the wall time).
fn process_cpu() -> Duration {
    #[cfg(unix)]
    {
        // SAFETY: `getrusage` fills the struct it is given, which may start zeroed.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut usage);
            usage
        };
        let time = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        time(usage.ru_utime) + time(usage.ru_stime)
    }
    #[cfg(not(unix))]
    {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed()
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn kb(bytes: isize) -> String {
    format!("{:.0} KB", bytes as f64 / 1024.0)
}

/// Waits, polling, until `done` holds, at most `limit`.
fn until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

/// What a pool did in the phases of a run.
struct Phases {
    /// The heap right after a burst of 64 threads, while 4 threads search (for `settle`
    /// and a little more), and after they exit (and `settle`).
    heap: [isize; 3],
    /// Caches built during the burst.
    built: usize,
    /// Searches done during the burst.
    searches: u64,
}

fn phases(pool: &impl Pool, settle: Duration, base: isize, broken: &AtomicBool) -> Phases {
    let built_before = BUILT.load(Ordering::Relaxed);
    let searches = search_for(pool, 64, Duration::from_millis(200), broken);
    let built = BUILT.load(Ordering::Relaxed) - built_before;
    let after_burst = counting::live_bytes() - base;
    let stop = AtomicBool::new(false);
    let mut during = 0;
    std::thread::scope(|s| {
        let searching = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                search_for(pool, 4, Duration::from_millis(50), broken);
            }
        });
        // The burst's threads are gone: their ids are free at once, and the slots above
        // the high water are trimmed once the retention has passed, at the next scan.
        std::thread::sleep(settle + Duration::from_millis(300));
        during = counting::live_bytes() - base;
        stop.store(true, Ordering::Relaxed);
        searching.join().unwrap();
    });
    std::thread::sleep(settle);
    let after = counting::live_bytes() - base;
    Phases {
        heap: [after_burst, during, after],
        built,
        searches,
    }
}

fn print_phases(name: &str, phases: &Phases) {
    println!(
        "  {:<24} {:>9} {:>11} {:>9} {:>14} {:>12.1} M",
        name,
        kb(phases.heap[0]),
        kb(phases.heap[1]),
        kb(phases.heap[2]),
        phases.built,
        phases.searches as f64 / 1e6
    );
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(9);
    let broken = AtomicBool::new(false);
    let sched = Scheduler::new().expect("a scheduler");
    let ids = IdSpace::new(&sched);
    let retention = Duration::from_secs(1);

    println!(
        "a cache pool: {} KB caches, {}-byte searches",
        CACHE_BYTES / 1024,
        HAYSTACK.len()
    );
    println!();
    println!("64 threads search for 200 ms, then 4 for 1.6 s, then none (heap: the pool's caches)");
    println!(
        "  {:<24} {:>9} {:>11} {:>9} {:>14} {:>14}",
        "", "heap: 64", "4 search", "none", "caches built", "searches in"
    );
    println!(
        "  {:<24} {:>9} {:>11} {:>9} {:>14} {:>14}",
        "", "", "", "", "in the burst", "the burst"
    );
    let base = counting::live_bytes();
    let stacks = Stacks::new();
    let of_stacks = phases(&stacks, retention, base, &broken);
    print_phases("stacks", &of_stacks);
    drop(stacks);
    let base = counting::live_bytes();
    let slots = percid_pool(&ids, retention);
    // A trim needs its id above the high water for the retention, then a scan.
    let of_slots = phases(
        &slots,
        retention + Duration::from_millis(300),
        base,
        &broken,
    );
    print_phases("PerCid, 1 s retention", &of_slots);
    let shrank = until(Duration::from_secs(3), || {
        counting::live_bytes() - base <= 2 * CACHE_BYTES as isize
    });
    if of_slots.heap[1] > 8 * CACHE_BYTES as isize || !shrank {
        println!("  BROKEN: the PerCid pool's heap did not follow the threads");
        broken.store(true, Ordering::Relaxed);
    }
    drop(slots);

    println!();
    println!(
        "cost per get + search + drop, CPU ns (medians of {rounds} interleaved rounds; the \
         ratio is the median of the rounds' ratios)"
    );
    let stacks = Stacks::new();
    let slots = percid_pool(&ids, retention);
    for (threads, searching) in [(1, true), (4, true), (1, false), (4, false)] {
        let (mut of_stacks, mut of_slots, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let (a, b) = (
                cost(&stacks, threads, searching),
                cost(&slots, threads, searching),
            );
            of_stacks.push(a);
            of_slots.push(b);
            ratios.push(b / a);
        }
        println!(
            "  {} thread{} {:<14} stacks {:>6.1} ns   PerCid {:>6.1} ns   ratio {:.2}",
            threads,
            if threads == 1 { " " } else { "s" },
            if searching {
                "with a search"
            } else {
                "bare get/put"
            },
            median(of_stacks),
            median(of_slots),
            median(ratios)
        );
    }
    drop((stacks, slots));

    println!();
    println!(
        "first search after 300 ms idle (4 threads search, sleep, search again; the scans \
         revoke the ids of idle threads)"
    );
    for retention in [Duration::ZERO, Duration::from_secs(1)] {
        let slots = percid_pool(&ids, retention);
        let warm = AtomicUsize::new(0);
        let took = Mutex::new(Vec::new());
        let together = Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    together.wait();
                    let began = Instant::now();
                    while began.elapsed() < Duration::from_millis(50) {
                        black_box(search(&mut slots.get(), HAYSTACK));
                    }
                    together.wait();
                    std::thread::sleep(Duration::from_millis(300));
                    together.wait();
                    let began = Instant::now();
                    let cached = slots.slots.take();
                    if cached.is_some() {
                        warm.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut cache = SlotsGuard {
                        pool: &slots,
                        cache: Some(cached.unwrap_or_else(|| Box::new(Cache::new()))),
                    };
                    black_box(search(&mut cache, HAYSTACK));
                    took.lock()
                        .unwrap()
                        .push(began.elapsed().as_secs_f64() * 1e6);
                    // Every thread has taken (or built) its cache before any gives one back.
                    together.wait();
                });
            }
        });
        println!(
            "  retention {:<5} {} of 4 caches kept; first search {:.1} µs (median)",
            format!("{retention:?}"),
            warm.load(Ordering::Relaxed),
            median(took.into_inner().unwrap())
        );
    }

    let shared = SHARED_CACHES.load(Ordering::Relaxed);
    if shared > 0 {
        println!("BROKEN: {shared} searches found their cache in use by another");
    }
    if broken.load(Ordering::Relaxed) || shared > 0 {
        std::process::exit(1);
    }
}

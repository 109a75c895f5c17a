//! Freeing a big batch of memory in parallel, on idle CPU only: the kernel's dedicated
//! page-freeing workers and padata's multithreaded jobs, with `run_chunked`.
//!
//! `cargo run --release --example parallel_free`
//!
//! 1. Frees 3 million boxed objects (each with a heap-allocated name and a 64-byte
//!    secret its destructor wipes) on one thread, then on two (the caller plus one
//!    nice-19 helper).
//!    The objects were allocated shard by shard, each half by its own thread, as a
//!    sharded cache fills. That matters: with glibc's malloc an object is freed into the
//!    arena of the thread that allocated it, and two threads freeing into one arena mostly
//!    fight over its bins (0.2–0.5× here when one thread allocated everything; the kernel
//!    saw the same past a few free workers). `run_chunked` has the caller take chunks from
//!    the front and helpers from the back, so here each frees its own shard.
//! 2. Frees them again from a maintenance work at nice 19 while a nice-0 loop runs on
//!    every CPU, and prints what the loop lost meanwhile, and how long the free took.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler};

const OBJECTS: usize = 3_000_000;
const BLOCK: usize = 4_096;

#[allow(dead_code)] // the fields are only there to be freed
struct Object {
    id: u64,
    name: String,
    secret: [u64; 8],
}

impl Drop for Object {
    /// A destructor that does some work, as real ones do (closing handles, dropping
    /// references): here it wipes its secret before the memory goes back.
    fn drop(&mut self) {
        for word in &mut self.secret {
            // SAFETY: `word` is a valid, aligned, exclusive reference.
            unsafe { std::ptr::write_volatile(word, 0) };
        }
    }
}

/// A table of objects in blocks, so a chunk of block indices can be freed on its own.
type Table = Vec<Mutex<Vec<Box<Object>>>>;

/// Fills the table the way a sharded cache is filled: each shard (a contiguous half of
/// the blocks) by its own thread, so each half lives in that thread's malloc arena.
fn allocate() -> Table {
    let blocks = OBJECTS.div_ceil(BLOCK);
    let half = blocks / 2;
    let build = |range: std::ops::Range<usize>| {
        range
            .map(|b| {
                let objects = (b * BLOCK..((b + 1) * BLOCK).min(OBJECTS))
                    .map(|i| {
                        Box::new(Object {
                            id: i as u64,
                            name: format!("object-{i}"),
                            secret: [i as u64; 8],
                        })
                    })
                    .collect();
                Mutex::new(objects)
            })
            .collect::<Vec<_>>()
    };
    std::thread::scope(|s| {
        let shards = [s.spawn(|| build(0..half)), s.spawn(|| build(half..blocks))];
        shards
            .into_iter()
            .flat_map(|shard| shard.join().unwrap())
            .collect()
    })
}

/// Frees every block with `run_chunked`; returns the time it took.
fn free(sched: &Scheduler, table: &Table) -> Duration {
    let start = Instant::now();
    sched
        .run_chunked(0..table.len(), 4, |blocks| {
            for block in &table[blocks] {
                drop(std::mem::take(&mut *block.lock().unwrap()));
            }
            Ok::<(), ()>(())
        })
        .unwrap();
    start.elapsed()
}

/// A nice-0 busy loop per CPU, counting its iterations.
struct Foreground {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Foreground {
    fn start(threads: usize) -> Foreground {
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let threads = (0..threads)
            .map(|_| {
                let (stop, count) = (stop.clone(), count.clone());
                std::thread::spawn(move || {
                    let mut x = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..1_000 {
                            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                        }
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Foreground {
            stop,
            count,
            threads,
        }
    }

    /// Iterations per second over `during` (which runs meanwhile).
    fn rate<T>(&self, during: impl FnOnce() -> T) -> (f64, T) {
        let (start, before) = (Instant::now(), self.count.load(Ordering::Relaxed));
        let result = during();
        let done = self.count.load(Ordering::Relaxed) - before;
        (done as f64 / start.elapsed().as_secs_f64(), result)
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            thread.join().unwrap();
        }
    }
}

fn main() -> Result<(), nicework::Error> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;

    let table = allocate();
    let one = free(&Scheduler::manual(), &table);
    let table = allocate();
    let sched = Scheduler::builder().workers(1).build()?;
    let two = free(&sched, &table);
    println!("freeing {OBJECTS} boxed objects (a String each, wiped on drop), 2 shards:");
    println!("  1 thread                      {:>8.1} ms", ms(one));
    println!(
        "  2 threads (caller + helper)   {:>8.1} ms   {:.2}× faster",
        ms(two),
        one.as_secs_f64() / two.as_secs_f64()
    );

    if two > one {
        println!(
            "  (slower here: two threads freeing into one malloc arena mostly fight over its\n   \
             bins. CPU-bound chunks scale: see `cargo bench --bench chunked`.)"
        );
    }

    // In the background, while a nice-0 loop saturates every CPU.
    let sched = Scheduler::builder().workers(cpus).build()?;
    let table = Arc::new(allocate());
    let foreground = Foreground::start(cpus);
    std::thread::sleep(Duration::from_millis(100));
    let (alone, ()) = foreground.rate(|| std::thread::sleep(Duration::from_millis(500)));
    let (tx, rx) = mpsc::channel();
    let (background, shared_table) = (sched.clone(), table.clone());
    let work = sched.work(move |_| {
        tx.send(free(&background, &shared_table)).unwrap();
        Next::Park
    });
    let (during, took) = foreground.rate(|| {
        work.schedule(Duration::ZERO);
        rx.recv().unwrap()
    });
    // The loop's rate alone, before and after, so drift does not count as loss.
    let (after, ()) = foreground.rate(|| std::thread::sleep(Duration::from_millis(500)));
    drop(foreground);
    let alone = (alone + after) / 2.0;
    println!("in a nice-19 maintenance work, while a nice-0 loop runs on each of {cpus} CPUs:");
    println!("  the free took                 {:>8.1} ms", ms(took));
    println!(
        "  foreground loss meanwhile     {:>8.2} %   (one run: ±2 % is noise here)",
        (1.0 - during / alone) * 100.0
    );
    Ok(())
}

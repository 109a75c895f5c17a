//! The per-CPU mode's figures (promise 11), each beside `thread_local` in the same run:
//!
//! - 4 threads per CPU counting: the live slots while they count and the CPU time per
//!   bump, against `ThreadLocal<AtomicU64>` doing the same. Two workloads: a tight loop of
//!   bumps (every moment is inside a guard, so nearly every preempted thread holds an id:
//!   the variant that misses the CPU's own id) and a counter bumped once per unit of other
//!   work (about 100 ns), as a server counts its requests.
//! - 200 threads on the machine's CPUs, each entering every millisecond, then every
//!   100 ms (once a scan period): `held()` and `PerCid::live()` after two scan periods, and the `PerCid`'s heap against a fresh one
//!   used by as many threads as there are CPUs.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nicework::hooks::id_mode;
use nicework::{IdSpace, PerCid, Scheduler};
use thread_local::ThreadLocal;

use crate::common::{self, median, thread_cpu_time};
use crate::counting::live_bytes;
use crate::tls_bump;

/// About 100 ns of work that is not the counter's.
#[inline(never)]
fn other_work(seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..60 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

/// `threads` threads run `bump` in a loop (with `other_work` between bumps if `between`);
/// once `ready` holds (the space is in per-CPU mode: a run starts in per-thread mode, and
/// the first scan that sees the threads switches), they are measured for `run`, and
/// `sample` is read every 10 ms. Returns the CPU time per bump and the samples.
fn count_for(
    threads: usize,
    between: bool,
    run: Duration,
    bump: impl Fn() + Sync,
    ready: &(dyn Fn() -> bool + Sync),
    sample: &(dyn Fn() -> usize + Sync),
) -> (f64, Vec<usize>) {
    let (measuring, stop) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        let counters: Vec<_> = (0..threads)
            .map(|t| {
                let (measuring, stop, bump) = (&measuring, &stop, &bump);
                s.spawn(move || {
                    let (mut bumps, mut seed) = (0u64, t as u64);
                    let mut from = None;
                    while !stop.load(Relaxed) {
                        if from.is_none() && measuring.load(Relaxed) {
                            from = Some((thread_cpu_time(), bumps));
                        }
                        for _ in 0..256 {
                            if between {
                                seed = black_box(other_work(seed));
                            }
                            bump();
                        }
                        bumps += 256;
                    }
                    let (cpu, counted) = from.expect("measured");
                    (thread_cpu_time() - cpu, bumps - counted)
                })
            })
            .collect();
        let waited = Instant::now();
        while !ready() {
            assert!(waited.elapsed() < Duration::from_secs(10), "never ready");
            std::thread::sleep(Duration::from_millis(5));
        }
        measuring.store(true, Relaxed);
        let began = Instant::now();
        let mut samples = Vec::new();
        while began.elapsed() < run {
            std::thread::sleep(Duration::from_millis(10));
            samples.push(sample());
        }
        stop.store(true, Relaxed);
        let (mut cpu, mut bumps) = (Duration::ZERO, 0);
        for counter in counters {
            let (time, count) = counter.join().unwrap();
            cpu += time;
            bumps += count;
        }
        (cpu.as_nanos() as f64 / bumps as f64, samples)
    })
}

/// 4 threads per CPU counting, on `PerCid` in per-CPU mode and on `ThreadLocal`.
pub fn four_threads_per_cpu_counting() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = 4 * cpus;
    let passes = if common::quick() { 1 } else { 3 };
    let run = Duration::from_millis(if common::quick() { 300 } else { 1_000 });
    let sched = Scheduler::new().expect("a scheduler");
    let ids = IdSpace::new(&sched);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    let tls: ThreadLocal<AtomicU64> = ThreadLocal::new();
    let with = || black_box(&counters).with(|n| *n.get_mut() += 1);
    let thread_local = || tls_bump(black_box(&tls));
    // Measured from the second scan after the switch: the slots of the per-thread ids
    // the threads had before it are trimmed by then.
    let switched_at = AtomicU64::new(u64::MAX);
    let per_cpu = || {
        let runs = ids.compaction_stats().runs;
        if id_mode(&ids).0 {
            switched_at.fetch_min(runs, Relaxed);
        }
        runs >= switched_at.load(Relaxed).saturating_add(2) && id_mode(&ids).0
    };
    for between in [false, true] {
        let (mut ratios, mut withs, mut tlss, mut lives) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..passes {
            let live = || counters.live();
            switched_at.store(u64::MAX, Relaxed);
            let (per_bump, samples) = count_for(threads, between, run, with, &per_cpu, &live);
            let (tl_per_bump, _) = count_for(threads, between, run, thread_local, &|| true, &|| 0);
            ratios.push(per_bump / tl_per_bump);
            withs.push(per_bump);
            tlss.push(tl_per_bump);
            lives.extend(samples);
        }
        lives.sort_unstable();
        let what = if between {
            "a bump per ~100 ns of other work"
        } else {
            "a tight loop of bumps"
        };
        println!(
            "  {threads} threads on {cpus} CPUs, {what}: PerCid::with {:5.2} ns CPU   ThreadLocal {:5.2} ns ({:.2}x, target <= 3x)   live slots median {} max {} (target <= CPUs + 2 = {})",
            median(withs),
            median(tlss),
            median(ratios),
            lives[lives.len() / 2],
            lives[lives.len() - 1],
            cpus + 2,
        );
    }
}

/// 200 threads on the machine's CPUs, each entering every millisecond, then every 100 ms.
pub fn two_hundred_threads_every_millisecond() {
    two_hundred_threads(Duration::from_millis(1));
    two_hundred_threads(Duration::from_millis(100));
}

/// 200 threads on the machine's CPUs, each entering every `interval`.
fn two_hundred_threads(interval: Duration) {
    const THREADS: usize = 200;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let period = Duration::from_millis(100);
    let sched = Scheduler::new().expect("a scheduler");
    let ids = IdSpace::builder().scan_period(period).build(&sched);
    let slots: Arc<PerCid<[u64; 8]>> = Arc::new(PerCid::new(&ids, || [0; 8]));
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (slots, stop, inside, entered, done) = (
                slots.clone(),
                stop.clone(),
                inside.clone(),
                entered.clone(),
                done.clone(),
            );
            std::thread::spawn(move || {
                slots.with(|slot| slot[0] += 1);
                entered.wait();
                while !stop.load(Relaxed) {
                    inside.fetch_add(1, Relaxed);
                    slots.with(|slot| slot[0] += 1);
                    inside.fetch_sub(1, Relaxed);
                    std::thread::sleep(interval);
                }
                // Alive, and done with the `PerCid`, while its heap is counted.
                drop(slots);
                done.wait();
                done.wait();
            })
        })
        .collect();
    entered.wait();
    // Two scan periods to switch and settle (and two intervals for the threads to
    // enter again).
    std::thread::sleep(2 * period.max(interval) + period / 2);
    let (mut held, mut live, mut most_inside) = (Vec::new(), Vec::new(), 0);
    let began = Instant::now();
    while began.elapsed() < 10 * period {
        held.push(ids.held());
        live.push(slots.live());
        most_inside = most_inside.max(inside.load(Relaxed));
        std::thread::sleep(Duration::from_millis(5));
    }
    let per_cpu = id_mode(&ids).0;
    stop.store(true, Relaxed);
    done.wait();
    // The heap the `PerCid` holds: what its drop gives back (nothing else allocates
    // meanwhile: its threads wait).
    let before = live_bytes();
    drop(slots);
    let used = before - live_bytes();
    done.wait();
    for thread in threads {
        thread.join().unwrap();
    }
    held.sort_unstable();
    live.sort_unstable();
    let fresh = fresh_heap(cpus);
    println!(
        "  {THREADS} threads on {cpus} CPUs, each entering every {interval:?} (per-CPU mode: {per_cpu}): held median {} max {}   PerCid::live median {} max {}   (target <= CPUs + guards alive beyond them; most counted inside at once: {most_inside})   PerCid heap {used} B vs fresh with {cpus} threads {fresh} B ({:.2}x, target <= 2x)",
        held[held.len() / 2],
        held[held.len() - 1],
        live[live.len() / 2],
        live[live.len() - 1],
        used as f64 / fresh as f64,
    );
}

/// The heap of a fresh `PerCid<[u64; 8]>` used by `threads` threads, counted as above.
fn fresh_heap(threads: usize) -> isize {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let slots: PerCid<[u64; 8]> = PerCid::new(&ids, || [0; 8]);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| slots.with(|slot| slot[0] += 1));
        }
    });
    let before = live_bytes();
    drop(slots);
    before - live_bytes()
}

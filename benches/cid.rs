//! Concurrency-id benchmarks, each a ratio against a peer in the same run.
//!
//! `cargo bench --bench cid` (add `quick` for fewer rounds, and words of the figures'
//! names to run only those: `cargo bench --bench cid -- scan_work`). Prints medians; the `enter()`
//! line repeats its comparison in passes and prints the median of the passes' ratios,
//! which a noisy machine moves less than one ratio of two figures timed apart.
//!
//! - `enter()` + drop on a held id, against `thread_local::ThreadLocal::get()` and against
//!   reading the kernel's own rseq `mm_cid` from glibc's rseq area (`__rseq_offset` from
//!   the thread pointer, field offset 24, one relaxed load): the physical limit.
//! - A per-thread counter bump, printed beside the `enter()` line and measured the same
//!   way (passes, median of the ratios): `PerCid::with(|n| *n.get_mut() += 1)` on a
//!   `PerCid<AtomicU64>` against `ThreadLocal<AtomicU64>::get_or` plus a relaxed load and
//!   a relaxed store of the value + 1 (what a user writes to sum per-thread counters from
//!   another thread), and against std's `thread_local!` `Cell<u64>` (which no other
//!   thread can read).
//! - The same bump on two `PerCid`s in turn (the slot cache's second entry) and on three
//!   (every call misses the thread's two-entry slot cache: the variant that misses
//!   `with`'s fast path), against as many `ThreadLocal`s in turn.
//! - The same bump from 8 threads at once on this machine's CPUs (more threads than CPUs,
//!   so they are preempted in the middle of their loops), against `ThreadLocal` doing the
//!   same with 8 threads.
//! - One compaction scan over 1,024 thread records: the cheap pass (every thread active)
//!   and the revoking pass (every thread idle: one membarrier, 1,024 ids freed).
//! - The compaction work's time per second on a busy space with 1 and with 30,000
//!   `PerCid`s (a scan visits only the `PerCid`s with slots above the high water), and
//!   with a thread coming and going that leaves a slot above it in every one of them.
//! - Heap after 64 threads shrink to 4: an `IdSpace` plus a `PerCid<[u64; 4]>` against a
//!   fresh pair used by 4 threads, and `thread_local::ThreadLocal` doing the same job
//!   (counted by a counting allocator: bytes, not time).
//! - Summing 4 per-thread counters from another thread: `PerCid::for_each` (which pays a
//!   membarrier so that the owners' `with` stays free of read-modify-writes) against
//!   `ThreadLocal::iter`.
//! - Per-CPU mode (`cid/per_cpu.rs`, `cargo bench --bench cid -- per_cpu`): 4 threads per
//!   CPU counting (live slots and CPU per bump, against `ThreadLocal`), and 200 threads
//!   each entering every millisecond (ids held, live slots, heap).

mod common;
#[path = "cid/per_cpu.rs"]
mod per_cpu;

#[path = "../examples/common/counting.rs"]
mod counting;
#[path = "../tests/common/shrink_heap.rs"]
mod shrink_heap;

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{median, per_op, quick};
use nicework::{IdSpace, PerCid, Scheduler};
use shrink_heap::heap_after_shrink;
use thread_local::ThreadLocal;

unsafe extern "C" {
    static __rseq_offset: isize;
    static __rseq_size: u32;
}

/// The kernel's mm_cid for this thread, if glibc registered rseq and the kernel fills it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn kernel_mm_cid() -> Option<u32> {
    // SAFETY: glibc ≥ 2.35 exports these; reading them has no side effects.
    let (offset, size) = unsafe { (__rseq_offset, __rseq_size) };
    if size == 0 {
        return None;
    }
    let tp: usize;
    // SAFETY: on x86_64 Linux, fs:0 holds the thread pointer (the TCB's self pointer).
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    let field = (tp as isize + offset + 24) as *const u32;
    // SAFETY: the rseq area is registered for this thread and lives as long as it does;
    // the kernel updates the field, hence the volatile (relaxed) read.
    Some(unsafe { std::ptr::read_volatile(field) })
}

#[cfg(not(target_arch = "x86_64"))]
fn kernel_mm_cid() -> Option<u32> {
    None
}

/// `enter()` + drop against `ThreadLocal::get` (and the rseq read). Both are timed in
/// several passes, each pass timing every contender back to back (medians over
/// `rounds()` rounds, as everywhere), so a burst of load from elsewhere on the machine
/// hits both sides of a pass's ratio; the ratio printed is the median of the passes'
/// ratios, and the ns figures are the medians of each side's passes.
fn enter_held() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    drop(ids.enter());
    let tls: thread_local::ThreadLocal<u64> = thread_local::ThreadLocal::new();
    let iters = 20_000_000;
    let passes = if common::quick() { 1 } else { 5 };
    let (mut enters, mut thread_locals, mut ratios, mut rseqs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..passes {
        let enter = per_op(iters, |_| {
            let cid = black_box(&ids).enter();
            black_box(cid.get());
        });
        let thread_local = per_op(iters, |_| {
            black_box(black_box(&tls).get_or(|| 0));
        });
        if kernel_mm_cid().is_some() {
            rseqs.push(per_op(iters, |_| {
                black_box(kernel_mm_cid());
            }));
        }
        enters.push(enter);
        thread_locals.push(thread_local);
        ratios.push(enter / thread_local);
    }
    let (enter, thread_local, ratio) = (median(enters), median(thread_locals), median(ratios));
    let rseq_text = if rseqs.is_empty() {
        "rseq mm_cid: not registered here".into()
    } else {
        let ns = median(rseqs);
        format!("rseq mm_cid read {ns:5.2} ns ({:.2}x)", enter / ns)
    };
    println!(
        "enter()+drop on a held id   {enter:5.2} ns   thread_local get {thread_local:5.2} ns ({ratio:.2}x, median of {passes} passes)   {rseq_text}   (target <= 3 ns; fence-free fast path: {})",
        nicework::hooks::uses_membarrier(),
    );
}

thread_local! {
    static STD_COUNTER: Cell<u64> = const { Cell::new(0) };
}

/// `PerCid::with` bumping a counter against the `ThreadLocal` and std `thread_local!`
/// bumps, in passes as `enter_held` does.
fn counter_bump() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    counters.with(|n| *n.get_mut() += 1);
    let tls: ThreadLocal<AtomicU64> = ThreadLocal::new();
    let iters = 20_000_000;
    let passes = if common::quick() { 1 } else { 5 };
    let (mut withs, mut thread_locals, mut cells, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..passes {
        let with = per_op(iters, |_| {
            black_box(&counters).with(|n| *n.get_mut() += 1);
        });
        let thread_local = per_op(iters, |_| tls_bump(black_box(&tls)));
        let cell = per_op(iters, |_| {
            STD_COUNTER.with(|n| n.set(black_box(n.get()) + 1));
        });
        withs.push(with);
        thread_locals.push(thread_local);
        cells.push(cell);
        ratios.push(with / thread_local);
    }
    let (with, thread_local, cell, ratio) = (
        median(withs),
        median(thread_locals),
        median(cells),
        median(ratios),
    );
    println!(
        "PerCid::with counter bump   {with:5.2} ns   ThreadLocal<AtomicU64> bump {thread_local:5.2} ns ({ratio:.2}x, median of {passes} passes; target <= 1.5x)   std thread_local! Cell {cell:5.2} ns ({:.2}x)",
        with / cell,
    );
    // Two `PerCid`s of one space in turn (each finds its slot in the second entry of the
    // thread's two-entry slot cache) and three (the variant that misses the cache at every
    // call), against as many `ThreadLocal`s in turn.
    let second: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    let third: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    second.with(|n| *n.get_mut() += 1);
    third.with(|n| *n.get_mut() += 1);
    let (tls2, tls3): (ThreadLocal<AtomicU64>, ThreadLocal<AtomicU64>) =
        (ThreadLocal::new(), ThreadLocal::new());
    let percids = [&counters, &second, &third];
    let thread_locals = [&tls, &tls2, &tls3];
    for k in [2, 3] {
        let with = per_op(iters, |i| {
            black_box(percids[(i % k) as usize]).with(|n| *n.get_mut() += 1);
        });
        let thread_local = per_op(iters, |i| {
            tls_bump(black_box(thread_locals[(i % k) as usize]))
        });
        let what = if k == 2 {
            "two PerCids in turn (the cache's second entry)"
        } else {
            "three PerCids in turn (every call misses the cache)"
        };
        println!(
            "  {what} {with:5.2} ns   as many ThreadLocals in turn {thread_local:5.2} ns ({:.2}x)",
            with / thread_local
        );
    }
}

/// `ThreadLocal<AtomicU64>`'s counter bump: what `PerCid::with(|n| *n.get_mut() += 1)`
/// replaces.
#[inline(always)]
pub(crate) fn tls_bump(tls: &ThreadLocal<AtomicU64>) {
    let n = tls.get_or(|| AtomicU64::new(0));
    n.store(n.load(Relaxed) + 1, Relaxed);
}

/// The counter bump from more threads than CPUs: each of 8 threads bumps in a loop while
/// the others preempt it, for `PerCid::with` and for `ThreadLocal`, in passes.
fn counter_bump_oversubscribed() {
    const THREADS: usize = 8;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    let tls: ThreadLocal<AtomicU64> = ThreadLocal::new();
    let iters = if common::quick() {
        2_000_000
    } else {
        5_000_000
    };
    let passes = if common::quick() { 1 } else { 5 };
    let (mut withs, mut thread_locals, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..passes {
        let with = common::per_op_threads(THREADS, iters, |_, _| {
            black_box(&counters).with(|n| *n.get_mut() += 1);
        });
        let thread_local = common::per_op_threads(THREADS, iters, |_, _| {
            tls_bump(black_box(&tls));
        });
        withs.push(with);
        thread_locals.push(thread_local);
        ratios.push(with / thread_local);
    }
    let (with, thread_local, ratio) = (median(withs), median(thread_locals), median(ratios));
    println!(
        "  the same, {THREADS} threads on {cpus} CPUs   PerCid::with {with:5.2} ns   ThreadLocal {thread_local:5.2} ns ({ratio:.2}x, median of {passes} passes; wall time per bump and thread, preemption included)",
    );
}

fn scan_1024() {
    const THREADS: usize = 1024;
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let entered = Arc::new(Barrier::new(THREADS + 1));
    let release = Arc::new(Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (ids, entered, release) = (ids.clone(), entered.clone(), release.clone());
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    drop(ids.enter());
                    entered.wait();
                    release.wait();
                })
                .unwrap()
        })
        .collect();
    entered.wait();
    assert_eq!(ids.held(), THREADS);
    let period = Duration::from_millis(100);
    let busy = |ids: &IdSpace| ids.compaction_stats().busy_total;
    let before = busy(&ids);
    sched.advance(period); // every thread used since the last scan: clears marks only
    let cheap = busy(&ids) - before;
    let before = busy(&ids);
    sched.advance(period); // every thread idle: revokes 1,024 ids (one membarrier)
    let revoking = busy(&ids) - before;
    assert_eq!(ids.held(), 0);
    release.wait();
    for thread in threads {
        thread.join().unwrap();
    }
    println!(
        "scan of 1,024 thread records   clear marks {:7.1} µs   revoke all {:7.1} µs   (kernel per-mm work: 2 µs avg, 75 µs tick-based)",
        cheap.as_secs_f64() * 1e6,
        revoking.as_secs_f64() * 1e6
    );
}

/// The compaction work's time per second of a busy space (4 threads that keep entering,
/// each bumping its counter in one `PerCid` after another) with 1 and with 30,000
/// `PerCid`s, and with 30,000 and a fifth thread that comes and goes every scan period,
/// bumping every one of them (the variant that misses the cheap path: each time it leaves,
/// every `PerCid` has a slot above the high water, and the next scan visits all of them).
fn scan_work_with_many_per_cids() {
    let run = if quick() {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    };
    let mut figures = Vec::new();
    for (storages, coming_and_going) in [(1, false), (30_000, false), (30_000, true)] {
        let sched = Scheduler::builder()
            .priority(nicework::Priority::Normal)
            .build()
            .expect("a scheduler");
        let ids = IdSpace::new(&sched);
        let counters: Vec<PerCid<u64>> = (0..storages).map(|_| PerCid::new(&ids, || 0)).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let busy_ms_per_s = std::thread::scope(|s| {
            for first in 0..4 {
                let (counters, stop) = (&counters, &stop);
                s.spawn(move || {
                    let mut at = first;
                    while !stop.load(Relaxed) {
                        // Bursts with pauses: the CPUs stay free for the worker, so its
                        // time is its work, not its wait for a CPU.
                        for _ in 0..2_000 {
                            counters[at % counters.len()].with(|n| *n += 1);
                            at += 4;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
            }
            if coming_and_going {
                let (counters, stop) = (&counters, &stop);
                s.spawn(move || {
                    while !stop.load(Relaxed) {
                        std::thread::scope(|passing| {
                            passing.spawn(|| counters.iter().for_each(|c| c.with(|n| *n += 1)));
                        });
                        std::thread::sleep(Duration::from_millis(100));
                    }
                });
            }
            // Past the first slots and the first trims.
            std::thread::sleep(Duration::from_millis(500));
            let busy = |ids: &IdSpace| ids.compaction_stats().busy_total;
            let before = busy(&ids);
            let started = std::time::Instant::now();
            std::thread::sleep(run);
            let per_s = (busy(&ids) - before).as_secs_f64() * 1e3 / started.elapsed().as_secs_f64();
            stop.store(true, Relaxed);
            per_s
        });
        figures.push(busy_ms_per_s);
    }
    println!(
        "scan work of a busy space     1 PerCid {:5.2} ms/s   30,000 PerCids {:5.2} ms/s   30,000 with a thread coming and going {:5.2} ms/s   (target: 30,000 <= 1 ms/s; every scan trimmed every PerCid: ~8 ms/s)",
        figures[0], figures[1], figures[2]
    );
}

/// Heap after 64 -> 4 threads against a fresh storage used by 4 threads.
fn heap_after_shrink_64_to_4() {
    let sched = Scheduler::manual();
    type Pair = (IdSpace, PerCid<[u64; 4]>);
    let make = || -> Pair {
        let ids = IdSpace::new(&sched);
        let slots = PerCid::new(&ids, || [0; 4]);
        (ids, slots)
    };
    let touch = |(_, slots): &Pair| slots.with(|slot| slot[0] += 1);
    // One scan after the survivors moved down.
    let settle = |_: &Pair| {
        sched.advance(Duration::from_millis(100));
    };
    heap_after_shrink(make, touch, settle, 4, 4); // one-time allocations
    let fresh = heap_after_shrink(make, touch, settle, 4, 4);
    let shrunk = heap_after_shrink(make, touch, settle, 64, 4);
    let tl_make = ThreadLocal::<Cell<[u64; 4]>>::new;
    let tl_touch = |tl: &ThreadLocal<Cell<[u64; 4]>>| {
        let slot = tl.get_or(|| Cell::new([0; 4]));
        let mut value = slot.get();
        value[0] += 1;
        slot.set(value);
    };
    heap_after_shrink(tl_make, tl_touch, |_| (), 4, 4);
    let tl_fresh = heap_after_shrink(tl_make, tl_touch, |_| (), 4, 4);
    let tl_shrunk = heap_after_shrink(tl_make, tl_touch, |_| (), 64, 4);
    println!(
        "heap after 64 -> 4 threads   IdSpace + PerCid<[u64; 4]> {shrunk} B vs fresh with 4 threads {fresh} B ({:.2}x, target <= 1.2x)   thread_local {tl_shrunk} B vs {tl_fresh} B ({:.2}x)",
        shrunk as f64 / fresh as f64,
        tl_shrunk as f64 / tl_fresh as f64,
    );
}

/// Another thread sums 4 per-thread counters while their owners keep counting.
fn sum_four_counters() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    let tl: ThreadLocal<AtomicU64> = ThreadLocal::new();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let iters = if common::quick() { 20_000 } else { 100_000 };
    let (for_each, iter) = std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while !stop.load(Relaxed) {
                    counters.with(|n| *n.get_mut() += 1);
                    tl.get_or(|| AtomicU64::new(0)).fetch_add(1, Relaxed);
                    std::thread::yield_now();
                }
            });
        }
        while counters.live() < 4 || tl.iter().count() < 4 {
            std::thread::yield_now();
        }
        let for_each = per_op(iters, |_| {
            let mut sum = 0;
            counters.for_each(|n| sum += n.load(Relaxed));
            black_box(sum);
        });
        let iter = per_op(iters, |_| {
            black_box(tl.iter().map(|n| n.load(Relaxed)).sum::<u64>());
        });
        stop.store(true, Relaxed);
        (for_each, iter)
    });
    println!(
        "sum of 4 live counters        PerCid::for_each {for_each:7.1} ns   ThreadLocal::iter {iter:7.1} ns ({:.1}x; for_each pays one membarrier so that `with` needs no read-modify-write)",
        for_each / iter
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // Words other than `quick` and flags pick the figures whose names contain them.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-') && arg != "quick")
        .collect();
    let figures: [(&str, fn()); 9] = [
        ("enter_held", enter_held),
        ("counter_bump", counter_bump),
        ("counter_bump_oversubscribed", counter_bump_oversubscribed),
        ("scan_1024", scan_1024),
        ("scan_work_with_many_per_cids", scan_work_with_many_per_cids),
        ("heap_after_shrink_64_to_4", heap_after_shrink_64_to_4),
        ("sum_four_counters", sum_four_counters),
        (
            "per_cpu_four_threads_per_cpu_counting",
            per_cpu::four_threads_per_cpu_counting,
        ),
        (
            "per_cpu_two_hundred_threads_every_millisecond",
            per_cpu::two_hundred_threads_every_millisecond,
        ),
    ];
    for (name, figure) in figures {
        if filters.is_empty() || filters.iter().any(|filter| name.contains(filter.as_str())) {
            figure();
        }
    }
}

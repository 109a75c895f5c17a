//! Concurrency-id benchmarks, each a ratio against a peer in the same run.
//!
//! `cargo bench --bench cid` (add `quick` for fewer rounds). Prints medians.
//!
//! - `enter()` + drop on a held id, against `thread_local::ThreadLocal::get()` and against
//!   reading the kernel's own rseq `mm_cid` from glibc's rseq area (`__rseq_offset` from
//!   the thread pointer, field offset 24, one relaxed load): the physical limit.
//! - One compaction scan over 1,024 thread records: the cheap pass (every thread active)
//!   and the revoking pass (every thread idle: one membarrier, 1,024 ids freed).

mod common;

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::per_op;
use nicework::{IdSpace, Scheduler};

extern "C" {
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

fn enter_held() {
    let sched = Scheduler::manual();
    let ids = IdSpace::new(&sched);
    drop(ids.enter());
    let tls: thread_local::ThreadLocal<u64> = thread_local::ThreadLocal::new();
    let iters = 50_000_000;
    let enter = per_op(iters, |_| {
        let cid = black_box(&ids).enter();
        black_box(cid.get());
    });
    let thread_local = per_op(iters, |_| {
        black_box(black_box(&tls).get_or(|| 0));
    });
    let rseq = kernel_mm_cid().map(|_| {
        per_op(iters, |_| {
            black_box(kernel_mm_cid());
        })
    });
    let rseq_text = match rseq {
        Some(ns) => format!("rseq mm_cid read {ns:5.2} ns ({:.2}x)", enter / ns),
        None => "rseq mm_cid: not registered here".into(),
    };
    println!(
        "enter()+drop on a held id   {enter:5.2} ns   thread_local get {thread_local:5.2} ns ({:.2}x)   {rseq_text}   (target <= 3 ns; fence-free fast path: {})",
        enter / thread_local,
        IdSpace::uses_membarrier(),
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

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    enter_held();
    scan_1024();
}

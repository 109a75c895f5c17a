//! The benchmark harness shared by the bench binaries: medians over rounds.
#![allow(dead_code)] // each bench binary uses a different part of it

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Rounds per figure: 7, or 3 with the `quick` argument.
pub fn rounds() -> usize {
    if std::env::args().any(|a| a == "quick") {
        3
    } else {
        7
    }
}

pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

/// ns per iteration of `f` (given the iteration index): the median over `rounds()`
/// rounds of `iters` iterations.
pub fn per_op(iters: u64, mut f: impl FnMut(u64)) -> f64 {
    median(
        (0..rounds())
            .map(|_| {
                let start = Instant::now();
                for i in 0..iters {
                    f(i);
                }
                start.elapsed().as_nanos() as f64 / iters as f64
            })
            .collect(),
    )
}

/// ns per iteration of `f` run by `threads` threads at once (each with its index and
/// the iteration index): the mean of the threads' figures, median over `rounds()`.
pub fn per_op_threads(threads: usize, iters: u64, f: impl Fn(usize, u64) + Sync) -> f64 {
    median(
        (0..rounds())
            .map(|_| {
                let barrier = std::sync::Barrier::new(threads);
                let total: f64 = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            let (barrier, f) = (&barrier, &f);
                            s.spawn(move || {
                                barrier.wait();
                                let start = Instant::now();
                                for i in 0..iters {
                                    f(t, i);
                                }
                                start.elapsed().as_nanos() as f64 / iters as f64
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).sum()
                });
                total / threads as f64
            })
            .collect(),
    )
}

/// Whether the `quick` argument asks for short rounds.
pub fn quick() -> bool {
    std::env::args().any(|a| a == "quick")
}

/// One unit of CPU-bound work (a few µs): the foreground's loop body and the
/// maintenance increments are made of it.
#[inline(never)]
pub fn unit(seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..2_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

/// How many units make about `target` of CPU time on this machine.
pub fn calibrate(target: Duration) -> u64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_millis(200) {
        black_box(unit(n));
        n += 1;
    }
    let per_unit = start.elapsed().as_secs_f64() / n as f64;
    ((target.as_secs_f64() / per_unit) as u64).max(1)
}

/// CPU time of the calling thread.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Spinning nice-0 threads that saturate every CPU until dropped.
pub struct Saturation {
    stop: Arc<AtomicBool>,
    iterations: Arc<AtomicU64>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Saturation {
    /// Starts `threads` spinners.
    pub fn start(threads: usize) -> Saturation {
        let stop = Arc::new(AtomicBool::new(false));
        let iterations = Arc::new(AtomicU64::new(0));
        let handles = (0..threads)
            .map(|t| {
                let (stop, counter) = (stop.clone(), iterations.clone());
                std::thread::spawn(move || {
                    let mut i = t as u64;
                    while !stop.load(Ordering::Relaxed) {
                        black_box(unit(i));
                        i += 1;
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Saturation {
            stop,
            iterations,
            handles,
        }
    }

    /// Units of work the spinners completed so far, all threads together.
    pub fn iterations(&self) -> u64 {
        self.iterations.load(Ordering::Relaxed)
    }
}

impl Drop for Saturation {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            h.join().unwrap();
        }
    }
}

//! Scheduler-core benchmarks, each figure a ratio against a peer measured in the same
//! run (the machine is shared and noisy, so an absolute time alone is not a result).
//!
//! `cargo bench --bench work` (add `-- quick` for fewer rounds; name benches to run only
//! those, e.g. `-- per-run`). Prints medians.

use std::future::Future;
mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{per_op, per_op_threads};
use nicework::{Next, Scheduler, Work};

/// Counts live heap bytes, for the bytes-per-parked-work figure.
#[path = "../examples/common/counting.rs"]
mod counting;

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

fn touch_armed() {
    let sched = Scheduler::new().unwrap();
    let work = sched.every(Duration::from_secs(3600), |_| Next::Again);
    let reference = AtomicU64::new(1);
    let iters = 50_000_000;
    let touch = per_op(iters, |_| black_box(&work).touch());
    let load = per_op(iters, |_| {
        black_box(black_box(&reference).load(Ordering::Relaxed));
    });
    println!(
        "touch() on an armed work      {touch:6.2} ns   relaxed load {load:6.2} ns   ratio {:.2}x   (target <= 2 ns)",
        touch / load
    );
}

fn touch_timeout() {
    let far = Duration::from_secs(3600);
    let iters = 20_000_000;
    let sched = Scheduler::new().unwrap();
    let works: Vec<Work> = (0..2).map(|_| sched.timeout(far, |_| Next::Park)).collect();
    let one = per_op(iters, |_| black_box(&works[0]).touch());
    let one_spawned = per_op_threads(1, iters, |_, _| black_box(&works[0]).touch());
    let two = per_op_threads(2, iters, |t, _| black_box(&works[t]).touch());

    // tokio: a registered Sleep reset to a later deadline, the caller's clock read
    // included (what a connection pool does on every checkin).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let tokio = rt.block_on(async {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut sleep = Box::pin(tokio::time::sleep(far));
        let _ = sleep.as_mut().poll(&mut cx);
        per_op(iters / 4, |_| {
            sleep.as_mut().reset(tokio::time::Instant::now() + far);
        })
    });
    println!(
        "touch() on an armed timeout  {one:6.2} ns   2 threads {two:6.2} ns ({:.2}x 1 spawned thread)   tokio Sleep::reset {tokio:6.2} ns ({:.1}x cheaper)   (target <= 3 ns, >= 10x, 2 threads <= 1.3x)",
        two / one_spawned,
        tokio / one,
    );

    // The quiet-time recipe's touch: a cache's idle (300 ms), with and without a leeway
    // that lets it read the touch tick instead of the clock.
    let idle = Duration::from_millis(300);
    let plain = sched.timeout(idle, |_| Next::Park);
    let lax = sched
        .timeout(idle, |_| Next::Park)
        .leeway(Duration::from_millis(150));
    let clock = per_op(iters, |_| black_box(&plain).touch());
    let ticked = per_op(iters, |_| black_box(&lax).touch());
    println!(
        "touch() on a 300 ms timeout  {clock:6.2} ns (the clock)   with a 150 ms leeway {ticked:6.2} ns (the touch tick, {:.1}x cheaper)   (target <= 3 ns)",
        clock / ticked,
    );
}

/// Delays an hour out that differ from call to call, spread over a second: a jittered
/// keep-alive, a pool reaper's `deadline - now`, a per-entry TTL. A table, so that the
/// changing-delay figures do not include computing the delay; its length is prime to the
/// hot sets', so a work meets a different delay at each of its calls.
fn varying_delays(far: Duration) -> Vec<Duration> {
    (0..4093u64)
        .map(|i| far + Duration::from_nanos(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 34))
        .collect()
}

/// `reschedule` + `cancel` on a hot set of `work()`s, 1M other works armed: with a
/// delay that changes at every call (the figure users meet: each change of delay also
/// changes a `work()`'s period) and with a constant one (the pattern the lock-free path
/// was first built for), from 1 and 2 threads, against tokio's timer and
/// scheduled-thread-pool in the same run.
fn rearm_pair() {
    const REGISTERED: usize = 1_000_000;
    const PAIRS: u64 = 1_000_000;
    const HOT: usize = 1024;
    let far = Duration::from_secs(3600);
    let delays = varying_delays(far);
    let varying = |i: u64| delays[(i % delays.len() as u64) as usize];

    // nicework: 1M armed works stay registered; the pair is measured on a hot set of
    // 1,024 other works (as the peers below), so the figure is the structure's cost and
    // not the memory latency of touching a random one of 1M handles.
    let sched = Scheduler::new().unwrap();
    let registered: Vec<Work> = (0..REGISTERED)
        .map(|i| {
            let work = sched.work(|_| Next::Park);
            work.schedule(far + Duration::from_millis(i as u64 % 100_000));
            work
        })
        .collect();
    let hot: Vec<Work> = (0..HOT).map(|_| sched.work(|_| Next::Park)).collect();
    let hot2: Vec<Work> = (0..HOT).map(|_| sched.work(|_| Next::Park)).collect();
    let pair = |set: &[Work], i: u64, delay: Duration| {
        let work = &set[i as usize % HOT];
        black_box(work.reschedule(delay));
        black_box(work.cancel());
    };
    let varying_one = per_op(PAIRS, |i| pair(&hot, i, varying(i)));
    let constant_one = per_op(PAIRS, |i| pair(&hot, i, far));
    assert_eq!(sched.metrics().armed, REGISTERED);
    // Two threads, each on its own hot set, against one spawned thread in the same
    // harness (a spawned thread's figure differs from the main thread's on this VM).
    let sets = [&hot, &hot2];
    let varying_spawned = per_op_threads(1, PAIRS, |_, i| pair(&hot, i, varying(i)));
    let varying_two = per_op_threads(2, PAIRS, |t, i| pair(sets[t], i, varying(i)));
    let constant_spawned = per_op_threads(1, PAIRS, |_, i| pair(&hot, i, far));
    let constant_two = per_op_threads(2, PAIRS, |t, i| pair(sets[t], i, far));
    // The variant that misses the lock-free path: each call's deadline is below the work's
    // entry (delays shrinking by 1 ms per call to the same work, far faster than time
    // passes), so every reschedule takes the lock and links an entry, and the one it
    // leaves stale is swept later.
    // The step counts on across rounds (each round restarts `i`), so no round's deadlines
    // come back above the entries the rounds before placed.
    let hot3: Vec<Work> = (0..HOT).map(|_| sched.work(|_| Next::Park)).collect();
    let step = std::cell::Cell::new(0u64);
    let below_entry = per_op(PAIRS / 4, |_| {
        let k = step.replace(step.get() + 1);
        pair(&hot3, k, far - Duration::from_micros(k))
    });
    drop(hot3);
    drop(registered);
    drop(hot);
    drop(hot2);
    drop(sched);

    // tokio: 1M registered Sleeps; a pair is a pinned Sleep reset (to a deadline that
    // changes at every call, as above: tokio's cost does not depend on it) and polled.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let tokio = rt.block_on(async {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let now = tokio::time::Instant::now();
        let mut sleeps: Vec<_> = (0..REGISTERED)
            .map(|i| {
                Box::pin(tokio::time::sleep_until(
                    now + far + Duration::from_millis(i as u64 % 100_000),
                ))
            })
            .collect();
        for sleep in &mut sleeps {
            let _ = sleep.as_mut().poll(&mut cx);
        }
        let mut hot: Vec<_> = (0..HOT)
            .map(|_| Box::pin(tokio::time::sleep_until(now + far)))
            .collect();
        per_op(PAIRS, |i| {
            let sleep = &mut hot[i as usize % HOT];
            sleep
                .as_mut()
                .reset(tokio::time::Instant::now() + varying(i));
            let _ = black_box(sleep.as_mut().poll(&mut cx));
        })
    });
    drop(rt);

    // scheduled-thread-pool: execute_after + cancel (its cancel only sets a flag).
    let pool = scheduled_thread_pool::ScheduledThreadPool::new(1);
    let handles: Vec<_> = (0..REGISTERED / 10)
        .map(|_| pool.execute_after(far, || {}))
        .collect();
    let stp = per_op(PAIRS / 4, |i| {
        let handle = pool.execute_after(varying(i), || {});
        handle.cancel();
        black_box(handle);
    });
    drop(handles);

    println!(
        "reschedule+cancel, 1M armed, delay changing at every call {varying_one:6.1} ns   tokio reset+poll {tokio:6.1} ns ({:.2}x)   scheduled-thread-pool execute_after+cancel {stp:6.1} ns ({:.2}x)   (target >= 3x tokio)",
        tokio / varying_one,
        stp / varying_one,
    );
    println!(
        "  the same pair, constant delay                            {constant_one:6.1} ns   changing/constant {:.2}x (target <= 1.2x)   tokio {:.2}x",
        varying_one / constant_one,
        tokio / constant_one,
    );
    println!(
        "  the same pair, each deadline below the entry (the locked path) {below_entry:6.1} ns ({:.2}x tokio)",
        tokio / below_entry
    );
    println!(
        "  from 2 threads, delay changing  {varying_two:6.1} ns   ({:.2}x the same harness on 1 spawned thread, {varying_spawned:.1} ns; target <= 1.2x)",
        varying_two / varying_spawned
    );
    println!(
        "  from 2 threads, constant delay  {constant_two:6.1} ns   ({:.2}x the same harness on 1 spawned thread, {constant_spawned:.1} ns)",
        constant_two / constant_spawned
    );
}

fn heap_per_parked_work() {
    const N: usize = 10_000;
    let sched = Scheduler::manual();
    let mut works: Vec<Work> = Vec::with_capacity(N);
    let before = counting::live_bytes();
    for _ in 0..N {
        works.push(sched.work(|_| Next::Park));
    }
    let nicework = (counting::live_bytes() - before) as f64 / N as f64;
    drop(works);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let tokio = rt.block_on(async {
        let mut sleeps = Vec::with_capacity(N);
        let before = counting::live_bytes();
        for _ in 0..N {
            sleeps.push(Box::pin(tokio::time::sleep(Duration::from_secs(3600))));
        }
        (counting::live_bytes() - before) as f64 / N as f64
    });
    println!(
        "heap per parked work          {nicework:6.1} B    tokio Box<Sleep> {tokio:6.1} B   (target <= 88 B; kernel delayed_work 88 B)"
    );
}

fn heap_per_armed_work() {
    const N: usize = 100_000;
    let far = Duration::from_secs(3600);
    // A real scheduler, whose wheel holds the entries; the deadlines spread over many
    // slots, as a server's would.
    let sched = Scheduler::new().unwrap();
    let warm: Vec<Work> = (0..1000).map(|_| sched.work(|_| Next::Park)).collect();
    for work in &warm {
        work.schedule(far);
    }
    let mut works: Vec<Work> = Vec::with_capacity(N);
    let before = counting::live_bytes();
    for i in 0..N {
        let work = sched.work(|_| Next::Park);
        work.schedule(far + Duration::from_millis(i as u64 % 10_000));
        works.push(work);
    }
    let nicework = (counting::live_bytes() - before) as f64 / N as f64;
    drop(works);
    drop(warm);
    drop(sched);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let tokio = rt.block_on(async {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut sleeps = Vec::with_capacity(N);
        let before = counting::live_bytes();
        for i in 0..N {
            let mut sleep = Box::pin(tokio::time::sleep(
                far + Duration::from_millis(i as u64 % 10_000),
            ));
            let _ = sleep.as_mut().poll(&mut cx);
            sleeps.push(sleep);
        }
        (counting::live_bytes() - before) as f64 / N as f64
    });
    println!(
        "heap per armed work           {nicework:6.1} B    tokio Box<Sleep>, registered {tokio:6.1} B   (target <= 96 B)"
    );
}

fn idle_wakeups() {
    let sched = Scheduler::new().unwrap();
    let works: Vec<Work> = (0..10_000)
        .map(|_| sched.every(Duration::from_millis(1), |_| Next::Park))
        .collect();
    while works.iter().any(|w| w.stats().runs == 0) || sched.metrics().armed > 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let window = Duration::from_secs(2);
    let before = sched.metrics().worker_wakeups;
    std::thread::sleep(window);
    let per_second = (sched.metrics().worker_wakeups - before) as f64 / window.as_secs_f64();
    println!(
        "worker wakeups/s, 10k parked  {per_second:6.1}      (target 0; Netty HashedWheelTimer ticks 10/s)"
    );
}

/// Works that were armed and then cancelled leave stale timer entries behind: one
/// wakeup at their old slot at most, then nothing.
fn parked_after_cancel_wakeups() {
    let sched = Scheduler::new().unwrap();
    let works: Vec<Work> = (0..10_000).map(|_| sched.work(|_| Next::Park)).collect();
    for work in &works {
        work.schedule(Duration::from_millis(20));
        work.cancel();
    }
    std::thread::sleep(Duration::from_millis(200));
    let window = Duration::from_secs(2);
    let before = sched.metrics().worker_wakeups;
    std::thread::sleep(window);
    let per_second = (sched.metrics().worker_wakeups - before) as f64 / window.as_secs_f64();
    println!(
        "worker wakeups/s, 10k cancelled {per_second:4.1}      (target 0 once their old deadlines passed)"
    );
}

/// What the touch tick costs in worker wakeups: a 16 s timeout touched all the time
/// (its tick is refreshed every 1 s while touches come), then left alone (the refresher
/// parks), against a scheduler with no timeout at all.
fn tick_wakeups() {
    let window = Duration::from_secs(if common::quick() { 2 } else { 4 });
    let none = Scheduler::new().unwrap();
    let sched = Scheduler::new().unwrap();
    std::thread::sleep(Duration::from_millis(100)); // both workers reach their sleep
    let work = sched.timeout(Duration::from_secs(16), |_| Next::Park);
    let none_before = (none.metrics().worker_wakeups, std::time::Instant::now());
    let before = sched.metrics().worker_wakeups;
    let end = std::time::Instant::now() + window;
    while std::time::Instant::now() < end {
        work.touch();
        std::thread::sleep(Duration::from_micros(100));
    }
    let touched = sched.metrics().worker_wakeups - before;
    std::thread::sleep(Duration::from_millis(2100)); // one refresh finds no touch: parked
    let before = sched.metrics().worker_wakeups;
    std::thread::sleep(window);
    let quiet = sched.metrics().worker_wakeups - before;
    let no_timeout = (none.metrics().worker_wakeups - none_before.0) as f64
        / none_before.1.elapsed().as_secs_f64();
    let secs = window.as_secs_f64();
    println!(
        "touch tick wakeups/s: touched {:.2} (tick every 1 s), left alone {:.2}, no timeout {no_timeout:.2}   (target: 0 without touches)",
        touched as f64 / secs,
        quiet as f64 / secs,
    );
}

/// A lone periodic work: worker wakeups per run, with 1 and 2 workers (the kernel's
/// timer programs the next expiry, so its figure is 1).
fn wakeups_per_run() {
    let periods_ms: &[u64] = if common::quick() {
        &[10, 300]
    } else {
        &[10, 50, 300, 1000, 10_000]
    };
    for workers in [1, 2] {
        let mut row = String::new();
        for &period_ms in periods_ms {
            let sched = Scheduler::builder().workers(workers).build().unwrap();
            let period = Duration::from_millis(period_ms);
            let work = sched.every(period, |_| Next::Again);
            while work.stats().runs < 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let (runs, wakeups) = (work.stats().runs, sched.metrics().worker_wakeups);
            // Two or more runs, in 1.5 s at least (25 s for the 10 s period).
            let window = if period >= Duration::from_secs(1) {
                period * 2 + period / 2
            } else {
                (period * 5).max(Duration::from_millis(1500))
            };
            std::thread::sleep(window);
            let runs = work.stats().runs - runs;
            let wakeups = sched.metrics().worker_wakeups - wakeups;
            row += &format!(
                "  {period_ms:>4} ms {:5.2}",
                wakeups as f64 / runs.max(1) as f64
            );
        }
        println!("wakeups per run, {workers} worker(s) {row}   (kernel timer: 1)");
    }
}

/// Works with a leeway share wakeups: `n` `every(1 s)` works created at `min(n, 100)`
/// phases over a second, each table cell counting the workers' wakeups per second (and
/// the runs per second) over 3 s after a second to settle. A lone work is the baseline:
/// one wakeup per run, whatever its leeway. All cells run at once, each on its own
/// scheduler (their wakeups are counted per scheduler).
fn coalesced_wakeups() {
    let counts: &[usize] = if common::quick() {
        &[1, 1000]
    } else {
        &[1, 100, 1000]
    };
    let leeways = [
        None,
        Some(Duration::from_millis(10)),
        Some(Duration::from_millis(100)),
        Some(Duration::from_secs(1)),
    ];
    let period = Duration::from_secs(1);
    let cell = |workers: usize, n: usize, leeway: Option<Duration>| -> (f64, f64) {
        let sched = Scheduler::builder().workers(workers).build().unwrap();
        let runs = std::sync::Arc::new(AtomicU64::new(0));
        let phases = n.min(100);
        let mut works = Vec::with_capacity(n);
        for phase in 0..phases {
            for _ in 0..n / phases {
                let runs = runs.clone();
                let work = sched.every(period, move |_| {
                    runs.fetch_add(1, Ordering::Relaxed);
                    Next::Again
                });
                works.push(match leeway {
                    Some(leeway) => work.leeway(leeway),
                    None => work,
                });
            }
            if phase + 1 < phases {
                std::thread::sleep(period / phases as u32);
            }
        }
        std::thread::sleep(period);
        let (wakeups, ran, start) = (
            sched.metrics().worker_wakeups,
            runs.load(Ordering::Relaxed),
            Instant::now(),
        );
        std::thread::sleep(period * 3);
        let secs = start.elapsed().as_secs_f64();
        (
            (sched.metrics().worker_wakeups - wakeups) as f64 / secs,
            (runs.load(Ordering::Relaxed) - ran) as f64 / secs,
        )
    };
    let mut rows: Vec<(usize, usize)> = counts.iter().map(|&n| (1, n)).collect();
    rows.push((2, 1000));
    let results: Vec<Vec<(f64, f64)>> = std::thread::scope(|s| {
        let handles: Vec<Vec<_>> = rows
            .iter()
            .map(|&(workers, n)| {
                leeways
                    .iter()
                    .map(|&leeway| s.spawn(move || cell(workers, n, leeway)))
                    .collect()
            })
            .collect();
        handles
            .into_iter()
            .map(|row| row.into_iter().map(|h| h.join().unwrap()).collect())
            .collect()
    });
    println!(
        "coalesced wakeups/s (runs/s), every(1 s) works at min(n, 100) phases:   leeway none | 10 ms | 100 ms | 1 s"
    );
    for (&(workers, n), cells) in rows.iter().zip(&results) {
        let mut line = format!("  {n:>5} works, {workers} worker(s)");
        for (wakeups, runs) in cells {
            line += &format!("  {wakeups:6.2} ({runs:6.0})");
        }
        if n == 1 {
            let per_run: Vec<String> = cells
                .iter()
                .map(|(w, r)| format!("{:.2}", w / r.max(f64::MIN_POSITIVE)))
                .collect();
            line += &format!("   wakeups per run {}", per_run.join(" / "));
        }
        println!("{line}");
    }
    println!(
        "  (targets, 1,000 works: <= 11 with a 100 ms leeway, <= 2 with 1 s; without: one per phase)"
    );
}

/// A hosted driver's two calls that a host makes on every loop turn, against the one
/// `Instant::now()` a host reads anyway.
fn hosted_driver() {
    let (sched, driver) = Scheduler::builder().build_hosted().unwrap();
    let _far = sched.every(Duration::from_secs(3600), |_| Next::Again);
    let iters = 10_000_000;
    let now = per_op(iters, |_| {
        black_box(std::time::Instant::now());
    });
    let next = per_op(iters, |_| {
        black_box(black_box(&driver).next_deadline());
    });
    let run_due = per_op(iters, |_| {
        black_box(black_box(&driver).run_due());
    });
    let (_idle_sched, idle_driver) = Scheduler::builder().build_hosted().unwrap();
    let run_due_unarmed = per_op(iters, |_| {
        black_box(black_box(&idle_driver).run_due());
    });
    println!(
        "hosted next_deadline()        {next:6.2} ns   run_due() with nothing due {run_due:6.2} ns (nothing armed {run_due_unarmed:6.2} ns)   Instant::now() {now:6.2} ns   ratios {:.2}x / {:.2}x   (targets <= 20 ns / <= 50 ns)",
        next / now,
        run_due.max(run_due_unarmed) / now,
    );
}

/// The executor stall when an async task drops a work whose 100 ms callback is running on
/// the worker: `drop(work)` blocks the executor's thread for the rest of the run,
/// `drop_async().await` does not. A current-thread runtime's heartbeat task (1 ms ticks)
/// measures the longest gap.
fn drop_stall() {
    let stall = |use_async: bool| -> f64 {
        let sched = Scheduler::new().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let (started_tx, started) = std::sync::mpsc::channel();
            let work = sched.work(move |_| {
                let _ = started_tx.send(());
                std::thread::sleep(Duration::from_millis(100));
                Next::Park
            });
            work.schedule(Duration::ZERO);
            started.recv().unwrap();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let heartbeat = {
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut longest = Duration::ZERO;
                    let mut last = std::time::Instant::now();
                    while !stop.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        longest = longest.max(last.elapsed());
                        last = std::time::Instant::now();
                    }
                    longest
                })
            };
            tokio::time::sleep(Duration::from_millis(5)).await;
            if use_async {
                work.drop_async().await;
            } else {
                drop(work);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            stop.store(true, Ordering::SeqCst);
            heartbeat.await.unwrap().as_secs_f64() * 1000.0
        })
    };
    let blocking = common::median((0..common::rounds()).map(|_| stall(false)).collect());
    let non_blocking = common::median((0..common::rounds()).map(|_| stall(true)).collect());
    println!(
        "executor stall, dropping a running 100 ms work: drop() {blocking:6.1} ms   drop_async().await {non_blocking:6.1} ms   (a 1 ms heartbeat's longest gap; target: no stall beyond the tick)"
    );
}

/// `Scheduler::works` over 100k live works (half of them armed), per work, against the
/// exporter's alternative: a list of its own handles, read through each handle.
fn listing() {
    const N: usize = 100_000;
    let sched = Scheduler::new().unwrap();
    let works: Vec<Work> = (0..N)
        .map(|i| {
            let work = sched.work(|_| Next::Park).named(format!("work-{}", i % 64));
            if i % 2 == 0 {
                work.schedule(Duration::from_secs(3600));
            }
            work
        })
        .collect();
    let per_work = |f: &mut dyn FnMut() -> usize| {
        common::median(
            (0..common::rounds())
                .map(|_| {
                    let start = Instant::now();
                    let seen = black_box(f());
                    assert_eq!(seen, N);
                    start.elapsed().as_nanos() as f64 / N as f64
                })
                .collect(),
        )
    };
    let listed = per_work(&mut || {
        let mut seen = 0;
        sched.works(|w| {
            black_box((w.name.len(), w.stats.runs, w.deadline, w.running));
            seen += 1;
        });
        seen
    });
    let own_list = per_work(&mut || {
        let mut seen = 0;
        for w in &works {
            black_box((w.name().len(), w.stats().runs, w.deadline(), w.is_running()));
            seen += 1;
        }
        seen
    });
    println!(
        "works(), 100k live works       {listed:6.1} ns per work   the exporter's own Vec<Work> read by handle {own_list:6.1} ns ({:.2}x)   (time in proportion to the works)",
        listed / own_list
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && a != "quick")
        .collect();
    let benches: [(&str, fn()); 13] = [
        ("touch", touch_armed),
        ("timeout", touch_timeout),
        ("rearm", rearm_pair),
        ("heap", heap_per_parked_work),
        ("armed-heap", heap_per_armed_work),
        ("wakeups", idle_wakeups),
        ("parked-wakeups", parked_after_cancel_wakeups),
        ("per-run", wakeups_per_run),
        ("coalesced", coalesced_wakeups),
        ("tick", tick_wakeups),
        ("hosted", hosted_driver),
        ("stall", drop_stall),
        ("listing", listing),
    ];
    for (name, bench) in benches {
        if only.is_empty() || only.iter().any(|o| name.contains(o.as_str())) {
            bench();
        }
    }
}

//! A connection pool's idle reaper: 10,000 connections, each owning an idle-timeout work
//! that closes it once it has not been checked in for `IDLE`, while 4 threads check
//! connections out and in. It shows that a checkin only postpones the reaper (no lock, no
//! timer operation), that no connection is ever reaped within `IDLE` of its last checkin,
//! that a reopened connection's next checkin re-arms its parked reaper, and what a
//! checkin's timer update costs against a plain work's `reschedule` and tokio's
//! `Sleep::reset`.
//!
//! An idle timeout (`sched.timeout`) runs because *nothing* happened: activity postpones
//! it, and a busy connection's reaper never runs. A periodic work (`sched.every`) runs
//! because *something* happened: activity wakes it, and it re-arms while there is work to
//! do.
//!
//! `cargo run --release --example pool_reaper`

use std::future::Future;
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

const CONNECTIONS: usize = 10_000;
const THREADS: usize = 4;
/// Short, so that reaping shows within seconds; touches of so short an idle read the full
/// clock (the coarse clock serves idles of 100 of its margins and more, 3.2 s here).
const IDLE: Duration = Duration::from_millis(800);
/// The idle of the cost comparison: a pool's usual order of magnitude, where a checkin's
/// `touch()` reads the coarse clock.
const COST_IDLE: Duration = Duration::from_secs(30);
const TRAFFIC: Duration = Duration::from_secs(4);
/// Traffic goes to a window of a quarter of the pool that sweeps it once per `SWEEP`: a
/// connection is busy for 0.5 s, then left alone for 1.5 s, long enough to be reaped
/// (after `IDLE`) and then reopened by the window's next pass, 0.7 s after its reap.
const SWEEP: Duration = Duration::from_secs(2);
const WINDOW: usize = CONNECTIONS / 4;
const ROUNDS: usize = 5;

const OPEN: u8 = 0;
const CHECKED_OUT: u8 = 1;
const CLOSED: u8 = 2;

struct Conn {
    state: AtomicU8,
    /// Nanoseconds since `Pool::start` of the latest checkin, read before its `touch()`
    /// so that it never postdates the touch the reaper is bound by.
    last_checkin_ns: AtomicU64,
    reaper: Work,
}

#[derive(Default)]
struct Stats {
    reaps: AtomicU64,
    reopens: AtomicU64,
    early_runs: AtomicU64,
    earliest_ns: AtomicU64,
    lateness_sum_ns: AtomicU64,
    lateness_max_ns: AtomicU64,
    /// Reaper runs that found the connection checked out: the checkin to come re-arms it.
    found_checked_out: AtomicU64,
    /// Reaper runs on a connection it had already closed: nothing but a checkin should
    /// have re-armed a parked reaper, and a checkin reopens first.
    found_closed: AtomicU64,
}

struct Pool {
    conns: Vec<Arc<Conn>>,
    stats: Arc<Stats>,
    start: Instant,
}

impl Pool {
    fn new(sched: &Scheduler) -> Pool {
        let stats = Arc::new(Stats {
            earliest_ns: AtomicU64::new(u64::MAX),
            ..Stats::default()
        });
        let start = Instant::now();
        let conns = (0..CONNECTIONS)
            .map(|_| {
                let stats = stats.clone();
                // The connection owns its reaper and the reaper reaches it through the
                // Weak: no cycle, and dropping the connection cancels its reaper.
                Arc::new_cyclic(|me: &Weak<Conn>| Conn {
                    state: AtomicU8::new(OPEN),
                    last_checkin_ns: AtomicU64::new(0),
                    reaper: sched.timeout_for(me, IDLE, move |conn: &Conn, cx| {
                        reap(conn, cx.scheduler(), &stats, start)
                    }),
                })
            })
            .collect();
        Pool {
            conns,
            stats,
            start,
        }
    }

    /// The connection at `index`, unless another thread has it.
    fn checkout(&self, index: usize) -> Option<Lease<'_>> {
        let conn = &self.conns[index];
        let was = conn.state.load(Ordering::Relaxed);
        if was == CHECKED_OUT {
            return None;
        }
        conn.state
            .compare_exchange(was, CHECKED_OUT, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        if was == CLOSED {
            // A real pool would connect again here; the reaper stays parked until the
            // checkin's touch() arms it.
            self.stats.reopens.fetch_add(1, Ordering::Relaxed);
        }
        Some(Lease { conn, pool: self })
    }

    fn open(&self) -> usize {
        self.conns
            .iter()
            .filter(|conn| conn.state.load(Ordering::Relaxed) != CLOSED)
            .count()
    }
}

/// A checked-out connection; dropping it checks it in.
struct Lease<'a> {
    conn: &'a Conn,
    pool: &'a Pool,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let now = self.pool.start.elapsed().as_nanos() as u64;
        self.conn.reaper.touch();
        self.conn.last_checkin_ns.store(now, Ordering::Relaxed);
        // Release: a reaper that finds the connection open sees the stamp above.
        self.conn.state.store(OPEN, Ordering::Release);
    }
}

/// The reaper's callback: close the connection and park until a checkin re-arms it.
fn reap(conn: &Conn, sched: &Scheduler, stats: &Stats, start: Instant) -> Next {
    // The stamp is read before the claim: once the connection is closed, a checkout may
    // reopen it and check it in again during this run, and that checkin's stamp is not
    // one this run was bound by. The Acquire pairs with the checkin's Release.
    let state = conn.state.load(Ordering::Acquire);
    let last_checkin_ns = conn.last_checkin_ns.load(Ordering::Relaxed);
    // A pool must not close a connection in use, so the reaper claims it first.
    let claimed = state == OPEN
        && conn
            .state
            .compare_exchange(OPEN, CLOSED, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
    if !claimed {
        let counter = match conn.state.load(Ordering::Relaxed) {
            CLOSED => &stats.found_closed,
            _ => &stats.found_checked_out,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        return Next::Park;
    }
    // The clock is read last, so the stamp above predates it; a checkin finishing only
    // now overlapped this run, where a touch is allowed.
    let now_ns = sched.now().saturating_duration_since(start).as_nanos() as u64;
    let due_ns = last_checkin_ns + IDLE.as_nanos() as u64;
    if now_ns < due_ns {
        stats.early_runs.fetch_add(1, Ordering::Relaxed);
        stats
            .earliest_ns
            .fetch_min(now_ns.wrapping_sub(due_ns), Ordering::Relaxed);
    } else {
        stats
            .lateness_sum_ns
            .fetch_add(now_ns - due_ns, Ordering::Relaxed);
        stats
            .lateness_max_ns
            .fetch_max(now_ns - due_ns, Ordering::Relaxed);
    }
    stats.reaps.fetch_add(1, Ordering::Relaxed);
    Next::Park
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// One thread's traffic: checkouts in the sweeping window, in batches with a short pause
/// between them (a server waiting for requests), until `stop`. Returns its checkins.
fn traffic(pool: &Pool, seed: u64, stop: &AtomicBool) -> u64 {
    let mut rng = seed;
    let mut checkins = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let elapsed = pool.start.elapsed().as_nanos();
        let window_start = (elapsed * CONNECTIONS as u128 / SWEEP.as_nanos()) as usize;
        for _ in 0..1_000 {
            let index = (window_start + xorshift(&mut rng) as usize % WINDOW) % CONNECTIONS;
            if let Some(lease) = pool.checkout(index) {
                black_box(&lease.conn);
                drop(lease);
                checkins += 1;
            }
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    checkins
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

/// ns per call of `f` over one round of `iters` calls.
fn ns_per_op(iters: u64, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

/// A checkin's timer update three ways, on this thread, one round of each in turn so that
/// a noisy moment hits all three: the median ns of each.
fn checkin_costs(sched: &Scheduler) -> (f64, f64, f64) {
    const IDLE: Duration = COST_IDLE;
    let timeout = sched.timeout(IDLE, |_| Next::Park);
    let plain = sched.work(|_| Next::Park);
    plain.schedule(IDLE);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let mut sleep = Box::pin(tokio::time::sleep(IDLE));
        // Polled once, the Sleep is registered with the driver, as a pool's would be.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let _ = sleep.as_mut().poll(&mut cx);
        let (mut touch, mut reschedule, mut reset) = (vec![], vec![], vec![]);
        for _ in 0..ROUNDS {
            touch.push(ns_per_op(10_000_000, || black_box(&timeout).touch()));
            reschedule.push(ns_per_op(1_000_000, || {
                black_box(black_box(&plain).reschedule(IDLE));
            }));
            reset.push(ns_per_op(1_000_000, || {
                sleep
                    .as_mut()
                    .reset(tokio::time::Instant::now() + black_box(IDLE));
            }));
        }
        (median(touch), median(reschedule), median(reset))
    })
}

fn main() -> Result<ExitCode, nicework::Error> {
    let sched = Scheduler::new()?;
    let pool = Pool::new(&sched);
    println!(
        "pool reaper: {CONNECTIONS} connections, {THREADS} threads, idle timeout {IDLE:?}, \
         {TRAFFIC:?} of traffic on a window of {WINDOW} connections that sweeps the pool every {SWEEP:?}"
    );

    let wakeups = sched.metrics().worker_wakeups;
    let stop = AtomicBool::new(false);
    let traffic_start = Instant::now();
    let checkins: u64 = std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                let (pool, stop) = (&pool, &stop);
                s.spawn(move || traffic(pool, 0x9e37_79b9_7f4a_7c15 ^ (t + 1), stop))
            })
            .collect();
        std::thread::sleep(TRAFFIC);
        stop.store(true, Ordering::Relaxed);
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    let duration = traffic_start.elapsed();
    let during = sched.metrics();
    let wakeups_per_s = (during.worker_wakeups - wakeups) as f64 / duration.as_secs_f64();

    // No more traffic: every connection must be reaped once IDLE has passed.
    let drain_start = Instant::now();
    while pool.open() > 0 && drain_start.elapsed() < IDLE + Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let drained_in = drain_start.elapsed();
    let missed = pool.open();
    let settled = sched.metrics();
    std::thread::sleep(Duration::from_millis(500));
    let idle_wakeups = sched.metrics().worker_wakeups - settled.worker_wakeups;

    let stats = &pool.stats;
    let reaps = stats.reaps.load(Ordering::Relaxed);
    let early_runs = stats.early_runs.load(Ordering::Relaxed);
    let on_time = reaps - early_runs;
    println!(
        "duration:        {duration:.2?}\n\
         checkins total:  {checkins} ({:.1} M/s)\n\
         reopens:         {}\n\
         reaps:           {reaps}, late after last checkin + idle by {:.2?} on average, {:.2?} at most\n\
         reaper runs that left the connection alone: {} checked out, {} already closed\n\
         early runs:      {early_runs}",
        checkins as f64 / duration.as_secs_f64() / 1e6,
        stats.reopens.load(Ordering::Relaxed),
        Duration::from_nanos(stats.lateness_sum_ns.load(Ordering::Relaxed) / on_time.max(1)),
        Duration::from_nanos(stats.lateness_max_ns.load(Ordering::Relaxed)),
        stats.found_checked_out.load(Ordering::Relaxed),
        stats.found_closed.load(Ordering::Relaxed),
    );
    if early_runs > 0 {
        println!(
            "                 the earliest {:.2?} before last checkin + idle",
            Duration::from_nanos(stats.earliest_ns.load(Ordering::Relaxed).wrapping_neg())
        );
    }
    println!(
        "worker wakeups:  {wakeups_per_s:.0} per second during traffic\n\
         timer at the end of traffic: timer_entries {}, armed {}\n\
         traffic stopped: {} connections reaped within {drained_in:.2?}, {missed} left open; \
         then timer_entries {}, armed {}, worker wakeups over the next 0.5 s: {idle_wakeups}",
        during.timer_entries,
        during.armed,
        CONNECTIONS - missed,
        settled.timer_entries,
        settled.armed,
    );

    let (touch, reschedule, reset) = checkin_costs(&sched);
    println!(
        "\ncost of a checkin's timer update with a {COST_IDLE:?} idle, one thread, median of \
         {ROUNDS} rounds (a noisy shared machine: only the ratios mean anything)\n\
         touch() on an armed timeout work        {touch:6.2} ns   1.00x\n\
         reschedule(IDLE) on a plain work        {reschedule:6.2} ns   {:.2}x\n\
         tokio Sleep::reset(now + IDLE)          {reset:6.2} ns   {:.2}x",
        reschedule / touch,
        reset / touch,
    );

    if early_runs > 0 || missed > 0 {
        eprintln!("FAILED: {early_runs} early runs, {missed} connections never reaped");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

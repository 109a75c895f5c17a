//! A connection pool's maintenance the way r2d2 does it, on nicework: one reaper work for
//! the whole pool that parks while no connection is idle and otherwise sleeps until the
//! earliest expiry (`schedule_within` on checkin, `Next::At` from the reaper), and
//! connection attempts as fire-and-forget works (`detach`) that retry with back-off on a
//! scheduler of their own (more workers, `Priority::Normal`), so that a slow connect never
//! holds up the nice-19 maintenance.
//!
//! It prints the reaps and how late they came after their connection's expiry, the
//! reaper's runs (it parks while nothing is idle), the connects and retries, and checks
//! that every detached attempt was freed once it finished.
//!
//! `cargo run --release --example pool_maintenance`

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use nicework::{Next, Priority, Scheduler, Work};

const IDLE: Duration = Duration::from_millis(300);
const MAX_SIZE: u64 = 64;
const THREADS: u64 = 4;
/// Traffic comes in bursts with quiet spells longer than `IDLE`, so connections are
/// reaped in the quiet and reconnected in the next burst.
const BURST: Duration = Duration::from_millis(400);
const QUIET: Duration = Duration::from_millis(500);
const BURSTS: u32 = 4;
/// Every third connect attempt fails and is retried after a back-off.
const FAIL_EVERY: u64 = 3;

#[derive(Default)]
struct Counters {
    reaps: AtomicU64,
    lateness_max_ns: AtomicU64,
    lateness_sum_ns: AtomicU64,
    launched: AtomicU64,
    attempts: AtomicU64,
    retries: AtomicU64,
    connects: AtomicU64,
    /// Detached attempts whose closure was freed.
    freed: AtomicU64,
}

struct Pool {
    /// Idle connections, by the time they were checked in.
    idle: Mutex<Vec<Instant>>,
    /// Open connections (idle or checked out) plus attempts in flight.
    size: AtomicU64,
    reaper: Work,
    counters: Counters,
}

impl Pool {
    fn new(maintenance: &Scheduler) -> Arc<Pool> {
        // The pool owns its reaper; the reaper reaches the pool through new_cyclic's Weak.
        Arc::new_cyclic(|me: &Weak<Pool>| Pool {
            idle: Mutex::new(Vec::new()),
            size: AtomicU64::new(0),
            reaper: maintenance
                .work_for(me, |pool: &Pool, cx| pool.reap(cx.scheduler().now()))
                .named("pool reaper"),
            counters: Counters::default(),
        })
    }

    /// Closes the connections idle for `IDLE`, then sleeps until the next one will be, or
    /// parks while none is idle (a checkin's `schedule_within` wakes it).
    fn reap(&self, now: Instant) -> Next {
        let mut idle = self.idle.lock().unwrap();
        let before = idle.len();
        idle.retain(|since| {
            let expires = *since + IDLE;
            if now < expires {
                return true;
            }
            let late = (now - expires).as_nanos() as u64;
            self.counters
                .lateness_max_ns
                .fetch_max(late, Ordering::Relaxed);
            self.counters
                .lateness_sum_ns
                .fetch_add(late, Ordering::Relaxed);
            false
        });
        let reaped = (before - idle.len()) as u64;
        self.size.fetch_sub(reaped, Ordering::Relaxed);
        self.counters.reaps.fetch_add(reaped, Ordering::Relaxed);
        match idle.iter().min() {
            Some(oldest) => Next::At(*oldest + IDLE),
            None => Next::Park,
        }
    }

    /// An idle connection, or `false` (and a connect in the background if there is room).
    fn checkout(self: &Arc<Pool>, connects: &Scheduler, clock: &Scheduler) -> bool {
        if self.idle.lock().unwrap().pop().is_some() {
            return true;
        }
        if self.size.fetch_add(1, Ordering::Relaxed) < MAX_SIZE {
            self.spawn_connect(connects, clock.clone());
        } else {
            self.size.fetch_sub(1, Ordering::Relaxed);
        }
        false
    }

    fn checkin(&self, clock: &Scheduler) {
        self.idle.lock().unwrap().push(clock.now());
        // Run no later than this connection's expiry; a sooner run stays as it is.
        self.reaper.schedule_within(IDLE);
    }

    /// A connection attempt nobody owns: it retries with back-off until it connects,
    /// then returns `Stop` and is freed.
    fn spawn_connect(self: &Arc<Pool>, connects: &Scheduler, clock: Scheduler) {
        let freed = Freed(self.clone());
        let mut backoff = Duration::from_millis(5);
        let attempt = connects.work(move |_| {
            let pool = &freed.0;
            let n = pool.counters.attempts.fetch_add(1, Ordering::Relaxed) + 1;
            // A real pool blocks in connect() here: this scheduler has workers to spare
            // for that, at normal priority, away from the maintenance works.
            std::thread::sleep(Duration::from_millis(2));
            if n % FAIL_EVERY == 0 {
                pool.counters.retries.fetch_add(1, Ordering::Relaxed);
                backoff *= 2;
                return Next::After(backoff);
            }
            pool.counters.connects.fetch_add(1, Ordering::Relaxed);
            pool.checkin(&clock);
            Next::Stop
        });
        self.counters.launched.fetch_add(1, Ordering::Relaxed);
        attempt.schedule(Duration::ZERO);
        attempt.detach();
    }
}

/// Counts the drop of a detached attempt's closure.
struct Freed(Arc<Pool>);

impl Drop for Freed {
    fn drop(&mut self) {
        self.0.counters.freed.fetch_add(1, Ordering::Relaxed);
    }
}

fn main() -> Result<ExitCode, nicework::Error> {
    let maintenance = Scheduler::builder().name("maint").build()?;
    let connects = Scheduler::builder()
        .name("connect")
        .workers(2)
        .priority(Priority::Normal)
        .build()?;
    let pool = Pool::new(&maintenance);
    println!(
        "pool maintenance: up to {MAX_SIZE} connections, {THREADS} threads, idle timeout {IDLE:?}, \
         {BURSTS} bursts of {BURST:?} with {QUIET:?} quiet in between"
    );

    let wakeups = maintenance.metrics().worker_wakeups;
    let start = Instant::now();
    let checkouts = AtomicU64::new(0);
    for _ in 0..BURSTS {
        let busy = AtomicBool::new(true);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    while busy.load(Ordering::Relaxed) {
                        if pool.checkout(&connects, &maintenance) {
                            checkouts.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_micros(200)); // a query
                            pool.checkin(&maintenance);
                        } else {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                });
            }
            std::thread::sleep(BURST);
            busy.store(false, Ordering::Relaxed);
        });
        std::thread::sleep(QUIET);
    }
    let elapsed = start.elapsed();
    let wakeups_per_s =
        (maintenance.metrics().worker_wakeups - wakeups) as f64 / elapsed.as_secs_f64();

    // Every attempt ends (connected) and is freed; every connection is reaped.
    let deadline = Instant::now() + Duration::from_secs(5);
    let c = &pool.counters;
    while (c.freed.load(Ordering::Relaxed) < c.launched.load(Ordering::Relaxed)
        || pool.size.load(Ordering::Relaxed) > 0)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let reaps = c.reaps.load(Ordering::Relaxed);
    let (launched, freed) = (
        c.launched.load(Ordering::Relaxed),
        c.freed.load(Ordering::Relaxed),
    );
    let left = pool.size.load(Ordering::Relaxed);
    println!(
        "checkouts:       {}\n\
         connects:        {} after {} attempts ({} retried with back-off), {launched} detached works, {freed} freed\n\
         reaps:           {reaps}, late after their expiry by {:.2?} on average, {:.2?} at most\n\
         reaper runs:     {} (it parks while no connection is idle)\n\
         maintenance worker wakeups: {wakeups_per_s:.0} per second\n\
         open at the end: {left}, reaper pending: {}",
        checkouts.load(Ordering::Relaxed),
        c.connects.load(Ordering::Relaxed),
        c.attempts.load(Ordering::Relaxed),
        c.retries.load(Ordering::Relaxed),
        Duration::from_nanos(c.lateness_sum_ns.load(Ordering::Relaxed) / reaps.max(1)),
        Duration::from_nanos(c.lateness_max_ns.load(Ordering::Relaxed)),
        pool.reaper.stats().runs,
        pool.reaper.is_pending(),
    );
    if freed != launched || left > 0 {
        eprintln!("FAILED: {freed} of {launched} attempts freed, {left} connections left open");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

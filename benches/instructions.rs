//! Instruction counts of the hot paths, for `valgrind --tool=callgrind`, which counts
//! the same on a busy machine as on a quiet one (timings here are too noisy to compare
//! two builds).
//!
//! Each run makes a real scheduler and the works below, then repeats one operation
//! `count` times; the difference between a run with `count` and one with 0, divided by
//! `count`, is that operation's cost in instructions (setup and thread start cancel out):
//!
//! ```text
//! cargo bench --bench instructions --no-run
//! bin=$(ls -t target/release/deps/instructions-* | grep -v '\.d$' | head -1)
//! for op in pair pair_varying touch timeout_touch enter tls_get with with_alternating \
//!     tls_counter take_put enter_per_cpu with_per_cpu; do
//!   for n in 0 100000; do
//!     valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" $op $n 2>&1 |
//!       grep -o 'Collected : [0-9]*'
//!   done
//! done
//! ```
//!
//! - `pair`: `reschedule(1 h)` + `cancel()` on one of 1,024 `work()`s with live entries
//!   (the lock-free pair).
//! - `pair_varying`: the same pair with a delay that changes at every call (an hour out,
//!   spread over a second), which also changes each `work()`'s period.
//! - `touch`: `touch()` on an armed periodic work (one load).
//! - `timeout_touch`: `touch()` on an armed timeout work.
//! - `enter`: `IdSpace::enter()` + drop on an id the thread holds.
//! - `tls_get`: `thread_local::ThreadLocal::get_or` on a value the thread has, the peer
//!   of `enter`, in the same loop.
//! - `with`: `PerCid::with` bumping a `PerCid<AtomicU64>` counter through `get_mut` (the
//!   thread holds its id and its slot has a value).
//! - `with_alternating`: the same bump on three `PerCid`s of one space in turn, so that
//!   every call misses the thread's two-entry slot cache.
//! - `tls_counter`: the peer of `with`: `ThreadLocal<AtomicU64>::get_or` plus a relaxed
//!   load and a relaxed store of the value + 1.
//! - `take_put`: `PerCid::take` then `PerCid::put` of the value (a cache pool's get and
//!   put), on a `PerCid<Box<[u64; 8]>>` whose slot holds a value (a pool of boxed
//!   caches: the two calls move one word).
//! - `enter_per_cpu`, `with_per_cpu`: `enter` and `with` on a space in per-CPU mode (it
//!   counts 1 CPU and saw 2 threads), where each outermost guard borrows its CPU's id with
//!   a compare-and-swap and gives it back at its drop.
//!
//! Run as a plain bench (`cargo bench --bench instructions`) it does each once, as a
//! smoke test.

use std::hint::black_box;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use nicework::{IdSpace, Next, PerCid, Scheduler};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let ops: Vec<&str> = match args.first() {
        Some(op) => vec![op.as_str()],
        None => vec![
            "pair",
            "pair_varying",
            "touch",
            "timeout_touch",
            "enter",
            "tls_get",
            "with",
            "with_alternating",
            "tls_counter",
            "take_put",
            "enter_per_cpu",
            "with_per_cpu",
        ],
    };
    let count: u64 = args.get(1).map_or(1, |n| n.parse().expect("a count"));
    let sched = Scheduler::new().expect("a scheduler");
    let far = Duration::from_secs(3600);
    let delays: Vec<Duration> = (0..4093u64)
        .map(|i| far + Duration::from_nanos(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 34))
        .collect();
    let hot: Vec<_> = (0..1024).map(|_| sched.work(|_| Next::Park)).collect();
    for work in &hot {
        work.reschedule(far);
        work.cancel();
    }
    let periodic = sched.every(far, |_| Next::Park);
    let timeout = sched.timeout(far, |_| Next::Park);
    let ids = IdSpace::new(&sched);
    drop(ids.enter());
    let tls: thread_local::ThreadLocal<u64> = thread_local::ThreadLocal::new();
    tls.get_or(|| 0);
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    counters.with(|n| *n.get_mut() += 1);
    let second: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    let third: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    second.with(|n| *n.get_mut() += 1);
    third.with(|n| *n.get_mut() += 1);
    let tls_counters: thread_local::ThreadLocal<AtomicU64> = thread_local::ThreadLocal::new();
    tls_counters.get_or(|| AtomicU64::new(0));
    let pool: PerCid<Box<[u64; 8]>> = PerCid::new(&ids, || Box::new([0; 8]));
    pool.put(Box::new([0; 8])).expect("an empty slot");
    let (_per_cpu_sched, per_cpu, per_cpu_counters, _other_thread) = per_cpu_space();
    for op in ops {
        match op {
            "pair" => {
                for i in 0..count {
                    let work = &hot[(i % 1024) as usize];
                    black_box(work.reschedule(far));
                    black_box(work.cancel());
                }
            }
            "pair_varying" => {
                for i in 0..count {
                    let work = &hot[(i % 1024) as usize];
                    black_box(work.reschedule(delays[(i % 4093) as usize]));
                    black_box(work.cancel());
                }
            }
            "touch" => (0..count).for_each(|_| black_box(&periodic).touch()),
            "timeout_touch" => (0..count).for_each(|_| black_box(&timeout).touch()),
            "enter" => (0..count).for_each(|_| {
                black_box(ids.enter().get());
            }),
            "tls_get" => (0..count).for_each(|_| {
                black_box(black_box(&tls).get_or(|| 0));
            }),
            "with" => (0..count).for_each(|_| {
                black_box(&counters).with(|n| *n.get_mut() += 1);
            }),
            "with_alternating" => (0..count).for_each(|i| {
                let counters = [&counters, &second, &third][(i % 3) as usize];
                black_box(counters).with(|n| *n.get_mut() += 1);
            }),
            "tls_counter" => (0..count).for_each(|_| {
                let n = black_box(&tls_counters).get_or(|| AtomicU64::new(0));
                n.store(n.load(Relaxed) + 1, Relaxed);
            }),
            "enter_per_cpu" => (0..count).for_each(|_| {
                black_box(per_cpu.enter().get());
            }),
            "with_per_cpu" => (0..count).for_each(|_| {
                black_box(&per_cpu_counters).with(|n| *n.get_mut() += 1);
            }),
            "take_put" => (0..count).for_each(|_| {
                let pool = black_box(&pool);
                let value = black_box(pool.take().expect("the slot's value"));
                black_box(pool.put(value).is_ok());
            }),
            other => panic!(
                "unknown operation {other:?}: pair, pair_varying, touch, timeout_touch, enter, \
                 tls_get, with, with_alternating, tls_counter, take_put, enter_per_cpu, \
                 with_per_cpu"
            ),
        }
    }
}

/// A space in per-CPU mode: it counts 1 CPU, and a scan saw this thread and another one
/// (kept alive, parked, until the returned sender drops) enter. Its scheduler is manual,
/// so no scan runs during the count.
fn per_cpu_space() -> (
    Scheduler,
    std::sync::Arc<IdSpace>,
    PerCid<AtomicU64>,
    std::sync::mpsc::Sender<()>,
) {
    let sched = Scheduler::manual();
    let ids = std::sync::Arc::new(IdSpace::new(&sched));
    nicework::hooks::count_cpus_as(&ids, Some(1));
    let (entered, wait_entered) = std::sync::mpsc::channel();
    let (done, wait_done) = std::sync::mpsc::channel::<()>();
    let other = ids.clone();
    std::thread::spawn(move || {
        drop(other.enter());
        entered.send(()).unwrap();
        let _ = wait_done.recv();
    });
    wait_entered.recv().unwrap();
    drop(ids.enter());
    sched.advance(Duration::from_millis(100));
    assert!(nicework::hooks::id_mode(&ids).0, "per-CPU mode");
    let counters: PerCid<AtomicU64> = PerCid::new(&ids, || AtomicU64::new(0));
    counters.with(|n| *n.get_mut() += 1);
    (sched, ids, counters, done)
}

//! How late an idle timeout reaps, and how many worker wakeups its touches cost, for
//! idles from 10 ms to 60 s (`cargo bench --bench timeouts`; `-- quick` stops at 10 s).
//!
//! For each idle: 16 timeout works on a real scheduler; a thread touches each one every
//! idle / 8 for four idles (the "touched" phase), then touches them one last time, spread
//! over idle / 16, and stops; each work is reaped once its idle has passed. Printed per
//! idle:
//!
//! - the lateness of the reaps after the last touch + idle (median and max of the 16);
//! - worker wakeups per second while touched, and from the last touch to the last reap
//!   (left alone), from `Scheduler::metrics().worker_wakeups`.
//!
//! Nothing is a ratio here: the figures are the rule the docs of `timeout` and `touch`
//! state, measured. Each idle gets a scheduler of its own, so the touch tick's refresher
//! runs at that idle's interval (1/16 of it, from 16 slacks = 16 ms up).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

const WORKS: usize = 16;

struct Row {
    idle: Duration,
    late_p50: Duration,
    late_max: Duration,
    touched_per_s: f64,
    alone_per_s: f64,
}

fn measure(idle: Duration) -> Row {
    let sched = Scheduler::new().unwrap();
    let reaped: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; WORKS]));
    let works: Vec<Work> = (0..WORKS)
        .map(|i| {
            let reaped = reaped.clone();
            sched.timeout(idle, move |_| {
                reaped.lock().unwrap()[i].get_or_insert_with(Instant::now);
                Next::Park
            })
        })
        .collect();
    let wakeups = || sched.metrics().worker_wakeups;
    let start = Instant::now();
    let woken_at_start = wakeups();
    let mut last_touch = vec![Instant::now(); WORKS];
    while start.elapsed() < idle * 4 {
        for (i, work) in works.iter().enumerate() {
            last_touch[i] = Instant::now();
            work.touch();
        }
        std::thread::sleep(idle / 8);
    }
    // The last touches spread over one sixteenth of the idle, so the reaps sample every
    // phase of the touch tick's refresh (or of a short idle's rounding).
    for (i, work) in works.iter().enumerate() {
        last_touch[i] = Instant::now();
        work.touch();
        std::thread::sleep(idle / 16 / WORKS as u32);
    }
    let touched_for = start.elapsed();
    let woken_touched = wakeups() - woken_at_start;
    let alone_start = Instant::now();
    while reaped.lock().unwrap().iter().any(Option::is_none) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let alone_for = alone_start.elapsed();
    let woken_alone = wakeups() - woken_at_start - woken_touched;
    let mut late: Vec<Duration> = reaped
        .lock()
        .unwrap()
        .iter()
        .zip(&last_touch)
        .map(|(reap, touch)| reap.unwrap().saturating_duration_since(*touch + idle))
        .collect();
    late.sort();
    Row {
        idle,
        late_p50: late[WORKS / 2],
        late_max: late[WORKS - 1],
        touched_per_s: woken_touched as f64 / touched_for.as_secs_f64(),
        alone_per_s: woken_alone as f64 / alone_for.as_secs_f64(),
    }
}

fn main() {
    let quick = std::env::args().any(|arg| arg == "quick");
    let mut idles = vec![10, 15, 16, 100, 999, 1_000, 3_300, 10_000];
    if !quick {
        idles.push(60_000);
    }
    println!(
        "| idle | reaped late, p50 / max | wakeups/s while touched | from the last touch to the last reap |"
    );
    println!("|---|---|---|---|");
    for ms in idles {
        let row = measure(Duration::from_millis(ms));
        println!(
            "| {:?} | {:.1} / {:.1} ms | {:.1} | {:.1} |",
            row.idle,
            row.late_p50.as_secs_f64() * 1e3,
            row.late_max.as_secs_f64() * 1e3,
            row.touched_per_s,
            row.alone_per_s,
        );
    }
}

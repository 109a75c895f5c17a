//! Idle timeouts: the rules on the manual clock, their edges, real threads, and bad input.
//!
//! One test binary, a module per behaviour.
//! - `bad_input`: Bad input and odd timing.
//! - `edges`: Edge cases of timeout works on the manual clock.
//! - `leeway_changes`: A timeout's leeway changed after creation, against runs, touches
//!   and the touch tick's registry.
//! - `manual`: Idle timeouts (`Scheduler::timeout`, `timeout_for`) on the manual clock.
//! - `quiet_time`: Maintenance that runs while the object is quiet: a timeout every
//!   write touches, with a leeway that makes its touches read the touch tick.
//! - `threaded`: Idle timeouts on real threads and the real clock.
//! - `touch_tick`: The touch tick that long timeouts' touches read, under attack.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod edges;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The start of each run of a [`recording_timeout`].
type Runs = Arc<Mutex<Vec<Instant>>>;

/// A timeout on `sched` whose callback records when each run started and parks.
fn recording_timeout(sched: &nicework::Scheduler, idle: Duration) -> (Arc<nicework::Work>, Runs) {
    let runs: Runs = Arc::default();
    let record = runs.clone();
    let work = sched.timeout(idle, move |_| {
        record.lock().unwrap().push(Instant::now());
        nicework::Next::Park
    });
    (Arc::new(work), runs)
}
mod leeway_changes;
mod manual;
mod quiet_time;
mod threaded;
mod touch_tick;

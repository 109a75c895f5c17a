//! A Prometheus-style text exposition of a scheduler's works, from `Scheduler::works`
//! and `Scheduler::metrics`: one series per work, told apart by its id and kind even
//! where many works share a default name (the closure's type), with per-object names
//! where the application gives them (`Work::named`).
//!
//! ```text
//! cargo run --release --example metrics_exporter
//! ```

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use nicework::{Next, Scheduler};

/// One connection, owning its idle reaper (named after the connection).
struct Conn {
    reaper: nicework::Work,
}

/// The exposition of `sched`'s works and metrics, in Prometheus' text format.
fn exposition(sched: &Scheduler) -> String {
    let mut out = String::new();
    let mut series = |metric: &str, help: &str, kind: &str, rows: &[(String, String)]| {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} {kind}");
        for (labels, value) in rows {
            if labels.is_empty() {
                let _ = writeln!(out, "{metric} {value}");
            } else {
                let _ = writeln!(out, "{metric}{{{labels}}} {value}");
            }
        }
    };
    let mut runs = Vec::new();
    let mut busy = Vec::new();
    let mut period = Vec::new();
    let mut armed = Vec::new();
    sched.works(|w| {
        let labels = format!(
            "id=\"{:x}\",kind=\"{}\",name=\"{}\"",
            w.id,
            w.kind,
            w.name.replace('\\', "\\\\").replace('"', "\\\"")
        );
        runs.push((labels.clone(), w.stats.runs.to_string()));
        busy.push((labels.clone(), w.stats.busy_total.as_secs_f64().to_string()));
        period.push((labels.clone(), w.period.as_secs_f64().to_string()));
        armed.push((labels, u8::from(w.deadline.is_some()).to_string()));
    });
    series(
        "nicework_work_runs_total",
        "Runs of the work.",
        "counter",
        &runs,
    );
    series(
        "nicework_work_busy_seconds_total",
        "Time spent in the work's callback.",
        "counter",
        &busy,
    );
    series(
        "nicework_work_period_seconds",
        "The work's period (a timeout's idle time).",
        "gauge",
        &period,
    );
    series(
        "nicework_work_armed",
        "1 while the work is armed.",
        "gauge",
        &armed,
    );
    let m = sched.metrics();
    let one = |value: String| [(String::new(), value)];
    series(
        "nicework_armed_works",
        "Works armed now.",
        "gauge",
        &one(m.armed.to_string()),
    );
    series(
        "nicework_worker_wakeups_total",
        "Worker wakeups.",
        "counter",
        &one(m.worker_wakeups.to_string()),
    );
    series(
        "nicework_panics_total",
        "Callbacks that panicked.",
        "counter",
        &one(m.panics.to_string()),
    );
    out
}

fn main() {
    let sched = Scheduler::manual();
    // Many reapers with one closure type: the same default name, told apart by id.
    let conns: Vec<Arc<Conn>> = (0..3)
        .map(|i| {
            Arc::new_cyclic(|me| Conn {
                reaper: sched
                    .timeout_for(me, Duration::from_secs(30), |_: &Conn, _| Next::Park)
                    .named(format!("conn-{i}.reaper")),
            })
        })
        .collect();
    let unnamed: Vec<_> = (0..2)
        .map(|_| sched.every(Duration::from_secs(10), |_| Next::Again))
        .collect();
    sched.advance(Duration::from_secs(20));
    conns[0].reaper.touch();
    let text = exposition(&sched);
    print!("{text}");
    // Every work is a series of its own.
    let runs_series = text
        .lines()
        .filter(|line| line.starts_with("nicework_work_runs_total{"))
        .count();
    assert_eq!(runs_series, conns.len() + unnamed.len());
}

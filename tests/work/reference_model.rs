//! Manual scheduler against a reference model: random schedule/reschedule/cancel/
//! cancel_sync/touch/advance on a few works (plain, `every`, timeouts), whole-millisecond
//! delays, callbacks returning Again/After/Park/Stop by a fixed rule. Every run must happen
//! at exactly the virtual time the crate's documented rules give, and every return value
//! must match.
//!
//! Timeouts are created after the clock passed their idle (this once worked around a
//! phantom touch at the scheduler's start, pinned now by `timeout_edges`).

use crate::common;

use common::Rng;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

const MS: u64 = 1;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Plain,
    Every(u64),
    Timeout(u64),
}

#[derive(Clone, Debug)]
struct Model {
    kind: Kind,
    pending: Option<u64>, // deadline (ms)
    stopped: bool,
    period: u64,
    touch: Option<u64>,
    runs: u64,
}

impl Model {
    fn due(&self) -> Option<u64> {
        let d = self.pending?;
        match (self.kind, self.touch) {
            (Kind::Timeout(idle), Some(t)) => Some(d.max(t + idle)),
            _ => Some(d),
        }
    }
}

fn outcome(work: usize, run: u64, seed: u64) -> Next {
    let h = (work as u64 * 7919 + run * 104_729 + seed * 31).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    match (h >> 32) % 6 {
        0 | 1 => Next::Again,
        2 => Next::After(Duration::from_millis((h >> 40) % 4)),
        3 | 4 => Next::Park,
        _ => Next::Stop,
    }
}

fn next_model(m: &mut Model, next: Next, now: u64) {
    match next {
        Next::Again => {
            m.pending = Some(now + m.period.max(1));
        }
        Next::After(d) => m.pending = Some(now + (d.as_millis() as u64).max(1)),
        Next::Park => {}
        Next::Stop => m.stopped = true,
        _ => unreachable!(),
    }
}

fn run_seed(seed: u64, ops: usize, zero_delays: bool) {
    let sched = Scheduler::manual();
    sched.advance(Duration::from_secs(1));
    let origin = sched.now();
    let ms = |t: Instant| -> u64 {
        let d = t - origin;
        assert_eq!(
            d.as_nanos() % 1_000_000,
            0,
            "seed {seed}: run off the ms grid at {d:?}"
        );
        d.as_millis() as u64
    };
    let log: Arc<Mutex<Vec<(u64, usize)>>> = Arc::new(Mutex::new(Vec::new()));
    let kinds = [
        Kind::Plain,
        Kind::Plain,
        Kind::Every(3),
        Kind::Timeout(5),
        Kind::Timeout(2),
    ];
    let mut works: Vec<Work> = Vec::new();
    let mut models: Vec<Model> = Vec::new();
    let mut now = 0u64;
    for (i, kind) in kinds.iter().enumerate() {
        let log = log.clone();
        let mut runs = 0u64;
        let origin2 = origin;
        let f = move |cx: &mut nicework::Ctx<'_>| {
            runs += 1;
            let t = cx.scheduler().now() - origin2;
            log.lock().unwrap().push((t.as_millis() as u64, i));
            let _ = t;
            outcome(i, runs, seed)
        };
        let (work, model) = match *kind {
            Kind::Plain => (
                sched.work(f),
                Model {
                    kind: *kind,
                    pending: None,
                    stopped: false,
                    period: 0,
                    touch: None,
                    runs: 0,
                },
            ),
            Kind::Every(p) => (
                sched.every(Duration::from_millis(p), f),
                Model {
                    kind: *kind,
                    pending: Some(now + p),
                    stopped: false,
                    period: p,
                    touch: None,
                    runs: 0,
                },
            ),
            Kind::Timeout(idle) => (
                sched.timeout(Duration::from_millis(idle), f),
                Model {
                    kind: *kind,
                    pending: Some(now + idle),
                    stopped: false,
                    period: idle,
                    touch: None,
                    runs: 0,
                },
            ),
        };
        works.push(work);
        models.push(model);
    }
    let _ = ms;
    let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
    let mut history: Vec<String> = Vec::new();
    for _ in 0..ops {
        let w = (rng.next() % works.len() as u64) as usize;
        let d = if zero_delays {
            rng.next() % 7
        } else {
            1 + rng.next() % 6
        };
        let dur = Duration::from_millis(d * MS);
        let op = rng.next() % 9;
        let m = &mut models[w];
        match op {
            0 => {
                let got = works[w].schedule(dur);
                let want = m.pending.is_none();
                if want {
                    m.pending = Some(now + d);
                    m.stopped = false;
                    if m.kind == Kind::Plain {
                        m.period = d;
                    }
                }
                history.push(format!("t={now} w{w}.schedule({d}ms) -> {got}"));
                assert_eq!(
                    got,
                    want,
                    "seed {seed}: schedule return\n{}",
                    history.join("\n")
                );
            }
            1 => {
                let got = works[w].reschedule(dur);
                let want = m.pending.is_some();
                m.pending = Some(now + d);
                m.stopped = false;
                if m.kind == Kind::Plain {
                    m.period = d;
                }
                history.push(format!("t={now} w{w}.reschedule({d}ms) -> {got}"));
                assert_eq!(
                    got,
                    want,
                    "seed {seed}: reschedule return\n{}",
                    history.join("\n")
                );
            }
            2 => {
                let got = works[w].cancel();
                let want = m.pending.take().is_some();
                history.push(format!("t={now} w{w}.cancel() -> {got}"));
                assert_eq!(
                    got,
                    want,
                    "seed {seed}: cancel return\n{}",
                    history.join("\n")
                );
            }
            3 => {
                let got = works[w].cancel_sync();
                let want = m.pending.take().is_some();
                m.stopped = true;
                history.push(format!("t={now} w{w}.cancel_sync() -> {got}"));
                assert_eq!(
                    got,
                    want,
                    "seed {seed}: cancel_sync return\n{}",
                    history.join("\n")
                );
            }
            4 | 5 => {
                works[w].touch();
                if let Kind::Timeout(idle) = m.kind {
                    m.touch = Some(now);
                    if m.pending.is_none() && !m.stopped {
                        m.pending = Some(now + idle);
                    }
                } else if m.pending.is_none() && !m.stopped {
                    m.pending = Some(now + m.period.max(1));
                }
                history.push(format!("t={now} w{w}.touch()"));
            }
            _ => {
                let by = rng.next() % 6;
                let target = now + by;
                // The model's runs, in time order.
                let mut want: Vec<(u64, usize)> = Vec::new();
                loop {
                    let pick = models
                        .iter()
                        .enumerate()
                        .filter_map(|(i, m)| m.due().filter(|&t| t <= target).map(|t| (t, i)))
                        .min();
                    let Some((t, i)) = pick else { break };
                    let m = &mut models[i];
                    m.pending = None;
                    m.runs += 1;
                    let run_at = t.max(now);
                    want.push((run_at, i));
                    next_model(m, outcome(i, m.runs, seed), run_at);
                }
                log.lock().unwrap().clear();
                sched.advance(Duration::from_millis(by));
                now = target;
                let mut got = log.lock().unwrap().clone();
                history.push(format!("t={} advance({by}ms) -> runs {got:?}", target - by));
                got.sort();
                want.sort();
                assert_eq!(
                    got,
                    want,
                    "seed {seed}: runs (time ms, work)\n{}",
                    history.join("\n")
                );
            }
        }
        for (i, (w, m)) in works.iter().zip(&models).enumerate() {
            assert_eq!(
                w.is_pending(),
                m.pending.is_some(),
                "seed {seed}: work {i} pending\n{}",
                history.join("\n")
            );
        }
    }
}

#[test]
fn manual_scheduler_matches_the_reference_model() {
    for seed in 1..400 {
        run_seed(seed, 300, false);
    }
}

/// The same with zero delays, which put entries on the ready queue (see
/// `attack_timeout_manual::advance_runs_in_deadline_order_after_a_zero_delay_is_moved_later`).
#[test]
fn manual_scheduler_matches_the_reference_model_with_zero_delays() {
    for seed in 1..400 {
        run_seed(seed, 300, true);
    }
}

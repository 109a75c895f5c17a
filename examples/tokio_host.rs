//! A tokio runtime drives a hosted scheduler: no nicework thread. One line hosts it,
//! `tokio::spawn(nicework::tokio::drive(driver))` (feature `tokio`): the task runs the due
//! works in bounded turns and sleeps on the driver's descriptor (Linux) or tokio's timer.
//! Sessions live on a multi-threaded runtime; each owns an idle reaper (`timeout_for`)
//! that tasks on several threads touch, and is closed with `drop_async().await`, so no
//! executor thread ever blocks on a reaper's run. A heartbeat task measures how long the
//! executor stalls.
//!
//! It prints the early reaps (a reaper that ran within its idle time of a touch; the
//! example exits non-zero unless there are 0) and the longest heartbeat stall.
//!
//! ```text
//! cargo run --release --features tokio --example tokio_host
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

struct Session {
    id: usize,
    last_touch: Mutex<Instant>,
    reaper: Mutex<Option<Work>>,
}

const IDLE: Duration = Duration::from_millis(120);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (sched, driver) = Scheduler::builder()
        .name("tokio-host")
        .build_hosted()
        .expect("a hosted scheduler");
    let stop = Arc::new(AtomicBool::new(false));
    let early = Arc::new(AtomicUsize::new(0));
    let reaped = Arc::new(AtomicUsize::new(0));
    let longest_stall_us = Arc::new(AtomicU64::new(0));

    runtime.block_on(async {
        let host_task = tokio::spawn(nicework::tokio::drive(driver));
        let heartbeat = {
            let (stop, longest) = (stop.clone(), longest_stall_us.clone());
            tokio::spawn(async move {
                let tick = Duration::from_millis(5);
                let mut last = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    tokio::time::sleep(tick).await;
                    let stall = last.elapsed().saturating_sub(tick);
                    longest.fetch_max(stall.as_micros() as u64, Ordering::Relaxed);
                    last = Instant::now();
                }
            })
        };

        let mut sessions = Vec::new();
        for id in 0..16 {
            let session = Arc::new(Session {
                id,
                last_touch: Mutex::new(Instant::now()),
                reaper: Mutex::new(None),
            });
            let (early, reaped) = (early.clone(), reaped.clone());
            let reaper = sched.timeout_for(&session, IDLE, move |session: &Session, _| {
                if session.last_touch.lock().unwrap().elapsed() < IDLE {
                    early.fetch_add(1, Ordering::SeqCst);
                    eprintln!("session {} reaped early", session.id);
                }
                // A reaper that costs something (it runs on the host task's thread);
                // closing a session must not wait for it on another executor thread.
                std::thread::sleep(Duration::from_millis(2));
                reaped.fetch_add(1, Ordering::SeqCst);
                Next::Park
            });
            *session.reaper.lock().unwrap() = Some(reaper);
            sessions.push(session);
        }

        // Clients on several runtime threads touch the even sessions for 600 ms; the
        // odd ones go idle and are reaped.
        let clients: Vec<_> = (0..4)
            .map(|client| {
                let sessions: Vec<_> = sessions.iter().step_by(2).cloned().collect();
                tokio::spawn(async move {
                    let start = Instant::now();
                    while start.elapsed() < Duration::from_millis(600) {
                        for session in sessions.iter().skip(client % 2).step_by(2) {
                            // Stamp first: a touch may be followed by a run at once.
                            *session.last_touch.lock().unwrap() = Instant::now();
                            if let Some(reaper) = session.reaper.lock().unwrap().as_ref() {
                                reaper.touch();
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
            })
            .collect();
        for client in clients {
            client.await.unwrap();
        }
        // Let the idle sessions' reapers run, then close every session without blocking
        // an executor thread (a reaper running at that moment is waited for by the
        // future, not by the thread).
        tokio::time::sleep(IDLE * 2).await;
        for session in sessions {
            let reaper = session.reaper.lock().unwrap().take();
            if let Some(reaper) = reaper {
                reaper.drop_async().await;
            }
        }
        stop.store(true, Ordering::SeqCst);
        heartbeat.await.unwrap();
        // The last handle: the scheduler shuts down and the host task ends.
        drop(sched);
        host_task.await.unwrap();
    });

    let early = early.load(Ordering::SeqCst);
    println!(
        "tokio host: {} reaper runs, {early} early reaps, longest executor stall {:.1} ms",
        reaped.load(Ordering::SeqCst),
        longest_stall_us.load(Ordering::Relaxed) as f64 / 1000.0
    );
    if early != 0 {
        std::process::exit(1);
    }
}

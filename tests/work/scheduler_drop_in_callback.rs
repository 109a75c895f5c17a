//! Dropping a scheduler's last handle from inside a callback does not join its workers,
//! so a worker whose callback waits for the dropping callback cannot deadlock it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nicework::{Next, Scheduler, Work};

fn bounded(name: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    if rx.recv_timeout(Duration::from_secs(10)).is_err() {
        panic!("DEADLOCK: {name} did not finish within 10 s");
    }
}

/// A (sched1) drops sched2's last handle while B (on sched2's worker) flushes A.
#[test]
fn dropping_another_schedulers_last_handle_from_a_callback_does_not_deadlock() {
    bounded("cross-scheduler drop", || {
        let sched1 = Scheduler::new().unwrap();
        let sched2 = Scheduler::new().unwrap();
        let a_slot: Arc<OnceLock<Work>> = Arc::new(OnceLock::new());
        let b_waiting = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let s2: Arc<Mutex<Option<Scheduler>>> = Arc::new(Mutex::new(None));

        let (slot, bw) = (a_slot.clone(), b_waiting.clone());
        let b = sched2.work(move |_| {
            bw.store(true, Ordering::SeqCst);
            slot.get().unwrap().flush(); // waits for A's run
            Next::Park
        });
        let (bw, s2c, d) = (b_waiting.clone(), s2.clone(), done.clone());
        let a = sched1.work(move |_| {
            while !bw.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(200));
            let last = s2c.lock().unwrap().take();
            drop(last); // joins sched2's worker, which waits for us
            d.store(true, Ordering::SeqCst);
            Next::Park
        });
        a_slot.set(a).ok().unwrap();
        *s2.lock().unwrap() = Some(sched2);
        a_slot.get().unwrap().schedule(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(50));
        b.schedule(Duration::ZERO);
        while !done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(b);
    });
}

/// Same scheduler: the main thread flushes A (runs on main); A drops the last handle while
/// the scheduler's worker runs B, which flushes A.
#[test]
fn dropping_the_own_schedulers_last_handle_from_a_flushed_callback_does_not_deadlock() {
    bounded("same-scheduler drop from a flushed callback", || {
        let sched = Scheduler::new().unwrap();
        let a_slot: Arc<OnceLock<Work>> = Arc::new(OnceLock::new());
        let b_waiting = Arc::new(AtomicBool::new(false));
        let holder: Arc<Mutex<Option<Scheduler>>> = Arc::new(Mutex::new(None));

        let (slot, bw) = (a_slot.clone(), b_waiting.clone());
        let b = sched.work(move |_| {
            bw.store(true, Ordering::SeqCst);
            slot.get().unwrap().flush();
            Next::Park
        });
        let (bw, h) = (b_waiting.clone(), holder.clone());
        let a = sched.work(move |_| {
            while !bw.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(200));
            drop(h.lock().unwrap().take());
            Next::Park
        });
        a_slot.set(a).ok().unwrap();
        // A is pending far away; B runs now on the worker.
        a_slot.get().unwrap().schedule(Duration::from_secs(3600));
        b.schedule(Duration::ZERO);
        *holder.lock().unwrap() = Some(sched);
        a_slot.get().unwrap().flush(); // runs A here, on this thread
        drop(b);
    });
}

//! A wait cycle that passes through one of several `run_chunked` helpers is found: the
//! helpers all hold the caller's work (they run on its behalf), so the cycle search follows
//! every edge that holds a work, and the caller's unconditional wait for its helpers never
//! deadlocks.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nicework::{Next, Scheduler, Work};

fn watchdog(secs: u64, what: &'static str) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(secs) {
            if d.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("WATCHDOG: {what}: hung for {secs} s");
        std::process::exit(101);
    });
    done
}

#[test]
fn a_cycle_through_the_second_of_two_helpers_is_broken() {
    let done = watchdog(
        30,
        "run_chunked deadlock: Z waits C, C waits helper H2, H2 waits Z",
    );
    let s = Scheduler::builder().workers(2).build().unwrap();
    let s2 = Scheduler::builder().workers(2).build().unwrap();

    let c_slot: Arc<OnceLock<Arc<Work>>> = Arc::new(OnceLock::new());
    let z_slot: Arc<OnceLock<Work>> = Arc::new(OnceLock::new());
    let x_slot: Arc<OnceLock<Work>> = Arc::new(OnceLock::new());
    let h2_go = Arc::new(AtomicBool::new(false));
    let x_started = Arc::new(AtomicBool::new(false));
    let z_started = Arc::new(AtomicBool::new(false));

    // X: a long (but finite) run, the decoy that H1 waits for.
    let xs = x_started.clone();
    let x = s2.work(move |_| {
        xs.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(2000));
        Next::Park
    });
    // Z: once H2 waits for it, it cancel_syncs C (the run_chunked caller).
    let (cs, hg, zs) = (c_slot.clone(), h2_go.clone(), z_started.clone());
    let z = s2.work(move |_| {
        zs.store(true, Ordering::SeqCst);
        while !hg.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(300));
        eprintln!("Z: cancel_sync(C)");
        cs.get().unwrap().cancel_sync();
        eprintln!("Z: cancel_sync(C) returned");
        Next::Park
    });
    assert!(x.schedule(Duration::ZERO));
    assert!(z.schedule(Duration::ZERO));
    while !(x_started.load(Ordering::SeqCst) && z_started.load(Ordering::SeqCst)) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = x_slot.set(x);
    let _ = z_slot.set(z);

    let main_id = std::thread::current().id();
    let helper_n = Arc::new(AtomicUsize::new(0));
    let (xs2, zs2, hn, hg2, sched) = (
        x_slot.clone(),
        z_slot.clone(),
        helper_n.clone(),
        h2_go.clone(),
        s.clone(),
    );
    let c = Arc::new(s.work(move |_| {
        let r = sched.run_chunked(0..16, 1, |_range| {
            if std::thread::current().id() == main_id {
                std::thread::sleep(Duration::from_millis(50));
                return Ok::<(), ()>(());
            }
            match hn.fetch_add(1, Ordering::SeqCst) {
                0 => {
                    eprintln!("H1: flush(X)");
                    xs2.get().unwrap().flush();
                    eprintln!("H1: flush(X) returned");
                }
                1 => {
                    std::thread::sleep(Duration::from_millis(100));
                    hg2.store(true, Ordering::SeqCst);
                    eprintln!("H2: cancel_sync(Z)");
                    zs2.get().unwrap().cancel_sync();
                    eprintln!("H2: cancel_sync(Z) returned");
                }
                _ => {}
            }
            Ok(())
        });
        assert!(r.is_ok());
        Next::Park
    }));
    let _ = c_slot.set(c.clone());
    assert!(c.schedule(Duration::from_secs(3600)));
    // C runs on this thread (frames = [C]); helpers on s's two workers.
    assert!(c.flush());
    done.store(true, Ordering::SeqCst);
}

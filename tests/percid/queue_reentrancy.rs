//! The reclaim queue visited one value at a time, with nested readers inside `on_reclaim`,
//! self-replacing callbacks, panics, and two readers: every value reaches the callback
//! exactly once, no pass visits a value twice, and none visits it after its callback began.

use crate::common;

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex, OnceLock, Weak, mpsc};
use std::time::Duration;

use nicework::{IdSpace, PerCid, Scheduler};

fn quiet_panics() {
    common::quiet_panics_starting_with("planted:");
}

struct Val {
    id: u64,
    started: AtomicBool,
    n: AtomicU64,
}

#[derive(Default)]
struct Stats {
    reclaims: Mutex<Vec<u64>>,
    dropped: Mutex<Vec<u64>>,
    visited_after_start: AtomicUsize,
    double_visits: AtomicUsize,
    started_twice: AtomicUsize,
    nested_passes: AtomicUsize,
    nested_panics: AtomicUsize,
}

struct Tracked(Val, Arc<Stats>);
impl Drop for Tracked {
    fn drop(&mut self) {
        self.1.dropped.lock().unwrap().push(self.0.id);
    }
}

static FILLING: AtomicBool = AtomicBool::new(false);
static P: OnceLock<Weak<PerCid<Tracked>>> = OnceLock::new();

fn check_pass(stats: &Stats, mut panic_on: Option<u64>) -> usize {
    let p = P.get().unwrap().upgrade().unwrap();
    let mut seen = HashSet::new();
    let r = catch_unwind(AssertUnwindSafe(|| {
        p.for_each(|t| {
            if t.0.started.load(SeqCst) {
                stats.visited_after_start.fetch_add(1, SeqCst);
            }
            if !seen.insert(t.0.id) {
                stats.double_visits.fetch_add(1, SeqCst);
            }
            if let Some(k) = panic_on {
                if t.0.id % 7 == k {
                    panic_on = None;
                    panic!("planted: reader panics on {}", t.0.id);
                }
            }
        })
    }));
    let _ = r;
    seen.len()
}

fn make_cb(generation: u64, stats: Arc<Stats>) -> impl FnMut(&mut Tracked) + Send + 'static {
    move |t: &mut Tracked| {
        if t.0.started.swap(true, SeqCst) {
            stats.started_twice.fetch_add(1, SeqCst);
        }
        stats.reclaims.lock().unwrap().push(t.0.id);
        // A nested reader on the same PerCid while this drain is mid-queue.
        let p = P.get().unwrap().upgrade().unwrap();
        // Not while fill_queue's reader waits for the advance() this runs in (that would be
        // the test's own lock-order cycle, as with two RwLocks).
        let r = catch_unwind(AssertUnwindSafe(|| {
            if !FILLING.load(SeqCst) {
                check_pass(&stats, None);
            }
        }));
        if r.is_err() {
            stats.nested_panics.fetch_add(1, SeqCst);
        }
        stats.nested_passes.fetch_add(1, SeqCst);
        // Replace itself on every call.
        p.on_reclaim(make_cb(generation + 1, stats.clone()));
        if generation % 3 == 2 {
            panic!("planted: on_reclaim panics (generation {generation})");
        }
    }
}

fn fill_queue(sched: &Scheduler, p: &Arc<PerCid<Tracked>>, n: usize) {
    // Make n values in n distinct ids, then let the threads exit.
    let bar = Arc::new(Barrier::new(n));
    let hs: Vec<_> = (0..n)
        .map(|_| {
            let (p, bar) = (p.clone(), bar.clone());
            std::thread::spawn(move || {
                p.with(|t| t.0.n.fetch_add(1, SeqCst));
                bar.wait();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    // A reader holds the gate while the scan runs: the trim is left to it, and its
    // DeferredTrim moves the values into the queue.
    let (in_tx, in_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let pr = p.clone();
    let reader = std::thread::spawn(move || {
        let mut first = true;
        pr.for_each(|_| {
            if first {
                first = false;
                in_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            }
        });
    });
    in_rx.recv().unwrap();
    FILLING.store(true, SeqCst);
    sched.advance(Duration::from_millis(100));
    FILLING.store(false, SeqCst);
    go_tx.send(()).unwrap();
    reader.join().unwrap();
}

#[test]
fn nested_reader_self_replacing_panicking_callback_and_a_second_reader() {
    quiet_panics();
    let sched = Scheduler::manual();
    let ids = IdSpace::builder()
        .scan_period(nicework::MIN_SCAN_PERIOD)
        .build(&sched);
    let stats = Arc::new(Stats::default());
    let next = Arc::new(AtomicU64::new(1));
    let p: Arc<PerCid<Tracked>> = Arc::new(PerCid::new(&ids, {
        let (next, stats) = (next.clone(), stats.clone());
        move || {
            Tracked(
                Val {
                    id: next.fetch_add(1, SeqCst),
                    started: AtomicBool::new(false),
                    n: AtomicU64::new(0),
                },
                stats.clone(),
            )
        }
    }));
    P.set(Arc::downgrade(&p)).ok().unwrap();
    p.on_reclaim(make_cb(0, stats.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, stats) = (stop.clone(), stats.clone());
        std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(SeqCst) {
                k += 1;
                check_pass(&stats, if k % 2 == 0 { Some(k % 7) } else { None });
            }
        })
    };
    for round in 0..40 {
        fill_queue(&sched, &p, 24);
        // A main-thread pass sees everything queued once.
        let seen = check_pass(&stats, None);
        let _ = (round, seen);
        for _ in 0..3 {
            sched.advance(Duration::from_millis(100));
        }
    }
    stop.store(true, SeqCst);
    reader.join().unwrap();
    for _ in 0..5 {
        sched.advance(Duration::from_millis(100));
    }
    let created = next.load(SeqCst) - 1;
    let live = p.live();
    let mut reclaims = stats.reclaims.lock().unwrap().clone();
    reclaims.sort();
    let mut dup = reclaims.clone();
    dup.dedup();
    eprintln!(
        "created={created} live={live} reclaims={} distinct={} nested={} nested_panics={} \
         visited_after_start={} double={} started_twice={}",
        reclaims.len(),
        dup.len(),
        stats.nested_passes.load(SeqCst),
        stats.nested_panics.load(SeqCst),
        stats.visited_after_start.load(SeqCst),
        stats.double_visits.load(SeqCst),
        stats.started_twice.load(SeqCst)
    );
    assert_eq!(stats.visited_after_start.load(SeqCst), 0, "(c)");
    assert_eq!(stats.double_visits.load(SeqCst), 0, "(b)");
    assert_eq!(stats.started_twice.load(SeqCst), 0, "(a) twice");
    assert_eq!(reclaims.len(), dup.len(), "(a) twice");
    assert_eq!(live, 0);
    assert_eq!(reclaims.len() as u64, created, "(a) every value reclaimed");
    drop(p);
}

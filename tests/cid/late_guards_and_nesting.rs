//! A guard keeps its id until it is dropped, and a nested `enter()` returns the outer
//! guard's id, under the two conditions that
//! broke it: a guard that outlives nicework's own thread-exit hook (it lives in a
//! thread-local destroyed after the hook), and nested `enter()` while the compaction scan
//! is between revoking an id and giving it back.
//!
//! Also run under AddressSanitizer (a guard that outlived its record wrote freed memory):
//! `RUSTFLAGS="-Zsanitizer=address" cargo +nightly test --target x86_64-unknown-linux-gnu
//! --test cid_adversarial`.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use nicework::{Cid, IdSpace, Scheduler};

use crate::common;

/// Far above any expected latency: only a hang reaches it.
const HANG: Duration = Duration::from_secs(20);

/// A space that lives for `'static`, as a `Cid<'static>` needs (a leaked box).
fn leaked_space(sched: &Scheduler) -> &'static IdSpace {
    Box::leak(Box::new(IdSpace::new(sched)))
}

/// Frees a space from `leaked_space`, so LeakSanitizer checks that nicework freed its
/// records and orphan lists.
///
/// # Safety
///
/// Every thread that used `ids` has been joined, and nothing else refers to it.
unsafe fn free_leaked_space(ids: &'static IdSpace) {
    // SAFETY: `ids` came from `Box::leak` in `leaked_space`; the caller promises it is no
    // longer referenced.
    drop(unsafe { Box::from_raw(ids as *const IdSpace as *mut IdSpace) });
}

/// What the late destructor reports to the test's main thread.
#[derive(Debug, PartialEq)]
enum Report {
    /// The destructor started; its guard (still alive) has this id.
    GuardAtTeardown(usize),
    /// A nested `enter()` made from the destructor while the guard lives.
    Nested(usize),
    /// The guard's id just before it is dropped.
    GuardBeforeDrop(usize),
}

/// A thread-local value that holds a `Cid<'static>` into the thread's teardown. Its
/// destructor must not panic (that aborts the process), so it reports to the main thread
/// over a channel and the main thread asserts.
struct LateGuard {
    ids: &'static IdSpace,
    guard: Option<Cid<'static>>,
    report: Sender<Report>,
    /// The main thread says "go on" once another thread has entered meanwhile.
    resume: Receiver<()>,
}

impl Drop for LateGuard {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let _ = self.report.send(Report::GuardAtTeardown(guard.get()));
        // Another thread enters while this guard lives (and nicework's exit hook has run).
        let _ = self.resume.recv_timeout(HANG);
        {
            let nested = self.ids.enter();
            let _ = self.report.send(Report::Nested(nested.get()));
        }
        let _ = self.report.send(Report::GuardBeforeDrop(guard.get()));
        drop(guard);
    }
}

thread_local! {
    static LATE: RefCell<Option<LateGuard>> = const { RefCell::new(None) };
}

/// A `Cid<'static>` kept in a thread-local whose destructor runs after nicework's
/// registry destructor (std runs thread-local destructors in the reverse order of their
/// registration, and `LATE` is registered before the thread's first `enter()`): the guard
/// keeps its id through the thread's teardown, another thread entering meanwhile gets a
/// different one, a nested `enter()` from the destructor returns the guard's id, and the id
/// is released when the guard drops, before `join()` returns.
#[test]
fn a_guard_in_a_thread_local_destroyed_after_the_exit_hook_keeps_its_id() {
    let sched = Scheduler::manual();
    let ids = leaked_space(&sched);
    let (report_tx, report) = mpsc::channel();
    let (resume, resume_rx) = mpsc::channel();
    let late = std::thread::spawn(move || {
        // Registered first, so destroyed last: after nicework's registry.
        LATE.with(|_| ());
        let guard = ids.enter();
        LATE.with(|late| {
            *late.borrow_mut() = Some(LateGuard {
                ids,
                guard: Some(guard),
                report: report_tx,
                resume: resume_rx,
            })
        });
    });
    let Report::GuardAtTeardown(id) = report.recv_timeout(HANG).unwrap() else {
        panic!("expected the teardown report first");
    };
    assert_eq!(
        (id, ids.held()),
        (0, 1),
        "the exiting thread still owns its id"
    );

    // Another thread enters while the late guard lives: it must get another id, and keep
    // it while the late destructor runs its nested enter.
    let (other_tx, other_id) = mpsc::channel();
    let (release_other, other_release) = mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        let guard = ids.enter();
        other_tx.send(guard.get()).unwrap();
        other_release.recv_timeout(HANG).unwrap();
        drop(guard);
    });
    let other_id = other_id.recv_timeout(HANG).unwrap();
    assert_ne!(other_id, id, "two live guards share an id");
    assert_eq!(ids.held(), 2);

    resume.send(()).unwrap();
    assert_eq!(
        report.recv_timeout(HANG).unwrap(),
        Report::Nested(id),
        "a nested enter() in the late destructor returns the guard's id"
    );
    assert_eq!(
        report.recv_timeout(HANG).unwrap(),
        Report::GuardBeforeDrop(id),
        "the guard's id did not change during teardown"
    );
    late.join().unwrap();
    assert_eq!(
        (ids.held(), ids.threads()),
        (1, 1),
        "the late guard's drop released its id and its thread before join() returned"
    );
    release_other.send(()).unwrap();
    other.join().unwrap();
    assert_eq!((ids.held(), ids.high_water(), ids.threads()), (0, 0, 0));
    // SAFETY: both threads that used `ids` were joined.
    unsafe { free_leaked_space(ids) };
}

/// Several guards in a thread-local destroyed after the exit hook (two spaces, and a nested
/// pair in one of them): each space's id is released exactly when that space's last guard
/// drops, and the thread leaves no record behind.
#[test]
fn late_guards_of_several_spaces_release_each_id_at_their_last_drop() {
    struct Late {
        guards: Vec<Cid<'static>>,
        report: Sender<(usize, usize)>,
        a: &'static IdSpace,
        b: &'static IdSpace,
    }
    impl Drop for Late {
        fn drop(&mut self) {
            // Drop in creation order: a's outer guard first (its nested one still pins it).
            while !self.guards.is_empty() {
                drop(self.guards.remove(0));
                let _ = self.report.send((self.a.held(), self.b.held()));
            }
        }
    }
    thread_local! {
        static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
    }
    let sched = Scheduler::manual();
    let (a, b) = (leaked_space(&sched), leaked_space(&sched));
    let (report_tx, report) = mpsc::channel();
    std::thread::spawn(move || {
        LATE.with(|_| ());
        let guards = vec![a.enter(), a.enter(), b.enter()];
        LATE.with(|late| {
            *late.borrow_mut() = Some(Late {
                guards,
                report: report_tx,
                a,
                b,
            })
        });
    })
    .join()
    .unwrap();
    let seen: Vec<(usize, usize)> = report.try_iter().collect();
    assert_eq!(
        seen,
        [(1, 1), (0, 1), (0, 0)],
        "(a.held, b.held) after each late drop"
    );
    assert_eq!((a.threads(), b.threads()), (0, 0));
    // SAFETY: the one thread that used them was joined.
    unsafe {
        free_leaked_space(a);
        free_leaked_space(b);
    }
}

/// A small xorshift generator: the workloads below vary per thread but are reproducible.
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// One outer `enter()` followed by nested ones; returns how many nested ids differed from
/// the outer id or were not below the high water.
fn enter_and_nest(ids: &IdSpace, nested: usize) -> usize {
    let outer = ids.enter();
    let id = outer.get();
    (0..nested)
        .filter(|_| {
            let inner = ids.enter();
            inner.get() != id || inner.get() >= ids.high_water()
        })
        .count()
}

/// Nested `enter()` under a fast compaction scan (a real scheduler, 1 ms scan period):
/// waves of threads enter, nest, idle long enough to lose their ids, and exit, while the
/// scans revoke idle ids and give back the ones whose thread pinned meanwhile. A nested
/// `enter()` must return the outer guard's id, also between a scan's revoke and its
/// give-back. The thread must pin in the few nanoseconds between the scan reading its pin
/// and revoking its id, so the workload uses many spaces (each with its own scan) to make
/// that happen a few times a second on two cores.
#[test]
fn nested_enter_returns_the_outer_id_under_a_fast_scan() {
    const SPACES: usize = 32;
    const WAVES: usize = 4;
    const THREADS: usize = 16;
    const ROUNDS: usize = 300;
    const NESTED: usize = 8;
    let sched = common::normal_priority_builder()
        .slack(Duration::from_micros(200))
        .build()
        .unwrap();
    let spaces: Arc<Vec<IdSpace>> = Arc::new(
        (0..SPACES)
            .map(|_| {
                IdSpace::builder()
                    .scan_period(Duration::from_millis(1))
                    .build(&sched)
            })
            .collect(),
    );
    let mismatches = Arc::new(AtomicUsize::new(0));
    for wave in 0..WAVES {
        let threads: Vec<_> = (0..THREADS)
            .map(|index| {
                let (spaces, mismatches) = (spaces.clone(), mismatches.clone());
                std::thread::spawn(move || {
                    let mut next = xorshift((wave * THREADS + index) as u64);
                    for _ in 0..ROUNDS {
                        for ids in spaces.iter() {
                            let bad = enter_and_nest(ids, NESTED);
                            mismatches.fetch_add(bad, Ordering::Relaxed);
                        }
                        // Idle, sometimes for more than a scan period: the next enter
                        // races with a scan revoking the id.
                        std::thread::sleep(Duration::from_micros(next() % 3000));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }
    let scans: u64 = spaces.iter().map(|ids| ids.compaction_stats().runs).sum();
    println!("{scans} compaction scans");
    assert_eq!(
        mismatches.load(Ordering::Relaxed),
        0,
        "a nested enter() returned another id than its outer guard"
    );
    for ids in spaces.iter() {
        assert_eq!(ids.held(), 0, "every exited thread released its id");
    }
}

/// The same race, made frequent: a thread runs the compaction scan back to back
/// (`advance` on a manual scheduler), so nearly every idle thread's next `enter()` races
/// with a revoke. No real time passes; the loop counts bound the test.
#[test]
fn nested_enter_returns_the_outer_id_under_back_to_back_scans() {
    const WAVES: usize = 2;
    const THREADS: usize = 8;
    const ROUNDS: usize = 3000;
    const NESTED: usize = 32;
    let sched = Scheduler::manual();
    let ids = Arc::new(IdSpace::new(&sched));
    let mismatches = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let scanner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut scans = 0u64;
            while !stop.load(Ordering::Relaxed) {
                sched.advance(Duration::from_millis(100));
                scans += 1;
            }
            scans
        })
    };
    for wave in 0..WAVES {
        let threads: Vec<_> = (0..THREADS)
            .map(|index| {
                let (ids, mismatches) = (ids.clone(), mismatches.clone());
                std::thread::spawn(move || {
                    let mut next = xorshift((wave * THREADS + index) as u64);
                    for _ in 0..ROUNDS {
                        mismatches.fetch_add(enter_and_nest(&ids, NESTED), Ordering::Relaxed);
                        for _ in 0..next() % 4 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    println!("{} compaction scans", scanner.join().unwrap());
    assert_eq!(
        mismatches.load(Ordering::Relaxed),
        0,
        "a nested enter() returned another id than its outer guard"
    );
    assert_eq!(ids.held(), 0, "every exited thread released its id");
}

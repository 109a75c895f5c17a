//! `fork()` with a scheduler in use: the child must neither deadlock on a lock another
//! thread held at the fork nor run callbacks; schedulers from before the fork are inert
//! there, new ones work (see `src/fork.rs`). Real forks, one child per case.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use nicework::{Next, Scheduler};

/// How long a child may take before it counts as hung. A child may itself wait up to
/// 2 × 10 s for nice-19 workers, which a saturated machine can starve for seconds, so
/// this is well above that; only a real deadlock reaches it.
const CHILD_BOUND: Duration = Duration::from_secs(60);

/// Forks; the child runs `child` and exits with its result (0 = passed). The parent waits
/// at most `CHILD_BOUND` (a hang is killed and fails) and returns the exit code.
fn in_child(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork in a multi-threaded process; the child only runs `child` (which uses
    // nicework, malloc and std, all fork-aware in glibc) and leaves through `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    wait_for_child(pid)
}

/// Waits for child `pid` at most `CHILD_BOUND` (a hang is killed and fails) and
/// returns its exit code; a child killed by a signal fails.
fn wait_for_child(pid: libc::pid_t) -> i32 {
    crate::common::child::wait_for_forked_child(pid, CHILD_BOUND)
        .expect("the child hung (deadlock on a lock held at fork time?)")
}

#[test]
fn a_forked_child_can_use_every_call_while_another_thread_hammered_the_lock() {
    let sched = Scheduler::builder().workers(2).build().unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let counter = runs.clone();
    let busy = sched.every(Duration::from_millis(1), move |_| {
        counter.fetch_add(1, Ordering::Relaxed);
        Next::Again
    });
    // Another thread takes and releases the scheduler's lock as fast as it can, so the
    // fork is likely to land while it is held.
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (sched, stop) = (sched.clone(), stop.clone());
        std::thread::spawn(move || {
            let work = sched.work(|_| Next::Park);
            // And the registry's lock, which making a work takes. The works are kept, not
            // dropped: under AddressSanitizer a fork while another thread frees can leave
            // the child's thread exits waiting for the sanitizer's quarantine lock.
            let mut made = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                work.reschedule(Duration::from_secs(60));
                work.cancel();
                if made.len() < 1_000 {
                    made.push(sched.work(|_| Next::Park));
                }
            }
        })
    };
    assert!(common::eventually(|| runs.load(Ordering::Relaxed) > 10));
    for _ in 0..20 {
        let code = in_child(|| {
            let runs_at_fork = runs.load(Ordering::Relaxed);
            let work = sched.work(|_| Next::Park);
            let checks = [
                !work.schedule(Duration::ZERO),
                !work.reschedule(Duration::ZERO),
                !work.cancel(),
                !work.flush(),
                !busy.cancel_sync(),
                !busy.flush(),
                !busy.disable(),
                sched.workers() == 0,
                sched.metrics().armed == 0,
                sched.advance(Duration::from_secs(1)) == 0,
                sched.run_chunked(0..100, 1, |_| Ok::<(), ()>(())).is_ok(),
                {
                    // The parent's works are not listed in the inert copy.
                    let mut listed = 0;
                    sched.works(|_| listed += 1);
                    listed == 0
                },
            ];
            busy.touch();
            busy.enable();
            drop(work);
            std::thread::sleep(Duration::from_millis(20));
            let no_runs = runs.load(Ordering::Relaxed) == runs_at_fork;
            // A scheduler made in the child works.
            let fresh = Scheduler::new().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let child_work = fresh.work(move |_| {
                tx.send(()).unwrap();
                Next::Park
            });
            child_work.schedule(Duration::ZERO);
            let fresh_ran = rx.recv_timeout(Duration::from_secs(10)).is_ok();
            let mut fresh_listed = 0;
            fresh.works(|_| fresh_listed += 1);
            let fresh_ran = fresh_ran && fresh_listed == 1;
            drop(child_work);
            drop(fresh);
            let global_ok = {
                let g = nicework::global();
                let (tx, rx) = std::sync::mpsc::channel();
                let w = g.work(move |_| {
                    tx.send(()).unwrap();
                    Next::Park
                });
                w.schedule(Duration::ZERO);
                rx.recv_timeout(Duration::from_secs(10)).is_ok()
            };
            // Dropping the parent's last handles in the child neither blocks nor joins.
            // SAFETY: this child only ends through `_exit`, so the originals are never
            // used or dropped again here.
            let (busy, sched) = unsafe { (std::ptr::read(&busy), std::ptr::read(&sched)) };
            drop(busy);
            drop(sched);
            let all = checks.iter().all(|&ok| ok) && no_runs && fresh_ran && global_ok;
            if all {
                0
            } else {
                eprintln!(
                    "checks {checks:?} no_runs {no_runs} fresh {fresh_ran} global {global_ok}"
                );
                1
            }
        });
        assert_eq!(code, 0, "a check failed in the child");
    }
    stop.store(true, Ordering::Relaxed);
    hammer.join().unwrap();
    // The parent is unaffected.
    let before = runs.load(Ordering::Relaxed);
    assert!(common::eventually(|| runs.load(Ordering::Relaxed) > before));
    drop(busy);
}

#[test]
fn an_id_space_from_before_the_fork_keeps_working_in_the_child_without_its_lock() {
    // A process of its own, where nothing but this test starts threads: std's thread
    // start takes a process-wide lock (for its stack-overflow handler), so a fork that
    // lands while another thread of the parent starts one (the test harness starting the
    // next test, say) leaves that lock held in the child, whose own threads then hang in
    // std before they run any code.
    const NAME: &str =
        "an_id_space_from_before_the_fork_keeps_working_in_the_child_without_its_lock";
    if !common::child::is_child(NAME) {
        common::child::assert_child_passes(module_path!(), NAME);
        return;
    }
    let sched = Scheduler::new().unwrap();
    let ids = Arc::new(nicework::IdSpace::new(&sched));
    // Held across the forks: on a loaded machine the forks can take longer than two scan
    // periods, and the scan would reclaim the id of an idle forking thread.
    let pinned = ids.enter();
    let forking_thread_id = pinned.get();
    // Another thread keeps taking the space's lock, so the fork is likely to land while
    // it is held: a `PerCid`'s first slot raises its reach, `live()` counts and a drop
    // leaves the index, each under that lock. (It starts no threads: see above.)
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        let ids = ids.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let slots = nicework::PerCid::new(&ids, || 0u64);
                slots.with(|n| *n += 1);
                assert_eq!(slots.live(), 1);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..10 {
        let code = in_child(|| {
            // The forking thread still owns its id.
            let same = ids.enter().get() == forking_thread_id;
            let high_water = ids.high_water();
            // New threads get fresh, distinct ids above the high water at the fork, and
            // per-id storage made in the child works with them.
            let slots = nicework::PerCid::new(&ids, || 0u64);
            let child_ids: Vec<usize> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            let id = ids.enter().get();
                            slots.with(|n| *n += 1);
                            id
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let mut distinct = child_ids.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let fresh = distinct.len() == 4 && child_ids.iter().all(|&id| id >= high_water);
            // A space made in the child is dense as usual.
            let child_sched = Scheduler::new().unwrap();
            let dense = nicework::IdSpace::new(&child_sched);
            let dense_id = std::thread::scope(|s| s.spawn(|| dense.enter().get()).join().unwrap());
            if same && fresh && slots.live() == 4 && dense_id == 0 {
                0
            } else {
                eprintln!(
                    "same {same} ids {child_ids:?} (high water {high_water}) dense {dense_id}"
                );
                1
            }
        });
        assert_eq!(code, 0, "a check failed in the child");
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    drop(pinned);
    println!("CHILD-OK");
}

#[test]
fn an_id_space_in_per_cpu_mode_keeps_working_in_the_child() {
    // A process of its own, as above.
    const NAME: &str = "an_id_space_in_per_cpu_mode_keeps_working_in_the_child";
    if !common::child::is_child(NAME) {
        common::child::assert_child_passes(module_path!(), NAME);
        return;
    }
    let sched = Scheduler::new().unwrap();
    let ids = Arc::new(nicework::IdSpace::new(&sched));
    nicework::hooks::count_cpus_as(&ids, Some(1));
    nicework::hooks::switch_id_mode(&ids, true);
    // The forking thread holds a borrowed id across the forks, and so does a thread that
    // is parked inside `with` (it does not exist in the child: its id stays held there).
    let pinned = ids.enter();
    let forking_thread_id = pinned.get();
    let slots = Arc::new(nicework::PerCid::new(&ids, || 0u64));
    let (parked_tx, parked_id) = std::sync::mpsc::channel();
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let parked = {
        let (ids, slots) = (ids.clone(), slots.clone());
        std::thread::spawn(move || {
            slots.with(|n| {
                *n += 1;
                parked_tx.send(ids.enter().get()).unwrap();
                wait.recv().unwrap();
            })
        })
    };
    let parked_id = parked_id.recv().unwrap();
    // Another thread borrows and gives back ids without the lock, and takes the lock for
    // each new `PerCid`, so a fork may land in either.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, ids) = (stop.clone(), ids.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let fresh = nicework::PerCid::new(&ids, || 0u64);
                for _ in 0..100 {
                    fresh.with(|n| *n += 1);
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..10 {
        let code = in_child(|| {
            let same = ids.enter().get() == forking_thread_id;
            let child_ids: Vec<usize> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            let mut seen = Vec::new();
                            for _ in 0..50 {
                                let cid = ids.enter();
                                slots.with(|n| *n += 1);
                                seen.push(cid.get());
                            }
                            seen
                        })
                    })
                    .collect();
                threads
                    .into_iter()
                    .flat_map(|t| t.join().unwrap())
                    .collect()
            });
            let clear = child_ids
                .iter()
                .all(|&id| id != forking_thread_id && id != parked_id);
            if same && clear {
                0
            } else {
                eprintln!(
                    "same {same}, ids {child_ids:?} (forking {forking_thread_id}, parked {parked_id})"
                );
                1
            }
        });
        assert_eq!(code, 0, "a check failed in the child");
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    release.send(()).unwrap();
    parked.join().unwrap();
    drop(pinned);
    println!("CHILD-OK");
}

/// A pipe whose write end callbacks use to report which process ran them.
struct Reports {
    read: libc::c_int,
    write: libc::c_int,
}

impl Reports {
    fn new() -> Reports {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid out-array of two ints. (`pipe` and `fcntl` rather than
        // `pipe2`, which macOS lacks; a test that execs in between may leak the pair into
        // its child, which only holds them open until it exits.)
        let rc = unsafe { libc::pipe(fds.as_mut_ptr()) };
        assert_eq!(rc, 0, "pipe failed");
        for fd in fds {
            // SAFETY: `fd` is a descriptor just opened.
            unsafe {
                assert_eq!(libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC), 0);
                assert_eq!(libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK), 0);
            }
        }
        Reports {
            read: fds[0],
            write: fds[1],
        }
    }

    /// Writes the calling process's pid (one 4-byte record; atomic below PIPE_BUF).
    fn report(write: libc::c_int) {
        // SAFETY: plain system call.
        let pid = unsafe { libc::getpid() };
        let bytes = pid.to_ne_bytes();
        // SAFETY: `bytes` is valid for its length; a full pipe just drops the record,
        // which only makes the assertions below weaker, never wrong.
        unsafe { libc::write(write, bytes.as_ptr().cast(), bytes.len()) };
    }

    /// Every pid reported so far.
    fn drain(&self) -> Vec<libc::pid_t> {
        let mut pids = Vec::new();
        let mut bytes = [0u8; 4];
        // SAFETY: reads into a valid 4-byte buffer; the pipe is non-blocking.
        while unsafe { libc::read(self.read, bytes.as_mut_ptr().cast(), 4) } == 4 {
            pids.push(libc::pid_t::from_ne_bytes(bytes));
        }
        pids
    }
}

impl Drop for Reports {
    fn drop(&mut self) {
        // SAFETY: closes our own descriptors once.
        unsafe {
            libc::close(self.read);
            libc::close(self.write);
        }
    }
}

#[test]
fn fork_inside_a_callback_runs_nothing_more_in_the_child_and_leaves_the_parents_timer_alone() {
    let sched = Scheduler::builder().workers(1).build().unwrap();
    let reports = Reports::new();
    let write = reports.write;
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let ticks = ticks.clone();
        sched.every(Duration::from_millis(1), move |_| {
            Reports::report(write);
            ticks.fetch_add(1, Ordering::SeqCst);
            Next::Again
        })
    };
    assert!(common::eventually(|| ticks.load(Ordering::SeqCst) > 3));
    let child = Arc::new(std::sync::atomic::AtomicI32::new(0));
    let forker = {
        let child = child.clone();
        sched.work(move |_| {
            // SAFETY: fork on a worker thread; in the child this thread only returns into
            // nicework, which must end it without running anything else.
            let pid = unsafe { libc::fork() };
            if pid > 0 {
                child.store(pid, Ordering::SeqCst);
            }
            Next::Again
        })
    };
    assert!(forker.schedule(Duration::ZERO));
    assert!(common::eventually(|| child.load(Ordering::SeqCst) != 0));
    let pid = child.load(Ordering::SeqCst);
    assert_eq!(
        wait_for_child(pid),
        0,
        "the child's worker did not end cleanly"
    );
    forker.cancel_sync();
    // The child is gone; everything it could have run has been reported.
    let reported = reports.drain();
    assert!(
        !reported.contains(&pid),
        "the child ran the parent's works ({} runs)",
        reported.iter().filter(|&&p| p == pid).count()
    );
    // The parent's worker goes on.
    let before = ticks.load(Ordering::SeqCst);
    assert!(common::eventually(
        || ticks.load(Ordering::SeqCst) > before + 5
    ));
    drop(ticker);
}

/// Forks inside a callback run by `drive` on this thread; in the child, checks that
/// `drive` returned to us without running `other` and exits with the verdict.
fn fork_inside_a_callback_on_the_caller(drive: impl FnOnce(&Scheduler, &nicework::Work)) {
    let sched = Scheduler::manual();
    let parent = std::process::id();
    let other_runs = Arc::new(AtomicU64::new(0));
    let other = {
        let other_runs = other_runs.clone();
        sched.every(Duration::from_millis(2), move |_| {
            other_runs.fetch_add(1, Ordering::SeqCst);
            Next::Again
        })
    };
    let child = Arc::new(std::sync::atomic::AtomicI32::new(0));
    let increments = Arc::new(AtomicU64::new(0));
    let forker = {
        let (child, increments) = (child.clone(), increments.clone());
        sched.work(move |_| {
            if increments.fetch_add(1, Ordering::SeqCst) > 0 {
                return if increments.load(Ordering::SeqCst) < 3 {
                    Next::Yield
                } else {
                    Next::Park
                };
            }
            // SAFETY: fork; the child returns into nicework and then to the test code
            // below, which leaves through `_exit`.
            let pid = unsafe { libc::fork() };
            if pid > 0 {
                child.store(pid, Ordering::SeqCst);
            }
            Next::Yield
        })
    };
    assert!(forker.schedule(Duration::from_millis(1)));
    drive(&sched, &forker);
    if std::process::id() != parent {
        // The child: nicework returned after the forking run without running anything.
        let ok = other_runs.load(Ordering::SeqCst) == 0 && increments.load(Ordering::SeqCst) == 1;
        // SAFETY: ends the child without running the parent's atexit handlers or tests.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let pid = child.load(Ordering::SeqCst);
    assert_ne!(pid, 0);
    assert_eq!(
        wait_for_child(pid),
        0,
        "the child ran more after fork in a callback"
    );
    assert_eq!(
        increments.load(Ordering::SeqCst),
        3,
        "the parent's run went on"
    );
    drop(other);
}

#[test]
fn fork_inside_a_callback_under_advance_returns_to_the_caller_in_the_child() {
    fork_inside_a_callback_on_the_caller(|sched, _| {
        sched.advance(Duration::from_millis(4));
    });
}

#[test]
fn fork_inside_a_callback_under_flush_returns_to_the_caller_in_the_child() {
    fork_inside_a_callback_on_the_caller(|_, forker| {
        assert!(forker.flush());
    });
}

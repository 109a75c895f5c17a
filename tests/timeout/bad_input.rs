//! Bad input and odd timing: zero/huge delays and idles on real schedulers, calls after
//! the scheduler is dropped, names renamed while running, fork while names change.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use common::{assert_inert, eventually};
use nicework::{Next, Scheduler};

fn sched() -> Scheduler {
    Scheduler::builder().workers(2).build().unwrap()
}

#[test]
fn zero_and_max_delays_and_idles_on_a_real_scheduler() {
    let sched = sched();
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    let zero = sched.timeout(Duration::ZERO, move |_| {
        r.fetch_add(1, SeqCst);
        Next::Park
    });
    assert!(
        eventually(|| runs.load(SeqCst) >= 1),
        "a zero idle never ran"
    );
    zero.touch();
    assert!(
        eventually(|| runs.load(SeqCst) >= 2),
        "a touched zero idle never ran"
    );
    let never = Arc::new(AtomicU64::new(0));
    let n = never.clone();
    let huge = sched.timeout(Duration::MAX, move |_| {
        n.fetch_add(1, SeqCst);
        Next::Again
    });
    for _ in 0..1000 {
        huge.touch();
    }
    assert!(huge.reschedule(Duration::MAX));
    assert!(!huge.schedule(Duration::MAX));
    let w = sched.work(|_| Next::Again);
    assert!(!w.reschedule(Duration::MAX));
    assert!(w.reschedule(Duration::from_secs(u64::MAX / 2)));
    assert!(w.cancel());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(never.load(SeqCst), 0);
    assert!(huge.is_pending());
}

#[test]
fn calls_after_the_scheduler_is_dropped_are_inert() {
    let sched = sched();
    let a = sched.timeout(Duration::from_millis(5), |_| Next::Again);
    let b = sched.every(Duration::from_secs(3600), |_| Next::Again);
    let c = sched.work(|_| Next::Again).named("c");
    c.reschedule(Duration::from_secs(3600));
    drop(sched);
    for w in [&a, &b, &c] {
        assert_inert(w);
        w.touch();
        assert!(!w.is_pending());
    }
    assert_eq!(c.name(), "c");
}

/// Renamed by several threads while it runs and while its name is read (in the callback
/// too): no crash, the final name is one of the names given.
#[test]
fn named_works_renamed_concurrently_while_running() {
    let sched = sched();
    let reads = Arc::new(AtomicU64::new(0));
    let r = reads.clone();
    let work = Arc::new(std::sync::Mutex::new(Some(
        sched
            .work(move |cx| {
                assert!(!cx.name().is_empty());
                r.fetch_add(1, SeqCst);
                Next::After(Duration::from_micros(50))
            })
            .named("start"),
    )));
    work.lock()
        .unwrap()
        .as_ref()
        .unwrap()
        .schedule(Duration::ZERO);
    let mut threads = Vec::new();
    for t in 0..4 {
        let work = work.clone();
        threads.push(std::thread::spawn(move || {
            for i in 0..2000 {
                let mut g = work.lock().unwrap();
                let w = g.take().unwrap();
                let w = w.named(format!("t{t}-{i}"));
                assert!(w.name().starts_with('t'));
                *g = Some(w);
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert!(eventually(|| reads.load(SeqCst) > 10));
}

/// fork() while other threads name works: the child reads a named work's name (the name
/// table's spin lock must not be inherited held) and exits 0.
// `fork()` is unix's.
#[cfg(unix)]
#[test]
fn fork_while_other_threads_name_works() {
    use nicework::Work;
    use std::sync::atomic::AtomicBool;

    let sched = sched();
    let named = sched.work(|_| Next::Park).named("the-named-one");
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for t in 0..3 {
        let (sched, stop) = (sched.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(SeqCst) {
                let w: Work = sched.work(|_| Next::Park).named(format!("n{t}-{i}"));
                let _ = w.name().len();
                drop(w);
                i += 1;
            }
        }));
    }
    for round in 0..200 {
        // SAFETY: the child only reads a name, then calls _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = named.name() == "the-named-one";
            // SAFETY: _exit is async-signal-safe and ends the child at once.
            unsafe { libc::_exit(if ok { 0 } else { 3 }) };
        }
        let mut status = 0;
        let mut waited = 0;
        // The child must finish: a deadlock shows as a child that never exits.
        let done = eventually(|| {
            // SAFETY: plain waitpid on our own child.
            let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            waited = rc;
            rc == pid
        });
        if !done {
            // SAFETY: kill our own child, then reap it.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
        }
        assert!(
            done,
            "round {round}: the forked child hung (name lock held across fork?)"
        );
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "round {round}: child status {status}"
        );
    }
    stop.store(true, SeqCst);
    for t in threads {
        t.join().unwrap();
    }
}

//! A child forked inside a callback may still wait from inside that callback (on a fresh
//! scheduler, say) while parent threads were using the process-wide wait-for graph at the
//! fork: the child gets a graph of its own and never blocks on the parent's lock.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

#[test]
fn a_child_waiting_inside_the_forking_callback_never_blocks_on_the_parents_wait_graph() {
    // Hammer: X waits for Y (edge X -> Y); Y flushes X in a tight loop: every call takes
    // the GRAPH lock, finds the cycle and returns at once.
    let hammer = Scheduler::builder().workers(2).build().unwrap();
    let (sx, sy): (Arc<OnceLock<Work>>, Arc<OnceLock<Work>>) =
        (Arc::new(OnceLock::new()), Arc::new(OnceLock::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let y_in = Arc::new(AtomicBool::new(false));
    let (sy2, yi) = (sy.clone(), y_in.clone());
    let x = hammer.work(move |_| {
        while !yi.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        sy2.get().unwrap().flush();
        Next::Park
    });
    let (sx2, yi, st) = (sx.clone(), y_in.clone(), stop.clone());
    let y = hammer.work(move |_| {
        yi.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        while !st.load(Ordering::Relaxed) {
            sx2.get().unwrap().flush();
        }
        Next::Park
    });
    sx.set(x).ok().unwrap();
    sy.set(y).ok().unwrap();
    sy.get().unwrap().schedule(Duration::ZERO);
    sx.get().unwrap().schedule(Duration::ZERO);
    std::thread::sleep(Duration::from_millis(200));

    let forker = Scheduler::new().unwrap();
    let child_pid = Arc::new(AtomicI32::new(0));
    let cp = child_pid.clone();
    let f = forker.work(move |_| {
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // Child, still inside the callback: do "work of its own" with a fresh scheduler.
            let fresh = Scheduler::new().unwrap();
            let w = fresh.work(|_| {
                std::thread::sleep(Duration::from_millis(20));
                Next::Park
            });
            w.schedule(Duration::ZERO);
            let start = Instant::now();
            while !w.is_running() && start.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_micros(100));
            }
            if std::env::var_os("ATTACK_CONTROL").is_none() {
                w.flush(); // from inside a callback: takes the GRAPH lock
            } else {
                while w.is_running() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            unsafe { libc::_exit(0) };
        }
        cp.store(pid, Ordering::SeqCst);
        Next::Park
    });
    f.schedule(Duration::from_secs(3600));
    let mut hung = 0;
    let tries = 40;
    for _ in 0..tries {
        child_pid.store(0, Ordering::SeqCst);
        assert!(f.flush()); // pending: runs the forking callback on this thread
        let pid = child_pid.load(Ordering::SeqCst);
        if pid <= 0 {
            continue;
        }
        let start = Instant::now();
        loop {
            let mut status = 0;
            let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if done == pid {
                break;
            }
            if start.elapsed() > Duration::from_secs(5) {
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                hung += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        f.schedule(Duration::from_secs(3600));
    }
    stop.store(true, Ordering::SeqCst);
    eprintln!("children hung: {hung}/{tries}");
    assert_eq!(
        hung, 0,
        "{hung}/{tries} forked children hung on the wait-for graph lock"
    );
}

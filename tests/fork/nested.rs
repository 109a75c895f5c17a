//! `fork()` inside a callback C that runs nested, because callback A (on a worker)
//! flushed it: in the child, nicework runs nothing more, including the rest of A.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler, Work};

#[test]
fn fork_in_a_nested_callback_ends_the_outer_callback_in_the_child_too() {
    let mut fds = [0i32; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (rd, wr) = (fds[0], fds[1]);
    unsafe { libc::fcntl(rd, libc::F_SETFL, libc::O_NONBLOCK) };
    let sched = Scheduler::new().unwrap();
    let child = Arc::new(AtomicI32::new(0));
    let ch = child.clone();
    let c = sched.work(move |_| {
        let pid = unsafe { libc::fork() };
        if pid > 0 {
            ch.store(pid, Ordering::SeqCst);
        }
        Next::Park
    });
    let sc: Arc<OnceLock<Work>> = Arc::new(OnceLock::new());
    let sc2 = sc.clone();
    let a = sched.work(move |_| {
        sc2.get().unwrap().flush();
        // user side effect after the flush
        let pid = unsafe { libc::getpid() };
        unsafe { libc::write(wr, (&pid as *const i32).cast(), 4) };
        Next::Park
    });
    sc.set(c).ok().unwrap();
    sc.get().unwrap().schedule(Duration::from_secs(3600));
    a.schedule(Duration::ZERO);
    let start = Instant::now();
    while child.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let cpid = child.load(Ordering::SeqCst);
    assert!(cpid > 0);
    let mut status = 0;
    let start = Instant::now();
    loop {
        if unsafe { libc::waitpid(cpid, &mut status, libc::WNOHANG) } == cpid {
            break;
        }
        if start.elapsed() > Duration::from_secs(5) {
            unsafe {
                libc::kill(cpid, libc::SIGKILL);
                libc::waitpid(cpid, &mut status, 0)
            };
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut pids = Vec::new();
    loop {
        let mut v = 0i32;
        let n = unsafe { libc::read(rd, (&mut v as *mut i32).cast(), 4) };
        if n != 4 {
            break;
        }
        pids.push(v);
    }
    eprintln!(
        "parent {} child {} callback-A side effects from pids {:?}",
        unsafe { libc::getpid() },
        cpid,
        pids
    );
    assert!(
        !pids.contains(&cpid),
        "callback A kept running in the forked child"
    );
}

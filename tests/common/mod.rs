//! Helpers shared by the integration tests. No helper asserts a timing: waits are liveness
//! bounds (generous timeouts) and measurements are counts.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous bound for "eventually": far above any expected latency, so only a hang fails.
pub const EVENTUALLY: Duration = Duration::from_secs(20);

/// Polls `cond` until it holds or `EVENTUALLY` passes; returns whether it held.
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < EVENTUALLY {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cond()
}

/// Sets its flag when dropped: captured by a closure, it tells when the closure was freed.
pub struct DropFlag(pub Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

pub fn drop_flag() -> (DropFlag, Arc<AtomicBool>) {
    let flag = Arc::new(AtomicBool::new(false));
    (DropFlag(flag.clone()), flag)
}

/// The calling thread's kernel id.
pub fn gettid() -> i32 {
    // SAFETY: plain system call.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Thread `tid`'s nice value.
pub fn nice_of(tid: i32) -> i32 {
    // SAFETY: plain system call with integer arguments.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) }
}

/// Thread `tid`'s scheduling policy.
pub fn policy_of(tid: i32) -> i32 {
    // SAFETY: plain system call with an integer argument.
    unsafe { libc::sched_getscheduler(tid) }
}

/// The calling thread's nice value.
pub fn current_nice() -> i32 {
    nice_of(gettid())
}

/// The calling thread's scheduling policy.
pub fn current_policy() -> i32 {
    // SAFETY: plain system call; 0 is the calling thread.
    unsafe { libc::sched_getscheduler(0) }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Re-executes this test binary's ignored test `test` as user 65534 (nobody) under
/// `setpriv --reuid=65534 --regid=65534 --clear-groups`, after `prefix` (for example
/// `["prlimit", "--nice=15:15"]`), and asserts that it ran and passed. Returns `false`
/// with a printed reason when that is impossible (not root, or a tool is missing).
pub fn run_unprivileged(test: &str, prefix: &[&str]) -> bool {
    if !is_root() {
        println!("skipped the unprivileged re-run of {test}: not running as root");
        return false;
    }
    for tool in ["setpriv"].iter().chain(prefix.first()) {
        if std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_err()
        {
            println!("skipped the unprivileged re-run of {test}: {tool} is not installed");
            return false;
        }
    }
    if let Some((program, rest)) = prefix.split_first() {
        let works = std::process::Command::new(program)
            .args(rest)
            .arg("true")
            .status()
            .is_ok_and(|status| status.success());
        if !works {
            println!("skipped the unprivileged re-run of {test}: `{prefix:?} true` fails here");
            return false;
        }
    }
    let exe = std::env::current_exe().unwrap();
    let (program, rest) = prefix.split_first().unwrap_or((&"setpriv", &[]));
    let mut command = std::process::Command::new(program);
    command.args(rest);
    if !prefix.is_empty() {
        command.arg("setpriv");
    }
    let output = command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args(["--exact", test, "--include-ignored", "--nocapture"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "unprivileged run failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "the unprivileged test did not run:\n{text}"
    );
    print!("{text}");
    true
}

/// Asserts that `work` is inert, as after its scheduler was dropped: every arming call
/// returns false and leaves it unarmed, and nothing waits.
pub fn assert_inert(work: &nicework::Work) {
    assert!(!work.is_pending() && !work.is_running());
    assert!(!work.schedule(Duration::ZERO));
    assert!(!work.reschedule(Duration::ZERO));
    work.touch();
    assert!(!work.is_pending());
    assert!(!work.flush());
    assert!(!work.cancel());
    assert!(!work.cancel_sync());
    assert!(!work.disable());
    work.enable();
}

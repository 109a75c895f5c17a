//! Helpers shared by the integration tests. No helper asserts a timing: waits are liveness
//! bounds (generous timeouts) and measurements are counts.
#![allow(dead_code)]

pub mod child;
pub mod counted;
pub mod events;
pub mod percid;
pub mod wakers;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// A small deterministic generator (xorshift), so randomized tests need no dependency and
/// repeat with their seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
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

/// Whether this thread has `CAP_SYS_NICE` in its effective set.
pub fn has_cap_sys_nice() -> bool {
    const CAP_SYS_NICE: u32 = 23;
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("CapEff:"))
                .and_then(|caps| u64::from_str_radix(caps.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0)
}

/// Set, to the test's name, in the environment of a test's re-run as user 65534.
const RERUN_AS_NOBODY: &str = "NICEWORK_TEST_RERUN_AS_UID_65534";

/// Where a test that must run as user 65534 (nobody) does its checks.
#[derive(Debug, PartialEq, Eq)]
pub enum AsNobody {
    /// This process is the re-run as user 65534: do the checks here.
    Here,
    /// This (root) process re-ran the test as user 65534, and that run passed.
    Passed,
}

/// For a test that checks what an unprivileged user sees: re-executes this test binary's
/// test `test` (the caller's own name) as user 65534 under
/// `setpriv --reuid=65534 --regid=65534 --clear-groups`, after `prefix` (for example
/// `["prlimit", "--nice=15:15"]`), and asserts that it ran and passed. In that re-run it
/// returns [`AsNobody::Here`].
///
/// Returns `Err` with the reason when the re-run is impossible here: not root, a tool is
/// missing, or `prefix` fails (`prlimit` raising a hard limit needs `CAP_SYS_RESOURCE`).
/// A test that may be skipped so says what it needs in its name, or is `#[ignore]`d.
pub fn as_uid_65534(test: &str, prefix: &[&str]) -> Result<AsNobody, String> {
    if std::env::var(RERUN_AS_NOBODY).is_ok_and(|name| name == test) {
        assert!(!is_root(), "the re-run of {test} still runs as root");
        return Ok(AsNobody::Here);
    }
    if !is_root() {
        return Err(format!("{test} needs root to re-run itself as user 65534"));
    }
    for tool in ["setpriv"].iter().chain(prefix.first()) {
        if std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_err()
        {
            return Err(format!("{test} needs {tool}, which is not installed"));
        }
    }
    if let Some((program, rest)) = prefix.split_first() {
        let works = std::process::Command::new(program)
            .args(rest)
            .arg("true")
            .status()
            .is_ok_and(|status| status.success());
        if !works {
            return Err(format!(
                "{test} needs `{prefix:?} true` to work, and it fails here"
            ));
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
        .env(RERUN_AS_NOBODY, test)
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
    Ok(AsNobody::Passed)
}

/// Drops this process's `RLIMIT_NICE` to 0 (soft and hard; lowering needs no right), so
/// that without `CAP_SYS_NICE` it may not lower any thread's nice.
pub fn drop_rlimit_nice() {
    use nix::sys::resource::{Resource, setrlimit};
    setrlimit(Resource::RLIMIT_NICE, 0, 0).expect("lowering RLIMIT_NICE");
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

/// Keeps the panics a test plants (their message starts with `prefix`) out of the output;
/// other panics still print. Installs the hook once per test binary.
pub fn quiet_panics_starting_with(prefix: &'static str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if !text.starts_with(prefix) {
                previous(info);
            }
        }));
    });
}

/// The name libtest knows a test by, for `--exact` in a child process: `module_path!()`
/// of the test's module without the binary's own name, then the test's name.
pub fn exact_name(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

/// Spins (politely: a yield every 64 polls) until `cond` holds or `bound` passes; returns
/// whether it held. For waits whose other side is a busy thread, where [`eventually`]'s
/// 1 ms sleeps would make a round of a race test slow.
pub fn spin_until(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let mut spins = 0u32;
    while !cond() {
        if start.elapsed() > bound {
            return cond();
        }
        spins += 1;
        if spins % 64 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    true
}

/// The verdict of a race test: no round broke `promise` (the count is printed either
/// way, for measuring rates).
pub fn assert_no_round_broke(promise: &str, broke: usize, rounds: usize, detail: &str) {
    eprintln!("{promise}: broken in {broke} of {rounds} rounds {detail}");
    assert_eq!(
        broke, 0,
        "{promise}: broken in {broke} of {rounds} rounds {detail}"
    );
}

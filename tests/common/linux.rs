//! Test helpers for what only Linux has: kernel thread ids and their scheduling states in
//! `/proc`, per-thread nice values and scheduling policies, CPU affinity, capabilities,
//! `RLIMIT_NICE`, and re-running a test as another user.

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

/// The scheduling state of thread `tid` of this process (`R`, `S`, `D`, ...): `S` while it
/// sleeps, in a wait for a run, say.
pub fn thread_state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Two CPUs this thread may run on, if it may run on two: racing threads pinned to them
/// run at the same time whenever both are runnable.
pub fn two_cpus() -> Option<(usize, usize)> {
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    let mut allowed = (0..libc::CPU_SETSIZE as usize).filter(|&cpu| {
        // SAFETY: `cpu` is below CPU_SETSIZE.
        unsafe { libc::CPU_ISSET(cpu, &set) }
    });
    Some((allowed.next()?, allowed.next()?))
}

/// Restricts the calling thread to `cpu`.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
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

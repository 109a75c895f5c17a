//! Tests whose failure would be an abort or a hang run their body in a child process:
//! the test re-runs this test binary with its own name, and the child, which finds its
//! name in `NICEWORK_TEST_CHILD`, runs the body and prints `CHILD-OK` last. And a thread
//! whose thread-local destructor runs after nicework's own, for the late-destructor
//! cases.

use std::cell::RefCell;
use std::thread;
use std::time::{Duration, Instant};

use nicework::{Next, Scheduler};

/// The variable that names the test a child process runs.
pub const CHILD_VAR: &str = "NICEWORK_TEST_CHILD";

/// Whether this process is the child that runs test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD_VAR).as_deref() == Ok(name)
}

/// How a child process running one test ended.
pub struct ChildRun {
    /// It exited by itself within 30 s (else it was killed as hung).
    pub finished: bool,
    pub status: std::process::ExitStatus,
    /// Its standard output, then its standard error.
    pub text: String,
}

/// Runs test `name` of the module at `module_path` (pass `module_path!()`) again in a
/// child process with `CHILD_VAR` naming it; a child still running after 30 s is killed.
pub fn run(module_path: &str, name: &str) -> ChildRun {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &super::exact_name(module_path, name),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, name)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let finished = loop {
        if child.try_wait().unwrap().is_some() {
            break true;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            break false;
        }
        thread::sleep(Duration::from_millis(2));
    };
    let output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    ChildRun {
        finished,
        status: output.status,
        text,
    }
}

/// [`run`]s test `name` in a child process and asserts that it exited successfully
/// within 30 s after printing `CHILD-OK`.
pub fn assert_child_passes(module_path: &str, name: &str) {
    let child = run(module_path, name);
    assert!(
        child.finished && child.status.success() && child.text.contains("CHILD-OK"),
        "the child running {name} hung, died or failed ({:?}):\n{}",
        child.status,
        child.text
    );
}

/// Runs its closure when dropped, inside a thread-local's destructor.
struct Late(Option<Box<dyn FnOnce() + Send>>);

impl Drop for Late {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

thread_local! {
    static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
}

/// Spawns a thread that runs `f` in a thread-local destructor that runs after nicework's
/// own thread-locals were destroyed: `LATE` is registered first (so it is destroyed
/// last), then a flush on a manual scheduler makes nicework use its thread-locals.
pub fn in_a_late_destructor(f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        LATE.with(|_| {}); // registered first, destroyed last
        let manual = Scheduler::manual();
        let work = manual.work(|_| Next::Park);
        work.schedule(Duration::ZERO);
        assert!(work.flush()); // ran on this thread: nicework's thread-locals exist now
        drop(work);
        drop(manual);
        LATE.with(|late| *late.borrow_mut() = Some(Late(Some(Box::new(f)))));
    })
}

/// Prints every thread's stack of hung child `pid` with `gdb`, where it is installed, so
/// a hang says where it waits.
#[cfg(unix)]
fn print_stacks_of(pid: libc::pid_t) {
    let stacks = std::process::Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt",
        ])
        .output();
    if let Ok(stacks) = stacks {
        eprintln!(
            "the hung child's threads:\n{}",
            String::from_utf8_lossy(&stacks.stdout)
        );
    }
}

/// Waits for the `fork()`ed child `pid` at most `bound`: its exit code, or `None` if it
/// hung (it is then killed and reaped). A child killed by a signal fails the test.
#[cfg(unix)]
pub fn wait_for_forked_child(pid: libc::pid_t, bound: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; `pid` is the caller's child.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            assert!(
                libc::WIFEXITED(status),
                "the child died: status {status:#x}"
            );
            return Some(libc::WEXITSTATUS(status));
        }
        if start.elapsed() > bound {
            print_stacks_of(pid);
            // SAFETY: kills and reaps the caller's own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

//! Priorities and privilege: the library's users are not root. Building a worker above
//! the caller's priority succeeds exactly when the process may lower a nice value
//! (`CAP_SYS_NICE`, or an `RLIMIT_NICE` that allows it), and otherwise fails cleanly.
//! The tests run as root in CI, so the unprivileged side is also checked in a re-run of
//! this binary as user 65534 under `setpriv --reuid=65534 --regid=65534 --clear-groups`.

use crate::common;

use common::AsNobody;
use nicework::{Error, Priority, Scheduler};

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn nice_limit_allows(nice: i32) -> bool {
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NICE)
        .map(|(soft, _)| soft)
        .unwrap_or(0);
    limit as i64 >= 20 - nice as i64
}

/// Whether this process may run a thread at `nice`.
fn may_run_at(nice: i32) -> bool {
    common::has_cap_sys_nice() || nice_limit_allows(nice)
}

/// Builds a worker one step above the caller's priority and checks that it succeeds
/// exactly when the process may lower nice, and fails cleanly otherwise. Returns whether
/// the privileged (successful) side was the one checked.
fn check_raising_the_worker_above_the_callers_priority() -> bool {
    let current = common::current_nice();
    // At -20 there is nothing above.
    let above = Priority::Nice((current - 1).max(-20));
    let allowed = current <= -20 || may_run_at(current - 1);
    let threads = thread_count();
    let built = Scheduler::builder().priority(above).build();
    if allowed {
        assert!(built.is_ok(), "{above} with the right: {:?}", built.err());
        return true;
    }
    let err = built.expect_err("a worker above the caller's priority without the right");
    match &err {
        Error::Priority { priority, source } => {
            assert_eq!(*priority, above);
            assert!(matches!(
                source.raw_os_error(),
                Some(libc::EACCES | libc::EPERM)
            ));
        }
        other => panic!("expected a priority error, got {other:?}"),
    }
    assert!(
        err.to_string()
            .starts_with("cannot apply worker priority nice")
    );
    // The failed worker was joined before `build` returned, but the kernel may list an
    // exited thread in /proc for a moment after the join: wait for the count, which a
    // thread really left behind would never reach.
    assert!(
        common::eventually(|| thread_count() == threads),
        "a failed build left a thread behind: {} threads, {threads} before",
        thread_count()
    );
    for priority in [
        Priority::Nice(19),
        Priority::Nice(current),
        Priority::Idle,
        Priority::Normal,
    ] {
        let sched = Scheduler::builder().priority(priority).build();
        assert!(sched.is_ok(), "{priority}: {:?}", sched.err());
    }
    false
}

/// Runs in this process, whatever its privileges: as root (CI) it checks the privileged
/// side, as an ordinary user the unprivileged one.
#[test]
fn raising_the_worker_above_the_callers_priority_needs_privilege() {
    check_raising_the_worker_above_the_callers_priority();
}

/// The unprivileged side when the tests run as root: re-runs itself as user 65534 with
/// `RLIMIT_NICE` 0. Skipped (with a printed reason) where that is impossible: not root, or
/// no `setpriv`.
#[test]
fn as_uid_65534_raising_the_worker_above_the_callers_priority_fails_needs_root_and_setpriv() {
    match common::as_uid_65534(
        &common::exact_name(
            module_path!(),
            "as_uid_65534_raising_the_worker_above_the_callers_priority_fails_needs_root_and_setpriv",
        ),
        &[],
    ) {
        Ok(AsNobody::Here) => {
            common::drop_rlimit_nice();
            assert!(!common::has_cap_sys_nice(), "user 65534 has CAP_SYS_NICE");
            let privileged = check_raising_the_worker_above_the_callers_priority();
            assert!(!privileged, "user 65534 could lower its nice");
        }
        Ok(AsNobody::Passed) => {}
        Err(reason) => println!("skipped: {reason}"),
    }
}

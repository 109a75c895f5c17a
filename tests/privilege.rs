//! Priorities as an unprivileged user: the library's users are not root. When the tests
//! run as root, this binary re-executes its unprivileged part under
//! `setpriv --reuid=65534 --regid=65534 --clear-groups`.

mod common;

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

#[test]
fn raising_the_worker_above_the_callers_priority_needs_privilege() {
    if !common::is_root() {
        unprivileged_checks();
        return;
    }
    // As root (CAP_SYS_NICE) a negative nice is allowed.
    let sched = Scheduler::builder().priority(Priority::Nice(-5)).build();
    assert!(sched.is_ok(), "{:?}", sched.err());
    common::run_unprivileged("unprivileged", &[]);
}

#[test]
#[ignore = "run by raising_the_worker_above_the_callers_priority_needs_privilege"]
fn unprivileged() {
    unprivileged_checks();
}

fn unprivileged_checks() {
    assert!(!common::is_root());
    let current = common::current_nice();
    if current <= -20 || nice_limit_allows(current - 1) {
        println!("skipped: RLIMIT_NICE lets this user lower nice");
        return;
    }
    let threads = thread_count();
    let err = Scheduler::builder()
        .priority(Priority::Nice(current - 1))
        .build()
        .unwrap_err();
    match &err {
        Error::Priority { priority, source } => {
            assert_eq!(*priority, Priority::Nice(current - 1));
            assert!(matches!(
                source.raw_os_error(),
                Some(libc::EACCES | libc::EPERM)
            ));
        }
        other => panic!("expected a priority error, got {other:?}"),
    }
    assert!(err
        .to_string()
        .starts_with("cannot apply worker priority nice"));
    assert_eq!(
        thread_count(),
        threads,
        "a failed build left a thread behind"
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
}

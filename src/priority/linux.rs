//! Linux: nice values per thread, `SCHED_IDLE`, and the rights that let a flusher raise a
//! worker (lending).
//!
//! nice is per thread on Linux (`setpriority(PRIO_PROCESS, tid, n)`). An unprivileged
//! thread may always *raise* its nice (lower its priority) or enter `SCHED_IDLE`; going
//! the other way needs `CAP_SYS_NICE` or `RLIMIT_NICE ≥ 20 − n`.

use std::io;

use super::Priority;

/// A thread as lending names it: its kernel thread id.
pub(crate) type Tid = libc::pid_t;

/// Applies `priority` to the calling thread.
pub(crate) fn apply(priority: Priority) -> io::Result<()> {
    match priority {
        Priority::Normal => Ok(()),
        Priority::Nice(n) => set_nice(current_tid(), n),
        Priority::Idle => {
            // nice does not weigh under SCHED_IDLE, but a worker raised out of it for
            // a flusher must be able to return to its nice without privilege, and any
            // thread may raise its nice to 19.
            set_nice(current_tid(), 19)?;
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is a valid sched_param for the duration of the call;
            // pid 0 is the calling thread.
            let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
    }
}

/// The calling thread's kernel id.
pub(crate) fn current_tid() -> Tid {
    nix::unistd::gettid().as_raw()
}

/// Sets the nice value of thread `tid`.
pub(crate) fn set_nice(tid: Tid, nice: i32) -> io::Result<()> {
    // SAFETY: plain system call with integer arguments.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's nice value.
pub(crate) fn current_nice() -> io::Result<i32> {
    nice_of(current_tid())
}

/// Thread `tid`'s nice value.
pub(crate) fn nice_of(tid: Tid) -> io::Result<i32> {
    // getpriority returns -1 both as a nice value and as an error, so errno decides.
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: plain system call with integer arguments.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    let error = io::Error::last_os_error();
    if nice == -1 && error.raw_os_error().unwrap_or(0) != 0 {
        Err(error)
    } else {
        Ok(nice)
    }
}

/// Whether the calling thread runs under `SCHED_IDLE`.
pub(crate) fn current_is_idle() -> bool {
    // SAFETY: plain system call; pid 0 is the calling thread.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_IDLE }
}

/// The lowest nice value this process may give a thread: −20 with `CAP_SYS_NICE`,
/// `20 − RLIMIT_NICE` otherwise, `None` when that is above 19 (the default limit of 0:
/// nice can only go up, so a lowered priority can never be raised back).
///
/// Read once per scheduler at build time; a process that drops the capability later
/// makes a raise fail, and a failed raise only means the flusher waits.
pub(crate) fn raise_limit() -> Option<i32> {
    if has_cap_sys_nice() {
        return Some(-20);
    }
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NICE)
        .map(|(soft, _)| soft)
        .unwrap_or(0);
    // RLIMIT_NICE allows nice n when 20 − n ≤ limit.
    let floor = 20i64 - i64::try_from(soft).unwrap_or(i64::MAX).min(40);
    (floor <= 19).then_some(floor as i32)
}

/// `CAP_SYS_NICE` (bit 23) in the effective set, from `/proc/self/status`.
fn has_cap_sys_nice() -> bool {
    const CAP_SYS_NICE: u32 = 23;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0)
}

/// Raises thread `tid` to `nice` under `SCHED_OTHER` (leaving `SCHED_IDLE` if it was
/// there). The nice is set first: leaving `SCHED_IDLE` without privilege is allowed only
/// when the thread's nice is within `RLIMIT_NICE`, and `nice` is.
pub(crate) fn raise(tid: Tid, nice: i32, from_idle: bool) -> io::Result<()> {
    set_nice(tid, nice)?;
    if from_idle {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is valid for the call; `tid` names a thread of this process.
        let rc = unsafe { libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

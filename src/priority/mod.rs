//! Worker priorities: nice values and `SCHED_IDLE`, and the privilege rules around them.
//!
//! nice is per thread on Linux (`setpriority(PRIO_PROCESS, tid, n)`), so a worker applies
//! its priority to itself before it runs anything, and `build()` waits for that to
//! succeed. An unprivileged thread may always *raise* its nice (lower its priority) or
//! enter `SCHED_IDLE`; going the other way needs `CAP_SYS_NICE` or `RLIMIT_NICE ≥ 20 − n`.
//! So `Nice(n)` below the caller's nice fails without privilege, and that failure is a
//! build error, never a silent default.

use std::fmt;
use std::io;

use crate::Error;

/// The CPU priority of a scheduler's worker threads.
///
/// The default, `Nice(19)`, is the kernel's `MAX_NICE` that ktask/padata helpers use: the
/// workers only get CPU time the process's other threads leave over. Remember autogroup:
/// nice only orders threads of one process (session) against each other.
///
/// # Examples
///
/// ```
/// use nicework::{Priority, Scheduler};
///
/// assert_eq!(Priority::default(), Priority::Nice(19));
/// let sched = Scheduler::builder().priority(Priority::Idle).build()?;
/// assert_eq!(sched.priority(), Priority::Idle);
/// # Ok::<(), nicework::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// This nice value (−20 ..= 19; higher is lower priority).
    Nice(i32),
    /// `SCHED_IDLE`: runs only when nothing else wants the CPU (weight 3 against nice 19's
    /// 15). The worker's nice is set to 19 as well, which only matters while a flusher
    /// lends it priority (see [`Work::flush`](crate::Work::flush)).
    Idle,
    /// Leaves the nice the worker inherited from the thread that called `build()`.
    Normal,
}

impl Default for Priority {
    fn default() -> Self {
        Priority::Nice(19)
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Priority::Nice(n) => write!(f, "nice {n}"),
            Priority::Idle => f.write_str("SCHED_IDLE"),
            Priority::Normal => f.write_str("inherited"),
        }
    }
}

impl Priority {
    pub(crate) fn validate(self) -> Result<(), Error> {
        match self {
            Priority::Nice(n) if !(-20..=19).contains(&n) => Err(Error::InvalidPriority(n)),
            _ => Ok(()),
        }
    }

    /// Applies this priority to the calling thread.
    pub(crate) fn apply_to_current_thread(self) -> io::Result<()> {
        match self {
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
}

/// The calling thread's kernel id.
pub(crate) fn current_tid() -> libc::pid_t {
    nix::unistd::gettid().as_raw()
}

/// Sets the nice value of thread `tid`.
pub(crate) fn set_nice(tid: libc::pid_t, nice: i32) -> io::Result<()> {
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
pub(crate) fn nice_of(tid: libc::pid_t) -> io::Result<i32> {
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
pub(crate) fn raise(tid: libc::pid_t, nice: i32, from_idle: bool) -> io::Result<()> {
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

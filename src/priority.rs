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
    /// `SCHED_IDLE`: runs only when nothing else wants the CPU (weight 3 against nice 19's 15).
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

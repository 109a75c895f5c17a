//! Worker priorities: the public [`Priority`], and one file per OS for what it becomes
//! there and for the privilege rules around it.
//!
//! A worker applies its priority to itself before it runs anything, and `build()` waits
//! for that to succeed, so a priority the process may not set, or one the OS cannot
//! express, is a build error ([`Error::Priority`]), never a silent default.
//!
//! - `linux.rs`: nice values per thread and `SCHED_IDLE`; `Nice(n)` below the caller's
//!   nice needs `CAP_SYS_NICE` or `RLIMIT_NICE`. The only OS where a waiter lends its
//!   priority to a worker.
//! - `macos.rs`: QoS classes. `freebsd.rs`: the idle scheduling class. `windows.rs`:
//!   thread priorities. Each file's header has the table of what each `Priority`
//!   becomes.
//! - `unsupported.rs`: any other OS, where only `Priority::Normal` is expressible.
//! - `fixed.rs`: what lending needs, on the OSes where a priority is set once and never
//!   lent.

#[cfg(not(target_os = "linux"))]
mod fixed;
// One file per OS, always named `os` here.
#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(target_os = "macos", path = "macos.rs")]
#[cfg_attr(target_os = "freebsd", path = "freebsd.rs")]
#[cfg_attr(windows, path = "windows.rs")]
#[cfg_attr(
    not(any(
        target_os = "linux",
        target_os = "macos",
        target_os = "freebsd",
        windows
    )),
    path = "unsupported.rs"
)]
mod os;

#[cfg(all(test, target_os = "linux"))]
pub(crate) use os::nice_of;
// Loom builds start no workers, so nothing reads the raise limit there.
#[cfg_attr(all(loom, feature = "loom"), allow(unused_imports))]
pub(crate) use os::{
    Tid, current_is_idle, current_nice, current_tid, raise, raise_limit, set_nice,
};

use std::fmt;
use std::io;

use crate::Error;

/// The CPU priority of a scheduler's worker threads.
///
/// The default, `Nice(19)`, is the kernel's `MAX_NICE` that ktask/padata helpers use: the
/// workers only get CPU time the process's other threads leave over. Remember autogroup:
/// nice only orders threads of one process (session) against each other.
///
/// On Linux these are nice values and `SCHED_IDLE`. Elsewhere each becomes the nearest
/// per-thread priority the OS has, and the lowest ones (`Nice(19)`, `Idle`) the lowest
/// an unprivileged process may set:
///
/// | `Priority` | macOS (QoS class) | Windows (thread priority) | FreeBSD |
/// |---|---|---|---|
/// | `Nice(19)`, `Idle` | `BACKGROUND` | `IDLE` | idle class, level 31 (see below) |
/// | `Nice(10..=18)` | `UTILITY` | `LOWEST` | error |
/// | `Nice(1..=9)` | `UTILITY` | `BELOW_NORMAL` | error |
/// | `Nice(0)` | `DEFAULT` | `NORMAL` | unchanged |
/// | `Nice(-9..=-1)` | `USER_INITIATED` | `ABOVE_NORMAL` | error |
/// | `Nice(-20..=-10)` | `USER_INITIATED` | `HIGHEST` | error |
/// | `Normal` | unchanged | unchanged | unchanged |
///
/// "error" is an [`Error::Priority`] from `build()` with an `Unsupported` source: FreeBSD
/// has no per-thread nice. Its idle class needs privilege unless the sysctl
/// `security.bsd.unprivileged_idprio` is 1; without either, `Nice(19)` and `Idle` fail
/// with `EPERM`, and such a process asks for `Normal`. On other OSes only `Normal` is
/// expressible. Lending (a waiter raising the worker it waits for) is Linux-only.
///
/// # A callback that holds what the foreground needs
///
/// Low priority is free only while nobody waits for the worker. nicework lends priority
/// only through its own waits (`flush`, `cancel_sync`, drop). A callback that holds a lock
/// the foreground threads take (a cache's maintenance lock, its map) runs at nice 19
/// *with* that lock: when it is preempted, every thread that needs the lock waits for a
/// thread that only gets leftover CPU. A real cache measured it: inserts stalled up to
/// 92 ms, against 15 ms with the cache alone. The remedies, from the cheapest:
///
/// - **The waiting side calls [`flush`](crate::Work::flush).** A writer that cannot go on
///   (a full write log) waits anyway; `flush` runs the work on the writer or waits for
///   the run in progress, and lends the writer's priority to the worker where the
///   process may. Readers, who may go on, call at most
///   [`try_flush`](crate::Work::try_flush).
/// - **Run while the object is quiet**: a [`timeout`](crate::Scheduler::timeout) that
///   every write [`touch`](crate::Work::touch)es runs once the writes stop, so it never
///   holds the lock while writers want it.
/// - **End the batch on contention**: between batches ask
///   [`Ctx::contended`](crate::Ctx::contended), and when it is true release the lock and
///   return [`Next::Yield`](crate::Next::Yield).
/// - **A `Normal` scheduler** for that work, when its lock is on the foreground's hot
///   path and none of the above fits.
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

    /// Applies this priority to the calling thread; a priority this OS cannot express
    /// is an `Unsupported` error.
    pub(crate) fn apply_to_current_thread(self) -> io::Result<()> {
        os::apply(self)
    }
}

//! The crate's one error type.
//!
//! Every public call that can be given bad input returns [`Error`] (or a documented
//! result such as `false`). The few calls that panic are programming errors, each
//! documented under `# Panics`: `Scheduler::advance` on a scheduler with worker
//! threads, re-entrant misuse of one `PerCid` on one thread, and `global()` when no
//! scheduler can be started at all. `Display` is lower-case and names the
//! offending value, as in crossbeam's `err.rs`.

use std::fmt;
use std::io;

use crate::Priority;

/// What went wrong when building a [`Scheduler`](crate::Scheduler).
///
/// # Examples
///
/// ```
/// use nicework::{Error, Scheduler};
///
/// let err = Scheduler::builder().workers(0).build().unwrap_err();
/// assert!(matches!(err, Error::InvalidWorkers(0)));
/// assert_eq!(err.to_string(), "invalid worker count 0: it must be between 1 and 256");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// `workers(n)` with `n == 0` or above [`MAX_WORKERS`](crate::MAX_WORKERS).
    InvalidWorkers(usize),
    /// `Priority::Nice(n)` with `n` outside `-20..=19`.
    InvalidPriority(i32),
    /// The thread name prefix contains a NUL byte.
    InvalidName(String),
    /// The worker thread could not apply its priority to itself: typically the process
    /// may not lower its nice value (no `CAP_SYS_NICE`, `RLIMIT_NICE` too low), or the OS
    /// cannot express the priority (an `io::ErrorKind::Unsupported` source; see
    /// [`Priority`] for what each becomes on each OS).
    Priority {
        /// The priority that was asked for.
        priority: Priority,
        /// What the kernel said.
        source: io::Error,
    },
    /// The timer or a worker thread could not be created.
    Io(io::Error),
    /// The operation is not available in this build (real schedulers in loom models).
    Unsupported(&'static str),
    /// A builder setting that only worker threads have (`workers`, `priority`) was set
    /// for [`build_hosted`](crate::Builder::build_hosted): the host's own threads run a
    /// hosted scheduler's works, at the host's priority.
    NotHosted(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidWorkers(n) => write!(
                f,
                "invalid worker count {n}: it must be between 1 and {}",
                crate::MAX_WORKERS
            ),
            Error::InvalidPriority(n) => {
                write!(f, "invalid nice value {n}: it must be between -20 and 19")
            }
            Error::InvalidName(name) => {
                write!(f, "invalid thread name {name:?}: it contains a NUL byte")
            }
            Error::Priority { priority, source } => {
                write!(f, "cannot apply worker priority {priority}: {source}")
            }
            Error::Io(source) => write!(f, "cannot start the scheduler: {source}"),
            Error::Unsupported(what) => write!(f, "unsupported: {what}"),
            Error::NotHosted(setting) => write!(
                f,
                "{setting} does not apply to a hosted scheduler: the host's threads run its works"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Priority { source, .. } | Error::Io(source) => Some(source),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(source: io::Error) -> Self {
        Error::Io(source)
    }
}

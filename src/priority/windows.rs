//! Windows: a worker's priority is its thread priority (`SetThreadPriority` on itself),
//! which any process may set within its priority class.
//!
//! | `Priority` | thread priority |
//! |---|---|
//! | `Nice(19)`, `Idle` | `THREAD_PRIORITY_IDLE` |
//! | `Nice(10..=18)` | `THREAD_PRIORITY_LOWEST` |
//! | `Nice(1..=9)` | `THREAD_PRIORITY_BELOW_NORMAL` |
//! | `Nice(0)` | `THREAD_PRIORITY_NORMAL` |
//! | `Nice(-9..=-1)` | `THREAD_PRIORITY_ABOVE_NORMAL` |
//! | `Nice(-20..=-10)` | `THREAD_PRIORITY_HIGHEST` |
//! | `Normal` | unchanged (inherited) |

use std::io;

use windows_sys::Win32::System::Threading::{
    GetCurrentThread, SetThreadPriority, THREAD_PRIORITY_ABOVE_NORMAL,
    THREAD_PRIORITY_BELOW_NORMAL, THREAD_PRIORITY_HIGHEST, THREAD_PRIORITY_IDLE,
    THREAD_PRIORITY_LOWEST, THREAD_PRIORITY_NORMAL,
};

use super::Priority;

pub(crate) use super::fixed::*;

/// Applies `priority` to the calling thread.
pub(crate) fn apply(priority: Priority) -> io::Result<()> {
    let level = match priority {
        Priority::Normal => return Ok(()),
        Priority::Idle | Priority::Nice(19..) => THREAD_PRIORITY_IDLE,
        Priority::Nice(10..=18) => THREAD_PRIORITY_LOWEST,
        Priority::Nice(1..=9) => THREAD_PRIORITY_BELOW_NORMAL,
        Priority::Nice(0) => THREAD_PRIORITY_NORMAL,
        Priority::Nice(-9..=-1) => THREAD_PRIORITY_ABOVE_NORMAL,
        Priority::Nice(..=-10) => THREAD_PRIORITY_HIGHEST,
    };
    // SAFETY: GetCurrentThread returns a pseudo-handle that is always valid for the
    // calling thread; SetThreadPriority reads only its arguments.
    let ok = unsafe { SetThreadPriority(GetCurrentThread(), level) };
    if ok != 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

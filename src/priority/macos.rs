//! macOS: a worker's priority is a QoS class, which the thread sets on itself
//! (`pthread_set_qos_class_self_np`) without privilege.
//!
//! | `Priority` | QoS class |
//! |---|---|
//! | `Nice(19)`, `Idle` | `QOS_CLASS_BACKGROUND` (the lowest an app may set: throttled CPU and I/O) |
//! | `Nice(1..=18)` | `QOS_CLASS_UTILITY` |
//! | `Nice(0)` | `QOS_CLASS_DEFAULT` |
//! | `Nice(-20..=-1)` | `QOS_CLASS_USER_INITIATED` |
//! | `Normal` | unchanged (inherited) |

use std::io;

use super::Priority;

pub(crate) use super::fixed::*;

/// Applies `priority` to the calling thread.
pub(crate) fn apply(priority: Priority) -> io::Result<()> {
    use libc::qos_class_t::{
        QOS_CLASS_BACKGROUND, QOS_CLASS_DEFAULT, QOS_CLASS_USER_INITIATED, QOS_CLASS_UTILITY,
    };
    let class = match priority {
        Priority::Normal => return Ok(()),
        Priority::Idle | Priority::Nice(19..) => QOS_CLASS_BACKGROUND,
        Priority::Nice(1..=18) => QOS_CLASS_UTILITY,
        Priority::Nice(0) => QOS_CLASS_DEFAULT,
        Priority::Nice(..=-1) => QOS_CLASS_USER_INITIATED,
    };
    // SAFETY: plain call with a valid class and a relative priority of 0; it acts on the
    // calling thread only.
    let rc = unsafe { libc::pthread_set_qos_class_self_np(class, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

//! FreeBSD: the one per-thread priority an application sets is its scheduling class
//! (`rtprio_thread`). Time-sharing threads have no per-thread nice (`setpriority` acts on
//! the whole process), so only the idle class expresses a low priority.
//!
//! | `Priority` | FreeBSD |
//! |---|---|
//! | `Nice(19)`, `Idle` | the idle class at its lowest level (`RTP_PRIO_IDLE`, 31) |
//! | `Nice(0)`, `Normal` | unchanged (time-sharing) |
//! | other `Nice(n)` | an `Unsupported` error from `build()` |
//!
//! The idle class needs privilege unless `security.bsd.unprivileged_idprio` is 1: without
//! it `build()` fails with `EPERM` ([`Error::Priority`](crate::Error::Priority)), and a
//! process that may not use it asks for `Priority::Normal`.

use std::io;

use super::Priority;

pub(crate) use super::fixed::*;

/// Applies `priority` to the calling thread.
pub(crate) fn apply(priority: Priority) -> io::Result<()> {
    match priority {
        Priority::Normal | Priority::Nice(0) => Ok(()),
        Priority::Idle | Priority::Nice(19) => {
            let mut rtp = libc::rtprio {
                type_: libc::RTP_PRIO_IDLE,
                prio: libc::RTP_PRIO_MAX,
            };
            // SAFETY: `rtp` is valid for the call; lwpid 0 is the calling thread.
            let rc = unsafe { libc::rtprio_thread(libc::RTP_SET, 0, &mut rtp) };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
        Priority::Nice(_) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "FreeBSD has no per-thread nice: use Nice(19) or Idle (the idle class), Nice(0) or Normal",
        )),
    }
}

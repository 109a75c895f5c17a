//! Lending priority to a running work: the kernel's `flush_work_at_nice`, in user space.
//!
//! A thread that waits for a run in progress on a worker, in
//! [`Work::flush`](crate::Work::flush), [`Work::cancel_sync`](crate::Work::cancel_sync) or
//! a `Work`'s drop, raises that worker to the waiter's nice for the rest of the run, and
//! the worker puts itself back when the run completes. The rules (a "flusher" is any such
//! waiter):
//!
//! - **Only with the right.** Lowering a nice value (or leaving `SCHED_IDLE`) needs
//!   `CAP_SYS_NICE` or `RLIMIT_NICE`; [`raise_limit`](crate::Scheduler::raise_limit) is read
//!   once at build time. Without it nothing is touched and the flusher only waits: an
//!   unprivileged thread can lower its own priority but never raise it again, so the
//!   library never lowers a thread it may need back. A worker is only ever moved *up* by a
//!   flusher and *down to its own configured priority* by itself.
//! - **Bounded by the right.** With `RLIMIT_NICE` the worker is raised as far as the limit
//!   allows, never past the flusher's own nice. A flusher under `SCHED_IDLE` lends nothing.
//! - **Exactly the run it waits for.** Each worker has a [`RunSlot`] naming the work it
//!   runs. Slots are set when a worker takes a run and cleared when the run completes,
//!   both under the core lock, as is the raise itself; so a raise always lands on the
//!   thread that runs the awaited instance, and the restore that follows is that run's.
//! - **Only worker threads.** A run executed by a flusher (a pending instance, or a
//!   yielded increment) or by `advance()` has no slot: it already runs at its caller's
//!   priority, and the library never changes a user's thread.

use crate::priority;

/// What a worker runs now, and what it was lent.
#[derive(Debug)]
pub(crate) struct RunSlot {
    tid: priority::Tid,
    /// The worker's own nice, as it applied its priority at start-up.
    base_nice: i32,
    /// Whether the worker's own policy is `SCHED_IDLE`.
    base_idle: bool,
    /// Address of the running work, 0 while idle.
    running: usize,
    /// The nice this run was raised to, if a flusher raised it.
    lent: Option<i32>,
}

/// How waits for runs went (`flush`, `cancel_sync` and drop), in [`Scheduler::metrics`].
///
/// [`Scheduler::metrics`]: crate::Scheduler::metrics
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Scheduler};
///
/// let sched = Scheduler::manual();
/// let work = sched.work(|_| Next::Park);
/// work.schedule(Duration::from_secs(1));
/// assert!(work.flush()); // pending, not started: runs on this thread
/// assert_eq!(sched.metrics().lending.helped, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LendingStats {
    /// Runs a flusher executed on its own thread, at its own priority: pending instances
    /// that had not started, and the increments of works returning `Next::Yield`.
    pub helped: u64,
    /// Runs in progress on a worker that a waiter (`flush`, `cancel_sync`, drop) raised
    /// to its own nice.
    pub raised: u64,
    /// Runs in progress that a waiter waited for without raising them: no right to
    /// raise, a waiter not above the worker, or a run on a non-worker thread.
    pub waited: u64,
}

/// The lending bookkeeping, inside the scheduler's core lock.
#[derive(Debug, Default)]
/// Priority lending, all of it guarded by the core lock (it lives in `Core`).
pub(crate) struct Lending {
    /// I: the lowest nice a flusher may raise a worker to, read at build.
    limit: Option<i32>,
    /// L: one slot per worker: its thread, what it runs, what it was lent.
    slots: Vec<RunSlot>,
    /// L: what flushes did.
    pub(crate) stats: LendingStats,
}

/// What a worker must do after a run it was lent priority for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Restore {
    base_nice: i32,
    base_idle: bool,
}

impl Restore {
    /// Puts the calling worker back to its own priority. Both steps only lower priority
    /// (a higher nice, or `SCHED_IDLE`), which any thread may do to itself.
    ///
    /// Called under the core lock, so a failure is returned for the caller to log once
    /// it let go of the lock (a `tracing` subscriber is user code).
    pub(crate) fn apply(self) -> Result<(), LendingFailure> {
        let tid = priority::current_tid();
        if self.base_idle {
            let restored = priority::Priority::Idle.apply_to_current_thread();
            // Under SCHED_IDLE nice has no effect; putting it back may need the right we
            // lack when the base nice was below the limit, and then it stays where it is.
            let _ = priority::set_nice(tid, self.base_nice);
            restored.map_err(|error| LendingFailure {
                error,
                what: "could not return to SCHED_IDLE after a lent run",
                warn: true,
            })
        } else {
            priority::set_nice(tid, self.base_nice).map_err(|error| LendingFailure {
                error,
                what: "could not return to the worker's nice after a lent run",
                warn: true,
            })
        }
    }
}

/// A priority change that failed under the core lock, to be logged once it is released.
#[derive(Debug)]
#[must_use]
pub(crate) struct LendingFailure {
    error: std::io::Error,
    what: &'static str,
    /// A WARN event (the worker stays at a priority it should not have); else DEBUG.
    warn: bool,
}

impl LendingFailure {
    /// Logs it; call with no lock held.
    pub(crate) fn log(self) {
        let error = self.error;
        if self.warn {
            tracing::warn!(%error, "{}", self.what);
        } else {
            tracing::debug!(%error, "{}", self.what);
        }
    }
}

impl Lending {
    pub(crate) fn new(limit: Option<i32>) -> Self {
        Lending {
            limit,
            slots: Vec::new(),
            stats: LendingStats::default(),
        }
    }

    pub(crate) fn limit(&self) -> Option<i32> {
        self.limit
    }

    /// Registers the calling worker (after it applied its priority); returns its slot.
    pub(crate) fn register_current_worker(&mut self) -> usize {
        let tid = priority::current_tid();
        self.slots.push(RunSlot {
            tid,
            base_nice: priority::current_nice().unwrap_or(0),
            base_idle: priority::current_is_idle(),
            running: 0,
            lent: None,
        });
        self.slots.len() - 1
    }

    /// Whether worker `tid` runs with a flusher's priority now.
    pub(crate) fn is_lent_to(&self, tid: priority::Tid) -> bool {
        self.slots.iter().any(|s| s.tid == tid && s.lent.is_some())
    }

    pub(crate) fn start(&mut self, slot: usize, cell_address: usize) {
        self.slots[slot].running = cell_address;
    }

    /// The run on `slot` completed; returns how to put the worker back if it was raised.
    pub(crate) fn finish(&mut self, slot: usize) -> Option<Restore> {
        let slot = &mut self.slots[slot];
        slot.running = 0;
        slot.lent.take().map(|_| Restore {
            base_nice: slot.base_nice,
            base_idle: slot.base_idle,
        })
    }

    /// [`lend`](Self::lend) with the calling thread's priority, for a waiter that waits
    /// once (`cancel_sync` and drop).
    pub(crate) fn lend_from_current_thread(
        &mut self,
        cell_address: usize,
    ) -> Result<(), LendingFailure> {
        self.lend(cell_address, || {
            (
                priority::current_nice().unwrap_or(0),
                priority::current_is_idle(),
            )
        })
    }

    /// A flusher is about to wait for the run of `cell_address`: raise its worker to the
    /// flusher's priority where allowed. `flusher` is the caller's (nice, is-idle), read
    /// lazily because most flushes never get here.
    ///
    /// A raise that fails is returned, to be logged once the core lock is released.
    pub(crate) fn lend(
        &mut self,
        cell_address: usize,
        flusher: impl FnOnce() -> (i32, bool),
    ) -> Result<(), LendingFailure> {
        let Some(slot) = self.slots.iter_mut().find(|s| s.running == cell_address) else {
            self.stats.waited += 1;
            return Ok(());
        };
        let Some(limit) = self.limit else {
            self.stats.waited += 1;
            return Ok(());
        };
        let (flusher_nice, flusher_idle) = flusher();
        // SCHED_IDLE ranks below every nice value.
        let current = slot
            .lent
            .or((!slot.base_idle).then_some(slot.base_nice))
            .unwrap_or(20);
        let target = flusher_nice.max(limit);
        if flusher_idle || target >= current {
            self.stats.waited += 1;
            return Ok(());
        }
        let from_idle = slot.base_idle && slot.lent.is_none();
        match priority::raise(slot.tid, target, from_idle) {
            Ok(()) => {
                slot.lent = Some(target);
                self.stats.raised += 1;
                Ok(())
            }
            Err(error) => {
                // The right was dropped after build (or a partial raise failed): wait,
                // and still let the worker restore itself in case the nice changed.
                slot.lent = slot.lent.or(Some(current));
                self.stats.waited += 1;
                Err(LendingFailure {
                    error,
                    what: "could not lend priority to a running work",
                    warn: false,
                })
            }
        }
    }
}

#[cfg(all(test, target_os = "linux", not(all(loom, feature = "loom"))))]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// A limit between the flusher's nice and the worker's (as `RLIMIT_NICE` 15 gives:
    /// nice 5) raises the worker only to the limit. Needs the right to raise, so it runs
    /// where the process has `CAP_SYS_NICE` (the integration tests cover the rest).
    #[test]
    fn a_limit_above_the_flusher_raises_only_to_the_limit_and_restore_puts_it_back_needs_cap_sys_nice()
     {
        if priority::raise_limit() != Some(-20) {
            // Visible in the name: this part needs CAP_SYS_NICE (CI runs as root and has it).
            println!("skipped: raising a thread here needs CAP_SYS_NICE");
            return;
        }
        let mut lending = Lending::new(Some(5));
        let (registered_tx, registered) = mpsc::channel();
        let (restore_tx, restore_rx) = mpsc::channel::<Option<Restore>>();
        let worker = std::thread::spawn(move || {
            priority::set_nice(priority::current_tid(), 19).unwrap();
            registered_tx
                .send((priority::current_tid(), priority::current_nice().unwrap()))
                .unwrap();
            if let Some(restore) = restore_rx.recv().unwrap() {
                restore.apply().unwrap();
            }
            priority::current_nice().unwrap()
        });
        let (tid, base) = registered.recv().unwrap();
        assert_eq!(base, 19);
        // Register the worker's slot as the worker itself would.
        lending.slots.push(RunSlot {
            tid,
            base_nice: base,
            base_idle: false,
            running: 0,
            lent: None,
        });
        lending.start(0, 0x1000);
        let _ = lending.lend(0x2000, || (0, false));
        assert_eq!(
            lending.stats.waited, 1,
            "a run it does not wait for is not raised"
        );
        let _ = lending.lend(0x1000, || (0, false));
        assert_eq!(lending.stats.raised, 1);
        assert_eq!(
            priority::nice_of(tid).unwrap(),
            5,
            "raised to the limit, not to 0"
        );
        let _ = lending.lend(0x1000, || (-10, false));
        assert_eq!(
            lending.stats.waited, 2,
            "already at the limit: nothing more to lend"
        );
        assert!(lending.is_lent_to(tid));
        restore_tx.send(lending.finish(0)).unwrap();
        assert_eq!(worker.join().unwrap(), 19, "the worker put itself back");
        assert!(!lending.is_lent_to(tid));
    }

    #[test]
    fn without_a_limit_nothing_is_raised() {
        let mut lending = Lending::new(None);
        lending.slots.push(RunSlot {
            tid: priority::current_tid(),
            base_nice: 19,
            base_idle: false,
            running: 0x1000,
            lent: None,
        });
        let _ = lending.lend(0x1000, || {
            unreachable!("the flusher's nice is not even read")
        });
        assert_eq!((lending.stats.raised, lending.stats.waited), (0, 1));
        assert!(lending.finish(0).is_none());
    }
}

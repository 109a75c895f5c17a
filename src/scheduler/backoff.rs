//! Backing off between increments when the machine is busy.
//!
//! `setpriority` alone does not make a saturating maintenance load free. A nice-19 thread
//! still takes its weight (15 against 1024) of a CPU it shares, and, worse, the load
//! balancer counts it as nearly free: with two CPU-bound nice-0 threads and one nice-19
//! worker on two CPUs it sometimes leaves both nice-0 threads stacked on one CPU while the
//! worker holds the other. Measured on a 2-core machine that costs the foreground 1–4 %.
//!
//! So a worker watches for others waiting: after a run that returned
//! [`Next::Yield`](crate::Next::Yield) it reads the number of runnable threads
//! (`/proc/loadavg`, which the kernel computes as the sum of the run-queue lengths) and, if
//! that exceeds the machine's online CPUs, the next increment is deferred by a
//! back-off that doubles while the contention lasts (1 ms up to 128 ms) and resets as soon
//! as a probe finds a free CPU. While the worker sleeps its CPU goes idle, and an idle CPU
//! pulls a waiting thread over at once (new-idle balancing), which undoes the stacking.
//!
//! The probe costs one `pread` of a small proc file per increment (about 2 µs), and only
//! after `Yield`: ordinary periodic works never pay it.
//!
//! Other OSes read the signal `contention` describes: a one-minute load average, which
//! starts and stops the back-off up to a minute late (`flush()` still runs the work on
//! its caller meanwhile), or none on Windows, where `Yield` only yields and the worker is
//! then no worse than its idle thread priority. Under full contention the
//! maintenance load's own progress drops to almost nothing; that is the point (it uses
//! only idle CPU), and a thread that needs the work done calls `flush()`, which runs the
//! remaining increments on its own thread. Counted: the runnable threads are
//! machine-wide, so busy threads of other processes also make the worker back off.

use crate::scheduler::contention::MachineLoad;

const FIRST_BACKOFF_NS: u64 = 1_000_000;
const MAX_BACKOFF_NS: u64 = 128_000_000;

/// One worker's contention probe and current back-off.
#[derive(Debug)]
pub(crate) struct Backoff {
    load: Option<MachineLoad>,
    delay_ns: u64,
}

impl Backoff {
    /// A probe, or an inert one when disabled or the OS has no load signal.
    pub(crate) fn new(enabled: bool) -> Self {
        Backoff {
            load: enabled.then(MachineLoad::open).flatten(),
            delay_ns: 0,
        }
    }

    /// After a run returned `Yield`: how long to defer the next increment (0: run it as
    /// soon as the others had their turn).
    pub(crate) fn after_yield(&mut self) -> u64 {
        let contended = self.others_waiting();
        self.record(contended)
    }

    fn record(&mut self, contended: bool) -> u64 {
        if contended {
            self.delay_ns = (self.delay_ns * 2).clamp(FIRST_BACKOFF_NS, MAX_BACKOFF_NS);
        } else {
            self.delay_ns = 0;
        }
        self.delay_ns
    }

    /// Whether more threads are runnable than the machine has CPUs (the count includes
    /// the calling worker).
    fn others_waiting(&self) -> bool {
        self.load.as_ref().is_some_and(MachineLoad::contended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disabled_probe_never_defers() {
        let mut backoff = Backoff::new(false);
        let deferred = (0..10).filter(|_| backoff.after_yield() > 0).count();
        assert_eq!(deferred, 0);
    }

    #[test]
    fn the_delay_doubles_up_to_the_cap() {
        let mut backoff = Backoff::new(false);
        let delays: Vec<u64> = (0..10).map(|_| backoff.record(true) / 1_000_000).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 128, 128]);
        assert_eq!(
            delays.iter().filter(|&&d| d > 0).count(),
            10,
            "every one deferred"
        );
        assert_eq!(backoff.record(false), 0, "a free CPU resets the back-off");
        assert_eq!(backoff.record(true), FIRST_BACKOFF_NS);
    }
}

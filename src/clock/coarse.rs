//! The coarse clock: a cheaper reading of the scheduler's time, for the lock-free arming
//! paths.
//!
//! The lock-free arming paths (`reschedule`, `schedule`, a timeout work's `touch`) read
//! `CLOCK_MONOTONIC_COARSE` on Linux: the same time base, as of the last timer tick, read
//! from the vDSO in a few ns where a full read costs up to ten times that on a VM. It lags
//! the real time by one kernel tick on bare metal, but on a VM the CPU that updates it
//! can be descheduled by the host, and lags of four ticks (16 ms at 250 Hz) were measured
//! on the development VM. So [`Coarse::upper_ns`] adds a *margin*: eight ticks and at
//! least 32 ms, raised to twice any lag a worker observes (each worker wakeup reads both
//! clocks and compares). Nothing runs early as long as the coarse clock never lags by more
//! than that margin; a deadline computed from it may be up to the margin late. The arming
//! paths use it only for delays of at least 100 margins, so that lateness is at most 1 %
//! of the delay; shorter delays read the full clock.
//!
//! Coarse readings have no `Instant` form: they count from two raw readings of
//! `CLOCK_MONOTONIC` taken just before and just after the epoch `Instant`, whichever keeps
//! each bound true.
//!
//! Other OSes (and Linux with `--cfg nicework_portable`) have no coarse clock here: the
//! margin is `u64::MAX`, so no delay is long enough for it and every path reads the full
//! clock. Only the cost differs.

#[cfg(all(target_os = "linux", not(nicework_portable)))]
pub(super) use linux::Coarse;
#[cfg(not(all(target_os = "linux", not(nicework_portable))))]
pub(super) use none::Coarse;

#[cfg(all(target_os = "linux", not(nicework_portable)))]
mod linux {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    /// The smallest margin added to coarse readings (see the module docs).
    const MIN_COARSE_MARGIN_NS: u64 = 32_000_000;

    /// Reads a clock, in nanoseconds.
    fn read(clock: libc::clockid_t) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; both clocks exist on every Linux
        // kernel nicework supports (2.6.32+), so the call cannot fail.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    }

    /// Reads `CLOCK_MONOTONIC_COARSE` (glibc answers it from the vDSO, no system call).
    ///
    /// rustix's direct vDSO call is a few ns cheaper, but its vDSO lookup crashes under
    /// valgrind, which maps the vDSO differently; users run their tests under valgrind,
    /// so nicework stays with libc here.
    #[inline]
    fn read_coarse() -> u64 {
        read(libc::CLOCK_MONOTONIC_COARSE)
    }

    /// The coarse clock's resolution: how far it may lag the real time.
    fn coarse_resolution_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: as in `read`.
        let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        if rc != 0 {
            // No coarse clock: fall back to a generous bound (a 100 Hz tick).
            return 10_000_000;
        }
        (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// `CLOCK_MONOTONIC_COARSE`, counted from a scheduler's epoch.
    #[derive(Debug)]
    pub(crate) struct Coarse {
        /// A raw `CLOCK_MONOTONIC` reading taken just before the epoch: counting from it
        /// errs late (upper bounds).
        epoch_raw_before_ns: u64,
        /// A raw `CLOCK_MONOTONIC` reading taken just after the epoch: counting from it
        /// errs early (lower bounds).
        epoch_raw_after_ns: u64,
        /// What [`upper_ns`](Self::upper_ns) adds to a coarse reading; only ever raised
        /// ([`observe_lag`](Self::observe_lag)). A std atomic: manual schedulers (and so
        /// loom models) never use the coarse clock.
        margin_ns: AtomicU64,
    }

    impl Coarse {
        /// Takes the epoch with `epoch` and the raw readings around it.
        pub(crate) fn around(epoch: impl FnOnce() -> Instant) -> (Instant, Self) {
            let epoch_raw_before_ns = read(libc::CLOCK_MONOTONIC);
            let epoch = epoch();
            let epoch_raw_after_ns = read(libc::CLOCK_MONOTONIC);
            let margin = coarse_resolution_ns()
                .saturating_mul(8)
                .max(MIN_COARSE_MARGIN_NS);
            (
                epoch,
                Coarse {
                    epoch_raw_before_ns,
                    epoch_raw_after_ns,
                    margin_ns: AtomicU64::new(margin),
                },
            )
        }

        #[inline]
        pub(crate) fn upper_ns(&self) -> u64 {
            read_coarse()
                .saturating_sub(self.epoch_raw_before_ns)
                .saturating_add(self.margin_ns())
        }

        #[inline]
        pub(crate) fn lower_ns(&self) -> u64 {
            read_coarse().saturating_sub(self.epoch_raw_after_ns)
        }

        #[inline]
        pub(crate) fn margin_ns(&self) -> u64 {
            self.margin_ns.load(Ordering::Relaxed)
        }

        pub(crate) fn observe_lag(&self, precise_ns: u64) {
            let lag = precise_ns.saturating_sub(self.lower_ns());
            if lag.saturating_mul(2) > self.margin_ns() {
                self.margin_ns
                    .fetch_max(lag.saturating_mul(2), Ordering::Relaxed);
            }
        }
    }
}

#[cfg(not(all(target_os = "linux", not(nicework_portable))))]
mod none {
    use std::time::Instant;

    /// No coarse clock: an infinite margin, so nothing is timed with it; the readings
    /// are full ones, should anything ask.
    #[derive(Debug)]
    pub(crate) struct Coarse {
        epoch: Instant,
    }

    impl Coarse {
        pub(crate) fn around(epoch: impl FnOnce() -> Instant) -> (Instant, Self) {
            let epoch = epoch();
            (epoch, Coarse { epoch })
        }

        fn now_ns(&self) -> u64 {
            super::super::nanos(Instant::now().saturating_duration_since(self.epoch))
        }

        pub(crate) fn upper_ns(&self) -> u64 {
            self.now_ns()
        }

        pub(crate) fn lower_ns(&self) -> u64 {
            self.now_ns()
        }

        pub(crate) fn margin_ns(&self) -> u64 {
            u64::MAX
        }

        pub(crate) fn observe_lag(&self, _precise_ns: u64) {}
    }
}

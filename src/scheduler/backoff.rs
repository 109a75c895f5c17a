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
//! Other unixes (and Linux built with `--cfg nicework_portable`) have no run-queue count
//! to read, so the probe reads `getloadavg(3)`'s one-minute load average instead: the
//! same machine-wide signal, smoothed, so the worker starts backing off up to a minute
//! after contention begins and keeps backing off as long after it ends (during which
//! `flush()` still runs the work on its caller). Windows has neither in a cheap form
//! (its processor-queue counter needs the performance-counter API), so there the probe
//! is inert and `Yield` only yields: the worker is then no worse than its idle thread
//! priority. Under full contention the
//! maintenance load's own progress drops to almost nothing; that is the point (it uses
//! only idle CPU), and a thread that needs the work done calls `flush()`, which runs the
//! remaining increments on its own thread. Counted: the runnable threads are
//! machine-wide, so busy threads of other processes also make the worker back off.

const FIRST_BACKOFF_NS: u64 = 1_000_000;
const MAX_BACKOFF_NS: u64 = 128_000_000;

/// One worker's contention probe and current back-off.
#[derive(Debug)]
pub(crate) struct Backoff {
    load: Option<load::LoadProbe>,
    cpus: usize,
    delay_ns: u64,
}

impl Backoff {
    /// A probe, or an inert one when disabled or the OS has no load signal.
    pub(crate) fn new(enabled: bool) -> Self {
        Backoff {
            load: enabled.then(load::LoadProbe::open).flatten(),
            cpus: online_cpus(),
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
        self.load
            .as_ref()
            .is_some_and(|load| load.busier_than(self.cpus))
    }
}

/// CPUs online in the machine. The runnable count is machine-wide, so it is compared
/// with the machine's CPUs, not with this process's share of them: in a container with a
/// 2-CPU quota on a 64-CPU host, comparing the host's runnable count with 2 would defer
/// every increment on a busy host even while the container idles. The price is that
/// contention confined to a CPU subset (`taskset`, cpusets) goes unseen, and the worker
/// is then no worse than plain nice 19.
fn online_cpus() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        if let Some(n) = usize::try_from(online).ok().filter(|&n| n > 0) {
            return n;
        }
    }
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The "running" count in `/proc/loadavg` (`0.00 0.01 0.05 3/250 12345`).
#[cfg_attr(
    not(all(target_os = "linux", not(nicework_portable))),
    allow(dead_code)
)]
fn runnable_threads(loadavg: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(loadavg).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// The machine's load signal, per OS (see the module docs).
mod load {
    /// Linux: the run-queue count in `/proc/loadavg`.
    #[cfg(all(target_os = "linux", not(nicework_portable)))]
    #[derive(Debug)]
    pub(super) struct LoadProbe {
        loadavg: std::fs::File,
    }

    #[cfg(all(target_os = "linux", not(nicework_portable)))]
    impl LoadProbe {
        pub(super) fn open() -> Option<Self> {
            let loadavg = std::fs::File::open("/proc/loadavg").ok()?;
            Some(LoadProbe { loadavg })
        }

        /// Whether more threads are runnable than `cpus`.
        pub(super) fn busier_than(&self, cpus: usize) -> bool {
            use std::os::unix::fs::FileExt;
            let mut text = [0u8; 128];
            let Ok(len) = self.loadavg.read_at(&mut text, 0) else {
                return false;
            };
            super::runnable_threads(&text[..len]).is_some_and(|runnable| runnable > cpus)
        }
    }

    /// Other unixes: `getloadavg(3)`'s one-minute average.
    #[cfg(all(unix, not(all(target_os = "linux", not(nicework_portable)))))]
    #[derive(Debug)]
    pub(super) struct LoadProbe;

    #[cfg(all(unix, not(all(target_os = "linux", not(nicework_portable)))))]
    impl LoadProbe {
        pub(super) fn open() -> Option<Self> {
            Self::load().map(|_| LoadProbe)
        }

        fn load() -> Option<f64> {
            let mut load = [0f64; 1];
            // SAFETY: `load` has room for the one element asked for.
            let n = unsafe { libc::getloadavg(load.as_mut_ptr(), 1) };
            (n == 1).then_some(load[0])
        }

        /// Whether the load average is above `cpus`.
        pub(super) fn busier_than(&self, cpus: usize) -> bool {
            Self::load().is_some_and(|load| load > cpus as f64)
        }
    }

    /// Windows: no probe.
    #[cfg(not(unix))]
    #[derive(Debug)]
    pub(super) enum LoadProbe {}

    #[cfg(not(unix))]
    impl LoadProbe {
        pub(super) fn open() -> Option<Self> {
            None
        }

        pub(super) fn busier_than(&self, _cpus: usize) -> bool {
            match *self {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_runnable_count() {
        assert_eq!(runnable_threads(b"0.52 0.58 0.59 3/467 12345\n"), Some(3));
        assert_eq!(runnable_threads(b"garbage"), None);
    }

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

//! Whether the machine is contended: more threads runnable than it has CPUs online.
//!
//! Two readers: a worker's back-off between `Yield` increments (see `backoff`), which
//! reads it after every increment, and [`Ctx::contended`](crate::Ctx::contended), which a
//! long callback asks between batches so that it can end its batch, release what the
//! foreground waits for, and return `Next::Yield`. The callback's reading is cached for
//! [`FRESH_NS`] per scheduler, so asking often costs a clock read, not a system call.
//!
//! The signal per OS: Linux reads the run-queue count in `/proc/loadavg` (the kernel's sum
//! of the run-queue lengths, one `pread`, about 2 µs). Other unixes (and Linux built
//! with `--cfg nicework_portable`) have no run-queue count to read, so they read
//! `getloadavg(3)`'s one-minute average instead: the same machine-wide signal, smoothed,
//! so it turns on up to a minute after contention begins and stays on as long after it
//! ends. Windows has neither in a cheap form (its processor-queue counter needs the
//! performance-counter API): there the machine never reads as contended.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How long a callback's reading stays fresh.
pub(crate) const FRESH_NS: u64 = 1_000_000;

/// The machine's load signal and its CPUs.
#[derive(Debug)]
pub(crate) struct MachineLoad {
    load: load::LoadProbe,
    cpus: usize,
}

impl MachineLoad {
    /// The probe, or `None` where the OS has no load signal.
    pub(crate) fn open() -> Option<Self> {
        Some(MachineLoad {
            load: load::LoadProbe::open()?,
            cpus: online_cpus(),
        })
    }

    /// Whether more threads are runnable than the machine has CPUs (the count includes
    /// the caller). One read of the signal.
    pub(crate) fn contended(&self) -> bool {
        self.load.busier_than(self.cpus)
    }
}

/// A scheduler's cached reading, for callbacks (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct ContentionCache {
    /// The probe, opened at the first question.
    machine: OnceLock<Option<MachineLoad>>,
    /// When the cached reading was taken (real ns since the scheduler's epoch, + 1; 0:
    /// never).
    read_at_ns: AtomicU64,
    contended: AtomicBool,
}

impl ContentionCache {
    /// Whether the machine is contended, as read at most [`FRESH_NS`] before `now_ns`.
    pub(crate) fn contended(&self, now_ns: u64) -> bool {
        let read_at = self.read_at_ns.load(Ordering::Relaxed);
        if read_at != 0 && now_ns.saturating_sub(read_at - 1) < FRESH_NS {
            return self.contended.load(Ordering::Relaxed);
        }
        let contended = self
            .machine
            .get_or_init(MachineLoad::open)
            .as_ref()
            .is_some_and(MachineLoad::contended);
        // Racing readers store readings of about the same moment; either will do.
        self.contended.store(contended, Ordering::Relaxed);
        self.read_at_ns
            .store(now_ns.saturating_add(1), Ordering::Relaxed);
        contended
    }
}

/// CPUs online in the machine. The runnable count is machine-wide, so it is compared
/// with the machine's CPUs, not with this process's share of them: in a container with a
/// 2-CPU quota on a 64-CPU host, comparing the host's runnable count with 2 would defer
/// every increment on a busy host even while the container idles. The price is that
/// contention confined to a CPU subset (`taskset`, cpusets) goes unseen, and the worker
/// is then no worse than plain nice 19.
pub(crate) fn online_cpus() -> usize {
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
    fn a_reading_stays_fresh_for_a_millisecond() {
        let cache = ContentionCache::default();
        let first = cache.contended(5);
        // Forced: whatever the machine does, a reading within FRESH_NS is the cached one.
        cache.contended.store(!first, Ordering::Relaxed);
        assert_eq!(cache.contended(5 + FRESH_NS - 1), !first);
        let _fresh = cache.contended(5 + FRESH_NS);
        assert_eq!(cache.read_at_ns.load(Ordering::Relaxed), 5 + FRESH_NS + 1);
    }
}

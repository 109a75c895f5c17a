//! The CPUs a space's per-CPU mode counts, and the CPU the calling thread runs on.
//!
//! # Which CPUs are counted
//!
//! [`CpuCount::read`] counts the CPUs the process may run on: std's
//! `available_parallelism` (the calling thread's affinity and, on Linux, a cgroup CPU
//! quota, v1 or v2, where one is readable), and on Linux no more than the CPUs in the
//! main thread's affinity mask (`sched_getaffinity(getpid())`), which also gives each
//! allowed CPU its position: a container limited to CPUs 4 and 5 counts 2, and CPU 5 is
//! its second. The scans read it again (at most once a second: a read costs tens of
//! microseconds), so a container that a quota limits to 2 CPUs of a 64-CPU host counts 2,
//! and a change of quota or affinity takes effect within a second or a scan period,
//! whichever is longer.
//!
//! # The calling thread's CPU
//!
//! [`current`] is a hint: the thread may move right after the read, so nothing relies on
//! it but the choice of which id to try first. In order:
//!
//! - Linux on x86_64 and aarch64 with glibc's registered rseq area: the `cpu_id` field
//!   (offset 4 of `struct rseq`, a documented field of the ABI), found from the thread
//!   pointer plus `__rseq_offset`, when `__rseq_size` says the area is registered. Both
//!   symbols are looked up with `dlsym` once, so a libc without them (older glibc, musl)
//!   falls back instead of failing to link. Nothing else of the area is read: rseq's
//!   other fields, and their side effects on preemption, are not part of the ABI.
//! - Linux otherwise, FreeBSD: `sched_getcpu()` (glibc's reads rseq or the vDSO).
//! - Windows: `GetCurrentProcessorNumber()`.
//! - Elsewhere (macOS has no call for it): `None`, and the caller uses a number of the
//!   thread's own (its record's address), so each thread still starts from one id.
//! - Loom: a number the model sets for the thread ([`pretend_current`]).

/// The CPUs counted and each allowed CPU's position among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CpuCount {
    /// How many CPUs the process may run on at once (at least 1).
    pub(crate) cpus: usize,
    /// For a CPU number, its position among the allowed CPUs, modulo `cpus`; empty where
    /// the allowed set is unknown (then a CPU number is taken modulo `cpus`).
    pub(crate) positions: Vec<u16>,
}

impl CpuCount {
    /// `cpus` CPUs numbered from 0, with no affinity to map.
    pub(crate) fn plain(cpus: usize) -> CpuCount {
        CpuCount {
            cpus: cpus.max(1),
            positions: Vec::new(),
        }
    }

    /// Reads the count now (see the module docs).
    pub(crate) fn read() -> CpuCount {
        let available = std::thread::available_parallelism().map_or(1, |n| n.get());
        let allowed = allowed_cpus();
        let cpus = match allowed.len() {
            0 => available,
            allowed_count => available.min(allowed_count),
        }
        .max(1);
        let mut positions = Vec::new();
        if let Some(&last) = allowed.last() {
            positions = vec![0; last + 1];
            for (position, &cpu) in allowed.iter().enumerate() {
                positions[cpu] = (position % cpus) as u16;
            }
        }
        CpuCount { cpus, positions }
    }

    /// The index, below `cpus`, that CPU `cpu` starts from.
    #[inline]
    pub(crate) fn home(&self, cpu: usize) -> usize {
        match self.positions.get(cpu) {
            Some(&position) => usize::from(position),
            None => cpu % self.cpus,
        }
    }
}

/// The CPUs the machine has (online or not), for sizing: never fewer than the process may
/// run on.
pub(crate) fn machine_cpus() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: no preconditions.
        let configured = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        if configured > 0 {
            return configured as usize;
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The CPUs in the main thread's affinity mask, ascending; empty where unknown.
#[cfg(all(target_os = "linux", not(all(loom, feature = "loom"))))]
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain data, and all zeroes is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed; `getpid()` names the main
    // thread, whose mask is the process's unless a thread changed its own.
    let read =
        unsafe { libc::sched_getaffinity(libc::getpid(), std::mem::size_of_val(&set), &mut set) };
    if read != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below `CPU_SETSIZE`, the size of `set`.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

#[cfg(not(all(target_os = "linux", not(all(loom, feature = "loom")))))]
fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

/// The CPU the calling thread runs on, as a hint (see the module docs).
#[cfg(not(all(loom, feature = "loom")))]
#[inline]
pub(crate) fn current() -> Option<usize> {
    os::current()
}

#[cfg(all(loom, feature = "loom"))]
loom::thread_local! {
    static PRETENDED: std::cell::Cell<Option<usize>> = std::cell::Cell::new(None);
}

/// Loom: the CPU the model said the calling thread runs on.
#[cfg(all(loom, feature = "loom"))]
pub(crate) fn current() -> Option<usize> {
    PRETENDED.with(std::cell::Cell::get)
}

/// Loom: the calling thread runs on `cpu` from now on, as far as [`current`] says.
#[cfg(all(loom, feature = "loom"))]
pub(crate) fn pretend_current(cpu: usize) {
    PRETENDED.with(|pretended| pretended.set(Some(cpu)));
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(all(loom, feature = "loom"))
))]
mod os {
    use std::sync::atomic::{AtomicIsize, Ordering};

    /// `__rseq_offset` once looked up: `UNKNOWN` before, `MISSING` where the area is not
    /// registered or the symbols do not exist.
    static OFFSET: AtomicIsize = AtomicIsize::new(UNKNOWN);
    const UNKNOWN: isize = isize::MIN;
    const MISSING: isize = isize::MIN + 1;

    /// The offset of `cpu_id` in `struct rseq` (after the `u32` `cpu_id_start`).
    const CPU_ID: isize = 4;

    #[inline]
    pub(super) fn current() -> Option<usize> {
        let offset = match OFFSET.load(Ordering::Relaxed) {
            UNKNOWN => look_up(),
            offset => offset,
        };
        if offset != MISSING {
            let field = (thread_pointer() as isize).wrapping_add(offset + CPU_ID) as *const u32;
            // SAFETY: glibc registered the area of every thread it runs (`__rseq_size` is
            // not 0), at this offset from the thread pointer, for the thread's lifetime;
            // the kernel writes the field, hence the volatile read.
            let cpu = unsafe { std::ptr::read_volatile(field) };
            // `RSEQ_CPU_ID_UNINITIALIZED` (-1) and `RSEQ_CPU_ID_REGISTRATION_FAILED` (-2)
            // read as huge numbers.
            if (cpu as i32) >= 0 {
                return Some(cpu as usize);
            }
        }
        super::asked()
    }

    /// Looks `__rseq_offset` and `__rseq_size` up once.
    #[cold]
    fn look_up() -> isize {
        // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name; a symbol found is
        // glibc's exported variable of the documented type, which it sets before any
        // thread runs and never changes.
        let offset = unsafe {
            let offset = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr());
            let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr());
            if offset.is_null() || size.is_null() || *(size as *const u32) < 8 {
                MISSING
            } else {
                *(offset as *const isize)
            }
        };
        OFFSET.store(offset, Ordering::Relaxed);
        offset
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn thread_pointer() -> usize {
        let pointer: usize;
        // SAFETY: on x86_64 Linux `fs:0` holds the thread pointer (the TCB's self pointer),
        // the base glibc's `__rseq_offset` is relative to.
        unsafe {
            std::arch::asm!("mov {}, fs:0", out(reg) pointer, options(nostack, readonly, preserves_flags))
        };
        pointer
    }

    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    fn thread_pointer() -> usize {
        let pointer: usize;
        // SAFETY: `tpidr_el0` is the thread pointer on aarch64 Linux.
        unsafe {
            std::arch::asm!("mrs {}, tpidr_el0", out(reg) pointer, options(nostack, nomem, preserves_flags))
        };
        pointer
    }
}

#[cfg(all(
    any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "dragonfly"
    ),
    not(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )),
    not(all(loom, feature = "loom"))
))]
mod os {
    #[inline]
    pub(super) fn current() -> Option<usize> {
        super::asked()
    }
}

/// The CPU from `sched_getcpu()` (where rseq does not say, on Linux).
#[cfg(all(
    any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "dragonfly"
    ),
    not(all(loom, feature = "loom"))
))]
#[inline(never)]
fn asked() -> Option<usize> {
    // SAFETY: no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

#[cfg(all(windows, not(all(loom, feature = "loom"))))]
mod os {
    #[inline]
    pub(super) fn current() -> Option<usize> {
        // SAFETY: no preconditions.
        let cpu = unsafe { windows_sys::Win32::System::Threading::GetCurrentProcessorNumber() };
        Some(cpu as usize)
    }
}

#[cfg(all(
    not(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "dragonfly",
        windows
    )),
    not(all(loom, feature = "loom"))
))]
mod os {
    #[inline]
    pub(super) fn current() -> Option<usize> {
        None
    }
}

#[cfg(all(test, not(all(loom, feature = "loom"))))]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_at_least_one_and_every_position_below_it() {
        let count = CpuCount::read();
        assert!(count.cpus >= 1);
        assert!(
            count
                .positions
                .iter()
                .all(|&position| usize::from(position) < count.cpus)
        );
        for cpu in 0..4096 {
            assert!(count.home(cpu) < count.cpus);
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_hint_is_a_cpu_the_process_may_run_on() {
        let cpu = current().expect("Linux always says");
        // SAFETY: no preconditions.
        let configured = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        assert!((cpu as libc::c_long) < configured.max(1));
    }
}

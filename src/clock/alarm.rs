//! The portable timer a worker sleeps on: a deadline under a mutex and a condition
//! variable with a timed wait. Every OS has one; Linux uses it when built with
//! `--cfg nicework_portable`, so the suite tests it here too.
//!
//! It keeps the contract of the timerfd it stands in for ([`timerfd`](super)): the
//! programming end lives in the scheduler's core and programs one shot; a worker's reader
//! blocks until the programmed time passes, also when that time was moved earlier while
//! it slept; an expiry that passes before the reader blocks is not lost (the deadline
//! stays until a reader sees it passed); disarming leaves the reader blocked with no
//! deadline at all, so a scheduler with every work parked sleeps without a wakeup.
//!
//! Invariants:
//! - `deadline` is the one pending expiry: `program` replaces it, `disarm` clears it, and
//!   the reader that finds it passed clears it (a one-shot timer fires once).
//! - `program` notifies only when a reader sleeps and the new deadline is earlier than the
//!   one it waits for (or it waits for none): a later one lets the sleeper wake at the old
//!   time, see the new one and sleep again, which costs one wakeup instead of two.
//!   `sleepers` is set and cleared under the lock around the wait, so a programmer that
//!   sees none knows the reader will read the new deadline before it sleeps.
//! - Each return of the OS wait is counted in [`WakeupCounter`]: the wakeups a worker
//!   reports are the times it really woke, spurious and early ones included.
//!
//! The lock order is the core lock, then the alarm's: `program` runs under the core lock
//! and a sleeping reader holds only the alarm's.
//!
//! # A hosted scheduler's descriptor (unix)
//!
//! Nobody blocks on a hosted scheduler's alarm; the host sleeps until
//! `Driver::next_deadline` in its own loop. So that the host also learns when that
//! deadline moves earlier without a waker, a hosted alarm on unix has a non-blocking
//! pipe, the `Driver`'s descriptor: [`Sleeper::signal_host`] writes a byte when the
//! scheduler's next wake moves earlier (as on Linux, nothing at shutdown: nothing is due
//! again), and the driver's
//! [`SleeperReader::drain`] empties it. Both run under the core lock, so they never race;
//! `host_signalled` is the flag `run_due` reads without the lock, set only after the byte
//! is written, so a readable descriptor always sends `run_due` down the path that drains
//! it and the host never spins on it.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Counts a worker's wakeups where no OS count exists.
pub(crate) type WakeupCounter = Arc<AtomicU64>;

#[derive(Debug)]
struct Alarm {
    shot: Mutex<Shot>,
    rung: Condvar,
    wakeups: WakeupCounter,
    /// A hosted alarm's descriptor (see the module docs).
    #[cfg(unix)]
    host: Option<HostPipe>,
}

/// The pipe a hosted alarm signals its host through.
#[cfg(unix)]
#[derive(Debug)]
struct HostPipe {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
    /// Set after a byte is written, cleared before the pipe is emptied.
    signalled: std::sync::atomic::AtomicBool,
}

#[cfg(unix)]
impl HostPipe {
    fn new() -> io::Result<Self> {
        use std::os::fd::{FromRawFd, OwnedFd};

        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid out-array of two ints (`pipe2` is not on every unix).
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just opened and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        for fd in [&read, &write] {
            use std::os::fd::AsRawFd;
            let fd = fd.as_raw_fd();
            // SAFETY: `fd` is open; these calls only set its flags.
            let ok = unsafe {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) == 0
                    && libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) == 0
            };
            if !ok {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(HostPipe {
            read,
            write,
            signalled: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn signal(&self) {
        use std::os::fd::AsRawFd;
        if self.signalled.load(Ordering::Relaxed) {
            return; // a byte is already waiting
        }
        // SAFETY: one byte from a valid buffer to an open descriptor; a full pipe
        // (EAGAIN) already holds a byte, which is all a signal needs.
        unsafe { libc::write(self.write.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        self.signalled.store(true, Ordering::Release);
    }

    fn drain(&self) {
        use std::os::fd::AsRawFd;
        if !self.signalled.swap(false, Ordering::Acquire) {
            return;
        }
        let mut bytes = [0u8; 64];
        // SAFETY: reads into a valid buffer from an open, non-blocking descriptor.
        while unsafe {
            libc::read(
                self.read.as_raw_fd(),
                bytes.as_mut_ptr().cast(),
                bytes.len(),
            )
        } > 0
        {}
    }
}

/// What the alarm's mutex guards.
#[derive(Debug, Default)]
struct Shot {
    /// When the programmed shot fires; `None` when disarmed or already seen.
    at: Option<Instant>,
    /// Readers inside the condition-variable wait (set and cleared under the lock, so
    /// whoever holds the lock and sees one knows it is asleep, not on its way there).
    sleepers: usize,
}

impl Alarm {
    fn shot(&self) -> MutexGuard<'_, Shot> {
        // Only this module's code runs under the lock and none of it panics: a poisoned
        // lock still holds a consistent shot.
        self.shot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The programming end.
#[derive(Debug)]
pub(crate) struct Sleeper {
    alarm: Arc<Alarm>,
}

/// A worker's blocking end.
#[derive(Debug)]
pub(crate) struct SleeperReader {
    alarm: Arc<Alarm>,
}

impl Sleeper {
    /// A reader blocked with a deadline wakes at it even after `disarm` (see
    /// `scheduler::standby`).
    pub(crate) const DISARM_IS_SILENT: bool = false;

    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self::with_alarm(Alarm {
            shot: Mutex::new(Shot::default()),
            rung: Condvar::new(),
            wakeups: WakeupCounter::default(),
            #[cfg(unix)]
            host: None,
        }))
    }

    fn with_alarm(alarm: Alarm) -> Self {
        Sleeper {
            alarm: Arc::new(alarm),
        }
    }

    /// A timer for a hosted scheduler's `Driver`: nobody blocks on it; on unix it has the
    /// host's descriptor (see the module docs).
    pub(crate) fn new_nonblocking() -> io::Result<Self> {
        Ok(Self::with_alarm(Alarm {
            shot: Mutex::new(Shot::default()),
            rung: Condvar::new(),
            wakeups: WakeupCounter::default(),
            #[cfg(unix)]
            host: Some(HostPipe::new()?),
        }))
    }

    /// Tells a hosted scheduler's host that its next wake moved earlier: the descriptor
    /// turns readable.
    pub(crate) fn signal_host(&self) {
        #[cfg(unix)]
        if let Some(pipe) = &self.alarm.host {
            pipe.signal();
        }
    }

    /// Another end of the same timer for a worker to block on.
    pub(crate) fn reader(&self) -> io::Result<SleeperReader> {
        Ok(SleeperReader {
            alarm: self.alarm.clone(),
        })
    }

    /// The count of wakeups the readers of this timer took.
    pub(crate) fn wakeups(&self) -> WakeupCounter {
        self.alarm.wakeups.clone()
    }

    /// Fires once, `after_ns` from now.
    pub(crate) fn program(&mut self, after_ns: u64) {
        let now = Instant::now();
        let at = now
            .checked_add(Duration::from_nanos(after_ns))
            // Beyond what `Instant` can hold: as good as never, but still armed.
            .unwrap_or_else(|| now + Duration::from_secs(u64::from(u32::MAX)));
        let mut shot = self.alarm.shot();
        let earlier = shot.at.is_none_or(|old| at < old);
        shot.at = Some(at);
        let sleepers = shot.sleepers;
        drop(shot);
        if earlier && sleepers > 0 {
            self.alarm.rung.notify_all();
        }
    }

    /// No shot pending; a blocked reader keeps sleeping (it wakes at most once more, at
    /// the time it was waiting for, and sleeps on without a deadline).
    pub(crate) fn disarm(&mut self) {
        self.alarm.shot().at = None;
    }
}

impl SleeperReader {
    /// Blocks until the programmed time passes.
    pub(crate) fn wait(&self) {
        let mut shot = self.alarm.shot();
        loop {
            let now = Instant::now();
            let timeout = match shot.at {
                Some(at) if at <= now => {
                    shot.at = None;
                    return;
                }
                Some(at) => Some(at - now),
                None => None,
            };
            shot.sleepers += 1;
            shot = match timeout {
                Some(timeout) => {
                    self.alarm
                        .rung
                        .wait_timeout(shot, timeout)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
                None => self
                    .alarm
                    .rung
                    .wait(shot)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
            shot.sleepers -= 1;
            self.alarm.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Clears an expiry that passed, as reading a non-blocking timerfd does, and empties
    /// a hosted alarm's descriptor.
    pub(crate) fn drain(&self) {
        let mut shot = self.alarm.shot();
        if shot.at.is_some_and(|at| at <= Instant::now()) {
            shot.at = None;
        }
        drop(shot);
        #[cfg(unix)]
        if let Some(pipe) = &self.alarm.host {
            pipe.drain();
        }
    }

    /// Whether the host's descriptor may be readable (read without a lock by `run_due`,
    /// which then drains it).
    #[inline]
    pub(crate) fn host_signalled(&self) -> bool {
        #[cfg(unix)]
        if let Some(pipe) = &self.alarm.host {
            return pipe.signalled.load(Ordering::Acquire);
        }
        false
    }
}

#[cfg(unix)]
impl std::os::fd::AsFd for SleeperReader {
    /// A hosted alarm's descriptor (a worker's reader has none and is never asked).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.alarm
            .host
            .as_ref()
            .expect("only a hosted scheduler's Driver has a descriptor")
            .read
            .as_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Generous: how long a blocked reader may take to notice what it must notice.
    const NOTICE: Duration = Duration::from_secs(30);
    const HOUR_NS: u64 = 3_600_000_000_000;

    /// Blocks a reader on its own thread; the receiver hears when `wait` returns.
    fn blocked_reader(source: &Sleeper) -> (mpsc::Receiver<()>, std::thread::JoinHandle<()>) {
        let reader = source.reader().unwrap();
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            reader.wait();
            let _ = tx.send(());
        });
        (rx, thread)
    }

    /// Waits until the reader sleeps in the condition variable (so what comes next must
    /// wake it, not merely be seen by it on its way in).
    fn until_asleep(source: &Sleeper) {
        while source.alarm.shot().sleepers == 0 {
            std::thread::yield_now();
        }
    }

    #[test]
    fn an_earlier_program_wakes_a_reader_waiting_for_a_later_one() {
        let mut source = Sleeper::new().unwrap();
        source.program(HOUR_NS);
        let (woke, thread) = blocked_reader(&source);
        until_asleep(&source);
        source.program(0);
        woke.recv_timeout(NOTICE)
            .expect("the earlier shot woke the reader");
        thread.join().unwrap();
    }

    #[test]
    fn a_reader_with_no_deadline_wakes_when_one_is_programmed() {
        let mut source = Sleeper::new().unwrap();
        let (woke, thread) = blocked_reader(&source);
        until_asleep(&source);
        source.program(1_000_000);
        woke.recv_timeout(NOTICE).expect("the shot woke the reader");
        thread.join().unwrap();
    }

    #[test]
    fn an_expiry_before_the_reader_blocks_is_kept_and_fires_once() {
        let mut source = Sleeper::new().unwrap();
        source.program(0);
        let reader = source.reader().unwrap();
        reader.wait(); // returns at once: the shot passed before the wait
        assert_eq!(source.alarm.shot().at, None, "a one-shot fires once");
        // The next wait needs a new shot.
        source.program(0);
        reader.wait();
    }

    #[test]
    fn disarm_and_a_later_program_leave_the_reader_asleep() {
        let mut source = Sleeper::new().unwrap();
        source.program(HOUR_NS);
        let (woke, thread) = blocked_reader(&source);
        until_asleep(&source);
        source.program(2 * HOUR_NS);
        source.disarm();
        // Still asleep: neither woke it (a wakeup would be counted before it slept again).
        until_asleep(&source);
        assert_eq!(source.wakeups().load(Ordering::Relaxed), 0);
        assert!(woke.try_recv().is_err(), "no shot is pending");
        source.program(0);
        woke.recv_timeout(NOTICE)
            .expect("a new shot still wakes it");
        thread.join().unwrap();
    }

    #[test]
    fn drain_clears_only_a_passed_expiry() {
        let mut source = Sleeper::new().unwrap();
        let reader = source.reader().unwrap();
        source.program(HOUR_NS);
        reader.drain();
        assert!(source.alarm.shot().at.is_some(), "not passed: kept");
        source.program(0);
        reader.drain();
        assert_eq!(source.alarm.shot().at, None);
    }

    #[test]
    fn a_huge_delay_is_armed_far_away_not_overflowed() {
        let mut source = Sleeper::new().unwrap();
        source.program(u64::MAX);
        let at = source.alarm.shot().at.expect("armed");
        assert!(at > Instant::now() + Duration::from_secs(3600));
    }

    #[test]
    fn every_return_of_the_wait_is_counted() {
        let mut source = Sleeper::new().unwrap();
        let wakeups = source.wakeups();
        let reader = source.reader().unwrap();
        source.program(0);
        reader.wait(); // passed before the wait: no sleep, no wakeup
        assert_eq!(wakeups.load(Ordering::Relaxed), 0);
        source.program(5_000_000);
        reader.wait(); // sleeps until the shot: at least one wakeup
        assert!(wakeups.load(Ordering::Relaxed) >= 1);
    }

    /// Far, later, disarming and huge programs racing a reader on its way to sleep, many
    /// times, each followed by a near shot: the near one always wakes it, and the reader
    /// returns exactly once per shot.
    #[test]
    fn programs_racing_the_reader_never_lose_the_near_shot() {
        use std::sync::atomic::AtomicUsize;
        let source = std::sync::Arc::new(Mutex::new(Sleeper::new().unwrap()));
        let reader = source.lock().unwrap().reader().unwrap();
        let returns = std::sync::Arc::new(AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (r, st) = (returns.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                reader.wait();
                r.fetch_add(1, Ordering::SeqCst);
            }
        });
        let mut x: u64 = 0x1234_5678;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let before = returns.load(Ordering::SeqCst);
            {
                let mut s = source.lock().unwrap();
                match x % 4 {
                    0 => s.program(HOUR_NS),
                    1 => s.disarm(),
                    2 => {
                        s.program(HOUR_NS);
                        s.program(2 * HOUR_NS);
                    }
                    _ => {
                        s.program(u64::MAX);
                    }
                }
            }
            for _ in 0..(x >> 8) % 200 {
                std::hint::spin_loop();
            }
            source.lock().unwrap().program((x >> 16) % 20_000);
            let start = Instant::now();
            while returns.load(Ordering::SeqCst) == before {
                assert!(start.elapsed() < NOTICE, "iteration {i}: near shot lost");
                std::thread::yield_now();
            }
            // Exactly one return per passed shot.
            assert_eq!(returns.load(Ordering::SeqCst), before + 1, "iteration {i}");
        }
        stop.store(true, Ordering::SeqCst);
        source.lock().unwrap().program(0);
        thread.join().unwrap();
    }
}

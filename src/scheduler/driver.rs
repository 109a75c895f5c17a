//! [`Driver`]: how a host's own event loop or async runtime runs a hosted scheduler's
//! works (`Builder::build_hosted`), with no nicework thread.
//!
//! The host learns when to look from three sources, any of which suffices:
//! - [`Driver::next_deadline`], for a loop that sleeps with a timeout or a runtime timer;
//! - the waker ([`Driver::set_waker`]), woken from the arming thread whenever the next
//!   deadline may have moved earlier;
//! - on unix, the descriptor ([`AsFd`](std::os::fd::AsFd)). On Linux it is a
//!   non-blocking timerfd programmed for the next deadline, so it turns readable once that
//!   deadline passes, also when an arm from another thread moved it earlier: an epoll or
//!   mio loop needs nothing else. On other unixes (and Linux built with
//!   `--cfg nicework_portable`) it is a pipe that turns readable whenever the next
//!   deadline may have moved earlier: the loop polls it with `next_deadline` as its
//!   timeout.
//!
//! # Invariants
//!
//! - `Shared::host_wake_ns` (what `next_deadline` reads, without the lock) is never later
//!   than the earliest end of an armed work's window (its deadline plus its leeway, see
//!   `leeway`) rounded up to the slack, leaving out the works a
//!   `run_due` call in progress holds back for its caller's next call (it ran them, they
//!   are due again, and no other call may run them: that call puts them back, and
//!   publishes their wake, before it returns): a locked arm that moves the
//!   earliest end earlier lowers it in `Shared::kick`, under the core lock, before the
//!   arm returns; a lock-free arm only ever moves a deadline later than its entry; a
//!   leeway given to an armed work moves it only to the wheel's new earliest end
//!   (`Shared::follow_next_wake`); and `run_due` recomputes it from the wheel before it
//!   returns. So `run_due`'s lock-free test "the next wake is after now" never skips a
//!   work whose window has ended; a work whose deadline has come but whose window has
//!   not ended yet may wait for the next wake, as it would on a worker.
//! - The waker is woken after the core lock is released (`CoreGuard`'s drop), never under
//!   it, so a waker may call back into nicework.
//! - `run_due` runs each work at most once per call: a work that re-arms itself due at
//!   once (`Next::Yield`, a zero-delay `reschedule` from its callback) is set aside and
//!   put back due when the call ends, so the host always gets control back and the next
//!   call runs it.
//! - The timer stands for a wake only while its expiry is not drained: `run_due` forgets
//!   the programmed wake when it drains the descriptor, and programs the next wake before
//!   each callback, so an arm from another thread during a long callback, and a deadline
//!   that passes meanwhile, still make the descriptor readable (and the arm wakes the
//!   waker).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Waker;
use std::time::Instant;

use crate::clock::sleeper::SleeperReader;
use crate::scheduler::handle::Handle;
use crate::scheduler::shared::{Core, NO_HOST_WAKE, Shared};
use crate::scheduler::wait::frames;
use crate::scheduler::work::run::{Executed, leave_forked_child};

/// Runs a hosted scheduler's works on the host's threads: returned with its
/// [`Scheduler`](crate::Scheduler) by [`Builder::build_hosted`](crate::Builder::build_hosted).
///
/// A host loop calls [`run_due`](Self::run_due) whenever it wakes, and sleeps until
/// [`next_deadline`](Self::next_deadline), or until the waker it registered with
/// [`set_waker`](Self::set_waker) is woken, or (on unix) until the driver's descriptor is
/// readable. Works run on the thread that calls `run_due`, at its priority, in deadline
/// order. `Driver` is `Send + Sync` and not `Clone`: one host runs the works (two threads
/// calling `run_due` at once still never run one work twice at the same time).
///
/// # Lifetime
///
/// A hosted scheduler shuts down at whichever comes first:
/// - the `Driver`'s drop;
/// - the drop of its last [`Scheduler`](crate::Scheduler) handle, as for a threaded
///   scheduler, while the `Driver` lives on.
///
/// Either way armed works are cancelled, a detached work's life ends, every later arm
/// returns `false`, the waker is woken once, and the descriptor goes quiet (nothing is
/// due again); a run in progress on another thread finishes first. After that `run_due`
/// returns 0 and `next_deadline` `None`, and
/// `nicework::tokio::drive` (feature `tokio`) resolves.
///
/// # Examples
///
/// A plain loop (a real host sleeps in its own event loop instead):
///
/// ```
/// use std::time::{Duration, Instant};
/// use nicework::{Next, Scheduler};
///
/// let (sched, driver) = Scheduler::builder().build_hosted()?;
/// let work = sched.every(Duration::from_millis(2), |_| Next::Again);
/// while work.stats().runs < 3 {
///     driver.run_due();
///     let until = driver.next_deadline().expect("the work re-arms");
///     std::thread::sleep(until.saturating_duration_since(Instant::now()));
/// }
/// # Ok::<(), nicework::Error>(())
/// ```
pub struct Driver {
    shared: Arc<Shared>,
    /// The host's end of the scheduler's timerfd (non-blocking).
    sleeper: SleeperReader,
}

impl Driver {
    pub(crate) fn new(shared: Arc<Shared>, sleeper: SleeperReader) -> Self {
        Driver { shared, sleeper }
    }

    /// When the host should call [`run_due`](Self::run_due) next: never later than the
    /// earliest end of any armed work's window, its deadline plus its
    /// [`leeway`](crate::Work::leeway) (an [`IdSpace`](crate::IdSpace)'s compaction
    /// included), rounded up to the slack; so works whose windows overlap share one
    /// call. Sometimes earlier, for a deadline moved later
    /// since or an entry left by a cancelled work. `None` when
    /// nothing is armed, and once the scheduler is shut down. One atomic load, no lock.
    ///
    /// While another thread is inside `run_due`, the works that call already ran and
    /// that are due again (a `Next::Yield`) are left out: only that thread's next call
    /// may run them, and that call publishes their wake before it returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let (sched, driver) = Scheduler::builder().build_hosted()?;
    /// assert_eq!(driver.next_deadline(), None);
    /// let work = sched.work(|_| Next::Park);
    /// work.schedule(Duration::from_secs(1));
    /// assert!(driver.next_deadline().unwrap() >= work.deadline().unwrap());
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn next_deadline(&self) -> Option<Instant> {
        let wake_ns = self.shared.host_wake_ns.load(Ordering::Acquire);
        (wake_ns != NO_HOST_WAKE && !self.shared.is_forked_copy())
            .then(|| self.shared.instant_at(wake_ns))
    }

    /// Runs every work due now on the calling thread (every work whose deadline has come,
    /// whatever is left of its window), earliest window end first (deadline order for
    /// works without a leeway), each at most once
    /// (a `Next::Yield` runs its next increment at the next call), and returns how many
    /// runs it made. Works that come due while it runs wait for the next call.
    ///
    /// Returns 0 at once when nothing is due or nothing is armed (one clock read and one
    /// atomic load, no lock), after the scheduler was shut down, in a `fork()`ed child, and when called
    /// from inside a work's callback (of any scheduler): a callback that drives its own
    /// host would run works inside works.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// let (sched, driver) = Scheduler::builder().build_hosted()?;
    /// let work = sched.work(|_| Next::Park);
    /// work.schedule(Duration::ZERO);
    /// assert_eq!(driver.run_due(), 1);
    /// assert_eq!(driver.run_due(), 0);
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn run_due(&self) -> usize {
        self.run_due_at_most(usize::MAX)
    }

    /// [`run_due`](Self::run_due), but at most `limit` runs: a host that must keep its
    /// turns short (an async executor whose other tasks wait meanwhile) bounds each turn,
    /// and calls again while works are left due. Those are due at once: `next_deadline`
    /// is then not in the future, and the descriptor stays readable. `limit` 0 runs
    /// nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use nicework::{Next, Scheduler};
    ///
    /// let (sched, driver) = Scheduler::builder().build_hosted()?;
    /// let works: Vec<_> = (0..5).map(|_| sched.work(|_| Next::Park)).collect();
    /// for work in &works {
    ///     work.schedule(Duration::ZERO);
    /// }
    /// assert_eq!(driver.run_due_at_most(2), 2);
    /// assert!(driver.next_deadline().unwrap() <= Instant::now()); // more are due
    /// assert_eq!(driver.run_due_at_most(10), 3);
    /// assert_eq!(driver.next_deadline(), None);
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn run_due_at_most(&self, limit: usize) -> usize {
        let shared = &self.shared;
        if limit == 0 {
            return 0;
        }
        if shared.host_wake_ns.load(Ordering::Acquire) > shared.now_ns()
            && !self.sleeper.host_signalled()
        {
            // Nothing is due (nothing is armed, for `NO_HOST_WAKE`), and the descriptor
            // is not readable: `Shared::reprogram` publishes a wake in the future only
            // once the timer no longer fires before it, and a signalled descriptor is
            // drained below.
            return 0;
        }
        if frames::in_callback() {
            return 0;
        }
        let Some(mut core) = shared.lock_unless_forked() else {
            return 0;
        };
        self.sleeper.drain();
        // The drained expiry is spent: the timer no longer stands for any wake, so the
        // next wake set below, or an arm's `kick` meanwhile, programs it again.
        core.programmed_ns = None;
        if core.shutdown {
            return 0;
        }
        let now = shared.now_ns();
        let handle = Handle::new(shared.clone());
        let scheduler = handle.as_scheduler();
        let mut ran = HashSet::new();
        let mut set_aside = Vec::new();
        let mut runs = 0;
        while runs < limit {
            shared.expire(&mut core, now);
            let Some(taken) = shared.take_ready_skipping(
                &mut core,
                now,
                |work| ran.contains(&work),
                &mut set_aside,
            ) else {
                break;
            };
            ran.insert(taken.work.address());
            // While the callback runs, the descriptor and `next_deadline` keep telling
            // the host's other threads about the works due meanwhile. Not about the ones
            // held back: no other call may run them, and this one puts them back due,
            // and programs the timer for them, before it returns.
            set_drained_timer(shared, &mut core, now);
            drop(core);
            let executed = shared.execute(scheduler, taken, now, None);
            runs += 1;
            if executed == Executed::InForkedChild {
                return leave_forked_child(runs);
            }
            core = shared.lock();
        }
        if core.shutdown {
            // A callback shut the scheduler down: the entries held back missed its
            // drain, so their works are disarmed here, as the wheel's were.
            let ended = Shared::disarm_drained(set_aside.iter().map(|(entry, _)| entry));
            drop(core);
            for work in ended {
                shared.end_life(&work);
            }
            return runs;
        }
        // A work that ran in this call and is due again (`Next::Yield`) runs at the next.
        let now_units = crate::scheduler::work::state::now_units(shared.now_ns());
        for (entry, due) in set_aside {
            // Due already: the window's end does not matter on the ready queue.
            core.wheel.insert(entry, due, due, now_units);
        }
        set_drained_timer(shared, &mut core, now);
        runs
    }

    /// Registers the waker to wake, from the arming thread, whenever
    /// [`next_deadline`](Self::next_deadline) may have moved earlier, and once at
    /// shutdown (the descriptor is disarmed then: nothing is due again). It replaces the previous one; a wake already on its way goes to the one
    /// it was taken from. Register, then read `next_deadline`: an arm before the
    /// registration shows there, and every arm after it wakes this waker. It is woken
    /// with no nicework lock held, so it may call into nicework.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::task::{Wake, Waker};
    /// use std::time::Duration;
    /// use nicework::{Next, Scheduler};
    ///
    /// struct Count(AtomicUsize);
    /// impl Wake for Count {
    ///     fn wake(self: Arc<Self>) {
    ///         self.0.fetch_add(1, Ordering::SeqCst);
    ///     }
    /// }
    ///
    /// let (sched, driver) = Scheduler::builder().build_hosted()?;
    /// let wakes = Arc::new(Count(AtomicUsize::new(0)));
    /// driver.set_waker(Waker::from(wakes.clone()));
    /// let work = sched.work(|_| Next::Park);
    /// work.schedule(Duration::from_secs(1)); // the first deadline: the host must know
    /// assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    /// work.reschedule(Duration::from_secs(2)); // later: nothing to tell
    /// assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn set_waker(&self, waker: Waker) {
        if let Some(mut core) = self.shared.lock_unless_forked() {
            if !core.shutdown {
                core.host_waker = Some(waker);
            }
        }
    }
}

impl Driver {
    /// Whether the scheduler shut down (or this is its copy in a `fork()`ed child).
    #[cfg_attr(not(any(feature = "tokio", test)), allow(dead_code))]
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shared.is_shut_down()
    }
}

/// Sets the timer for the next wake after `run_due` drained it: a programming only if a
/// callback's arm (or an earlier call of this) did not set it for that wake since the
/// drain. With nothing armed it disarms and publishes that nothing is due, whatever the
/// record says: the drained timer may not have expired yet, and a descriptor readable
/// with no wake published would never be cleared.
fn set_drained_timer(shared: &Shared, core: &mut Core, now_ns: u64) {
    let wake = shared.next_wake_ns(core, now_ns);
    if wake.is_some() {
        shared.program(core, wake, shared.now_ns());
    } else if core.programmed_ns.is_some()
        || shared.host_wake_ns.load(Ordering::Relaxed) != NO_HOST_WAKE
    {
        shared.reprogram(core, None, shared.now_ns());
    }
}

/// On unix, for event loops that take a raw descriptor (mio's `SourceFd`, calloop's
/// `Generic`, async-io's `Async`): the descriptor of [`AsFd`](std::os::fd::AsFd), which
/// stays owned by the driver.
#[cfg(unix)]
impl std::os::fd::AsRawFd for Driver {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.as_fd().as_raw_fd()
    }
}

/// On unix. Windows hosts use [`next_deadline`](Driver::next_deadline) and
/// [`set_waker`](Driver::set_waker).
#[cfg(unix)]
impl std::os::fd::AsFd for Driver {
    /// Linux: the scheduler's timerfd, non-blocking: readable once the next deadline
    /// passes (also when an arm from another thread moved it earlier). Other unixes: a
    /// pipe, readable whenever [`next_deadline`](Driver::next_deadline) may have moved
    /// earlier, so the host polls it with that deadline as its timeout. Both are quiet
    /// after shutdown, when nothing is due again. [`run_due`](Driver::run_due) clears it; never read it yourself.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sleeper.as_fd()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.shared.shutdown();
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("next_deadline", &self.next_deadline())
            .finish_non_exhaustive()
    }
}

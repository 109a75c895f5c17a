//! [`Builder`]: validates settings, starts the workers, and waits until each one has
//! applied its priority, so a priority that cannot be applied is a `build()` error.

use std::time::Duration;

use crate::clock::nanos;
use crate::scheduler::shared::Config;
use crate::{Driver, Error, Priority, Scheduler};

/// Most worker threads one scheduler may have.
pub const MAX_WORKERS: usize = 256;
/// Smallest slack: re-arm delays are rounded up to the slack, so this bounds how often a
/// work returning `Next::Again` with a zero period can run (10,000 times a second).
pub const MIN_SLACK: Duration = Duration::from_micros(100);
/// Largest slack.
pub const MAX_SLACK: Duration = Duration::from_secs(10);
const DEFAULT_SLACK: Duration = Duration::from_millis(1);

/// Configures and starts a [`Scheduler`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Priority, Scheduler};
///
/// let sched = Scheduler::builder()
///     .name("maint")
///     .priority(Priority::Nice(19))
///     .workers(2)
///     .slack(Duration::from_millis(5))
///     .build()?;
/// assert_eq!(sched.workers(), 2);
/// # Ok::<(), nicework::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    name: String,
    priority: Priority,
    workers: usize,
    slack: Duration,
    back_off: bool,
    /// The first setting made that only worker threads have, refused by `build_hosted`.
    thread_setting: Option<&'static str>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            name: "nicework".into(),
            priority: Priority::default(),
            workers: 1,
            slack: DEFAULT_SLACK,
            back_off: true,
            thread_setting: None,
        }
    }
}

impl Builder {
    /// Thread name prefix; workers are called `{name}-{index}` (Linux keeps 15 bytes).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Worker priority, [`Priority::Nice(19)`](Priority::Nice) by default.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self.thread_setting.get_or_insert("priority");
        self
    }

    /// Number of worker threads (the workqueue's `max_active`), 1 by default. Checked by
    /// [`build`](Self::build): 0 or more than [`MAX_WORKERS`] is an error.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self.thread_setting.get_or_insert("workers");
        self
    }

    /// How late a work may run so that neighbouring deadlines share one wakeup (1 ms by
    /// default). It is also the wheel's tick and the smallest re-arm delay. Values outside
    /// [`MIN_SLACK`]`..=`[`MAX_SLACK`] are clamped into that range (zero becomes
    /// `MIN_SLACK`), and rounded up to a whole 100 µs, the unit deadlines are kept in.
    ///
    /// The slack is every work's floor of [`Work::leeway`](crate::Work::leeway): a work
    /// may let a wider window share wakeups, never a narrower one.
    ///
    /// Deadlines are rounded up, never down, so a work never runs early. A delay of at
    /// least 100 times the coarse clock's margin (3.2 s and more on a 250 Hz kernel) is
    /// timed on the lock-free paths with `CLOCK_MONOTONIC_COARSE` plus that margin (8
    /// kernel ticks and at least 32 ms, raised to twice any lag the workers observe):
    /// such a work may run up to the margin later than the slack alone allows (at most
    /// 1 % of its delay), and never earlier.
    pub fn slack(mut self, slack: Duration) -> Self {
        self.slack = slack;
        self
    }

    /// Whether a worker defers the next increment of a work returning
    /// [`Next::Yield`](crate::Next::Yield) while more threads are runnable machine-wide
    /// than there are online CPUs (on by default). This is what keeps a saturating
    /// maintenance load from taking measurable throughput from the foreground, which nice
    /// 19 alone does not (the README's "Why low priority" has the figures). The cost is one
    /// read of `/proc/loadavg` per
    /// increment, and under contention the load makes almost no progress of its own until
    /// a CPU is free or someone [`flush`](crate::Work::flush)es it.
    ///
    /// # Examples
    ///
    /// ```
    /// let sched = nicework::Scheduler::builder().back_off(false).build()?;
    /// assert!(!sched.backs_off());
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn back_off(mut self, back_off: bool) -> Self {
        self.back_off = back_off;
        self
    }

    /// Starts the workers and returns once each runs at the configured priority.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidWorkers`] for `workers(0)` or more than [`MAX_WORKERS`];
    /// - [`Error::InvalidPriority`] for a nice value outside −20..=19;
    /// - [`Error::InvalidName`] for a name with a NUL byte;
    /// - [`Error::Priority`] when a worker may not take the priority (for example
    ///   `Nice(n)` below the current nice without `CAP_SYS_NICE`);
    /// - [`Error::Io`] when the timerfd or a thread cannot be created;
    /// - [`Error::Unsupported`] in loom builds, where only [`Scheduler::manual`] exists.
    ///
    /// # Examples
    ///
    /// ```
    /// use nicework::{Error, Priority, Scheduler};
    ///
    /// assert!(matches!(
    ///     Scheduler::builder().priority(Priority::Nice(40)).build(),
    ///     Err(Error::InvalidPriority(40))
    /// ));
    /// ```
    pub fn build(self) -> Result<Scheduler, Error> {
        let config = self.validate()?;
        start(config)
    }

    /// Builds a hosted scheduler: no nicework thread. The host's own event loop or async
    /// runtime runs the works through the returned [`Driver`] (see its docs for the
    /// loop), on the host's threads and at their priority. Time is the real clock, so
    /// `touch`, `schedule` and every other arm from any thread are exact, and an
    /// [`IdSpace`](crate::IdSpace)'s compaction runs under the host's
    /// [`run_due`](Driver::run_due) like any other work. Dropping the `Driver` shuts the
    /// scheduler down.
    ///
    /// # Errors
    ///
    /// - [`Error::NotHosted`] when [`workers`](Self::workers) or
    ///   [`priority`](Self::priority) was set: the host's threads run the works;
    /// - [`Error::InvalidName`] for a name with a NUL byte;
    /// - [`Error::Io`] when the timer cannot be created.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use nicework::{Error, Next, Scheduler};
    ///
    /// let (sched, driver) = Scheduler::builder().build_hosted()?;
    /// let work = sched.every(Duration::from_millis(1), |_| Next::Park);
    /// let due = driver.next_deadline().expect("armed");
    /// std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
    /// while driver.run_due() == 0 {
    ///     std::thread::sleep(Duration::from_millis(1)); // up to the slack later
    /// }
    /// assert_eq!(work.stats().runs, 1);
    /// assert!(matches!(
    ///     Scheduler::builder().workers(2).build_hosted(),
    ///     Err(Error::NotHosted("workers"))
    /// ));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn build_hosted(self) -> Result<(Scheduler, Driver), Error> {
        if let Some(setting) = self.thread_setting {
            return Err(Error::NotHosted(setting));
        }
        let mut config = self.validate()?;
        config.workers = 0;
        config.hosted = true;
        start_hosted(config)
    }

    fn validate(self) -> Result<Config, Error> {
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return Err(Error::InvalidWorkers(self.workers));
        }
        self.priority.validate()?;
        if self.name.contains('\0') {
            return Err(Error::InvalidName(self.name));
        }
        Ok(Config {
            name: self.name,
            priority: self.priority,
            workers: self.workers,
            slack_ns: nanos(self.slack.clamp(MIN_SLACK, MAX_SLACK))
                .next_multiple_of(crate::scheduler::work::state::DEADLINE_UNIT_NS),
            back_off: self.back_off,
            hosted: false,
        })
    }

    /// The configuration a manual scheduler uses: the defaults, no threads.
    pub(crate) fn manual_config() -> Config {
        Builder::default()
            .validate()
            .expect("the default configuration is valid")
    }
}

/// Also in loom builds: no thread blocks on a hosted scheduler's timer (the host polls
/// it), so loom models can drive a `Driver` by hand.
fn start_hosted(config: Config) -> Result<(Scheduler, Driver), Error> {
    use std::sync::Arc;

    use crate::clock::sleeper::Sleeper;
    use crate::scheduler::shared::Shared;

    let source = Sleeper::new_nonblocking()?;
    let reader = source.reader()?;
    let shared = Arc::new(Shared::new(config, Some(source), None, None));
    let driver = Driver::new(shared.clone(), reader);
    Ok((Scheduler::owning(shared), driver))
}

#[cfg(all(loom, feature = "loom"))]
fn start(_config: Config) -> Result<Scheduler, Error> {
    Err(Error::Unsupported(
        "threaded schedulers in loom models; use Scheduler::manual()",
    ))
}

#[cfg(not(all(loom, feature = "loom")))]
fn start(config: Config) -> Result<Scheduler, Error> {
    use std::sync::{Arc, mpsc};

    use crate::clock::sleeper::Sleeper;
    use crate::scheduler::shared::Shared;
    use crate::sync::lock_std;

    let source = Sleeper::new()?;
    // The standby's timer (see `standby`): only where disarming it wakes nobody.
    let watch = if config.workers >= 2 && Sleeper::DISARM_IS_SILENT {
        Some(Sleeper::new()?)
    } else {
        None
    };
    let readers = (0..config.workers)
        .map(|_| {
            let watch_reader = watch.as_ref().map(Sleeper::reader).transpose()?;
            Ok::<_, std::io::Error>((source.reader()?, watch_reader))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let raise_limit = crate::priority::raise_limit();
    let shared = Arc::new(Shared::new(config, Some(source), watch, raise_limit));
    // From here on, dropping `scheduler` shuts down and joins whatever was started.
    let scheduler = Scheduler::owning(shared.clone());
    let (started_tx, started_rx) = mpsc::channel();
    for (index, (reader, watch_reader)) in readers.into_iter().enumerate() {
        let thread_shared = shared.clone();
        let tx = started_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{}-{index}", shared.config.name))
            .spawn(move || {
                crate::scheduler::worker::main(thread_shared, reader, watch_reader, tx)
            })?;
        lock_std(&shared.threads).push(spawned);
    }
    drop(started_tx);
    for _ in 0..shared.config.workers {
        match started_rx.recv() {
            Ok(Ok(tid)) => shared.wakeups.add_worker(tid),
            Ok(Err(error)) => return Err(error),
            Err(_) => {
                return Err(Error::Io(std::io::Error::other(
                    "a worker thread exited during start-up",
                )));
            }
        }
    }
    Ok(scheduler)
}

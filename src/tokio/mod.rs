//! Driving a hosted scheduler from tokio: `tokio::spawn(nicework::tokio::drive(driver))`.
//!
//! [`drive`] turns a [`Driver`] into a task that runs the scheduler's works on the
//! runtime's threads, with no thread of nicework's. The task loops:
//!
//! 1. it runs the due works ([`Driver::run_due_at_most`]), at most [`TURN`] in one turn;
//!    a full turn yields to the executor (`tokio::task::yield_now`, which tokio queues
//!    behind the other tasks), so 100,000 works due at once cost the executor one turn's
//!    worth at a time, not the whole batch;
//! 2. it waits for the next wake. It registers its waker with the driver (when it
//!    changed), then looks at the shutdown and the source, in that order, so neither a
//!    shutdown nor an arm after the look is missed. The source is, on Linux, the
//!    driver's timerfd through `AsyncFd`: readable once the next deadline passes, also
//!    when another thread's arm moved it earlier; on other OSes (and Linux built with
//!    `--cfg nicework_portable`), tokio's timer set for [`Driver::next_deadline`], with
//!    the waker, which every arm that moves that deadline earlier wakes.
//!
//! A work that returns [`Next::Yield`](crate::Next::Yield) runs once per `run_due` call,
//! and every call counts against the turn (at least one, even with nothing due), so a
//! work that yields for ever shares the executor instead of holding it.
//!
//! # Invariants
//!
//! - The readiness of the `AsyncFd` is cleared before `run_due` drains the descriptor, so
//!   an expiry during the turn is not lost: it leaves the descriptor readable and the
//!   readiness set again.
//! - The task resolves once the scheduler is shut down: its last
//!   [`Scheduler`](crate::Scheduler) handle was dropped (the shutdown wakes the
//!   registered waker). Dropping the task drops the driver, which shuts the scheduler
//!   down.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::Driver;

/// The most runs one turn of [`drive`]'s task makes before it yields to the executor:
/// tokio's own coop budget per task poll.
pub const TURN: usize = 128;

/// Runs a hosted scheduler's works on the tokio runtime that polls it, until the
/// scheduler shuts down (its last [`Scheduler`](crate::Scheduler) handle is dropped).
/// Spawn it: `tokio::spawn(nicework::tokio::drive(driver))`. Dropping the task (an
/// `abort`, or the runtime's shutdown) drops the driver, which shuts the scheduler down.
///
/// It works on current-thread and multi-thread runtimes, and bounds each turn to
/// [`TURN`] runs (see the [module docs](self)).
///
/// # Panics
///
/// When polled outside a tokio runtime, or in one without the time driver; on Linux, also
/// in one without the I/O driver. `Builder::enable_all` enables both.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nicework::{Next, Scheduler};
///
/// # #[cfg(feature = "tokio")]
/// tokio::runtime::Builder::new_current_thread()
///     .enable_all()
///     .build()
///     .unwrap()
///     .block_on(async {
///         let (sched, driver) = Scheduler::builder().build_hosted()?;
///         let host = tokio::spawn(nicework::tokio::drive(driver));
///         let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
///         let work = sched.every(Duration::from_millis(5), move |_| {
///             let _ = tx.send(());
///             Next::Again
///         });
///         rx.recv().await;
///         rx.recv().await; // two runs, on this runtime's thread
///         drop(work);
///         drop(sched); // the last handle: the scheduler shuts down, and the task ends
///         host.await.unwrap();
///         Ok::<(), nicework::Error>(())
///     })?;
/// # Ok::<(), nicework::Error>(())
/// ```
// Not an `async fn`: the signature states `Send + 'static`, which `tokio::spawn` needs
// and an `async fn` would leave to inference.
#[allow(clippy::manual_async_fn)]
pub fn drive(driver: Driver) -> impl Future<Output = ()> + Send + 'static {
    async move {
        let mut host = Host {
            source: Source::new(driver),
            registered: None,
        };
        let mut budget = TURN;
        loop {
            // Each call costs at least one: a source that fires with nothing due still
            // ends the turn.
            let runs = host.source.driver().run_due_at_most(budget);
            budget -= runs.max(1).min(budget);
            if budget == 0 {
                // A full turn: let the executor's other tasks run (tokio defers a
                // yielded task behind them), then come back.
                ::tokio::task::yield_now().await;
                budget = TURN;
                continue;
            }
            let mut waited = false;
            let wake = std::future::poll_fn(|cx| match host.poll_wake(cx) {
                Poll::Pending => {
                    waited = true;
                    Poll::Pending
                }
                Poll::Ready(true) => Poll::Ready(Wake::ShutDown),
                Poll::Ready(false) if waited => Poll::Ready(Wake::AfterWaiting),
                Poll::Ready(false) => Poll::Ready(Wake::AtOnce),
            })
            .await;
            match wake {
                Wake::ShutDown => return,
                Wake::AfterWaiting => budget = TURN,
                Wake::AtOnce => {}
            }
        }
    }
}

/// What ended a wait for the next wake.
enum Wake {
    /// The scheduler shut down.
    ShutDown,
    /// A source fired after the task waited (returned `Pending`): a new turn.
    AfterWaiting,
    /// A source had fired already: the same turn goes on.
    AtOnce,
}

/// The task's state between turns.
struct Host {
    source: Source,
    /// The waker last registered with the driver.
    registered: Option<Waker>,
}

/// The wake source besides the waker, and the driver it watches.
enum Source {
    /// The driver's timerfd, through the reactor; the `AsyncFd` owns the driver.
    #[cfg(all(target_os = "linux", not(nicework_portable)))]
    Descriptor(::tokio::io::unix::AsyncFd<Driver>),
    /// Tokio's timer, set for the next deadline (made at the first wait).
    Timer(Driver, Option<Pin<Box<::tokio::time::Sleep>>>),
}

impl Source {
    /// The descriptor where it can be watched, else the timer. Called inside the task, so
    /// inside the runtime.
    fn new(driver: Driver) -> Source {
        #[cfg(all(target_os = "linux", not(nicework_portable)))]
        {
            // SAFETY: the descriptor is the driver's timerfd, which the driver owns and
            // closes only when dropped; the `AsyncFd` owns the driver, so the descriptor
            // stays open and the same for the `AsyncFd`'s whole life, and `as_raw_fd`
            // always returns it.
            let registered = unsafe {
                ::tokio::io::unix::AsyncFd::register_with_interest(
                    driver,
                    ::tokio::io::Interest::READABLE,
                )
            };
            match registered {
                Ok(fd) => Source::Descriptor(fd),
                Err(error) => {
                    let (driver, error) = error.into_parts();
                    // The process is out of epoll watches: the timer and the waker tell
                    // the task as much.
                    tracing::error!(
                        %error,
                        "nicework::tokio::drive: the driver's descriptor cannot be watched; \
                         using tokio's timer"
                    );
                    Source::Timer(driver, None)
                }
            }
        }
        #[cfg(not(all(target_os = "linux", not(nicework_portable))))]
        Source::Timer(driver, None)
    }

    fn driver(&self) -> &Driver {
        match self {
            #[cfg(all(target_os = "linux", not(nicework_portable)))]
            Source::Descriptor(fd) => fd.get_ref(),
            Source::Timer(driver, _) => driver,
        }
    }
}

impl Host {
    /// Waits for the next wake; `true` once the scheduler shut down. Registers the waker
    /// (when it changed) before it looks at the shutdown and the source, so neither a
    /// shutdown nor an arm after the look is missed.
    fn poll_wake(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if !self
            .registered
            .as_ref()
            .is_some_and(|waker| waker.will_wake(cx.waker()))
        {
            self.source.driver().set_waker(cx.waker().clone());
            self.registered = Some(cx.waker().clone());
        }
        if self.source.driver().is_shut_down() {
            return Poll::Ready(true);
        }
        match &mut self.source {
            #[cfg(all(target_os = "linux", not(nicework_portable)))]
            Source::Descriptor(fd) => match fd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut ready)) => {
                    // Cleared before `run_due` drains the descriptor: an expiry during
                    // the turn sets the readiness again.
                    ready.clear_ready();
                    Poll::Ready(false)
                }
                Poll::Ready(Err(error)) => {
                    // The reactor is gone: the runtime is shutting down, and with it
                    // this task.
                    tracing::error!(%error, "nicework::tokio::drive: the reactor failed; the task ends");
                    Poll::Ready(true)
                }
                Poll::Pending => Poll::Pending,
            },
            Source::Timer(driver, sleep) => {
                // Nothing armed: the waker hears of the next arm.
                let Some(at) = driver.next_deadline() else {
                    return Poll::Pending;
                };
                let sleep =
                    sleep.get_or_insert_with(|| Box::pin(::tokio::time::sleep_until(at.into())));
                sleep.as_mut().reset(at.into());
                sleep.as_mut().poll(cx).map(|()| false)
            }
        }
    }
}

#[cfg(test)]
mod tests;
